"""tpo_gym.integrations.trl: TargetPOTrainer (TPO on TRL's GRPOTrainer).

Exact gradients (left-padded prompts included), distributed exactness, GRPO parity, a KL term, honest logs,
no silently ignored GRPO option, errors. Rollouts are the deterministic ones of ``trl_toys`` (injected through
TRL's ``rollout_func``); the references are written from the equations on each row's unpadded prompt +
completion.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from tpo_gym.agents.lm import sequence_logprobs
from tpo_gym.integrations import trl as tpo_trl
from tpo_gym.integrations.trl import TargetPOConfig, TargetPOTrainer
from tpo_gym.objectives import grpo_loss, standardize_scores, tpo_loss, tpo_target

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import trl_toys  # noqa: E402
from trl_toys import (  # noqa: E402
    N_PROMPTS,
    GradCapture,
    K,
    completion_tokens,
    reference_batch,
    reward_count_a,
    tiny_llama,
    tiny_tokenizer,
    trainer_grads,
)


def _reference_tpo_grads(length_normalize: bool = False, eta: float = 1.0, anchor: bool = True,
                         n_prompts: int = N_PROMPTS) -> dict[str, torch.Tensor]:
    """tpo-gym's own TPO gradient on the same rollouts: sequence_logprobs + objectives.tpo_loss."""
    batch = reference_batch(n_prompts)
    model = tiny_llama(seed=0)
    token_logp = sequence_logprobs(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                   batch["token_mask"], temperature=1.0)
    seq = token_logp.sum(dim=1)
    if length_normalize:
        seq = seq / batch["token_mask"].sum(dim=1)
    logp = seq.view(n_prompts, K)
    q = tpo_target(logp.detach(), standardize_scores(batch["rewards"]), eta=eta, anchor=anchor)
    tpo_loss(logp, q).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float = 1e-5,
                       scale: float = 1.0) -> float:
    assert set(got) == set(want), set(got) ^ set(want)
    worst = 0.0
    for name, g in want.items():
        g = g * scale
        err = (got[name] - g).abs().max().item()
        bound = rtol * g.abs().max().item() + 1e-7
        assert err <= bound, f"{name}: max |diff| {err:.3g} > {bound:.3g}"
        worst = max(worst, err / (g.abs().max().item() + 1e-12))
    assert any(g.abs().max() > 0 for g in want.values())
    return worst


def test_trl_private_methods_it_overrides_exist() -> None:
    for name in tpo_trl.OVERRIDDEN_TRL_METHODS:
        assert callable(getattr(GRPOTrainer, name, None)), (
            f"trl.GRPOTrainer.{name} is gone in TRL {tpo_trl.trl_version()}: TargetPOTrainer overrides / calls it")
    for attr in ("_buffered_inputs", "_step", "reward_weights", "num_generations", "_metrics"):
        assert attr in GRPOTrainer.__init__.__code__.co_names or attr in dir(GRPOTrainer), (
            f"trl.GRPOTrainer no longer sets {attr}, which TargetPOTrainer reads")


@pytest.mark.parametrize("update, config", [
    ("groups", {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}),
    # q stored at generation (old-log-prob forward), reused by the second iteration
    ("groups", {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_iterations": 2}),
    ("weights", {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}),
    # groups split across two micro-batches (after TRL's row shuffle)
    ("weights", {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}),
])
def test_one_step_gradient_equals_tpo_gym(tmp_path: Path, update: str, config: dict) -> None:
    got = trainer_grads(TargetPOTrainer, TargetPOConfig, str(tmp_path), target_update=update, **config)
    worst = _assert_same_grads(got, _reference_tpo_grads())
    assert worst < 1e-5


@pytest.mark.parametrize("settings", [{"length_normalize": True}, {"eta": 0.5, "anchor": False}])
def test_target_settings_reach_the_gradient(tmp_path: Path, settings: dict) -> None:
    got = trainer_grads(TargetPOTrainer, TargetPOConfig, str(tmp_path), per_device_train_batch_size=4,
                        gradient_accumulation_steps=2, **settings)
    _assert_same_grads(got, _reference_tpo_grads(**settings))
    # and they matter: the default target gives another gradient
    default = _reference_tpo_grads()
    assert any((got[n] - default[n]).abs().max() > 1e-4 * default[n].abs().max() for n in default)


def test_auto_picks_whole_groups_when_micro_batches_hold_them() -> None:
    args = TargetPOConfig(output_dir="unused", num_generations=4, per_device_train_batch_size=4,
                          gradient_accumulation_steps=2, num_iterations=2, use_cpu=True, report_to="none")
    assert tpo_trl.resolve_target_update(args) == "groups"
    args = TargetPOConfig(output_dir="unused", num_generations=4, per_device_train_batch_size=2,
                          gradient_accumulation_steps=2, use_cpu=True, report_to="none")
    assert tpo_trl.resolve_target_update(args) == "weights"


def test_shuffle_keeps_groups_whole() -> None:
    batch = {"completion_ids": torch.arange(12).unsqueeze(1), "n": torch.tensor(5), "tags": list(range(12))}
    out = tpo_trl._shuffle_groups(batch, 4)
    rows = out["completion_ids"].squeeze(1)
    assert sorted(rows.tolist()) == list(range(12))
    assert all(len(set((rows[i:i + 4] // 4).tolist())) == 1 for i in range(0, 12, 4))
    assert out["tags"] == rows.tolist() and out["n"].item() == 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_with_groups_split_across_ranks_give_the_one_process_gradient(tmp_path: Path) -> None:
    """torchrun, 2 CPU processes (gloo): 'weights' with each group split over the ranks, and 'groups'."""
    # 3 prompts x K=4 = 12 rows; 2 ranks x 6 rows: group 1 is split over the ranks, then over micro-batches
    one_weights = trainer_grads(TargetPOTrainer, TargetPOConfig, str(tmp_path / "w1"), n_prompts=3,
                                per_device_train_batch_size=6, gradient_accumulation_steps=2, target_update="weights")
    one_groups = trainer_grads(TargetPOTrainer, TargetPOConfig, str(tmp_path / "g1"), per_device_train_batch_size=8,
                               gradient_accumulation_steps=1, target_update="groups")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
           str(HERE / "trl_two_process_worker.py"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    from safetensors.torch import load_file

    two_weights = load_file(str(tmp_path / "weights.safetensors"))
    two_groups = load_file(str(tmp_path / "groups.safetensors"))
    _assert_same_grads(two_weights, one_weights)
    _assert_same_grads(two_groups, one_groups)
    _assert_same_grads(two_weights, _reference_tpo_grads(n_prompts=3))


def test_trl_grpo_matches_tpo_gym_grpo_where_the_definitions_coincide(tmp_path: Path) -> None:
    """TRL's GRPO (loss_type='grpo', beta=0) vs tpo_gym.objectives.grpo_loss at token level, first step.

    The definitions differ by documented factors only: TRL averages over the N = G*K completions
    (tpo-gym sums the K of a group and averages over groups: 1/K) and scales advantages by the
    Bessel std + 1e-4 (tpo-gym: population std + 1e-8). Every group's rewards here are a permutation
    of 0..K-1, so the std ratio is the same constant for every group.
    """
    got = trainer_grads(GRPOTrainer, GRPOConfig, str(tmp_path), loss_type="grpo", beta=0.0,
                        scale_rewards="group", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    batch = reference_batch()
    model = tiny_llama(seed=0)
    token_logp = sequence_logprobs(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                   batch["token_mask"], temperature=1.0)
    t = token_logp.shape[1]
    logp = token_logp.view(N_PROMPTS, K, t)
    grpo_loss(logp, logp.detach(), batch["rewards"], beta=0.0, token_mask=batch["token_mask"].view(N_PROMPTS, K, t)
              ).backward()
    want = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    r = batch["rewards"][0]
    pop, bessel = r.std(correction=0).item(), r.std(correction=1).item()
    _assert_same_grads(got, want, scale=(pop + 1e-8) / (bessel + 1e-4) / K)


def test_bad_configs_name_the_setting(tmp_path: Path) -> None:
    base = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": "none"}
    with pytest.raises(ValueError, match="num_generations"):
        TargetPOConfig(**base, num_generations=1, per_device_train_batch_size=2)
    with pytest.raises(ValueError, match="eta"):
        TargetPOConfig(**base, num_generations=4, per_device_train_batch_size=4, eta=0.0)
    with pytest.raises(ValueError, match="target_update"):
        TargetPOConfig(**base, num_generations=4, per_device_train_batch_size=4, target_update="rows")
    tok, model = tiny_tokenizer(), tiny_llama()

    def make(**config: object) -> None:
        args = TargetPOConfig(**{**base, "num_generations": 4, "per_device_train_batch_size": 4, **config})
        TargetPOTrainer(model=model, reward_funcs=trl_toys.reward_count_a, args=args,
                        train_dataset=trl_toys.dataset(), processing_class=tok)

    with pytest.raises(ValueError, match=r"per_device_train_batch_size \(2\).*num_generations \(4\)"):
        make(per_device_train_batch_size=2, gradient_accumulation_steps=2, target_update="groups")
    with pytest.raises(ValueError, match="num_iterations"):
        make(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_iterations=2, target_update="weights")
    with pytest.raises(ValueError, match="no exact TPO update"):
        make(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_iterations=2)
    with pytest.raises(ValueError, match="loss_type"):
        make(loss_type="grpo")
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        make(top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="mask_truncated_completions"):
        make(mask_truncated_completions=True)
    with pytest.raises(ValueError, match="TargetPOConfig"):
        TargetPOTrainer(model=model, reward_funcs=trl_toys.reward_count_a, processing_class=tok,
                        args=GRPOConfig(**base, num_generations=4, per_device_train_batch_size=4),
                        train_dataset=trl_toys.dataset())


@pytest.mark.parametrize(("name", "value", "message"), [
    ("eta", 10**400, r"eta must be a finite number > 0, got 1000.*\(int\)"),
    ("eta", float("nan"), r"eta must be a finite number > 0, got nan"),
    ("beta", float("nan"), r"beta must be a finite number >= 0, got nan"),
    ("beta", float("inf"), r"beta must be a finite number >= 0, got inf"),
    ("target_update", "bogus", r"target_update must be one of \['auto', 'groups', 'weights'\], got 'bogus'"),
    ("num_generations", 2.5, r"num_generations must be an integer >= 2, got 2.5 \(float\)"),
    ("num_generations", "4", r"num_generations must be an integer >= 2, got '4' \(str\)"),
], ids=["eta-huge", "eta-nan", "beta-nan", "beta-inf", "target_update", "num_generations-float", "num_generations-str"])
def test_one_validator_checks_the_config_when_built_and_when_the_trainer_gets_it(
        tmp_path: Path, name: str, value: object, message: str) -> None:
    """TargetPOConfig's __post_init__ and TargetPOTrainer run the same check_config: a value set after the
    config was built is refused by the trainer (at init, and before a generation) as the config refuses it."""
    base = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": "none", "num_generations": 4,
            "per_device_train_batch_size": 4}
    with pytest.raises(ValueError, match=message):
        TargetPOConfig(**{**base, name: value})
    args = TargetPOConfig(**base)
    setattr(args, name, value)
    with pytest.raises(ValueError, match=message):
        tpo_trl.check_config(args)
    with pytest.raises(ValueError, match=message):
        TargetPOTrainer(model=tiny_llama(), reward_funcs=trl_toys.reward_count_a, args=args,
                        train_dataset=trl_toys.dataset(), processing_class=tiny_tokenizer())


def test_a_beta_set_to_nan_after_the_trainer_is_made_stops_training_before_it_starts(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    args = TargetPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4, max_steps=1,
                          max_completion_length=8, use_cpu=True, report_to="none", save_strategy="no",
                          disable_tqdm=True)
    trainer = TargetPOTrainer(model=tiny_llama(), reward_funcs=trl_toys.reward_count_a, args=args,
                              train_dataset=trl_toys.dataset(4), processing_class=tok,
                              rollout_func=trl_toys.make_rollout(tok))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.args.beta = float("nan")
    with pytest.raises(ValueError, match=r"beta must be a finite number >= 0, got nan"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_several_iterations_on_whole_groups_train(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    args = TargetPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4,
                          gradient_accumulation_steps=2, num_iterations=2, max_steps=2, max_completion_length=8,
                          use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = TargetPOTrainer(model=tiny_llama(), reward_funcs=trl_toys.reward_count_a, args=args,
                              train_dataset=trl_toys.dataset(4), processing_class=tok,
                              rollout_func=trl_toys.make_rollout(tok))
    assert trainer.target_update == "groups"
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    # one generation serves both steps (num_iterations=2): the target is built once
    targets = [h for h in trainer.state.log_history if "target/entropy_q" in h]
    assert len(targets) >= 1 and all(0.0 <= h["target/zero_variance_fraction"] <= 1.0 for h in targets)


# ---------------------------------------------------------------------------------------------
# Reasoning Gym for TRL
# ---------------------------------------------------------------------------------------------
def test_reasoning_gym_dataset_and_reward_score_with_the_env() -> None:
    from tpo_gym.integrations.trl import reasoning_gym_dataset, reasoning_gym_reward

    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    data = reasoning_gym_dataset("basic_arithmetic", size=6, seed=3, **config)
    assert len(data) == 6 and data[2]["index"] == 2
    messages = data[0]["prompt"]
    assert messages[0]["role"] == "system" and "<answer>" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": data[0]["question"]}
    reward = reasoning_gym_reward("basic_arithmetic", size=6, seed=3, **config)
    right = [f"<answer>{row['answer']}</answer>" for row in data]
    assert reward(completions=right, index=data["index"]) == [1.0] * 6
    assert reward(completions=["no tags"] * 6, index=data["index"]) == [0.0] * 6
    # conversational completions (TRL's layout for chat prompts)
    assert reward(completions=[[{"role": "assistant", "content": right[1]}]], index=[1]) == [1.0]
    assert reward.__name__ == "reasoning_gym_basic_arithmetic"


def test_reasoning_gym_prefill_format_builds_text_prompts() -> None:
    from tpo_gym.integrations.trl import reasoning_gym_dataset, reasoning_gym_reward

    with pytest.raises(ValueError, match="tokenizer"):
        reasoning_gym_dataset("basic_arithmetic", size=3, prompt_format="answer_prefill")
    tok = tiny_tokenizer()
    data = reasoning_gym_dataset("basic_arithmetic", size=3, tokenizer=tok, prompt_format="answer_prefill")
    assert all(isinstance(p, str) and p.endswith("<answer>") for p in data["prompt"])
    reward = reasoning_gym_reward("basic_arithmetic", size=3, prompt_format="answer_prefill")
    # the model continues after the prefill; the tag is closed for it
    assert reward(completions=[str(data[0]["answer"])], index=[0]) == [1.0]


def test_reasoning_gym_sources_and_errors() -> None:
    import gymnasium as gym

    from tpo_gym.integrations.trl import reasoning_gym_dataset, reasoning_gym_reward

    env = gym.make("tpo_gym/ReasoningGym-v0", dataset="basic_arithmetic", size=4, seed=1)
    from_env = reasoning_gym_dataset(env)
    from_id = reasoning_gym_dataset("tpo_gym/ReasoningGym-v0", dataset="basic_arithmetic", size=4, seed=1)
    assert from_env["question"] == from_id["question"]
    reward = reasoning_gym_reward(env)
    assert reward(completions=[f"<answer>{from_env[3]['answer']}</answer>"], index=[3]) == [1.0]
    with pytest.raises(ValueError, match="config"):
        reasoning_gym_dataset(env, min_terms=2)
    with pytest.raises(ValueError, match="source"):
        reasoning_gym_dataset(42)
    with pytest.raises(ValueError, match="index"):
        reward(completions=["x"])


def test_peft_adapter_trains_and_the_base_stays(tmp_path: Path) -> None:
    from peft import LoraConfig

    tok = tiny_tokenizer()
    model = tiny_llama()
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = TargetPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4,
                          max_steps=1, max_completion_length=8, learning_rate=1e-2, use_cpu=True, bf16=False,
                          report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = TargetPOTrainer(model=model, reward_funcs=trl_toys.reward_count_a, args=args, processing_class=tok,
                              train_dataset=trl_toys.dataset(), rollout_func=trl_toys.make_rollout(tok),
                              peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     task_type="CAUSAL_LM"))
    trainer.train()
    named = dict(trainer.model.named_parameters())
    lora_b = [p for n, p in named.items() if "lora_B" in n]
    assert lora_b and any(p.abs().max() > 0 for p in lora_b)  # B starts at 0: the adapter moved
    for n, p in named.items():
        if "lora_" not in n:
            key = n.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(p.detach(), base[key]), n


def test_example_script_runs_on_the_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = _example_module()
    summary = module.main(["--steps", "1", "--num-generations", "4", "--prompts-per-step", "1",
                           "--max-completion-length", "6", "--size", "20", "--eval-size", "4",
                           "--output-dir", str(tmp_path)])
    assert 0.0 <= summary["held_out_before"] <= 1.0 and 0.0 <= summary["held_out_after"] <= 1.0
    assert "held-out score (4 questions, greedy): before" in capsys.readouterr().out
    assert summary["steps"] == 1 and summary["target_update"] == "groups" and len(summary["reward"]) == 1
    assert summary["length_normalize"] is True, "the example avoids the collapsed target by default"


def _example_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_target_po", HERE.parents[1] / "examples" / "trl_target_po.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_held_out_score_rises_when_target_po_trains(tmp_path: Path) -> None:
    """The example's before / after measure on a task the tiny model can learn ("say X": the share of the
    first 3 characters equal to X): TargetPOTrainer with real generation raises the greedy held-out score."""
    from datasets import Dataset

    example = _example_module()

    def reward(completions: list[str], index: list[int], **kwargs: Any) -> list[float]:
        return [sum(ch == "abcd"[int(i) % 4] for ch in c[:3]) / 3 for c, i in zip(completions, index, strict=True)]

    data = Dataset.from_list([{"prompt": f"say {'abcd'[i % 4]}\n>", "index": i} for i in range(64)])
    tok, model = tiny_tokenizer(), tiny_llama(seed=0)
    before = example.held_out_score(model, tok, data, reward, 8, 4)
    args = TargetPOConfig(output_dir=str(tmp_path), num_generations=8, per_device_train_batch_size=64,
                          max_completion_length=4, learning_rate=3e-3, max_steps=40, num_iterations=2,
                          length_normalize=True, use_cpu=True, report_to="none", save_strategy="no",
                          logging_steps=1, disable_tqdm=True, temperature=1.0, seed=0)
    trainer = TargetPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    after = example.held_out_score(trainer.model, tok, data, reward, 8, 4)
    assert after >= before + 0.3, (before, after)  # measured: 0.083 -> 0.667
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert sum(rewards[-5:]) > sum(rewards[:5]), rewards


def test_example_under_torchrun_is_one_run_of_two_processes(tmp_path: Path) -> None:
    """The README's multi-process command: each process sees world size 2, and after a step both ranks
    hold the same weights (one data-parallel run, not two independent copies)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
           str(HERE.parents[1] / "examples" / "trl_target_po.py"), "--steps", "1", "--num-generations", "4",
           "--prompts-per-step", "1", "--max-completion-length", "6", "--size", "20", "--learning-rate", "1e-2",
           "--output-dir", str(tmp_path / "out"), "--report-dir", str(tmp_path / "ranks")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 and r["torch_world_size"] == 2 for r in ranks), ranks
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"], "the ranks trained different weights"
    assert all(r["steps"] == 1 for r in ranks)


#: prompts of four different lengths: TRL left-pads them in one batch
PADDED_PROMPTS = ["a\n>", "say bb\n>", "X\n>", "say dddd\n>"]


def tiny_gpt2(seed: int = 0, dtype: torch.dtype = torch.float64) -> Any:
    """A random 2-layer GPT-2: learned absolute position embeddings, no dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tiny_tokenizer()), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0, eos_token_id=1,
                        bos_token_id=1, tie_word_embeddings=False)
    return GPT2LMHeadModel(config).to(dtype)


MODELS = {"gpt2": tiny_gpt2, "llama": lambda: tiny_llama(seed=0, dtype=torch.float64)}


def _dataset(prompts: list[str], n_prompts: int) -> Any:
    from datasets import Dataset

    return Dataset.from_list([{"prompt": prompts[i % len(prompts)]} for i in range(n_prompts)])


def _rollout(tokenizer: Any, sampling_logprobs: bool = False) -> Any:
    """trl_toys' rollouts (row ``j`` gets a fixed completion), with vLLM-style sampling log-probs if asked."""
    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        start = trainer.accelerator.process_index * len(prompts)
        completions = [completion_tokens(tokenizer, start + i) for i in range(len(prompts))]
        return {"prompt_ids": [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts],
                "completion_ids": completions,
                "logprobs": [[-1.0] * len(c) for c in completions] if sampling_logprobs else None}

    return rollout


def _trainer(model: Any, out: Path, prompts: list[str] = PADDED_PROMPTS, n_prompts: int = 2, reward: Any = None,
             sampling_logprobs: bool = False, peft_config: Any = None, **config: Any
             ) -> tuple[TargetPOTrainer, GradCapture]:
    """A one-step TargetPOTrainer on the deterministic rollouts; its first gradient lands in the capture."""
    tok = tiny_tokenizer()
    settings = {"output_dir": str(out), "num_generations": K, "per_device_train_batch_size": K,
                "gradient_accumulation_steps": 2, "max_completion_length": 8, "max_steps": 1, "report_to": "none",
                "use_cpu": True, "save_strategy": "no", "shuffle_dataset": False, "max_grad_norm": 0.0,
                "learning_rate": 1e-3, "logging_steps": 1, "disable_tqdm": True, "seed": 0, "bf16": False, **config}
    capture = GradCapture()
    trainer = TargetPOTrainer(model=model, reward_funcs=reward or reward_count_a, args=TargetPOConfig(**settings),
                              train_dataset=_dataset(prompts, n_prompts), processing_class=tok,
                              rollout_func=_rollout(tok, sampling_logprobs), callbacks=[capture.callback],
                              peft_config=peft_config)
    capture.model = trainer.model
    return trainer, capture


def _rows(prompts: list[str], n_prompts: int) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    """Each row's unpadded prompt ids and completion ids (global row order), and the rewards ``[G, K]``."""
    tok = tiny_tokenizer()
    rows = range(n_prompts * K)
    prompt_ids = [tok(prompts[(j // K) % len(prompts)], add_special_tokens=False)["input_ids"] for j in rows]
    completions = [completion_tokens(tok, j) for j in rows]
    texts = [tok.decode(c, skip_special_tokens=True) for c in completions]
    return prompt_ids, completions, torch.tensor(reward_count_a(texts), dtype=torch.float64).view(n_prompts, K)


def _token_logps(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Log-probs of the completion's tokens from one unpadded forward (positions 0..L-1)."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)


def _independent_loss(model: Any, prompts: list[str], n_prompts: int, beta: float = 0.0,
                      ref_logps: Any = None) -> torch.Tensor:
    r"""TPO's loss from the equations, row by row: :math:`-\frac1G\sum_g\sum_i q_i\log p^\theta_i` plus
    :math:`\beta\,\frac1N\sum_i\frac1{T_i}\sum_t (e^{r_t - l_t} - (r_t - l_t) - 1)`."""
    prompt_ids, completions, rewards = _rows(prompts, n_prompts)
    token_logps = [_token_logps(model, p, c) for p, c in zip(prompt_ids, completions, strict=True)]
    logp = torch.stack([t.sum() for t in token_logps]).view(n_prompts, K)
    q = tpo_target(logp.detach(), standardize_scores(rewards))
    loss = tpo_loss(logp, q)
    if beta:
        kl_rows = []
        for lp, ref in zip(token_logps, ref_logps, strict=True):
            d = ref - lp
            kl_rows.append((torch.exp(d) - d - 1).mean())
        loss = loss + beta * torch.stack(kl_rows).mean()
    return loss


def _grads(model: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """Largest ``max|got - want| / max|want|`` over the parameters (both must have the same ones)."""
    got = {n.removeprefix("module."): g for n, g in got.items()}
    assert set(got) == set(want), set(got) ^ set(want)
    assert any(g.abs().max() > 0 for g in want.values())
    return max(((got[n] - g).abs().max() / g.abs().max().clamp(min=1e-30)).item() for n, g in want.items())


# ---------------------------------------------------------------------------------------------
# positions on left-padded batches
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_left_padded_gradient_equals_unpadded_per_row_forward(tmp_path: Path, arch: str) -> None:
    trainer, capture = _trainer(MODELS[arch](), tmp_path)
    trainer.train()
    reference = MODELS[arch]()
    want = _grads(reference, _independent_loss(reference, PADDED_PROMPTS, 2))
    error = _relative_error(capture.grads, want)
    print(f"{arch}: max relative gradient error vs unpadded per-row forwards {error:.2e}")
    assert error < 1e-5, f"{arch}: relative error {error:.3g}"


def test_every_forward_gets_positions_from_the_attention_mask(tmp_path: Path) -> None:
    """Loss, old log-prob (weights form) and reference (beta > 0) forwards all see mask positions."""
    from transformers import LlamaForCausalLM

    tiny_llama(seed=0).save_pretrained(tmp_path / "init")
    trainer, _ = _trainer(LlamaForCausalLM.from_pretrained(tmp_path / "init"), tmp_path / "run",
                          target_update="weights", beta=0.1)
    seen: dict[str, list[bool]] = {"policy": [], "reference": []}

    def recorder(name: str) -> Any:
        def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            mask, positions = kwargs["attention_mask"], kwargs.get("position_ids")
            seen[name].append(positions is not None and torch.equal(positions, tpo_trl.mask_positions(mask)))
        return hook

    trainer.model.model.register_forward_pre_hook(recorder("policy"), with_kwargs=True)
    trainer.ref_model.model.register_forward_pre_hook(recorder("reference"), with_kwargs=True)
    trainer.train()
    # weights form: one old-log-prob pass (2 chunks) and 2 loss micro-batches; the reference: 2 chunks
    assert len(seen["policy"]) == 4 and len(seen["reference"]) == 2, seen
    assert all(seen["policy"]) and all(seen["reference"]), seen
    padded = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert tpo_trl.mask_positions(padded).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


# ---------------------------------------------------------------------------------------------
# beta: k3 KL to the frozen reference
# ---------------------------------------------------------------------------------------------
def _perturb(model: Any, seed: int = 7, scale: float = 0.05) -> None:
    """Move the policy away from the reference (a KL of 0 has a zero gradient)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def test_kl_penalty_gradient_matches_independent_k3_formula(tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    beta = 0.5
    tiny_llama(seed=0, dtype=torch.float64).save_pretrained(tmp_path / "init")
    trainer, capture = _trainer(LlamaForCausalLM.from_pretrained(tmp_path / "init"), tmp_path / "run", beta=beta)
    assert trainer.ref_model is not None and trainer.args.use_bias_correction_kl is False
    _perturb(trainer.model)
    trainer.train()

    reference = tiny_llama(seed=0, dtype=torch.float64)  # the initial weights
    prompt_ids, completions, _ = _rows(PADDED_PROMPTS, 2)
    with torch.no_grad():
        ref_logps = [_token_logps(reference, p, c) for p, c in zip(prompt_ids, completions, strict=True)]
    policy = tiny_llama(seed=0, dtype=torch.float64)
    _perturb(policy)
    want = _grads(policy, _independent_loss(policy, PADDED_PROMPTS, 2, beta, ref_logps))
    error = _relative_error(capture.grads, want)
    assert error < 1e-5, error
    # the KL term is material here: without it the gradient is another one
    without = _grads(policy, _independent_loss(policy, PADDED_PROMPTS, 2))
    assert max(((want[n] - without[n]).abs().max() / want[n].abs().max()).item() for n in want) > 1e-2
    kl = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert kl and kl[0] > 0


def test_kl_with_lora_uses_the_adapter_disabled_base_without_a_copy(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    beta = 0.5
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                      init_lora_weights=False)  # a random B: the adapted policy differs from the base
    trainer, capture = _trainer(tiny_llama(seed=0, dtype=torch.float64), tmp_path, beta=beta, peft_config=lora)
    assert trainer.ref_model is None  # the reference is the base model with the adapter disabled
    policy = get_peft_model(tiny_llama(seed=0, dtype=torch.float64), lora)
    policy.load_state_dict(trainer.model.state_dict())
    trainer.train()

    prompt_ids, completions, _ = _rows(PADDED_PROMPTS, 2)
    with torch.no_grad(), policy.disable_adapter():
        ref_logps = [_token_logps(policy, p, c) for p, c in zip(prompt_ids, completions, strict=True)]
    want = _grads(policy, _independent_loss(policy, PADDED_PROMPTS, 2, beta, ref_logps))
    got = {n: g for n, g in capture.grads.items() if "lora_" in n}
    assert got and _relative_error(got, {n: g for n, g in want.items() if "lora_" in n}) < 1e-5


def test_kl_on_a_model_without_a_path_is_refused_early(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"beta=0.1 needs a frozen reference model.*peft_config"):
        _trainer(tiny_llama(seed=0), tmp_path, beta=0.1)  # built in memory: GRPOTrainer cannot load a copy


def test_k3_kl_is_the_per_completion_token_mean() -> None:
    logp = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, -0.5, -0.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 99.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    value = tpo_trl.k3_kl(logp, ref, mask)
    d = torch.tensor([-0.5, 1.0], dtype=torch.float64)
    assert torch.isclose(value, (torch.exp(d) - d - 1).mean() / 2)  # row 2 has KL 0; the padded 99 is ignored
    value.backward()
    assert torch.allclose(logp.grad[0, :2], (1 - torch.exp(d)) / 4) and (logp.grad[0, 2] == 0)


def test_beta_defaults_to_zero_and_refuses_negative() -> None:
    args = TargetPOConfig(output_dir="unused", num_generations=4, per_device_train_batch_size=4, use_cpu=True,
                          report_to="none")
    assert args.beta == 0.0
    with pytest.raises(ValueError, match="beta"):
        TargetPOConfig(output_dir="unused", num_generations=4, per_device_train_batch_size=4, use_cpu=True,
                       report_to="none", beta=-0.1)


# ---------------------------------------------------------------------------------------------
# honest logs
# ---------------------------------------------------------------------------------------------
def _reward_a_for_say_a(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
    """Prompt 'say a': a third per 'a' (one group reaches 1); any other prompt: 0 (an all-fail group)."""
    return [c.count("a") / 3 if "say a" in p else 0.0 for p, c in zip(prompts, completions, strict=True)]


@pytest.mark.parametrize("update", ["groups", "weights"])
def test_logs_show_tpo_numbers_and_the_native_diagnostics(tmp_path: Path, update: str) -> None:
    import pandas as pd

    prompts = ["say a\n>", "say b\n>"]
    trainer, _ = _trainer(tiny_llama(seed=0), tmp_path, prompts=prompts, reward=_reward_a_for_say_a,
                          target_update=update, log_completions=True, learning_rate=0.0)
    trainer.train()
    table = pd.read_parquet(tmp_path / "completions" / "completions_00001.parquet")

    model = tiny_llama(seed=0)
    prompt_ids, completions, _ = _rows(prompts, 2)
    texts = [tiny_tokenizer().decode(c, skip_special_tokens=True) for c in completions]
    rewards = torch.tensor(_reward_a_for_say_a([prompts[j // K] for j in range(2 * K)], texts)).view(2, K)
    with torch.no_grad():
        logp = torch.stack([_token_logps(model, p, c).sum() for p, c in zip(prompt_ids, completions, strict=True)])
    logp = logp.view(2, K)
    u = standardize_scores(rewards.double())
    q = tpo_target(logp, u)
    p_old = torch.softmax(logp, dim=-1)
    cross_entropy = -(q * torch.log_softmax(logp, dim=-1)).sum(-1).mean().item()

    assert table["advantage"].isna().all()  # GRPO's z-scores are not what TPO uses
    assert torch.allclose(torch.tensor(table["tpo_u"].to_numpy()), u.reshape(-1), atol=1e-6)
    assert torch.allclose(torch.tensor(table["tpo_q_minus_p_old"].to_numpy()), (q - p_old).reshape(-1), atol=1e-5)
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    assert logged["all_fail_fraction"] == 0.5 and logged["any_success_fraction"] == 0.5
    winners, losers = q[u > 0].mean().item(), q[u < 0].mean().item()
    assert math.isclose(logged["mean_q_winners"], winners, abs_tol=1e-5)
    assert math.isclose(logged["mean_q_losers"], losers, abs_tol=1e-5)
    assert math.isclose(logged["loss"], cross_entropy, rel_tol=1e-4)  # TPO's cross-entropy, in both forms
    best = torch.where(rewards == rewards.max(dim=-1, keepdim=True).values, q, torch.zeros_like(q)).sum(-1)
    informative = rewards.max(dim=-1).values > rewards.min(dim=-1).values
    want = ((best <= 0.01) & informative).sum().item() / max(int(informative.sum()), 1)
    assert math.isclose(logged["collapsed_target_fraction"], want, abs_tol=1e-9)

    evaluation = trainer.evaluate(_dataset(prompts, 2))  # learning_rate 0: still the initial policy
    assert math.isclose(evaluation["eval_loss"], cross_entropy, rel_tol=1e-4) and evaluation["eval_loss"] > 0


def _reward_zero(completions: list[str], **kwargs: Any) -> list[float]:
    """The same reward for every completion: no group has winners, losers or informative groups."""
    return [0.0 for _ in completions]


@pytest.mark.parametrize("update", ["groups", "weights"])
def test_a_step_without_winners_logs_numbers_or_nothing(tmp_path: Path, update: str) -> None:
    prompts = ["say a\n>", "say b\n>"]
    trainer, _ = _trainer(tiny_llama(seed=0), tmp_path, prompts=prompts, reward=_reward_zero, target_update=update,
                          max_steps=2)
    trainer.train()
    evaluation = trainer.evaluate(_dataset(prompts, 2))
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    for logged in [*trainer.state.log_history, evaluation]:
        bad = {key: value for key, value in logged.items()
               if not isinstance(value, int | float) or not math.isfinite(value)}
        assert not bad, bad  # None / NaN would be dropped by TensorBoard with a warning
    for logged in steps:  # no winners, losers or informative groups: the keys are left out
        assert not {"mean_q_winners", "mean_q_losers", "collapsed_target_fraction"} & set(logged)
        assert logged["target/zero_variance_fraction"] == 1.0
    assert "eval_mean_q_winners" not in evaluation and "eval_loss" in evaluation


# ---------------------------------------------------------------------------------------------
# no silently ignored GRPO option
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("option, value", [
    ("loss_type", "grpo"), ("loss_type", "dr_grpo"), ("loss_type", "bnpo"), ("loss_type", "cispo"),
    ("loss_type", "sapo"), ("scale_rewards", "batch"), ("scale_rewards", False), ("epsilon", 0.1),
    ("epsilon_high", 0.28), ("delta", 2.0), ("importance_sampling_level", "sequence"), ("sapo_temperature_neg", 2.0),
    ("vespo_k_pos", 1.0), ("top_entropy_quantile", 0.2), ("entropy_coef", 0.01), ("use_adaptive_entropy", True),
    ("off_policy_mask_threshold", 0.5), ("mask_truncated_completions", True),
    ("multi_objective_aggregation", "normalize_then_sum"), ("use_bias_correction_kl", True),
    ("vllm_importance_sampling_correction", True), ("vllm_importance_sampling_mode", "token_truncate"),
])
def test_grpo_option_tpo_does_not_use_is_refused_by_name(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"\b{option}="):
        TargetPOConfig(output_dir="unused", num_generations=4, per_device_train_batch_size=4, use_cpu=True,
                       report_to="none", **{option: value})


def test_every_grpo_option_is_either_used_or_refused() -> None:
    """A GRPOConfig option added by a new TRL must be classified here (used by TPO, or refused)."""
    from transformers import TrainingArguments

    used = {
        "model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "disable_dropout", "cast_lm_head_to_fp32",
        "num_generations", "num_generations_eval", "max_completion_length", "ds3_gather_for_generation",
        "shuffle_dataset", "pad_to_multiple_of", "generation_batch_size", "steps_per_generation", "temperature",
        "top_p", "top_k", "min_p", "generation_kwargs", "chat_template_kwargs", "repetition_penalty",
        "cache_implementation", "use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode",
        "vllm_structured_outputs_regex", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
        "vllm_server_timeout", "vllm_group_port", "vllm_gpu_memory_utilization", "vllm_max_model_length",
        "vllm_tensor_parallel_size", "beta", "num_iterations", "reward_weights", "sync_ref_model",
        "ref_model_mixup_alpha", "ref_model_sync_steps", "max_tool_calling_iterations", "log_completions",
        "log_multimodal", "num_completions_to_print", "log_unique_prompts", "log_completions_hub_repo",
        "use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged",
    }
    grpo = {f.name for f in dataclasses.fields(GRPOConfig)} - {f.name for f in dataclasses.fields(TrainingArguments)}
    refused = set(tpo_trl.GRPO_OPTIONS_TPO_IGNORES)
    assert not refused - grpo, f"GRPO_OPTIONS_TPO_IGNORES names options GRPOConfig lacks: {sorted(refused - grpo)}"
    unknown = grpo - used - refused
    assert not unknown, f"GRPOConfig options TargetPOTrainer neither uses nor refuses: {sorted(unknown)}"


@pytest.mark.parametrize("update, rows_per_step", [("groups", 8), ("weights", 16)])
def test_vllm_generation_runs_only_the_forwards_tpo_needs(tmp_path: Path, update: str, rows_per_step: int) -> None:
    """With vLLM, 'groups' (num_iterations 1) builds q from the loss forward: no old-log-prob forward.

    vLLM cannot run here: the trainer is built without it, then told it generates with vLLM
    (``use_vllm``, a stub weight sync) while the rollouts, with vLLM-style sampling log-probs, come
    through ``rollout_func``; TRL's decision to run the old-log-prob forward reads exactly these.
    """
    trainer, _ = _trainer(tiny_llama(seed=0), tmp_path, sampling_logprobs=True, target_update=update)
    trainer.use_vllm = True
    trainer.vllm_generation = SimpleNamespace(sync_weights=lambda: None)
    trainer._last_loaded_step = -1
    rows = []
    trainer.model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].size(0)), with_kwargs=True)
    trainer.train()
    # 8 completions: the loss forward over them, plus (weights form only) the old log-probs TPO's target needs
    assert sum(rows) == rows_per_step, rows


# ---------------------------------------------------------------------------------------------
# TRL surface: overridden methods, Reasoning Gym answers
# ---------------------------------------------------------------------------------------------
def test_overridden_trl_methods_keep_their_recorded_signatures() -> None:
    ours = {name for name, value in vars(TargetPOTrainer).items() if callable(value) and hasattr(GRPOTrainer, name)}
    ours -= {"__init__"}
    assert ours == set(tpo_trl.OVERRIDDEN_TRL_METHODS), (
        f"TargetPOTrainer overrides {sorted(ours)} but OVERRIDDEN_TRL_METHODS lists "
        f"{sorted(tpo_trl.OVERRIDDEN_TRL_METHODS)}: keep the list written down")
    for name, recorded in tpo_trl.OVERRIDDEN_TRL_METHODS.items():
        method = getattr(GRPOTrainer, name, None)
        assert method is not None, f"trl.GRPOTrainer.{name} is gone in TRL {tpo_trl.trl_version()}"
        now = tuple(inspect.signature(method).parameters)
        assert now == recorded, (
            f"trl.GRPOTrainer.{name} changed its signature in TRL {tpo_trl.trl_version()}: recorded {recorded}, "
            f"installed {now}. TargetPOTrainer overrides it: check the override, then update OVERRIDDEN_TRL_METHODS")


def test_reasoning_gym_dataset_without_a_single_answer_has_none() -> None:
    from tpo_gym.integrations.trl import reasoning_gym_dataset, reasoning_gym_reward

    data = reasoning_gym_dataset("graph_color", size=3)
    assert data["answer"] == [None, None, None]  # graph_color scores the colouring; there is no one answer
    reward = reasoning_gym_reward("graph_color", size=3)
    assert reward(completions=["<answer>None</answer>"], index=[0]) == [0.0]
    assert reasoning_gym_dataset("basic_arithmetic", size=2)["answer"][0] not in (None, "None")


def test_mixture_of_experts_router_loss_is_added_as_grpo_adds_it(tmp_path: Path) -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    def mixtral() -> Any:
        torch.manual_seed(0)
        return MixtralForCausalLM(config)

    config = MixtralConfig(vocab_size=len(tiny_tokenizer()), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           router_aux_loss_coef=0.5, max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                           bos_token_id=1)
    trainer, _ = _trainer(mixtral(), tmp_path, learning_rate=0.0, target_update="weights")
    assert trainer.aux_loss_enabled
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    assert logged["aux_loss"] > 0  # TPO's loss would otherwise drop the router's load-balancing term
    with torch.no_grad():
        cross_entropy = _independent_loss(mixtral(), PADDED_PROMPTS, 2).item()
    assert math.isclose(logged["loss"], cross_entropy + 0.5 * logged["aux_loss"], rel_tol=1e-4)


def test_a_collapsed_target_warns_once_naming_the_remedies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import tpo_gym.agents.algorithms.tpo as tpo_module

    monkeypatch.setattr(tpo_module, "COLLAPSE_Q", 1.01)  # every informative group counts as collapsed
    prompts = ["say a\n>", "say b\n>"]
    trainer, _ = _trainer(tiny_llama(seed=0), tmp_path, prompts=prompts, reward=_reward_a_for_say_a, max_steps=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    collapse = [str(w.message) for w in caught if "target has collapsed" in str(w.message)]
    assert len(collapse) == 1, collapse
    assert "length_normalize" in collapse[0] and "max_completion_length" in collapse[0]
