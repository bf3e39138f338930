"""LPO, MaxRL and TailRL as agents: each update is one step on its objective of tpo_gym.objectives.listwise, they
learn at token level, at sequence level and on a tiny language model, log what they declare, and save / load."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.agents.conftest import bandit_env, params_of, token_env
from tests.agents.lm_toys import lm_kwargs, say_letter_env
from tpo_gym import LPO, MaxRL, TailRL, train_seeds
from tpo_gym import objectives as O
from tpo_gym.agents import GroupAlgorithm, persistence
from tpo_gym.agents.common.update import accumulate_text_gradients
from tpo_gym.objectives import listwise as LW

LR = 0.05
SGD = {"optimizer_class": torch.optim.SGD}
#: Every new class with the settings tested (LPO's two fits and its named temperatures).
VARIANTS = [(LPO, {}), (LPO, {"fit": "reverse_kl", "tau": "mean"}), (LPO, {"tau": "one"}), (MaxRL, {}), (TailRL, {})]
IDS = ["LPO", "LPO-reverse-mean", "LPO-one", "MaxRL", "TailRL"]


def _stepwise_logp(policy: Any, obs: torch.Tensor) -> torch.Tensor:
    """log pi ``[N, T, A]`` from one ``action_logits`` call per state (not the agents' trajectory shortcut)."""
    n, t = obs.shape[:2]
    logits = policy.action_logits(obs.reshape(n * t, *obs.shape[2:])).reshape(n, t, -1)
    return torch.log_softmax(logits, dim=-1)


def _objective(cls: type, kw: dict[str, Any], logp: torch.Tensor, logp_old: torch.Tensor, scores: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
    """The loss of one class, assembled directly from the objectives."""
    if cls is LPO:
        w = LW.lpo_target(scores.double(), kw.get("tau", "std"), mask)
        return LW.lpo_loss(logp, logp_old, w, kw.get("fit", "forward_kl"), mask)
    advantages = LW.maxrl_advantages if cls is MaxRL else LW.tailrl_advantages
    return O.group_pg_loss(logp, advantages(scores, mask), 1.0, mask)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize(("cls", "kw"), VARIANTS, ids=IDS)
def test_update_is_one_step_on_the_objective(cls: type, kw: dict[str, Any], level: str) -> None:
    model = cls("TransformerPolicy", token_env(), level=level, group_size=4, learning_rate=LR, batch_size=12,
                n_epochs=1, seed=3, policy_kwargs=dict(SGD), **kw)
    model.learn(model.steps_per_iteration)  # move away from the initialisation first
    batch = model.rollout_batch = model.collect_rollouts()
    reference = copy.deepcopy(model.policy)
    before = params_of(model)
    stats = model.train()

    logp = _stepwise_logp(reference, batch.obs)
    if level == "token":
        c = batch.candidates
        loss = _objective(cls, kw, logp.gather(-1, c), batch.logp_old.gather(-1, c), batch.candidate_scores, None)
    else:
        def seq(lp: torch.Tensor) -> torch.Tensor:
            return lp.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1).sum(1).reshape(-1, 4)

        loss = _objective(cls, kw, seq(logp), seq(batch.logp_old), batch.rewards.mean(1).reshape(-1, 4), None)
    grads = torch.autograd.grad(loss, list(reference.parameters()), allow_unused=True)
    after = params_of(model)
    assert max(float((after[k] - before[k]).abs().max()) for k in before) > 0, "the update did not move"
    for (k, p), g in zip(reference.named_parameters(), grads, strict=True):
        expected = p.detach() - LR * (g if g is not None else torch.zeros_like(p))
        torch.testing.assert_close(after[k], expected, rtol=1e-4, atol=1e-6, msg=f"parameter {k}")
    assert stats["loss"] == pytest.approx(float(loss.detach()), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(("cls", "kw"), VARIANTS, ids=IDS)
def test_each_learns_reverse_copy_at_token_level(cls: type, kw: dict[str, Any]) -> None:
    model = cls("TransformerPolicy", token_env(length=3, vocab_size=2), batch_size=32, seed=0, **kw)
    assert model.level == "token"
    model.learn(30 * model.steps_per_iteration)
    errors = [h["error"] for h in model.history]
    assert np.mean(errors[-5:]) < np.mean(errors[:3]) - 0.2, errors
    assert [set(h) - {"iteration", "num_timesteps", "error"} for h in model.history[:1]] == \
        [{d.key for d in cls.spec.diagnostics} - {"completion_length", "mean_score"}]


@pytest.mark.parametrize(("cls", "kw"), VARIANTS, ids=IDS)
def test_each_learns_the_terminal_reward_task_at_sequence_level(cls: type, kw: dict[str, Any]) -> None:
    env = token_env(length=2, vocab_size=2, reward="terminal")  # 0/1 exact match: MaxRL's setting
    model = cls("TransformerPolicy", env, level="sequence", batch_size=16, group_size=8, seed=0, **kw)
    model.learn(30 * model.steps_per_iteration)
    errors = [h["error"] for h in model.history]
    assert np.mean(errors[-5:]) < np.mean(errors[:3]) - 0.4, errors


def test_tailrl_and_maxrl_train_alike_on_binary_rewards() -> None:
    """The published identity at the agent level: with 0/1 scores the two updates are the same."""
    env = token_env(length=2, vocab_size=2, reward="terminal")
    runs = [cls("TransformerPolicy", env, level="sequence", batch_size=16, group_size=8, seed=1)
            for cls in (MaxRL, TailRL)]
    for model in runs:
        model.learn(3 * model.steps_per_iteration)
    for a, b in zip(runs[0].history, runs[1].history, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key
    for k, v in params_of(runs[0]).items():
        torch.testing.assert_close(params_of(runs[1])[k], v, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("cls", "kw"), VARIANTS[:2] + VARIANTS[3:], ids=IDS[:2] + IDS[3:])
def test_each_raises_the_mean_score_of_a_tiny_language_model(cls: type, kw: dict[str, Any]) -> None:
    model = cls("CausalLMPolicy", say_letter_env(), policy_kwargs=lm_kwargs(), batch_size=8, group_size=8,
                n_epochs=2, learning_rate=1e-2, seed=0, **kw)
    model.learn(40 * model.steps_per_iteration)
    scores = [h["mean_score"] for h in model.history]
    assert np.mean(scores[-5:]) > np.mean(scores[:5]) + 0.1, scores
    assert set(model.history[-1]) - {"iteration", "num_timesteps", "error"} == {d.key for d in cls.spec.diagnostics}


@pytest.mark.parametrize(("cls", "kw"), [(LPO, {}), (LPO, {"fit": "reverse_kl"}), (MaxRL, {}), (TailRL, {})],
                         ids=["LPO", "LPO-reverse", "MaxRL", "TailRL"])
def test_micro_batches_give_the_full_batch_gradient(cls: type, kw: dict[str, Any]) -> None:
    grads = []
    for micro in (None, 1, 3):
        model = cls("CausalLMPolicy", say_letter_env(), batch_size=4, group_size=4, n_epochs=1, seed=0,
                    learning_rate=1e-2, policy_kwargs=lm_kwargs(dtype="float64", micro_batch_size=micro), **kw)
        batch = model.rollout_batch = model.collect_rollouts()
        prepared, _ = model.prepare(batch, batch.logp_old)
        model.train()  # one step: the gradient below is off the on-policy point (logp != logp_old for LPO)
        model.policy.optimizer.zero_grad(set_to_none=True)
        accumulate_text_gradients(model, batch, prepared)
        grads.append({n: p.grad.detach().clone() for n, p in model.policy.model.named_parameters()
                      if p.grad is not None})
    assert grads[0]
    for other in grads[1:]:
        for name, g in grads[0].items():
            torch.testing.assert_close(other[name], g, rtol=1e-9, atol=1e-12)


def test_lpo_settings_round_trip_and_resume_equals_uninterrupted(tmp_path: Path) -> None:
    def make() -> LPO:
        return LPO("MlpPolicy", bandit_env(), fit="reverse_kl", tau=0.5, batch_size=16, seed=2)

    straight = make()
    n = 3 * straight.steps_per_iteration
    straight.learn(2 * n)
    first = make()
    first.learn(n)
    first.save(tmp_path / "half.zip")
    resumed = GroupAlgorithm.load(tmp_path / "half.zip", env=first.get_env())
    assert type(resumed) is LPO and resumed.fit == "reverse_kl" and resumed.tau == 0.5
    assert persistence.agent_settings(resumed) == persistence.agent_settings(first)
    resumed.learn(n, reset_num_timesteps=False)
    assert resumed.history == straight.history
    for k, v in params_of(straight).items():
        torch.testing.assert_close(params_of(resumed)[k], v, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [LPO, MaxRL, TailRL])
def test_save_load_predict_identical(cls: type, tmp_path: Path) -> None:
    model = cls("TransformerPolicy", token_env(length=3), batch_size=16, seed=5)
    model.learn(2 * model.steps_per_iteration)
    obs = np.stack([token_env(length=3).reset(seed=s)[0] for s in range(10)])
    model.save(tmp_path / "m.zip")
    loaded = cls.load(tmp_path / "m.zip")
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    assert loaded.history == model.history and loaded.level == "token"


def test_seed_batches_and_mnist_style_candidates_run() -> None:
    from tests.golden.histories import fake_mnist

    kwargs = {"level": "token", "batch_size": 6, "group_size": 3,
              "policy_kwargs": {"d_model": 8, "d_ff": 16, "n_layers": 1}}
    for cls in (LPO, MaxRL, TailRL):
        alone = cls("TransformerPolicy", "tpo_gym/TokenReversal-v0", seed=0, **kwargs)
        alone.learn(2 * alone.steps_per_iteration)
        looped = train_seeds(cls, "TransformerPolicy", "tpo_gym/TokenReversal-v0", [0, 1],
                             2 * alone.steps_per_iteration, forward="loop", optimizer="loop", **kwargs)
        assert looped[0].history == alone.history
        stacked = train_seeds(cls, "TransformerPolicy", "tpo_gym/TokenReversal-v0", [0, 1],
                              2 * alone.steps_per_iteration, forward="stacked", optimizer="stacked", **kwargs)
        assert len(stacked[1].history) == 2
        with fake_mnist():
            mnist = cls("MlpPolicy", "tpo_gym/MNISTBandit-v0", batch_size=16, group_size=3, seed=0,
                        policy_kwargs={"net_arch": [16]})
            mnist.learn(2 * mnist.steps_per_iteration)
        assert mnist.level == "token" and len(mnist.history) == 2


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"fit must be one of \['forward_kl', 'reverse_kl'\], got 'kl'"):
        LPO("MlpPolicy", bandit_env(), fit="kl")
    with pytest.raises(ValueError, match=r"tau must be one of \['std', 'one', 'mean'\], got 'median'"):
        LPO("MlpPolicy", bandit_env(), tau="median")
    with pytest.raises(ValueError, match="tau must be a finite number > 0, got -1"):
        LPO("MlpPolicy", bandit_env(), tau=-1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'eta'"):  # no temperature: A is used as is
        MaxRL("MlpPolicy", bandit_env(), eta=0.5)
