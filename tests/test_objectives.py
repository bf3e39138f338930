"""Properties of the objective library (SPEC sections 1-2)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tpo_gym import objectives as O


@pytest.fixture(autouse=True, scope="module")
def _float64_default():
    """float64 within this module only (restored after, so other modules' models stay float32)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


finite = st.floats(min_value=-50.0, max_value=50.0, allow_nan=False, allow_infinity=False)


def group(k_min: int = 2, k_max: int = 12):
    return st.lists(finite, min_size=k_min, max_size=k_max)


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


# ----------------------------------------------------------------------------------- TPO core
@settings(max_examples=60, deadline=None)
@given(data=st.data(), k=st.integers(2, 10), eta=st.floats(0.05, 20.0))
def test_tpo_gradient_is_p_minus_q(data, k, eta):
    logits = t(data.draw(st.lists(finite, min_size=k, max_size=k)))
    scores = t(data.draw(st.lists(finite, min_size=k, max_size=k)))
    u = O.standardize_scores(scores)
    q = O.tpo_target(logits, u, eta=eta)
    lp = logits.clone().requires_grad_(True)
    O.tpo_loss(lp, q).backward()
    p = torch.softmax(logits, dim=-1)
    assert torch.allclose(lp.grad, p - q, atol=1e-10, rtol=0)


def test_tpo_gradient_batched_is_mean_over_groups():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=g)
    u = O.standardize_scores(torch.randn(5, 7, generator=g))
    q = O.tpo_target(logits, u)
    lp = logits.clone().requires_grad_(True)
    O.tpo_loss(lp, q).backward()
    assert torch.allclose(lp.grad, (torch.softmax(logits, -1) - q) / 5, atol=1e-12)


@pytest.mark.parametrize("value", [0.0, 1.0, -3.5, 1e6])
def test_all_equal_group_carries_no_signal(value):
    logits = t([0.3, -1.2, 2.0, 0.0])
    scores = torch.full((4,), value)
    u = O.standardize_scores(scores)
    assert torch.equal(u, torch.zeros(4))
    q = O.tpo_target(logits, u)
    assert torch.allclose(q, torch.softmax(logits, -1), atol=1e-15)
    lp = logits.clone().requires_grad_(True)
    O.tpo_loss(lp, q).backward()
    assert torch.allclose(lp.grad, torch.zeros(4), atol=1e-15)


def test_tiny_variance_counts_as_zero_variance():
    u = O.standardize_scores(t([1.0, 1.0 + 1e-7, 1.0]))
    assert torch.equal(u, torch.zeros(3))


def _objective(r, u, p_old, eta):
    return (r * u).sum() - eta * (r * (r.clamp_min(1e-300).log() - p_old.log())).sum()


@settings(max_examples=40, deadline=None)
@given(data=st.data(), k=st.integers(2, 8), eta=st.floats(0.1, 5.0), seed=st.integers(0, 10_000))
def test_target_maximises_regularised_objective(data, k, eta, seed):
    """Proposition 1: q maximises sum r u - eta KL(r || p_old) over the simplex."""
    logits = t(data.draw(st.lists(st.floats(-5, 5), min_size=k, max_size=k)))
    scores = t(data.draw(st.lists(st.floats(-5, 5), min_size=k, max_size=k)))
    u = O.standardize_scores(scores)
    p_old = torch.softmax(logits, -1)
    q = O.tpo_target(logits, u, eta=eta)
    best = _objective(q, u, p_old, eta)
    g = torch.Generator().manual_seed(seed)
    rand = torch.distributions.Dirichlet(torch.ones(k)).sample((200,))
    rand = rand[torch.randperm(200, generator=g)]
    for r in rand:
        assert _objective(r, u, p_old, eta) <= best + 1e-9
    # small perturbations inside the simplex are worse too
    for _ in range(20):
        d = torch.randn(k, generator=g) * 1e-3
        d -= d.mean()
        r = q + d
        if (r > 0).all():
            assert _objective(r, u, p_old, eta) <= best + 1e-12


@settings(max_examples=60, deadline=None)
@given(scores=group(), a=st.floats(1e-3, 1e3), b=st.floats(-1e3, 1e3))
def test_standardize_is_affine_invariant(scores, a, b):
    s = t(scores)
    u1 = O.standardize_scores(s)
    u2 = O.standardize_scores(a * s + b)
    if (s.std(unbiased=False) * min(a, 1.0)) > 1e-3:
        assert torch.allclose(u1, u2, atol=1e-6)


def test_standardize_uses_population_std():
    u = O.standardize_scores(t([0.0, 1.0]))
    assert torch.allclose(u, t([-1.0, 1.0]))
    u = O.standardize_scores(t([1.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(u, (t([1.0, 0, 0, 0]) - 0.25) / math.sqrt(0.1875))


def test_eta_limits():
    logits = t([0.5, -0.5, 1.5, 0.0])
    u = O.standardize_scores(t([1.0, 0.0, 3.0, 3.0]))
    q_big = O.tpo_target(logits, u, eta=1e6)
    assert torch.allclose(q_big, torch.softmax(logits, -1), atol=1e-5)
    q_small = O.tpo_target(logits, u, eta=1e-3)
    best = u == u.max()
    assert q_small[best].sum() > 1 - 1e-9
    # among the tied best, mass follows p_old
    p = torch.softmax(logits, -1)
    assert torch.allclose(q_small[best] / q_small[best].sum(), p[best] / p[best].sum(), atol=1e-9)


def test_no_anchor_is_softmax_of_u():
    logits = t([5.0, -5.0, 0.0])
    u = O.standardize_scores(t([0.0, 1.0, 2.0]))
    assert torch.allclose(O.tpo_target(logits, u, eta=0.5, anchor=False), torch.softmax(u / 0.5, -1))


def test_target_is_detached():
    logits = t([0.1, 0.2]).requires_grad_(True)
    q = O.tpo_target(logits, t([1.0, -1.0]))
    assert not q.requires_grad


# ------------------------------------------------------------------------- numerics and masks
@pytest.mark.parametrize("fn", ["tpo", "grpo", "group_pg"])
def test_no_nan_for_extreme_logprobs(fn):
    logp = t([[-1e4, 0.0, -3.0, -1e4], [-1e4, -1e4, -1e4, -1e4]]).requires_grad_(True)
    scores = t([[1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 0.0, 0.0]])
    u = O.standardize_scores(scores)
    if fn == "tpo":
        loss = O.tpo_loss(logp, O.tpo_target(logp, u))
    elif fn == "grpo":
        loss = O.grpo_loss(logp, logp.detach() - 50.0, scores)
    else:
        loss = O.group_pg_loss(logp, u)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


def test_single_candidate_group():
    logp = t([[-2.0], [-0.1]]).requires_grad_(True)
    s = t([[3.0], [1.0]])
    u = O.standardize_scores(s)
    assert torch.equal(u, torch.zeros(2, 1))
    q = O.tpo_target(logp, u)
    assert torch.equal(q, torch.ones(2, 1))
    loss = O.tpo_loss(logp, q)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(2, 1))
    assert torch.isfinite(O.grpo_loss(logp, logp.detach(), s))


def test_fully_masked_group_is_finite_and_silent():
    logp = t([[0.1, 0.2, 0.3], [0.5, -0.5, 0.0]]).requires_grad_(True)
    s = t([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[False, False, False], [True, True, True]])
    u = O.standardize_scores(s, mask)
    q = O.tpo_target(logp, u, mask=mask)
    assert torch.equal(q[0], torch.zeros(3)) and torch.isfinite(q).all()
    loss = O.tpo_loss(logp, q, mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.equal(logp.grad[0], torch.zeros(3))
    # the valid group alone gives the same loss
    alone = O.tpo_loss(logp[1:].detach(), q[1:])
    assert torch.allclose(loss, alone)
    for fn in (lambda: O.grpo_loss(logp, logp.detach(), s, mask=mask),
               lambda: O.group_pg_loss(logp, u, mask=mask)):
        assert torch.isfinite(fn())


def test_all_groups_masked_gives_zero_loss():
    logp = t([[0.1, 0.2]]).requires_grad_(True)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    u = O.standardize_scores(t([[1.0, 0.0]]), mask)
    loss = O.tpo_loss(logp, O.tpo_target(logp, u, mask=mask), mask)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(1, 2))


def test_masked_candidates_get_no_mass_and_no_gradient():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, generator=g)
    scores = torch.randn(4, 6, generator=g)
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[:, 0] = True
    u = O.standardize_scores(scores, mask)
    assert torch.equal(u[~mask], torch.zeros(int((~mask).sum())))
    q = O.tpo_target(logits, u, mask=mask)
    assert torch.equal(q[~mask], torch.zeros(int((~mask).sum())))
    assert torch.allclose(q.sum(-1), torch.ones(4))
    for loss_fn in (
        lambda lp: O.tpo_loss(lp, q, mask),
        lambda lp: O.grpo_loss(lp, logits, scores, mask=mask),
        lambda lp: O.group_pg_loss(lp, u, mask=mask),
    ):
        lp = logits.clone().requires_grad_(True)
        loss_fn(lp).backward()
        assert torch.equal(lp.grad[~mask], torch.zeros(int((~mask).sum())))
    # masking equals dropping the candidates
    row = 2
    keep = mask[row]
    u_drop = O.standardize_scores(scores[row][keep])
    assert torch.allclose(u[row][keep], u_drop)
    assert torch.allclose(q[row][keep], O.tpo_target(logits[row][keep], u_drop))


# ---------------------------------------------------------------------------------- baselines
def test_grpo_without_kl_and_clip_equals_zscored_reinforce_first_epoch():
    g = torch.Generator().manual_seed(2)
    logp_old = torch.log_softmax(torch.randn(6, 8, generator=g), -1)
    scores = (torch.rand(6, 8, generator=g) > 0.5).to(torch.float64)
    lp1 = logp_old.clone().requires_grad_(True)
    O.grpo_loss(lp1, logp_old, scores, beta=0.0).backward()
    lp2 = logp_old.clone().requires_grad_(True)
    O.reinforce_loss(lp2, O.grpo_advantages(scores)).backward()
    assert torch.allclose(lp1.grad, lp2.grad, atol=1e-12)
    # and the z-scores are the TPO standardisation up to the 1e-8 epsilon
    assert torch.allclose(O.grpo_advantages(scores), O.standardize_scores(scores), atol=1e-6)


def test_grpo_kl_is_zero_on_first_epoch_and_positive_after():
    logp_old = t([[-1.0, -2.0, -0.5]])
    scores = t([[1.0, 0.0, 0.0]])
    base = O.grpo_loss(logp_old, logp_old, scores, beta=0.0)
    assert torch.allclose(O.grpo_loss(logp_old, logp_old, scores, beta=1.0), base)
    moved = logp_old + t([[0.05, -0.05, 0.02]])
    assert O.grpo_loss(moved, logp_old, scores, beta=1.0) > O.grpo_loss(moved, logp_old, scores, beta=0.0)
    assert (O.k3_kl(moved, logp_old) >= 0).all()


def test_grpo_clipping_stops_gradient_outside_trust_region():
    logp_old = t([[0.0, 0.0]])
    scores = t([[1.0, 0.0]])  # A = [+1, -1]
    lp = (logp_old + t([[0.5, -0.5]])).requires_grad_(True)  # ratios e^0.5 > 1.2, e^-0.5 < 0.8
    O.grpo_loss(lp, logp_old, scores, beta=0.0).backward()
    assert torch.equal(lp.grad, torch.zeros(1, 2))


def test_grpo_zero_variance_masking_averages_over_informative_groups():
    logp_old = t([[-1.0, -2.0], [-0.3, -0.7], [-1.5, -0.1]])
    scores = t([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    lp = logp_old + t([[0.1, -0.1], [0.05, 0.0], [0.0, -0.05]])
    plain = O.grpo_loss(lp, logp_old, scores, beta=0.04)
    masked = O.grpo_loss(lp, logp_old, scores, beta=0.04, mask_zero_variance=True)
    only = O.grpo_loss(lp[:1], logp_old[:1], scores[:1], beta=0.04)
    assert torch.allclose(masked, only)
    assert not torch.allclose(plain, masked, rtol=1e-3, atol=0)
    assert torch.equal(O.zero_variance_groups(scores), torch.tensor([False, True, True]))


def test_grpo_token_level_matches_sequence_level_for_one_token():
    g = torch.Generator().manual_seed(3)
    logp_old = torch.randn(4, 5, generator=g) - 2
    lp = logp_old + 0.1 * torch.randn(4, 5, generator=g)
    s = torch.randn(4, 5, generator=g)
    seq = O.grpo_loss(lp, logp_old, s)
    tok = O.grpo_loss(lp.unsqueeze(-1), logp_old.unsqueeze(-1), s)
    assert torch.allclose(seq, tok)


def test_dg_gate_formula_and_range():
    adv = t([2.0, -1.0, 0.0, 50.0, -50.0])
    logp = t([-0.1, -3.0, -1.0, -20.0, -20.0])
    w = O.dg_gate(adv, logp, eta=0.5)
    assert torch.allclose(w, torch.sigmoid(adv * (-logp) / 0.5))
    w1 = O.dg_gate(t([0.3, -0.2]), t([-1.0, -2.0]))
    assert ((w1 > 0) & (w1 < 1)).all()
    assert w[2] == 0.5


def test_dg_loss_gradient_is_gated_pg():
    adv = t([[1.0, -0.5], [0.0, 2.0]])
    logp = t([[-0.7, -1.1], [-0.2, -3.0]]).requires_grad_(True)
    O.dg_loss(logp, adv).backward()
    w = torch.sigmoid(adv * -logp.detach())
    assert torch.allclose(logp.grad, -(w * adv) / 2)


def test_ppo_and_reinforce_and_group_pg():
    r = t([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    a = O.batch_baseline_advantages(r)
    assert torch.allclose(a, r - r.mean(0))
    logp = t([[-0.5, -0.6], [-0.7, -0.1], [-1.0, -2.0]]).requires_grad_(True)
    O.ppo_loss(logp, logp.detach(), a).backward()
    assert torch.allclose(logp.grad, -a / 3)
    lp2 = logp.detach().clone().requires_grad_(True)
    O.reinforce_loss(lp2, a).backward()
    assert torch.allclose(lp2.grad, -a / 3)
    lp3 = logp.detach().clone().requires_grad_(True)
    O.group_pg_loss(lp3, a, eta=2.0).backward()
    assert torch.allclose(lp3.grad, -a / 2 / 3)


def test_onehot_scores_and_cross_entropy():
    probs = t([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    s = O.onehot_advantage_scores(torch.tensor([1, 2]), t([1.0, 0.0]), probs)
    assert torch.allclose(s, t([[0.0, 0.5, 0.0], [0.0, 0.0, -0.38]]))
    logits = t([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    ce = O.cross_entropy_loss(logits, torch.tensor([0, 2]))
    assert torch.allclose(ce, -torch.log_softmax(logits, -1)[[0, 1], [0, 2]].mean())


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("eta", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_eta_raises(eta):
    with pytest.raises(ValueError, match="eta"):
        O.tpo_target(t([0.0, 1.0]), t([1.0, -1.0]), eta=eta)
    with pytest.raises(ValueError, match="eta"):
        O.group_pg_loss(t([0.0, 1.0]), t([1.0, -1.0]), eta=eta)
    with pytest.raises(ValueError, match="eta"):
        O.dg_gate(t([0.0, 1.0]), t([-1.0, -1.0]), eta=eta)


def test_mismatched_shapes_raise():
    with pytest.raises(ValueError, match="u"):
        O.tpo_target(t([0.0, 1.0]), t([1.0, -1.0, 0.0]))
    with pytest.raises(ValueError, match="q"):
        O.tpo_loss(t([0.0, 1.0]), t([1.0]))
    with pytest.raises(ValueError, match="logp_old"):
        O.grpo_loss(t([[0.0, 1.0]]), t([[0.0]]), t([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="mask"):
        O.standardize_scores(t([0.0, 1.0]), torch.tensor([True]))
    with pytest.raises(ValueError, match="advantages"):
        O.ppo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([1.0]))


def test_nan_scores_raise():
    with pytest.raises(ValueError, match="scores"):
        O.standardize_scores(t([0.0, float("nan")]))
    with pytest.raises(ValueError, match="scores"):
        O.grpo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([float("nan"), 1.0]))


def test_bad_clip_and_beta_raise():
    with pytest.raises(ValueError, match="clip_eps"):
        O.grpo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([0.0, 1.0]), clip_eps=-0.1)
    with pytest.raises(ValueError, match="beta"):
        O.grpo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([0.0, 1.0]), beta=-1.0)
