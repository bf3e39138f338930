"""TargetPOTrainer (TPO on TRL's GRPOTrainer): exact gradients, distributed exactness, GRPO parity, errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

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
from trl_toys import N_PROMPTS, K, reference_batch, tiny_llama, tiny_tokenizer, trainer_grads  # noqa: E402


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


def test_example_script_runs_on_the_tiny_model(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_target_po", HERE.parents[1] / "examples" / "trl_target_po.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary = module.main(["--steps", "1", "--num-generations", "4", "--prompts-per-step", "1",
                           "--max-completion-length", "6", "--size", "20", "--output-dir", str(tmp_path)])
    assert summary["steps"] == 1 and summary["target_update"] == "groups" and len(summary["reward"]) == 1


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
