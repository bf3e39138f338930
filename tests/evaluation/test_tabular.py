"""The tabular bandits' two setups: this project's ("tuned") and the reference code's variants."""

from __future__ import annotations

import math

import pytest
import torch

from tpo_gym.evaluation import tabular as T


def _batch(n_arms: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n_arms, generator=gen, dtype=torch.float64)
    actions = torch.tensor([0, 2, 5, 5])  # one hit in four: batch mean 0.25, not 0.5
    correct = 2
    return logits, actions, (actions == correct).to(torch.float64), correct


def _direction(method: str, setup: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, actions, rewards, correct = _batch()
    table = logits.clone().requires_grad_(True)
    T._sampled_loss(method, table, actions, rewards, correct, 1.0, setup).backward()
    return -table.grad, torch.softmax(logits, -1), actions, rewards


def test_reference_tpo_scores_every_arm_and_moves_along_q_minus_pi() -> None:
    g, pi, actions, rewards = _direction("tpo", "reference")
    u = torch.full_like(pi, 0.5)  # unsampled arms 1, 3, 4 score the baseline
    u[actions] = rewards          # sampled: 0 -> 0, 2 -> 1, 5 -> 0
    q = pi * torch.exp(u) / (pi * torch.exp(u)).sum()
    torch.testing.assert_close(g, q - pi)
    assert (g[[1, 3, 4]] != 0).all(), "the target covers arms no sample hit"


@pytest.mark.parametrize("method", ["pg", "dg"])
def test_reference_pg_and_dg_use_the_constant_baseline_half(method: str) -> None:
    g, pi, actions, rewards = _direction(method, "reference")
    adv = rewards - 0.5
    onehot = torch.nn.functional.one_hot(actions, pi.numel()).to(pi.dtype)
    logp = torch.log(pi[actions])
    weight = adv if method == "pg" else torch.sigmoid(adv * -logp) * adv
    expected = (weight[:, None] * (onehot - pi)).mean(0)
    torch.testing.assert_close(g, expected)
    tuned, *_ = _direction(method, "tuned")
    assert not torch.allclose(g, tuned), "the batch-mean baseline gives another direction"


@pytest.mark.parametrize("method", ["grpo", "group_pg", "ce"])
def test_reference_setup_leaves_the_other_methods_alone(method: str) -> None:
    torch.testing.assert_close(_direction(method, "reference")[0], _direction(method, "tuned")[0])


def test_reference_single_context_runs_are_seeded_and_converge() -> None:
    a = T.single_context_bandit("tpo", 3, steps=60, setup="reference")
    assert a == T.single_context_bandit("tpo", 3, steps=60, setup="reference")
    assert a[-1]["error"] < a[0]["error"] and len(a) == 61


def test_reference_multi_context_logs_after_the_update_with_lambda_exp_10_3() -> None:
    tuned = T.multi_context_bandit("tpo", 1, steps=20, lam=28.0)
    ref = T.multi_context_bandit("tpo", 1, steps=20, lam=28.0, setup="reference")
    assert len(tuned) == 21 and len(ref) == 20
    for t in range(20):  # the reference's row t is the error after update t: tuned's row t + 1
        assert ref[t]["error"] == pytest.approx(tuned[t + 1]["error"], rel=1e-12)
        assert ref[t]["misalignment"] == pytest.approx(tuned[t]["misalignment"], rel=1e-12, abs=1e-15)
    default = T.multi_context_bandit("tpo", 1, steps=20, setup="reference")
    explicit = T.multi_context_bandit("tpo", 1, steps=20, setup="reference", lam=math.exp(10 / 3))
    assert default == explicit and default != ref


@pytest.mark.parametrize("fn", [T.single_context_bandit, T.multi_context_bandit])
def test_unknown_setup_is_rejected_by_name(fn) -> None:
    with pytest.raises(ValueError, match="setup must be one of tuned, reference; got 'paper'"):
        fn("tpo", 0, setup="paper")
