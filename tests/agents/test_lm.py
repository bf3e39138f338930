"""TPO / GRPO on a causal language model (tiny random Llama, char tokenizer, toy text env; CPU, seconds)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.agents.lm_toys import SayLetterEnv, lm_kwargs, say_letter_env, tiny_llama, tiny_tokenizer
from tpo_gym import GRPO, PPO, TPO
from tpo_gym.agents.common.registry import algorithm_class, algorithm_registry
from tpo_gym.agents.common.update import accumulate_text_gradients
from tpo_gym.agents.lm import completion_mask, sequence_logprobs
from tpo_gym.agents.lm.text_rollouts import TextBatch, collect_text_rollouts
from tpo_gym.objectives import tpo_loss


def _agent(cls: type = TPO, **kw: Any) -> Any:
    policy_kwargs = lm_kwargs(**kw.pop("policy_kwargs", {}))
    kw.setdefault("batch_size", 4)
    kw.setdefault("group_size", 4)
    kw.setdefault("seed", 0)
    return cls("CausalLMPolicy", say_letter_env(), policy_kwargs=policy_kwargs, **kw)


def _grads(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.policy.model.named_parameters() if p.grad is not None}


def test_tpo_gradient_is_p_minus_q_on_a_real_lm_forward() -> None:
    model = _agent(policy_kwargs={"dtype": "float64"})
    batch = model.collect_rollouts()
    prepared, _ = model.prepare(batch, batch.logp_old)
    q = prepared.q
    logp = model.policy.group_logp(batch, 0, batch.n_groups)
    loss = tpo_loss(logp, q)
    (g_logp,) = torch.autograd.grad(loss, logp, retain_graph=True)
    p = torch.softmax(logp.detach(), dim=-1)
    torch.testing.assert_close(g_logp, (p - q) / batch.n_groups, rtol=0, atol=1e-12)
    loss.backward()
    full = _grads(model)
    model.policy.model.zero_grad(set_to_none=True)
    logp = model.policy.group_logp(batch, 0, batch.n_groups)
    ((p - q).detach() / batch.n_groups * logp).sum().backward()  # sum_i (p_i - q_i) grad l_i
    for name, g in _grads(model).items():
        torch.testing.assert_close(full[name], g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls,kw", [(TPO, {}), (TPO, {"beta": 0.5}), (GRPO, {"beta": 0.04}),
                                    (GRPO, {"mask_zero_variance": True})])
def test_micro_batches_give_the_full_batch_gradient(cls: type, kw: dict[str, Any]) -> None:
    grads = []
    for micro in (None, 1, 3):
        model = _agent(cls, policy_kwargs={"dtype": "float64", "micro_batch_size": micro}, **kw)
        batch = model.collect_rollouts()
        prepared, _ = model.prepare(batch, batch.logp_old)
        model.policy.optimizer.zero_grad(set_to_none=True)
        accumulate_text_gradients(model, batch, prepared)
        grads.append(_grads(model))
    for other in grads[1:]:
        for name, g in grads[0].items():
            torch.testing.assert_close(other[name], g, rtol=1e-9, atol=1e-12)


class _ConstantEnv(SayLetterEnv):
    def score_candidates(self, candidates: list[str]) -> np.ndarray:
        return np.full(len(candidates), 0.5, dtype=np.float32)


@pytest.mark.parametrize("cls", [algorithm_class(n) for n, s in algorithm_registry().items() if "llm" in s.run_kinds])
def test_all_equal_groups_give_an_exactly_zero_first_gradient(cls: type) -> None:
    env = gym.wrappers.TimeLimit(_ConstantEnv(), max_episode_steps=1)
    model = cls("CausalLMPolicy", env, policy_kwargs=lm_kwargs(), batch_size=3, group_size=4, n_epochs=1, seed=1)
    model.learn(model.steps_per_iteration)
    assert model.history[0]["grad_norm"] == 0.0
    assert model.history[0]["zero_variance_fraction"] == 1.0


def test_tokens_after_eos_and_left_padding_do_not_change_logprobs() -> None:
    net = tiny_llama().double()
    tok = tiny_tokenizer()
    eos = tok.eos_token_id
    completion = torch.tensor([[4, 5, eos, 6, 7], [4, 5, eos, 8, 3]])
    mask = completion_mask(completion, eos, tok.pad_token_id)
    assert mask.tolist() == [[True, True, True, False, False]] * 2
    prompt = torch.tensor([[8, 9, 10], [8, 9, 10]])
    ones = torch.ones_like(prompt)
    a = sequence_logprobs(net, prompt, ones, completion, mask)
    torch.testing.assert_close(a[0], a[1], rtol=0, atol=0)  # what follows EOS cannot matter
    assert (a[:, 3:] == 0).all()
    padded = torch.tensor([[0, 0, 8, 9, 10]])
    b = sequence_logprobs(net, padded, torch.tensor([[0, 0, 1, 1, 1]]), completion[:1], mask[:1])
    torch.testing.assert_close(b, a[:1], rtol=0, atol=1e-12)
    logp = sequence_logprobs(net, prompt, ones, completion, mask).sum()
    grads = torch.autograd.grad(logp, [p for p in net.parameters()], allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_tpo_raises_the_mean_score_on_a_toy_text_task() -> None:
    model = _agent(batch_size=8, group_size=8, n_epochs=2, learning_rate=1e-2)
    model.learn(80 * model.steps_per_iteration)
    scores = [h["mean_score"] for h in model.history]
    assert np.mean(scores[-10:]) > np.mean(scores[:10]) + 0.25, scores
    for key in ("entropy_q", "entropy_p_old", "completion_length", "zero_variance_fraction", "all_fail_fraction"):
        assert key in model.history[-1]


def test_same_seed_same_history_and_ablations_run() -> None:
    runs = [_agent(GRPO, beta=0.0).learn(2 * 16).history for _ in range(2)]
    assert runs[0] == runs[1]
    _agent(TPO, anchor=False).learn(16)
    _agent(GRPO, kl_reference="initial").learn(16)


def test_save_load_round_trip_in_a_fresh_process(tmp_path: Path) -> None:
    model = _agent(learning_rate=1e-2)
    model.learn(2 * model.steps_per_iteration)
    model.save(tmp_path / "agent")
    assert (tmp_path / "agent" / "model" / "model.safetensors").is_file()
    expected = model.predict(["say a", "say b"], deterministic=True)[0].tolist()
    code = (
        "import json, sys; from tpo_gym import TPO; "
        f"m = TPO.load({str(tmp_path / 'agent')!r}); "
        "print(json.dumps({'p': m.predict(['say a', 'say b'], deterministic=True)[0].tolist(), "
        "'h': len(m.history), 'n': m.num_timesteps}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd())
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"p": expected, "h": 2, "n": model.num_timesteps}
    loaded = TPO.load(tmp_path / "agent", env=say_letter_env())
    loaded.learn(loaded.steps_per_iteration, reset_num_timesteps=False)
    assert len(loaded.history) == 3


def test_predict_returns_completions() -> None:
    model = _agent()
    text, state = model.predict("say a")
    assert isinstance(text, str) and state is None
    batch, _ = model.predict([{"question": "say b", "system_prompt": "X"}, "say c"], deterministic=True)
    assert batch.shape == (2,)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="CausalLMPolicy needs a text env"):
        TPO("CausalLMPolicy", "tpo_gym/Bandit-v0", policy_kwargs=lm_kwargs())
    with pytest.raises(ValueError, match="a text env .* needs policy='CausalLMPolicy'; got MlpPolicy"):
        TPO("MlpPolicy", say_letter_env())
    with pytest.raises(ValueError, match="group_size must be an integer >= 2, got 1"):
        _agent(group_size=1)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got 0"):
        _agent(policy_kwargs={"max_new_tokens": 0})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TPO("CausalLMPolicy", say_letter_env(), policy_kwargs={"model": "/nonexistent/model.gguf"})
    with pytest.raises(ValueError, match="PPO does not train language models"):
        PPO("CausalLMPolicy", say_letter_env(), policy_kwargs=lm_kwargs())
    with pytest.raises(ValueError, match="level='token' is for Discrete token tasks"):
        _agent(level="token")
    with pytest.raises(ValueError, match="needs policy_kwargs=\\{'model'"):
        TPO("CausalLMPolicy", say_letter_env())


def test_the_callers_tokenizer_is_left_as_it_was() -> None:
    tok = tiny_tokenizer()
    tok.padding_side = "right"
    tok.pad_token = None
    model = TPO("CausalLMPolicy", say_letter_env(), batch_size=2, group_size=2, seed=0,
                policy_kwargs={"model": tiny_llama(), "tokenizer": tok, "max_new_tokens": 4})
    assert tok.padding_side == "right" and tok.pad_token is None, "the caller's tokenizer was changed"
    assert model.policy.tokenizer.padding_side == "left" and model.policy.tokenizer.pad_token == "<eos>"


def test_collapsed_target_fraction_counts_informative_groups_whose_best_gets_no_mass() -> None:
    from tpo_gym.agents.algorithms.tpo import collapsed_target_fraction

    scores = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [1.0, 1.0, 0.0]])
    q = torch.tensor([[0.001, 0.999, 0.0], [0.6, 0.4, 0.0], [1.0, 0.0, 0.0], [0.006, 0.006, 0.988]])
    # group 0: collapsed; 1: not; 2: not informative (equal scores); 3: the best two share 0.012 > 0.01
    assert collapsed_target_fraction(q, scores, None).item() == pytest.approx(1 / 3)
    mask = torch.tensor([[True, True, False]] * 4)  # group 3's valid scores are now equal: 1 of 2 informative
    assert collapsed_target_fraction(q, scores, mask).item() == pytest.approx(1 / 2)
    assert torch.isnan(collapsed_target_fraction(q[2:3], scores[2:3], None))


def test_a_collapsed_target_warns_once_and_is_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import tpo_gym.agents.algorithms.tpo as tpo_module

    monkeypatch.setattr(tpo_module, "COLLAPSE_Q", 1.01)  # every informative group counts as collapsed
    model = TPO("CausalLMPolicy", say_letter_env(), batch_size=4, group_size=8, seed=0, policy_kwargs=lm_kwargs())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(3 * model.steps_per_iteration)
    fractions = [row["collapsed_target_fraction"] for row in model.history]
    assert any(f == 1.0 for f in fractions), fractions
    collapse = [w for w in caught if "target has collapsed" in str(w.message)]
    assert len(collapse) == 1, [str(w.message) for w in caught]
    assert "length_normalize" in str(collapse[0].message) and "eta" in str(collapse[0].message)
    monkeypatch.setattr(tpo_module, "COLLAPSE_Q", -1.0)  # nothing collapses: no warning
    quiet = TPO("CausalLMPolicy", say_letter_env(), batch_size=4, group_size=8, seed=0, policy_kwargs=lm_kwargs())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.learn(quiet.steps_per_iteration)
    assert not [w for w in caught if "target has collapsed" in str(w.message)]


def test_tpo_kl_penalty_gradient_matches_an_independent_formula() -> None:
    """TPO(beta): L = CE(q, softmax(l)) / G + beta / N sum_i sum_t m_it k3_it / n_i, with the per-token
    k3_it = e^(r - l) - (r - l) - 1 against the initial model; checked after a step moved the policy."""
    import copy

    from tpo_gym.agents.lm import sequence_logprobs

    model = _agent(policy_kwargs={"dtype": "float64"}, beta=0.5, learning_rate=1e-2, n_epochs=1)
    initial = copy.deepcopy(model.policy.model)
    model.learn(model.steps_per_iteration)  # the policy leaves the reference: the KL's gradient is not 0
    batch = model.collect_rollouts()
    prepared, _ = model.prepare(batch, batch.logp_old)
    model.policy.optimizer.zero_grad(set_to_none=True)
    accumulate_text_gradients(model, batch, prepared)
    got = _grads(model)

    model.policy.optimizer.zero_grad(set_to_none=True)
    k, g = batch.group_size, batch.n_groups
    prompts = batch.prompt_ids.repeat_interleave(k, dim=0)
    masks = batch.prompt_mask.repeat_interleave(k, dim=0)
    mask = batch.token_mask
    token = sequence_logprobs(model.policy.model, prompts, masks, batch.completion_ids, mask)
    with torch.no_grad():
        ref = sequence_logprobs(initial, prompts, masks, batch.completion_ids, mask)
    logp = token.sum(dim=1).view(g, k)
    ce = -(prepared.q * torch.log_softmax(logp, dim=-1)).sum(dim=-1).mean()
    delta = torch.where(mask, ref - token, torch.zeros_like(token))
    kl = ((torch.exp(delta) - delta - 1).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
    assert kl.item() > 1e-8, "the policy moved: the KL to the initial model is not 0"
    (ce + 0.5 * kl).backward()
    want = _grads(model)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(batch.token_logp_ref, ref)


def test_tpo_kl_reference_with_lora_is_the_base_model_without_a_copy() -> None:
    from tpo_gym.agents.lm import sequence_logprobs

    lora = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}
    model = _agent(policy_kwargs={"dtype": "float64", "lora": lora}, beta=0.1, learning_rate=1e-1, n_epochs=1)
    model.learn(2 * model.steps_per_iteration)
    assert model.policy.reference is None  # no second copy of the model
    batch = model.collect_rollouts()
    k = batch.group_size
    base = tiny_llama().to(torch.float64)  # the same initial weights, no adapters
    with torch.no_grad():
        ref = sequence_logprobs(base, batch.prompt_ids.repeat_interleave(k, dim=0),
                                batch.prompt_mask.repeat_interleave(k, dim=0), batch.completion_ids, batch.token_mask)
    torch.testing.assert_close(batch.token_logp_ref, ref)
    assert not torch.allclose(batch.logp_old, batch.logp_ref), "the adapters moved the policy off its base"


def test_tpo_beta_needs_a_language_model() -> None:
    from tests.agents.conftest import bandit_env

    with pytest.raises(ValueError, match="beta"):
        TPO("MlpPolicy", bandit_env(), beta=0.1)
    with pytest.raises(ValueError, match="beta"):
        _agent(beta=-1.0)


def test_predict_on_an_empty_list_of_questions_returns_no_completions() -> None:
    from tests.agents.lm_toys import lm_kwargs, say_letter_env

    model = TPO("CausalLMPolicy", say_letter_env(), policy_kwargs=lm_kwargs(), batch_size=2, group_size=2, seed=0)
    texts, state = model.predict([])
    assert state is None and texts.shape == (0,) and texts.dtype == object


def test_text_rollouts_are_a_function_of_the_policy_and_the_seed() -> None:
    policy = _agent().policy
    a, b = (collect_text_rollouts(policy, say_letter_env(), 3, 2, seed=5, with_reference=True) for _ in range(2))
    assert isinstance(a, TextBatch) and a.n_groups == 3 and a.group_size == 2 and len(a.completions) == 6
    assert a.scores.shape == a.logp_old.shape == a.logp_ref.shape == (3, 2)
    assert a.token_logp_ref.shape == a.completion_ids.shape
    assert a.prompts == b.prompts and a.completions == b.completions
    for field in ("completion_ids", "token_mask", "scores", "logp_old", "logp_ref", "token_logp_ref"):
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=0, atol=0)
    torch.testing.assert_close(a.logp_ref, a.logp_old)  # untrained: the frozen reference is the policy itself
    plain = collect_text_rollouts(policy, say_letter_env(), 3, 2, seed=5)
    assert plain.logp_ref is None and plain.token_logp_ref is None and plain.completions == a.completions


MOVED_OUT_OF_LM = {
    "tpo_gym.agents.lm.text_rollouts": ["TextBatch", "TextVecEnv", "is_text_env"],
    "tpo_gym.agents.lm.files": ["AGENT_MODEL_KWARGS", "AGENT_LORA_KWARGS", "agent_model_kwargs",
                                "check_agent_model_kwargs", "check_agent_lora_kwargs", "load_agent_model",
                                "load_agent_tokenizer", "load_agent_adapter"],
}


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in MOVED_OUT_OF_LM.items() for n in names])
def test_names_moved_out_of_lm_still_load_by_their_old_module_and_name(module: str, name: str) -> None:
    # Resolved as an agent file's "module:QualName" is (import the module, then getattr along the name). Files
    # name only nn.Module / optimiser classes, and CausalLMPolicy stayed in lm, but older code imports these.
    old: Any = importlib.import_module("tpo_gym.agents.lm")
    for part in name.split("."):
        old = getattr(old, part)
    assert old is getattr(importlib.import_module(module), name)


def test_the_policy_class_keeps_the_name_agent_files_store() -> None:
    from tpo_gym.agents.lm import CausalLMPolicy

    assert f"{CausalLMPolicy.__module__}:{CausalLMPolicy.__qualname__}" == "tpo_gym.agents.lm:CausalLMPolicy"


def test_a_text_agent_takes_back_its_own_vec_env() -> None:
    """``set_env(model.get_env())``: the SB3 VecEnv of a text env (not registered: no spec) is rebuilt from its env."""
    from tpo_gym.agents.lm.text_rollouts import TextVecEnv

    model = _agent()
    venv = model.get_env()
    assert isinstance(venv, TextVecEnv) and venv.envs[0].spec is None
    model.set_env(venv)
    assert model.rollout_source is not None and model.rollout_source.spec is None
    model.learn(model.steps_per_iteration)
    assert len(model.history) == 1


def test_the_policys_old_collect_is_a_deprecated_name_of_collect_text_rollouts() -> None:
    policy = _agent().policy
    with pytest.warns(DeprecationWarning, match="collect_text_rollouts"):
        old = policy.collect(say_letter_env(), 2, 3, seed=4)
    new = collect_text_rollouts(policy, say_letter_env(), 2, 3, seed=4)
    assert old.completions == new.completions and torch.equal(old.logp_old, new.logp_old)


def test_a_language_model_refuses_single_candidates_by_name() -> None:
    with pytest.raises(ValueError, match="candidates='single' scores every action of a Discrete action space"):
        _agent(candidates="single")
