"""On a fixed batch, each agent's update is one optimiser step on its objective from tpo_gym.objectives.

The expected update is built independently: log-probabilities from the policy's per-state
``action_logits`` (not the trajectory shortcut ``step_logits`` the agents use), the loss assembled
directly from :mod:`tpo_gym.objectives`, and a plain SGD step ``theta - lr * grad``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest
import torch

from tests.agents.conftest import bandit_env, params_of, token_env
from tpo_gym import CE, DG, GRPO, PPO, REINFORCE, TPO, GroupPG
from tpo_gym import objectives as O

LR = 0.05
SGD = {"optimizer_class": torch.optim.SGD}


def _stepwise_logp(policy: Any, obs: torch.Tensor) -> torch.Tensor:
    """log pi ``[N, T, A]`` from one ``action_logits`` call per state."""
    n, t = obs.shape[:2]
    logits = policy.action_logits(obs.reshape(n * t, *obs.shape[2:])).reshape(n, t, -1)
    return torch.log_softmax(logits, dim=-1)


def _tpo_token(b: Any, lp: torch.Tensor) -> torch.Tensor:
    u = O.standardize_scores(b.candidate_scores)
    q = O.tpo_target(b.logp_old.gather(-1, b.candidates), u, eta=0.7)
    return O.tpo_loss(lp.gather(-1, b.candidates), q)


def _seq_logp(b: Any, lp: torch.Tensor, k: int) -> torch.Tensor:
    return lp.gather(-1, b.actions.unsqueeze(-1)).squeeze(-1).sum(1).reshape(-1, k)


def _tpo_seq(b: Any, lp: torch.Tensor) -> torch.Tensor:
    scores = b.rewards.mean(1).reshape(-1, 4)  # bag: score = mean per-token reward
    q = O.tpo_target(_seq_logp(b, b.logp_old, 4), O.standardize_scores(scores), eta=0.7, anchor=False)
    return O.tpo_loss(_seq_logp(b, lp, 4), q)


def _tpo_single(b: Any, lp: torch.Tensor) -> torch.Tensor:
    s = O.onehot_advantage_scores(b.actions[:, 0], b.rewards[:, 0], b.logp_old[:, 0].exp())
    q = O.tpo_target(b.logp_old[:, 0], O.standardize_scores(s), eta=0.7)
    return O.tpo_loss(lp[:, 0], q)


def _grpo_token(b: Any, lp: torch.Tensor) -> torch.Tensor:
    c = b.candidates
    return O.grpo_loss(lp.gather(-1, c), b.logp_old.gather(-1, c), b.candidate_scores, 0.2, 0.04)


def _grpo_seq_zv(b: Any, lp: torch.Tensor) -> torch.Tensor:
    scores = b.rewards.mean(1).reshape(-1, 4)
    return O.grpo_loss(_seq_logp(b, lp, 4), _seq_logp(b, b.logp_old, 4), scores, 0.2, 0.0, mask_zero_variance=True)


def _group_pg(b: Any, lp: torch.Tensor) -> torch.Tensor:
    return O.group_pg_loss(lp.gather(-1, b.candidates), O.standardize_scores(b.candidate_scores), eta=0.7)


def _taken(b: Any, lp: torch.Tensor) -> torch.Tensor:
    return lp.gather(-1, b.actions.unsqueeze(-1)).squeeze(-1)


def _ppo(b: Any, lp: torch.Tensor) -> torch.Tensor:
    adv = b.rewards - b.rewards.mean(0, keepdim=True)
    return O.ppo_loss(_taken(b, lp), _taken(b, b.logp_old), adv, 0.2)


def _reinforce_expected(b: Any, lp: torch.Tensor) -> torch.Tensor:
    adv = b.rewards - b.logp_old.exp().pow(2).sum(-1)
    return O.reinforce_loss(_taken(b, lp), adv)


def _dg(b: Any, lp: torch.Tensor) -> torch.Tensor:
    adv = O.batch_baseline_advantages(b.rewards)
    return O.dg_loss(_taken(b, lp), adv, eta=1.0)


def _ce(b: Any, lp: torch.Tensor) -> torch.Tensor:
    return O.cross_entropy_loss(lp, b.candidate_scores.argmax(-1))


CASES: list[tuple[str, Callable[[], Any], Callable[[Any, torch.Tensor], torch.Tensor]]] = [
    ("tpo_token", lambda: TPO("TransformerPolicy", token_env(), eta=0.7, **_kw()), _tpo_token),
    ("tpo_seq_noanchor", lambda: TPO("TransformerPolicy", token_env(), eta=0.7, anchor=False, level="sequence",
                                     group_size=4, **_kw()), _tpo_seq),
    ("tpo_single", lambda: TPO("MlpPolicy", bandit_env(), eta=0.7, candidates="single", **_kw()), _tpo_single),
    ("grpo_token", lambda: GRPO("TransformerPolicy", token_env(), **_kw()), _grpo_token),
    ("grpo_seq_zv", lambda: GRPO("TransformerPolicy", token_env(), level="sequence", group_size=4, beta=0.0,
                                 mask_zero_variance=True, **_kw()), _grpo_seq_zv),
    ("group_pg", lambda: GroupPG("MlpPolicy", bandit_env(), eta=0.7, **_kw()), _group_pg),
    ("ppo", lambda: PPO("TransformerPolicy", token_env(), **_kw()), _ppo),
    ("reinforce_expected", lambda: REINFORCE("MlpPolicy", bandit_env(), baseline="expected", **_kw()),
     _reinforce_expected),
    ("dg", lambda: DG("TransformerPolicy", token_env(), **_kw()), _dg),
    ("ce", lambda: CE("MlpPolicy", bandit_env(), **_kw()), _ce),
]


def _kw() -> dict[str, Any]:
    return {"learning_rate": LR, "batch_size": 12, "n_epochs": 1, "seed": 3, "policy_kwargs": dict(SGD)}


@pytest.mark.parametrize("name,make,loss_fn", CASES, ids=[c[0] for c in CASES])
def test_update_is_one_step_on_the_objective(name: str, make: Callable[[], Any], loss_fn: Any) -> None:
    model = make()
    model.learn(model.steps_per_iteration)  # move away from the initialisation first
    batch = model.collect_rollouts()
    model.rollout_batch = batch
    reference = copy.deepcopy(model.policy)
    before = params_of(model)

    stats = model.train()

    loss = loss_fn(batch, _stepwise_logp(reference, batch.obs))
    grads = torch.autograd.grad(loss, list(reference.parameters()), allow_unused=True)
    expected = {
        k: p.detach() - LR * (g if g is not None else torch.zeros_like(p))
        for (k, p), g in zip(reference.named_parameters(), grads, strict=True)
    }
    after = params_of(model)
    moved = max(float((after[k] - before[k]).abs().max()) for k in expected)
    assert moved > 0, "the update did not change the parameters"
    for k, value in expected.items():
        torch.testing.assert_close(after[k], value, rtol=1e-4, atol=1e-6, msg=f"{name}: parameter {k}")
    assert stats["loss"] == pytest.approx(float(loss.detach()), rel=1e-4, abs=1e-6)
    grad_norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads if g is not None])))
    assert stats["grad_norm"] == pytest.approx(grad_norm, rel=1e-3, abs=1e-7)


def test_epochs_reuse_the_frozen_target() -> None:
    """With E epochs the target q is computed once: E SGD steps on the same tpo_loss."""
    model = TPO("MlpPolicy", bandit_env(), learning_rate=LR, batch_size=12, n_epochs=3, seed=1,
                policy_kwargs=dict(SGD))
    batch = model.rollout_batch = model.collect_rollouts()
    reference = copy.deepcopy(model.policy)
    model.train()
    opt = torch.optim.SGD(reference.parameters(), lr=LR)
    u = O.standardize_scores(batch.candidate_scores)
    q = O.tpo_target(batch.logp_old.gather(-1, batch.candidates), u)
    for _ in range(3):
        opt.zero_grad()
        O.tpo_loss(_stepwise_logp(reference, batch.obs).gather(-1, batch.candidates), q).backward()
        opt.step()
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(model.policy.state_dict()[k], v, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cls", [PPO, REINFORCE, DG])
def test_terminal_reward_credits_every_position(cls: type) -> None:
    """docs/method.md section 3: terminal r_t = 1{all correct} at every t, so single-sample advantages use it
    everywhere."""
    model = cls("TransformerPolicy", token_env(length=2, vocab_size=2, reward="terminal"), batch_size=64, seed=0)
    batch = model.collect_rollouts()
    exact = batch.rewards[:, -1]
    assert 0 < float(exact.mean()) < 1, "need both solved and failed episodes in the batch"
    assert torch.equal(batch.rewards[:, 0], torch.zeros_like(exact))  # the env pays only at the end
    torch.testing.assert_close(batch.credited_rewards(), exact[:, None].expand(-1, 2))
    adv = model.advantages(batch)
    torch.testing.assert_close(adv[:, 0], exact - exact.mean())
    torch.testing.assert_close(adv[:, 1], exact - exact.mean())


def test_dense_rewards_are_credited_as_given() -> None:
    model = PPO("TransformerPolicy", token_env(length=3, vocab_size=2, reward="bag"), batch_size=16, seed=0)
    batch = model.collect_rollouts()
    assert torch.equal(batch.credited_rewards(), batch.rewards)


# ---------------------------------------------------------------------------------------------
# tpo_gym.agents.common.update: typed batches and the one epoch loop
# ---------------------------------------------------------------------------------------------
def test_slice_groups_cuts_every_per_group_tensor_of_a_typed_batch_or_a_mapping() -> None:
    from tpo_gym.agents.common.update import ClippedGroupBatch, slice_groups

    scores, logp = torch.arange(12.0).reshape(4, 3), torch.zeros(4, 3)
    part = slice_groups(ClippedGroupBatch(scores=scores, mask=None, logp_old=logp, logp_ref=torch.ones(3)), 1, 3, 4)
    assert isinstance(part, ClippedGroupBatch) and part.mask is None
    assert torch.equal(part.scores, scores[1:3]) and torch.equal(part.logp_old, logp[1:3])
    assert torch.equal(part.logp_ref, torch.ones(3)), "a tensor not shaped by the groups is kept whole"
    as_dict = slice_groups({"scores": scores, "eta": 0.5}, 0, 2, 4)
    assert torch.equal(as_dict["scores"], scores[:2]) and as_dict["eta"] == 0.5
    with pytest.raises(TypeError, match="prepare\\(\\) must return a Prepared batch or a mapping, got list"):
        slice_groups([scores], 0, 1, 4)


def test_run_epochs_is_the_plain_loop_for_each_model() -> None:
    """S models through run_epochs: the first epoch's loss and gradient norm (before clipping), the last loss, and
    the parameters after E clipped SGD steps equal each model's own loop."""
    from tpo_gym.agents.common.update import run_epochs

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=gen), torch.randn(8, generator=gen)
    models = [torch.nn.Linear(3, 1) for _ in range(2)]
    clones = copy.deepcopy(models)
    clips = [None, 0.1]
    opts = [torch.optim.SGD(m.parameters(), lr=0.3) for m in models]

    def loss_of(m: torch.nn.Module) -> torch.Tensor:
        return ((m(x).squeeze(-1) - y) ** 2).mean()

    def backward() -> list[torch.Tensor]:
        losses = [loss_of(m) for m in models]
        for loss in losses:
            loss.backward()
        return losses

    stats = run_epochs(3, [list(m.parameters()) for m in models], clips,
                       lambda: [o.zero_grad() for o in opts], backward, lambda: [o.step() for o in opts])
    for m, clone, clip, st in zip(models, clones, clips, stats, strict=True):
        opt = torch.optim.SGD(clone.parameters(), lr=0.3)
        for epoch in range(3):
            opt.zero_grad()
            loss = loss_of(clone)
            loss.backward()
            if epoch == 0:
                first = loss.item()
                norm = torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in clone.parameters()])).item()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(clone.parameters(), clip)
            opt.step()
            last = loss.item()
        assert st["loss"] == pytest.approx(first, rel=1e-6) and st["final_loss"] == pytest.approx(last, rel=1e-6)
        assert st["grad_norm"] == pytest.approx(norm, rel=1e-6)
        for p, q in zip(m.parameters(), clone.parameters(), strict=True):
            assert torch.equal(p, q)


def _plateau_agent(cls: type, **kwargs: Any) -> Any:
    """A terminal-reward token task where the first batch fails in every group (H=8: success needs 8 right)."""
    env = gym.make("tpo_gym/TokenTask-v0", target="reverse_copy", reward="terminal", vocab_size=2, length=8)
    return cls("TransformerPolicy", env, level="sequence", batch_size=4, group_size=4, n_epochs=2, seed=0,
               policy_kwargs={"setup": "reference"}, **kwargs)


@pytest.mark.parametrize("cls", [TPO, GRPO])
def test_skip_uninformative_steps_leaves_the_weights_where_no_group_carries_signal(cls: type) -> None:
    """The plateau ablation: with every group's scores equal, the optimiser takes no step (the weights, and so
    the optimiser state, are untouched); without it, rounding noise (and GRPO's KL term) moves them."""
    moved = {}
    for skip in (False, True):
        agent = _plateau_agent(cls, skip_uninformative_steps=skip)
        before = [p.detach().clone() for p in agent.policy.parameters()]
        agent.learn(agent.steps_per_iteration)
        assert agent.history[0]["zero_variance_fraction"] == 1.0  # no signal in this batch
        moved[skip] = max(float((p - b).abs().max()) for p, b in zip(agent.policy.parameters(), before, strict=True))
        if skip:  # one epoch, no step: the loss at pi_old is the last epoch's too
            first = agent.history[0]
            assert math.isfinite(first["loss"]) and first["loss"] == first["final_loss"]
    assert moved[True] == 0.0
    assert moved[False] > 0.0


def test_skip_uninformative_steps_still_steps_when_a_group_carries_signal() -> None:
    kwargs = {"level": "sequence", "batch_size": 6, "group_size": 3, "policy_kwargs": {"d_model": 8, "d_ff": 16,
                                                                                         "n_layers": 1}}
    agents = [TPO("TransformerPolicy", "tpo_gym/TokenReversal-v0", seed=0, skip_uninformative_steps=skip, **kwargs)
              for skip in (False, True)]
    for agent in agents:
        agent.learn(2 * agent.steps_per_iteration)
        assert all(r["zero_variance_fraction"] < 1.0 for r in agent.history)  # bag reward: signal everywhere
    for p, q in zip(agents[0].policy.parameters(), agents[1].policy.parameters(), strict=True):
        assert torch.equal(p, q)


def test_skip_uninformative_steps_is_refused_where_it_cannot_apply() -> None:
    with pytest.raises(ValueError, match="skip_uninformative_steps=True applies to group methods"):
        PPO("TransformerPolicy", "tpo_gym/TokenReversal-v0", skip_uninformative_steps=True)
    with pytest.raises(ValueError, match="skip_uninformative_steps"):
        TPO("TransformerPolicy", "tpo_gym/TokenReversal-v0", skip_uninformative_steps="yes")
    from tpo_gym import SeedBatch

    agents = [_plateau_agent(TPO, skip_uninformative_steps=True) for _ in range(2)]
    with pytest.raises(ValueError, match="train those agents one by one"):
        SeedBatch(agents)
