"""tpo_gym.objectives, function by function (docs/method.md sections 1-2): the TPO target and loss, the
baselines' losses, the zero-variance rule, and what every objective shares (bad input refused by name,
masks, wide reductions, deferred checks)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
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


HALF_AND_UP = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
NONFINITE = [float("nan"), float("inf"), float("-inf")]
F32 = torch.float32
F32_MAX = torch.finfo(F32).max
N_HALF = 70_000  # more groups / rows than float16 can count (its maximum is 65,504)


def _f32(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F32)


def _lp(*shape):
    g = torch.Generator().manual_seed(sum(shape))
    return torch.log_softmax(torch.randn(*shape, generator=g), -1)


extreme32 = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, -2.0, 1e-30, 1e9, -1e9, 1e30, -1e30, 3e38, -3e38]),
    st.floats(min_value=-F32_MAX, max_value=F32_MAX, allow_nan=False, allow_infinity=False, width=32),
)


# ---------------------------------------------------------------------------------------------
# standardize_scores, zero_variance_groups and grpo_advantages: the zero-variance rule, every dtype
# ---------------------------------------------------------------------------------------------
def test_standardize_uses_population_std():
    u = O.standardize_scores(t([0.0, 1.0]))
    assert torch.allclose(u, t([-1.0, 1.0]))
    u = O.standardize_scores(t([1.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(u, (t([1.0, 0, 0, 0]) - 0.25) / math.sqrt(0.1875))


@settings(max_examples=60, deadline=None)
@given(scores=group(), a=st.floats(1e-3, 1e3), b=st.floats(-1e3, 1e3))
def test_standardize_is_affine_invariant(scores, a, b):
    s = t(scores)
    u1 = O.standardize_scores(s)
    u2 = O.standardize_scores(a * s + b)
    if (s.std(unbiased=False) * min(a, 1.0)) > 1e-3:
        assert torch.allclose(u1, u2, atol=1e-6)


def _relative_spread(s: torch.Tensor) -> float:
    """std / max|s|, computed on s / max|s| (no underflow of the squares)."""
    big = s.abs().max()
    return float((s / big).std(unbiased=False)) if float(big) > 0 else 0.0


@settings(max_examples=200, deadline=None)
@given(
    scores=group(),
    log_a=st.floats(-8.0, 8.0),
    b=st.one_of(st.just(0.0), st.floats(-1e3, 1e3)),
)
def test_standardize_is_affine_invariant_over_wide_scales(scores, log_a, b):
    """u(a s + b) == u(s) for a in [1e-8, 1e8] wherever the rule sees signal in both groups."""
    a = 10.0**log_a
    s = t(scores)
    s2 = a * s + b
    u1, u2 = O.standardize_scores(s), O.standardize_scores(s2)
    r1, r2 = _relative_spread(s), _relative_spread(s2)
    for r, u in ((r1, u1), (r2, u2)):
        if r <= O.STD_EPS / 2:  # clearly zero-variance: exactly zero
            assert torch.equal(u, torch.zeros_like(u))
    if r1 > 2 * O.STD_EPS and r2 > 2 * O.STD_EPS:
        # rounding of a*s+b is eps64 * max|s2|, at most eps64 / (2 STD_EPS) of the spread
        assert torch.allclose(u1, u2, atol=1e-6, rtol=0)
    if b == 0.0 and r1 > 2 * O.STD_EPS:  # pure scaling is always invariant
        assert torch.allclose(u1, u2, atol=1e-9, rtol=0)


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


def test_all_equal_float32_groups_in_10_100_give_exactly_zero():
    """2,000 float32 groups of eight equal values in [10, 100): no rounding noise is read as signal."""
    g = torch.Generator().manual_seed(9)
    values = (10.0 + 90.0 * torch.rand(2000, 1, generator=g)).to(torch.float32)
    scores = values.expand(2000, 8).contiguous()
    u = O.standardize_scores(scores)
    assert u.dtype == torch.float32
    assert torch.equal(u, torch.zeros_like(u))
    assert torch.equal(O.grpo_advantages(scores), torch.zeros_like(u))
    assert bool(O.zero_variance_groups(scores).all())


@pytest.mark.parametrize("dtype", HALF_AND_UP)
@pytest.mark.parametrize("low, high", [(1e-3, 1e-1), (0.1, 10.0), (10.0, 100.0), (100.0, 6e4), (-6e4, -1.0)])
def test_all_equal_groups_give_exactly_zero_in_every_dtype(dtype, low, high):
    g = torch.Generator().manual_seed(int(high))
    values = (low + (high - low) * torch.rand(500, 1, generator=g)).to(dtype)
    scores = values.expand(500, 8).contiguous()
    mask = torch.rand(500, 8, generator=g) > 0.3
    for m in (None, mask):
        u = O.standardize_scores(scores, m)
        assert u.dtype == dtype
        assert torch.equal(u, torch.zeros_like(u))
        adv = O.grpo_advantages(scores, m)
        assert adv.dtype == dtype and torch.equal(adv, torch.zeros_like(adv))
        assert bool(O.zero_variance_groups(scores, m).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_all_equal_groups_give_no_gradient_to_grpo_group_pg_and_zscored_reinforce(dtype):
    scores = torch.full((3, 8), 23.7, dtype=dtype)
    logp_old = torch.log_softmax(torch.randn(3, 8, generator=torch.Generator().manual_seed(0)), -1).to(dtype)
    for loss_fn in (
        lambda lp: O.grpo_loss(lp, logp_old, scores, beta=0.0),
        lambda lp: O.group_pg_loss(lp, O.standardize_scores(scores)),
        lambda lp: O.reinforce_loss(lp, O.standardize_scores(scores)),
    ):
        lp = logp_old.clone().requires_grad_(True)
        loss_fn(lp).backward()
        assert torch.equal(lp.grad, torch.zeros_like(lp.grad))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_one_ulp_apart_scores_count_as_zero_variance(dtype):
    """Values within rounding noise of the dtype (one ulp apart) carry no signal."""
    base = torch.tensor([0.3, 23.7, 1234.0], dtype=dtype).unsqueeze(-1).expand(3, 8).contiguous()
    nudged = base.clone()
    nudged[:, 3] = torch.nextafter(base[:, 3], torch.full_like(base[:, 3], math.inf))
    assert not torch.equal(nudged, base)
    assert torch.equal(O.standardize_scores(nudged), torch.zeros_like(nudged))
    assert bool(O.zero_variance_groups(nudged).all())


def test_zero_variance_rule_is_relative_to_the_scores_magnitude():
    u = O.standardize_scores(t([0.0, 1e-7, 0.0, 1e-7]))
    assert torch.allclose(u, t([-1.0, 1.0, -1.0, 1.0]))
    assert not bool(O.zero_variance_groups(t([0.0, 1e-7, 0.0, 1e-7])))
    assert torch.allclose(O.grpo_advantages(t([0.0, 1e-7, 0.0, 1e-7]), eps=0.0), t([-1.0, 1.0, -1.0, 1.0]))
    for scale in (1e-300, 1e-30, 1e-7, 1.0, 1e30, 1e300):
        assert torch.allclose(O.standardize_scores(scale * t([0.0, 1.0, 0.0, 1.0])), t([-1.0, 1.0, -1.0, 1.0]))
    # extremes: no overflow in the squares, no underflow for subnormal spreads
    assert torch.allclose(O.standardize_scores(t([-1.7e308, 1.7e308])), t([-1.0, 1.0]))
    assert torch.allclose(O.standardize_scores(t([0.0, 5e-324])), t([-1.0, 1.0]))
    assert torch.allclose(O.grpo_advantages(t([0.0, 5e-324]), eps=0.0), t([-1.0, 1.0]))
    assert torch.equal(O.grpo_advantages(t([0.0, 5e-324])), torch.zeros(2))  # eps dominates a tiny spread
    assert torch.allclose(O.grpo_advantages(t([-1.7e308, 1.7e308])), t([-1.0, 1.0]))
    f32 = torch.tensor([-3e38, 3e38], dtype=torch.float32)
    assert torch.allclose(O.standardize_scores(f32), torch.tensor([-1.0, 1.0], dtype=torch.float32))
    # docs/method.md's std <= 1e-6 for scores of order one is unchanged: this is relative spread 1e-7
    assert torch.equal(O.standardize_scores(t([1.0, 1.0 + 2e-7, 1.0, 1.0 + 2e-7])), torch.zeros(4))
    assert torch.equal(O.standardize_scores(t([0.0, 0.0, 0.0])), torch.zeros(3))
    # a relative spread of 1e-7 over three scores
    u = O.standardize_scores(t([1.0, 1.0 + 1e-7, 1.0]))
    assert torch.equal(u, torch.zeros(3))


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    dtype=st.sampled_from(HALF_AND_UP),
    magnitude=st.sampled_from([1e-6, 1e-2, 1.0, 23.7, 1e3]),
    k=st.integers(1, 9),
    n=st.integers(1, 4),
)
def test_zero_variance_groups_agrees_with_standardize_and_grpo(data, dtype, magnitude, k, n):
    levels = st.sampled_from([0.0, 1.0, 1.0 + 1e-7, 1.0 + 1e-3, 2.0, -1.0])
    rows = data.draw(st.lists(st.lists(levels, min_size=k, max_size=k), min_size=n, max_size=n))
    scores = (magnitude * torch.tensor(rows, dtype=torch.float64)).to(dtype)
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=k, max_size=k), min_size=n,
                                           max_size=n)))
    for m in (None, mask):
        zv = O.zero_variance_groups(scores, m)
        u = O.standardize_scores(scores, m)
        adv = O.grpo_advantages(scores, m)
        assert zv.shape == (n,)
        assert torch.equal(zv, (u == 0).all(dim=-1))
        assert torch.equal(zv, (adv == 0).all(dim=-1))
        assert torch.isfinite(u).all() and torch.isfinite(adv).all()
        informative_u = u[~zv]
        if informative_u.numel():  # a z-scored group has max |u| >= 1
            assert (informative_u.abs().amax(dim=-1) >= 1 - 1e-2).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_statistics_are_computed_wide(dtype):
    rows = [[0.0, 60000.0], [1000.0, 1001.0], [100.0, 101.0], [0.0, 1.0]]
    for row in rows:
        s = torch.tensor(row, dtype=dtype)
        u = O.standardize_scores(s)
        assert u.dtype == dtype
        ref = O.standardize_scores(s.to(torch.float64))
        assert torch.allclose(u.to(torch.float64), ref, atol=1e-2, rtol=0), (row, u)
    g = torch.Generator().manual_seed(5)
    s = (100.0 + 50.0 * torch.randn(64, 8, generator=g)).to(dtype)
    ref = O.standardize_scores(s.to(torch.float64))
    assert torch.allclose(O.standardize_scores(s).to(torch.float64), ref, atol=2e-2, rtol=0)
    assert torch.allclose(O.grpo_advantages(s).to(torch.float64), ref, atol=2e-2, rtol=0)


def test_float32_statistics_are_accurate_for_large_offsets():
    g = torch.Generator().manual_seed(6)
    s64 = 1e4 + torch.randn(256, 8, generator=g)
    s32 = s64.to(torch.float32)
    ref = O.standardize_scores(s32.to(torch.float64))
    assert torch.allclose(O.standardize_scores(s32).to(torch.float64), ref, atol=1e-4, rtol=0)


def test_standardize_and_grpo_advantages_stay_differentiable():
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
    mask = torch.tensor([[True] * 5, [True, False, True, True, False], [True, True, False, False, False]])
    assert torch.autograd.gradcheck(lambda s: O.standardize_scores(s), (x,))
    assert torch.autograd.gradcheck(lambda s: O.standardize_scores(s, mask), (x,))
    assert torch.autograd.gradcheck(lambda s: O.grpo_advantages(s, mask), (x,))


# ---------------------------------------------------------------------------------------------
# tpo_target and tpo_loss
# ---------------------------------------------------------------------------------------------
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


def _objective(r, u, p_old, eta):
    return (r * u).sum() - eta * (r * (r.clamp_min(1e-300).log() - p_old.log())).sum()


@settings(max_examples=20, deadline=None)
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


@pytest.mark.parametrize("eta", [1e-300, 1e-40])
def test_tiny_eta_gives_the_argmax_limit_not_nan(eta):
    logits = torch.tensor([[0.5, -0.5, 1.5, 0.0]], dtype=torch.float32)
    u = O.standardize_scores(torch.tensor([[1.0, 0.0, 3.0, 3.0]], dtype=torch.float32))
    q = O.tpo_target(logits, u, eta=eta)
    assert torch.isfinite(q).all() and torch.allclose(q.sum(-1), torch.ones(1, dtype=torch.float32))
    assert torch.equal(q[0, :2], torch.zeros(2, dtype=torch.float32))
    assert torch.isfinite(O.dg_gate(t([0.0, 1.0, -1.0]), t([-1.0, -1.0, -1.0]), eta=eta)).all()
    assert O.group_pg_loss(t([-1.0, -2.0]), t([0.0, 0.0]), eta=eta).item() == 0.0


def test_no_anchor_is_softmax_of_u():
    logits = t([5.0, -5.0, 0.0])
    u = O.standardize_scores(t([0.0, 1.0, 2.0]))
    assert torch.allclose(O.tpo_target(logits, u, eta=0.5, anchor=False), torch.softmax(u / 0.5, -1))


def test_target_is_detached():
    logits = t([0.1, 0.2]).requires_grad_(True)
    q = O.tpo_target(logits, t([1.0, -1.0]))
    assert not q.requires_grad


def test_tpo_gradient_is_exactly_zero_when_the_target_is_the_policy() -> None:
    logp = torch.log_softmax(torch.randn(6, 8, dtype=torch.float32), dim=-1).requires_grad_(True)
    q = O.tpo_target(logp.detach(), torch.zeros(6, 8, dtype=torch.float32), eta=1.0)
    (grad,) = torch.autograd.grad(O.tpo_loss(logp, q), logp)
    assert torch.equal(grad, torch.zeros_like(grad))
    mask = torch.rand(6, 8) > 0.3
    q = O.tpo_target(logp.detach(), torch.zeros(6, 8, dtype=torch.float32), eta=1.0, mask=mask)
    (grad,) = torch.autograd.grad(O.tpo_loss(logp, q, mask), logp)
    assert torch.equal(grad, torch.zeros_like(grad))


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


def test_tpo_loss_zero_target_entries_add_exactly_zero_at_extreme_logits():
    for q, value, grad in (([[1.0, 0.0]], 0.0, [[0.0, 0.0]]), ([[0.5, 0.5]], 3e38, [[0.5, -0.5]])):
        lp = _f32([[3e38, -3e38]]).requires_grad_(True)
        loss = O.tpo_loss(lp, _f32(q))
        loss.backward()
        assert loss.item() == pytest.approx(value, rel=1e-6) and torch.equal(lp.grad, _f32(grad))
    lp = _f32([[3e38, -3e38, 0.0]]).requires_grad_(True)  # and with a mask
    loss = O.tpo_loss(lp, _f32([[1.0, 0.0, 0.0]]), torch.tensor([[True, True, False]]))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(1, 3, dtype=F32))
    with pytest.raises(ValueError, match="tpo_loss overflows float32.*logp"):  # the exact value is 6e38
        O.tpo_loss(_f32([[3e38, -3e38]]), _f32([[0.0, 1.0]]))


def test_tpo_loss_refuses_a_target_that_does_not_sum_to_one_naming_the_group():
    logp = torch.log_softmax(torch.randn(3, 4, dtype=F32), -1)
    q = torch.full((3, 4), 0.25, dtype=F32)
    q[1] = _f32([0.5, 0.5, 0.5, 0.0])
    with pytest.raises(ValueError, match=r"q must be a target distribution .*group \(1,\) sums to 1\.5"):
        O.tpo_loss(logp, q)
    with pytest.raises(ValueError, match=r"group \(1,\) sums to 1\.5"), O.deferred_checks(force=True):
        O.tpo_loss(logp, q)  # queued like every value check, raised at the end of the block
    stacked = torch.full((2, 3, 4), 0.25, dtype=F32)  # SeedBatch shapes [S, G, K]: the index names (s, g)
    stacked[1, 2, 0] = 0.0
    with pytest.raises(ValueError, match=r"group \(1, 2\) sums to 0\.75"):
        O.tpo_loss(torch.zeros(2, 3, 4, dtype=F32), stacked)
    with pytest.raises(ValueError, match=r"group \(0,\) sums to 0\.0"):
        O.tpo_loss(logp[:1], torch.zeros(1, 4, dtype=F32))
    # the sum runs over the valid candidates; a fully masked group may hold anything
    mask = torch.tensor([[True, True, False, False], [False] * 4, [True] * 4])
    q = _f32([[0.5, 0.5, 7.0, 0.0], [0.9, 0.9, 0.9, 0.9], [0.25] * 4])
    O.tpo_loss(logp, q, mask)
    with pytest.raises(ValueError, match=r"group \(0,\) sums to 0\.5"):
        O.tpo_loss(logp, _f32([[0.5, 0.0, 0.5, 0.0], [0.0] * 4, [0.25] * 4]), mask)
    # the tolerance follows the dtype: n_valid * eps, at least float32's
    O.tpo_loss(logp.double(), torch.softmax(torch.randn(3, 4, dtype=F32), -1).double())  # float32 q cast up
    with pytest.raises(ValueError, match="sums to"):
        O.tpo_loss(logp.double(), torch.full((3, 4), 0.25 + 1e-5, dtype=torch.float64))
    O.tpo_loss(logp.half(), torch.full((3, 4), 0.25 + 1e-4, dtype=torch.float16))  # within float16 rounding


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, F32, torch.float64])
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), eta=st.sampled_from([1e-40, 1e-3, 1.0, 1e6]), anchor=st.booleans(),
       shape=st.sampled_from([(5, 8), (2, 3, 6), (4, 1), (3, 64)]))
def test_every_target_from_tpo_target_is_accepted_by_tpo_loss(dtype, seed, eta, anchor, shape):
    """The agents' path: q from tpo_target (masked, fully masked groups, stacked [S, G, K], any dtype)."""
    g = torch.Generator().manual_seed(seed)
    logits = (5.0 * torch.randn(*shape, generator=g)).to(dtype)
    mask = torch.rand(*shape, generator=g) > 0.3
    mask.view(-1, shape[-1])[0] = False  # one fully masked group
    u = O.standardize_scores(torch.randn(*shape, generator=g).to(dtype), mask)
    for m in (None, mask):
        q = O.tpo_target(logits, u, eta=eta, anchor=anchor, mask=m)
        lp = logits.clone().requires_grad_(True)
        loss = O.tpo_loss(lp, q, m)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()


def test_float16_tpo_loss_over_65504_groups_has_the_exact_gradient():
    g = torch.Generator().manual_seed(11)
    lp = torch.log_softmax(torch.randn(N_HALF, 2, generator=g, dtype=F32), -1).half().requires_grad_(True)
    q = torch.softmax(torch.randn(N_HALF, 2, generator=g, dtype=F32), -1).half()
    ref_value = -(q.double() * torch.log_softmax(lp.detach().double(), -1)).sum(-1).mean()
    ref_grad = (torch.softmax(lp.detach().double(), -1) - q.double()) / N_HALF
    for mask in (None, torch.ones(N_HALF, 2, dtype=torch.bool)):
        lp.grad = None
        loss = O.tpo_loss(lp, q, mask)
        loss.backward()
        assert loss.dtype == torch.float16
        torch.testing.assert_close(loss.double(), ref_value, rtol=2e-3, atol=0)
        assert lp.grad.abs().max() > 0
        torch.testing.assert_close(lp.grad.double(), ref_grad, rtol=1e-2, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# grpo_loss and k3_kl
# ---------------------------------------------------------------------------------------------
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


def test_grpo_kl_to_a_reference_model() -> None:
    torch.manual_seed(0)
    logp_old = torch.randn(3, 4, dtype=torch.float64)
    scores = torch.rand(3, 4, dtype=torch.float64)
    logp = (logp_old + 0.1 * torch.randn(3, 4, dtype=torch.float64)).requires_grad_(True)
    same = O.grpo_loss(logp, logp_old, scores, beta=0.5, logp_ref=logp_old)
    torch.testing.assert_close(same, O.grpo_loss(logp, logp_old, scores, beta=0.5))
    ref = logp_old - 0.3
    with_ref = O.grpo_loss(logp, logp_old, scores, beta=0.5, logp_ref=ref)
    no_kl = O.grpo_loss(logp, logp_old, scores, beta=0.0)
    r = (ref - logp).detach()
    expected_kl = (torch.exp(r) - r - 1).sum(dim=-1).mean()
    torch.testing.assert_close(with_ref - no_kl, 0.5 * expected_kl)
    with pytest.raises(ValueError, match="logp_ref"):
        O.grpo_loss(logp, logp_old, scores, logp_ref=torch.zeros(3, 5, dtype=torch.float64))


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


def test_half_precision_ratios_do_not_overflow():
    """e^20 overflows float16: the ratio of a moved zero-advantage candidate gave inf * 0 = NaN."""
    logp_old = torch.tensor([[-15.0, 0.0]], dtype=torch.float16)
    scores = torch.tensor([[1.0, 1.0]], dtype=torch.float16)
    for beta in (0.0, 0.04):
        lp = torch.tensor([[0.0, -15.0]], dtype=torch.float16, requires_grad=True)
        loss = O.grpo_loss(lp, logp_old, scores, beta=beta)
        loss.backward()
        assert torch.isfinite(loss)
        if beta == 0.0:
            assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp.grad))
    lp = torch.tensor([0.0, -15.0], dtype=torch.float16, requires_grad=True)
    loss = O.ppo_loss(lp, torch.tensor([-15.0, 0.0], dtype=torch.float16), torch.zeros(2, dtype=torch.float16))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp.grad))
    assert torch.isfinite(O.k3_kl(lp.detach(), torch.tensor([-15.0, 0.0], dtype=torch.float16))).all()


# ---------------------------------------------------------------------------------------------
# batch_baseline_advantages, ppo_loss, reinforce_loss and group_pg_loss
# ---------------------------------------------------------------------------------------------
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


def test_step_losses_average_over_trajectories_with_a_valid_step():
    g = torch.Generator().manual_seed(12)
    steps = _lp(3, 4)
    adv = torch.randn(3, 4, generator=g)
    mask = torch.tensor([[True, True, False, False], [False] * 4, [True] * 4])
    keep = mask.any(-1)
    for fn in (
        lambda lp, a, m: O.ppo_loss(lp, lp.detach() - 0.1, a, mask=m),
        lambda lp, a, m: O.reinforce_loss(lp, a, m),
        lambda lp, a, m: O.dg_loss(lp, a, mask=m),
    ):
        full = fn(steps, adv, mask)
        sub = fn(steps[keep], adv[keep], mask[keep])
        assert torch.allclose(full, sub)
        # by hand: sum over valid steps, mean over the two trajectories that have one
        assert not torch.allclose(full, sub * 2 / 3)


def test_step_losses_one_step_trajectories_with_a_mask():
    lp = t([-0.5, -1.0, -2.0])
    adv = t([1.0, 2.0, -1.0])
    mask = torch.tensor([True, False, True])
    assert torch.allclose(O.reinforce_loss(lp, adv, mask), t(-(1.0 * -0.5 + -1.0 * -2.0) / 2))


def test_group_pg_loss_refuses_an_eta_whose_weights_overflow_instead_of_nan():
    for dtype, eta in ((F32, 1e-40), (torch.float16, 1e-5)):
        logp, u = torch.tensor([[-1.0, -2.0]], dtype=dtype), torch.tensor([[1.0, -1.0]], dtype=dtype)
        with pytest.raises(ValueError, match=r"u / eta overflows .*eta \(got"):
            O.group_pg_loss(logp, u, eta=eta)
        assert O.group_pg_loss(logp, torch.zeros_like(u), eta=eta).item() == 0.0  # no signal, any eta
    # where u / eta fits the dtype the value is exact: -(1e30 * -1 - 1e30 * -2)
    assert O.group_pg_loss(_f32([[-1.0, -2.0]]), _f32([[1.0, -1.0]]), eta=1e-30).item() == pytest.approx(-1e30)


def test_losses_with_huge_advantages_of_mixed_sign_are_exact_not_nan():
    """Products near +-1e39 cancel exactly: computed in float64, each loss is its exact value."""
    adv, logp = _f32([[1e30, -1e30], [-1e30, 1e30]]), _f32([[-1e9, -1e9], [-2.0, -3.0]])
    near_max = _f32([[3e38, -3e38], [3e38, -3e38]])
    ones = torch.full((2, 2), -1.0, dtype=F32)
    cases = [  # (loss of lp, lp, exact value)
        (lambda lp: O.reinforce_loss(lp, adv), logp, 5e29),  # -(0 + (2e30 - 3e30)) / 2
        (lambda lp: O.group_pg_loss(lp, adv), logp, 5e29),
        (lambda lp: O.dg_loss(lp, adv[:1], eta=1e300), logp[:1], 0.0),  # gates exactly 1/2: +-5e38 cancel
        (lambda lp: O.ppo_loss(lp, ones - 0.14, near_max), ones, 0.0),  # ratio 1.15: +-3.45e38 cancel
    ]
    for i, (call, lp, value) in enumerate(cases):
        lp = lp.clone().requires_grad_(True)
        loss = call(lp)
        loss.backward()
        assert loss.dtype == F32 and loss.item() == pytest.approx(value, rel=1e-6, abs=0.0), i
        assert torch.isfinite(lp.grad).all(), i
    # the gradient -rho * A / B of one step would be -4.9e38: refused, naming the advantages
    with pytest.raises(ValueError, match="ppo_loss.*overflows float32.*advantages"):
        O.ppo_loss(_f32([-1.0]), _f32([-21.0]), _f32([-1e30]))
    reached = []
    with pytest.raises(ValueError, match="ppo_loss.*overflows"), O.deferred_checks(force=True):
        O.ppo_loss(_f32([-1.0]), _f32([-21.0]), _f32([-1e30]))  # queued like every value check
        reached.append(True)
    assert reached == [True]


@settings(max_examples=200, deadline=None)
@given(data=st.lists(extreme32, min_size=12, max_size=12))
def test_reinforce_and_group_pg_refuse_only_what_float32_cannot_hold(data):
    """The loss is the exact float64 value rounded to float32, refused exactly when that overflows."""
    a, lp = (_f32(data[i:i + 6]).reshape(2, 3) for i in (0, 6))
    exact = -(a.double() * lp.double()).sum(-1).mean()
    for loss_fn in (lambda: O.reinforce_loss(lp, a), lambda: O.group_pg_loss(lp, a)):
        if math.isfinite(exact.to(F32).item()):
            assert loss_fn().item() == exact.to(F32).item()
        else:
            with pytest.raises(ValueError, match="overflows float32"):
                loss_fn()


# ---------------------------------------------------------------------------------------------
# dg_gate and dg_loss
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# onehot_advantage_scores and cross_entropy_loss
# ---------------------------------------------------------------------------------------------
def test_onehot_scores_and_cross_entropy():
    probs = t([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    s = O.onehot_advantage_scores(torch.tensor([1, 2]), t([1.0, 0.0]), probs)
    assert torch.allclose(s, t([[0.0, 0.5, 0.0], [0.0, 0.0, -0.38]]))
    logits = t([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    ce = O.cross_entropy_loss(logits, torch.tensor([0, 2]))
    assert torch.allclose(ce, -torch.log_softmax(logits, -1)[[0, 1], [0, 2]].mean())


@pytest.mark.parametrize("actions", [
    t([0.0, 2.7]), t([0.0, 2.0]), torch.tensor([True, False]), torch.tensor([0, -1]), torch.tensor([0, 3]),
])
def test_onehot_actions_are_validated_not_truncated(actions):
    probs = t([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    with pytest.raises(ValueError, match="actions"):
        O.onehot_advantage_scores(actions, t([1.0, 0.0]), probs)
    for dtype in (torch.uint8, torch.int32, torch.int64):
        s = O.onehot_advantage_scores(torch.tensor([1, 2], dtype=dtype), t([1.0, 0.0]), probs)
        assert torch.allclose(s, t([[0.0, 0.5, 0.0], [0.0, 0.0, -0.38]]))


def test_onehot_probs_must_be_probabilities():
    with pytest.raises(ValueError, match="probs"):
        O.onehot_advantage_scores(torch.tensor([0]), t([1.0]), t([[-0.5, 1.5]]))


@pytest.mark.parametrize("labels", [
    t([0.0, 2.7]), t([0.0, 2.0]), torch.tensor([True, False]), torch.tensor([0, -1]), torch.tensor([0, 3]),
    torch.tensor([0, 2**40]),
])
def test_cross_entropy_labels_are_validated_not_truncated(labels):
    logits = t([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    with pytest.raises(ValueError, match="labels"):
        O.cross_entropy_loss(logits, labels)


def test_cross_entropy_accepts_every_integer_dtype_and_ignores_masked_labels():
    logits = t([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 1.0, 1.0]])
    ref = O.cross_entropy_loss(logits[:2], torch.tensor([0, 2]))
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        assert torch.allclose(O.cross_entropy_loss(logits[:2], torch.tensor([0, 2], dtype=dtype)), ref)
    mask = torch.tensor([True, True, False])
    assert torch.allclose(O.cross_entropy_loss(logits, torch.tensor([0, 2, -100]), mask), ref)
    assert torch.allclose(O.cross_entropy_loss(logits, torch.tensor([0, 2, 7]), mask), ref)
    lg = torch.where(mask.unsqueeze(-1), logits, math.nan).requires_grad_(True)
    loss = O.cross_entropy_loss(lg, torch.tensor([0, 2, -100]), mask)
    loss.backward()
    assert torch.allclose(loss, ref) and torch.equal(lg.grad[2], torch.zeros(3))
    with pytest.raises(ValueError, match="mask"):
        O.cross_entropy_loss(logits, torch.tensor([0, 2, 0]), torch.ones(2, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        O.cross_entropy_loss(logits, torch.tensor([0, 2, 0]), torch.ones(3))
    full = torch.zeros(3, dtype=torch.bool)
    lg = logits.clone().requires_grad_(True)
    loss = O.cross_entropy_loss(lg, torch.tensor([0, 2, 0]), full)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lg.grad, torch.zeros(3, 3))


# ---------------------------------------------------------------------------------------------
# every objective: bad input is refused early with a ValueError naming the argument
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eta", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_eta_raises(eta):
    with pytest.raises(ValueError, match="eta"):
        O.tpo_target(t([0.0, 1.0]), t([1.0, -1.0]), eta=eta)
    with pytest.raises(ValueError, match="eta"):
        O.group_pg_loss(t([0.0, 1.0]), t([1.0, -1.0]), eta=eta)
    with pytest.raises(ValueError, match="eta"):
        O.dg_gate(t([0.0, 1.0]), t([-1.0, -1.0]), eta=eta)


def test_scalar_arguments_use_the_shared_validation_messages():
    with pytest.raises(ValueError, match=r"eta must be a finite number > 0"):
        O.tpo_target(t([0.0, 1.0]), t([1.0, -1.0]), eta=0.0)
    with pytest.raises(ValueError, match=r"eta must be a finite number > 0"):
        O.dg_loss(t([0.0, 1.0]), t([1.0, -1.0]), eta=True)
    with pytest.raises(ValueError, match=r"clip_eps must be a finite number >= 0"):
        O.ppo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([1.0, -1.0]), clip_eps=float("nan"))
    with pytest.raises(ValueError, match=r"beta must be a finite number >= 0"):
        O.grpo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([0.0, 1.0]), beta="0.1")
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        O.grpo_advantages(t([0.0, 1.0]), eps=-1e-8)
    with pytest.raises(ValueError, match="anchor"):
        O.tpo_target(t([0.0, 1.0]), t([1.0, -1.0]), anchor="no")
    with pytest.raises(ValueError, match="mask_zero_variance"):
        O.grpo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([0.0, 1.0]), mask_zero_variance=1)
    with pytest.raises(ValueError, match="clip_eps"):
        O.grpo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([0.0, 1.0]), clip_eps=-0.1)
    with pytest.raises(ValueError, match="beta"):
        O.grpo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([0.0, 1.0]), beta=-1.0)


def _calls():
    """(name of the poisoned argument, function of a dict of arguments, the arguments)."""
    s = t([[1.0, 0.0, 0.5, 2.0], [0.0, 1.0, 0.0, 3.0]])
    lp = _lp(2, 4)
    tok = _lp(2, 4, 3)
    steps = _lp(3, 5)
    adv = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    return [
        ("scores", lambda a: O.standardize_scores(**a), {"scores": s}),
        ("scores", lambda a: O.zero_variance_groups(**a), {"scores": s}),
        ("scores", lambda a: O.grpo_advantages(**a), {"scores": s}),
        ("logp_old", lambda a: O.tpo_target(**a), {"logp_old": lp, "u": s}),
        ("u", lambda a: O.tpo_target(**a), {"logp_old": lp, "u": s}),
        ("logp", lambda a: O.tpo_loss(**a), {"logp": lp, "q": torch.softmax(lp, -1)}),
        ("q", lambda a: O.tpo_loss(**a), {"logp": lp, "q": torch.softmax(lp, -1)}),
        ("rewards", lambda a: O.onehot_advantage_scores(**a),
         {"actions": torch.tensor([0, 3]), "rewards": t([1.0, 0.0]), "probs": lp.exp()}),
        ("probs", lambda a: O.onehot_advantage_scores(**a),
         {"actions": torch.tensor([0, 3]), "rewards": t([1.0, 0.0]), "probs": lp.exp()}),
        ("logp", lambda a: O.grpo_loss(**a), {"logp": lp, "logp_old": lp, "scores": s}),
        ("logp_old", lambda a: O.grpo_loss(**a), {"logp": lp, "logp_old": lp, "scores": s}),
        ("scores", lambda a: O.grpo_loss(**a), {"logp": lp, "logp_old": lp, "scores": s}),
        ("logp", lambda a: O.grpo_loss(**a), {"logp": tok, "logp_old": tok, "scores": s}),
        ("logp_old", lambda a: O.grpo_loss(**a), {"logp": tok, "logp_old": tok, "scores": s}),
        ("rewards", lambda a: O.batch_baseline_advantages(**a), {"rewards": adv}),
        ("logp", lambda a: O.ppo_loss(**a), {"logp": steps, "logp_old": steps, "advantages": adv}),
        ("logp_old", lambda a: O.ppo_loss(**a), {"logp": steps, "logp_old": steps, "advantages": adv}),
        ("advantages", lambda a: O.ppo_loss(**a), {"logp": steps, "logp_old": steps, "advantages": adv}),
        ("logp", lambda a: O.reinforce_loss(**a), {"logp": steps, "advantages": adv}),
        ("advantages", lambda a: O.reinforce_loss(**a), {"logp": steps, "advantages": adv}),
        ("logp", lambda a: O.group_pg_loss(**a), {"logp": lp, "u": s}),
        ("u", lambda a: O.group_pg_loss(**a), {"logp": lp, "u": s}),
        ("advantages", lambda a: O.dg_gate(**a), {"advantages": adv, "logp": steps}),
        ("logp", lambda a: O.dg_gate(**a), {"advantages": adv, "logp": steps}),
        ("logp", lambda a: O.dg_loss(**a), {"logp": steps, "advantages": adv}),
        ("advantages", lambda a: O.dg_loss(**a), {"logp": steps, "advantages": adv}),
        ("logits", lambda a: O.cross_entropy_loss(**a), {"logits": lp, "labels": torch.tensor([0, 3])}),
        ("logp", lambda a: O.k3_kl(**a), {"logp": steps, "logp_ref": steps}),
        ("logp_ref", lambda a: O.k3_kl(**a), {"logp": steps, "logp_ref": steps}),
    ]


CALLS = _calls()
CALL_IDS = [f"{i}-{name}" for i, (name, _, _) in enumerate(CALLS)]


@pytest.mark.parametrize("bad", NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("case", range(len(CALLS)), ids=CALL_IDS)
def test_every_objective_rejects_nonfinite_inputs(case, bad):
    name, fn, args = CALLS[case]
    fn({k: v.clone() for k, v in args.items()})  # the clean call works
    poisoned = {k: v.clone() for k, v in args.items()}
    poisoned[name].view(-1)[1] = bad
    with pytest.raises(ValueError, match=name):
        fn(poisoned)


def test_nonfinite_scores_are_refused_not_read_as_no_signal():
    with pytest.raises(ValueError, match="scores"):
        O.standardize_scores(t([[math.inf, 0.0, 0.0, 1.0]]))
    with pytest.raises(ValueError, match="scores"):
        O.zero_variance_groups(t([[math.inf, 0.0, 0.0, 1.0]]))
    with pytest.raises(ValueError, match="scores"):
        O.standardize_scores(t([0.0, float("nan")]))
    with pytest.raises(ValueError, match="scores"):
        O.grpo_loss(t([0.0, 1.0]), t([0.0, 1.0]), t([float("nan"), 1.0]))


def test_baseline_and_grpo_advantages_reject_nonfinite_and_empty():
    for bad in NONFINITE:
        with pytest.raises(ValueError, match="rewards"):
            O.batch_baseline_advantages(t([[1.0, bad], [0.0, 1.0]]))
        with pytest.raises(ValueError, match="scores"):
            O.grpo_advantages(t([[1.0, bad], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="rewards"):
        O.batch_baseline_advantages(torch.zeros(0, 3))
    with pytest.raises(ValueError, match="scores"):
        O.grpo_advantages(torch.zeros(2, 0))


@pytest.mark.parametrize("case", range(len(CALLS)), ids=CALL_IDS)
@pytest.mark.parametrize("axis", ["first", "last"])
def test_every_objective_rejects_empty_batches(case, axis):
    name, fn, args = CALLS[case]
    empty = {}
    for k, v in args.items():
        if v.ndim == 1 or axis == "first":
            empty[k] = v[:0]
        else:
            empty[k] = v[..., :0]
    with pytest.raises(ValueError, match="empty"):
        fn(empty)


_MULTI = [i for i in range(len(CALLS)) if len(CALLS[i][2]) > 1]  # single-tensor calls: masks checked below


@pytest.mark.parametrize("case", _MULTI, ids=[CALL_IDS[i] for i in _MULTI])
def test_every_objective_rejects_mismatched_shapes(case):
    name, fn, args = CALLS[case]
    bad = {k: v.clone() for k, v in args.items()}
    bad[name] = torch.cat([bad[name], bad[name][:1]], dim=0)
    with pytest.raises(ValueError, match="shape") as err:
        fn(bad)
    assert any(arg in str(err.value) for arg in args if arg != name) or name in str(err.value)


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
    with pytest.raises(ValueError, match="logp_ref"):
        O.k3_kl(t([0.0, -1.0]), t([0.0]))
    with pytest.raises(ValueError, match="advantages"):
        O.dg_gate(t([0.0, -1.0]), t([-1.0]))
    with pytest.raises(ValueError, match="advantages"):
        O.reinforce_loss(t([[0.0, -1.0]]), t([[0.0]]))
    with pytest.raises(ValueError, match="labels"):
        O.cross_entropy_loss(t([[0.0, 1.0]]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="probs"):
        O.onehot_advantage_scores(torch.tensor([0, 1]), t([1.0, 0.0]), t([0.5, 0.5]))
    with pytest.raises(ValueError, match="token_mask"):
        O.grpo_loss(t([[0.0, 1.0]]), t([[0.0, 1.0]]), t([[0.0, 1.0]]), token_mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="token_mask"):
        O.grpo_loss(_lp(1, 2, 3), _lp(1, 2, 3), t([[0.0, 1.0]]), token_mask=torch.ones(1, 2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="logp"):
        O.grpo_loss(_lp(1, 3, 3), _lp(1, 3, 3), t([[0.0, 1.0]]))


def test_k3_kl_and_dg_gate_validate_shapes_and_values():
    with pytest.raises(ValueError, match="shape"):
        O.k3_kl(t([[0.0, -1.0]]), t([0.0, -1.0]))
    with pytest.raises(ValueError, match="logp_ref"):
        O.k3_kl(t([0.0, -1.0]), t([0.0, math.nan]))
    with pytest.raises(ValueError, match="shape"):
        O.dg_gate(t([[1.0, 0.0]]), t([-1.0, -1.0]))
    with pytest.raises(ValueError, match="advantages"):
        O.dg_gate(t([1.0, math.inf]), t([-1.0, -1.0]))
    assert torch.equal(O.k3_kl(t([-1.0, -2.0]), t([-1.0, -2.0])), torch.zeros(2))
    # extreme but finite log-ratios stay finite (clipped at +-20)
    assert torch.isfinite(O.k3_kl(t([-1e300, 0.0]), t([0.0, -1e300]))).all()
    assert torch.isfinite(O.dg_gate(t([1e300, -1e300]), t([-1e300, -1e300]))).all()


def test_type_errors_are_consistent():
    """Wrong kinds of tensors raise TypeError (also a ValueError, as every bad argument)."""
    cases = [
        lambda: O.standardize_scores([0.0, 1.0]),
        lambda: O.standardize_scores(torch.tensor([0, 1])),
        lambda: O.standardize_scores(torch.tensor([True, False])),
        lambda: O.standardize_scores(t([0.0, 1.0]), torch.tensor([1, 1])),
        lambda: O.tpo_loss(t([0.0, 1.0]), torch.tensor([1, 0])),
        lambda: O.k3_kl(torch.tensor([0, 1]), t([0.0, 1.0])),
        lambda: O.cross_entropy_loss(t([[0.0, 1.0]]), [0]),
        lambda: O.onehot_advantage_scores([0], t([1.0]), t([[0.5, 0.5]])),
    ]
    for fn in cases:
        with pytest.raises(TypeError):
            fn()
        with pytest.raises(ValueError):
            fn()


@pytest.mark.parametrize("fn", [
    lambda lp: O.tpo_loss(lp, torch.softmax(t([[0.0, 0.0, 1.0]]), -1)),
    lambda lp: O.tpo_target(lp, t([[1.0, 0.0, -1.0]])),
    lambda lp: O.grpo_loss(lp, t([[-1.0, -1.0, -1.0]]), t([[1.0, 0.0, 2.0]])),
    lambda lp: O.grpo_loss(t([[-1.0, -1.0, -1.0]]), lp, t([[1.0, 0.0, 2.0]])),
    lambda lp: O.group_pg_loss(lp, t([[1.0, 0.0, -1.0]])),
    lambda lp: O.ppo_loss(lp, lp, t([[1.0, 0.0, -1.0]])),
    lambda lp: O.reinforce_loss(lp, t([[1.0, 0.0, -1.0]])),
    lambda lp: O.dg_loss(lp, t([[1.0, 0.0, -1.0]])),
    lambda lp: O.dg_gate(t([[1.0, 0.0, -1.0]]), lp),
    lambda lp: O.k3_kl(lp, t([[-1.0, -1.0, -1.0]])),
])
def test_unmasked_minus_inf_logp_raises(fn):
    """A log-prob of -inf at a valid position (a sampled candidate of probability 0) is an error."""
    lp = t([[-0.5, -math.inf, -1.0]])
    with pytest.raises(ValueError, match="logp"):
        fn(lp)
    fn(t([[-0.5, -1e4, -1.0]]))  # very negative but finite is fine
    mask = torch.tensor([[True, False, True]])
    O.tpo_loss(lp, torch.softmax(t([[0.0, -math.inf, 1.0]]), -1), mask)  # masked is fine


# ---------------------------------------------------------------------------------------------
# every objective: masked entries are ignored, fully masked rows give zero
# ---------------------------------------------------------------------------------------------
MASKED_FNS = [
    lambda m: O.standardize_scores(t([[0.0, 1.0]]), m),
    lambda m: O.zero_variance_groups(t([[0.0, 1.0]]), m),
    lambda m: O.grpo_advantages(t([[0.0, 1.0]]), m),
    lambda m: O.tpo_target(t([[0.0, 1.0]]), t([[0.0, 1.0]]), mask=m),
    lambda m: O.tpo_loss(t([[0.0, 1.0]]), t([[0.5, 0.5]]), m),
    lambda m: O.grpo_loss(t([[0.0, 1.0]]), t([[0.0, 1.0]]), t([[0.0, 1.0]]), mask=m),
    lambda m: O.group_pg_loss(t([[0.0, 1.0]]), t([[0.0, 1.0]]), mask=m),
    lambda m: O.batch_baseline_advantages(t([[0.0, 1.0]]), m),
    lambda m: O.ppo_loss(t([[0.0, 1.0]]), t([[0.0, 1.0]]), t([[0.0, 1.0]]), mask=m),
    lambda m: O.reinforce_loss(t([[0.0, 1.0]]), t([[0.0, 1.0]]), m),
    lambda m: O.dg_loss(t([[0.0, 1.0]]), t([[0.0, 1.0]]), mask=m),
    lambda m: O.dg_gate(t([[0.0, 1.0]]), t([[0.0, 1.0]]), mask=m),
    lambda m: O.k3_kl(t([[0.0, 1.0]]), t([[0.0, 1.0]]), mask=m),
]


@pytest.mark.parametrize("fn", MASKED_FNS)
def test_every_mask_of_the_wrong_shape_or_dtype_raises(fn):
    fn(torch.ones(1, 2, dtype=torch.bool))  # the right mask works
    with pytest.raises(ValueError, match="mask"):
        fn(torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        fn(torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        fn(torch.ones(1, 2))


def _masked_cases():
    """(function of the tensors, {name: tensor}, {name: mask of that tensor}, names with a gradient)."""
    g = torch.Generator().manual_seed(11)
    lp = _lp(3, 4)
    s = torch.randn(3, 4, generator=g)
    m = torch.tensor([[True, True, False, True], [False, False, False, False], [True, False, True, True]])
    tok = _lp(3, 4, 5)
    tm = torch.rand(3, 4, 5, generator=g) > 0.3
    tm[..., 0] = True
    tm[0, 0] = False  # a valid candidate without valid tokens
    full_tm = tm & m.unsqueeze(-1)
    steps = _lp(3, 5)
    adv = torch.randn(3, 5, generator=g)
    sm = torch.tensor([[True, True, True, False, False], [False] * 5, [True] * 5])
    labels = torch.tensor([1, -100, 3])
    row = torch.tensor([True, False, True])
    q = O.tpo_target(lp, O.standardize_scores(s, m), mask=m)
    return {
        "standardize": (lambda a: O.standardize_scores(a["scores"], m), {"scores": s}, {"scores": m}, ()),
        "zero_variance": (lambda a: O.zero_variance_groups(a["scores"], m), {"scores": s}, {"scores": m}, ()),
        "grpo_advantages": (lambda a: O.grpo_advantages(a["scores"], m), {"scores": s}, {"scores": m}, ()),
        "tpo_target": (lambda a: O.tpo_target(a["logp_old"], a["u"], mask=m), {"logp_old": lp, "u": s},
                       {"logp_old": m, "u": m}, ()),
        "tpo_loss": (lambda a: O.tpo_loss(a["logp"], a["q"], m), {"logp": lp, "q": q}, {"logp": m, "q": m},
                     ("logp",)),
        "grpo_seq": (lambda a: O.grpo_loss(a["logp"], a["logp_old"], a["scores"], mask=m),
                     {"logp": lp + 0.1, "logp_old": lp, "scores": s}, {"logp": m, "logp_old": m, "scores": m},
                     ("logp",)),
        "grpo_seq_zv": (lambda a: O.grpo_loss(a["logp"], a["logp_old"], a["scores"], mask=m,
                                              mask_zero_variance=True),
                        {"logp": lp + 0.1, "logp_old": lp, "scores": s},
                        {"logp": m, "logp_old": m, "scores": m}, ("logp",)),
        "grpo_token": (lambda a: O.grpo_loss(a["logp"], a["logp_old"], a["scores"], mask=m, token_mask=tm),
                       {"logp": tok + 0.1, "logp_old": tok, "scores": s},
                       {"logp": full_tm, "logp_old": full_tm, "scores": m}, ("logp",)),
        "grpo_token_no_cand_mask": (lambda a: O.grpo_loss(a["logp"], a["logp_old"], a["scores"], token_mask=tm),
                                    {"logp": tok + 0.1, "logp_old": tok, "scores": s},
                                    {"logp": tm, "logp_old": tm}, ("logp",)),
        "group_pg": (lambda a: O.group_pg_loss(a["logp"], a["u"], mask=m), {"logp": lp, "u": s},
                     {"logp": m, "u": m}, ("logp",)),
        "batch_baseline": (lambda a: O.batch_baseline_advantages(a["rewards"], sm), {"rewards": adv},
                           {"rewards": sm}, ()),
        "ppo": (lambda a: O.ppo_loss(a["logp"], a["logp_old"], a["advantages"], mask=sm),
                {"logp": steps + 0.3, "logp_old": steps, "advantages": adv},
                {"logp": sm, "logp_old": sm, "advantages": sm}, ("logp",)),
        "reinforce": (lambda a: O.reinforce_loss(a["logp"], a["advantages"], sm),
                      {"logp": steps, "advantages": adv}, {"logp": sm, "advantages": sm}, ("logp",)),
        "dg": (lambda a: O.dg_loss(a["logp"], a["advantages"], mask=sm), {"logp": steps, "advantages": adv},
               {"logp": sm, "advantages": sm}, ("logp",)),
        "dg_gate": (lambda a: O.dg_gate(a["advantages"], a["logp"], mask=sm), {"logp": steps, "advantages": adv},
                    {"logp": sm, "advantages": sm}, ()),
        "k3_kl": (lambda a: O.k3_kl(a["logp"], a["logp_ref"], mask=sm), {"logp": steps + 0.2, "logp_ref": steps},
                  {"logp": sm, "logp_ref": sm}, ("logp",)),
        "cross_entropy": (lambda a: O.cross_entropy_loss(a["logits"], labels, row), {"logits": lp},
                          {"logits": row.unsqueeze(-1).expand(3, 4)}, ("logits",)),
    }


MASKED = _masked_cases()


@pytest.mark.parametrize("fill", NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", list(MASKED))
def test_masked_entries_are_ignored_whatever_they_hold(name, fill):
    fn, tensors, masks, grad_names = MASKED[name]

    def run(source):
        args = {k: v.clone().requires_grad_(k in grad_names) for k, v in source.items()}
        out = fn(args)
        grads = {}
        if grad_names:
            out.sum().backward()
            grads = {k: args[k].grad for k in grad_names}
        return out, grads

    masks = {k: masks.get(k, torch.ones_like(v, dtype=torch.bool)) for k, v in tensors.items()}
    clean = {k: torch.where(masks[k], v, torch.zeros(())) for k, v in tensors.items()}
    dirty = {k: torch.where(masks[k], v, torch.full((), fill)) for k, v in tensors.items()}
    out_clean, grad_clean = run(clean)
    out_dirty, grad_dirty = run(dirty)
    assert torch.equal(out_clean, out_dirty)
    if out_dirty.is_floating_point():
        assert torch.isfinite(out_dirty).all()
    for k in grad_names:
        assert torch.isfinite(grad_dirty[k]).all()
        assert torch.equal(grad_dirty[k], grad_clean[k])
        assert torch.equal(grad_dirty[k][~masks[k]], torch.zeros(int((~masks[k]).sum())))


def test_masked_outputs_are_zero():
    _, tensors, masks, _ = MASKED["standardize"]
    m = masks["scores"]
    dirty = torch.where(m, tensors["scores"], torch.full((), math.nan))
    assert torch.equal(O.standardize_scores(dirty, m)[~m], torch.zeros(int((~m).sum())))
    assert torch.equal(O.grpo_advantages(dirty, m)[~m], torch.zeros(int((~m).sum())))
    _, tensors, masks, _ = MASKED["dg_gate"]
    sm = masks["logp"]
    w = O.dg_gate(tensors["advantages"], torch.where(sm, tensors["logp"], -math.inf), mask=sm)
    assert torch.equal(w[~sm], torch.zeros(int((~sm).sum())))
    kl = O.k3_kl(tensors["logp"], tensors["logp"] + 1.0, mask=sm)
    assert torch.equal(kl[~sm], torch.zeros(int((~sm).sum()))) and (kl[sm] > 0).all()


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


_FULLY_MASKED = [
    lambda lp, m: O.ppo_loss(lp, lp.detach(), torch.ones_like(lp), mask=m),
    lambda lp, m: O.reinforce_loss(lp, torch.ones_like(lp), m),
    lambda lp, m: O.dg_loss(lp, torch.ones_like(lp), mask=m),
    lambda lp, m: O.tpo_loss(lp, torch.zeros_like(lp), m),
    lambda lp, m: O.grpo_loss(lp, lp.detach(), torch.ones_like(lp), mask=m),
    lambda lp, m: O.group_pg_loss(lp, torch.ones_like(lp), mask=m),
    lambda lp, m: O.cross_entropy_loss(lp, torch.zeros(lp.shape[:-1], dtype=torch.long), m[..., 0]),
]


@pytest.mark.parametrize("fn,shape", [(fn, shape) for fn in _FULLY_MASKED for shape in ((3,), (2, 3))
                                      if shape == (2, 3) or "cross_entropy_loss" not in fn.__code__.co_names])
def test_fully_masked_batch_gives_zero_loss_and_zero_gradient(fn, shape):
    lp = torch.full(shape, -math.inf).requires_grad_(True)
    mask = torch.zeros(shape, dtype=torch.bool)
    loss = fn(lp, mask)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(lp.grad, torch.zeros(shape))


# ---------------------------------------------------------------------------------------------
# every objective: no NaN and no silent wrong value at extreme or wide inputs
# ---------------------------------------------------------------------------------------------
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


def _half_cases():
    """(name, float16 call with an all-True mask, the same inputs in float64 without a mask); values of order 1."""
    g = torch.Generator().manual_seed(12)
    rows = torch.ones(N_HALF, dtype=torch.bool)
    pairs = torch.ones(N_HALF, 2, dtype=torch.bool)
    logits = torch.randn(N_HALF, 4, generator=g, dtype=F32).half()
    labels = torch.randint(0, 4, (N_HALF,), generator=g)
    logp = (-1.0 - torch.rand(N_HALF, generator=g, dtype=F32)).half()
    adv = (1.0 + 0.1 * torch.randn(N_HALF, generator=g, dtype=F32)).half()
    cand = torch.log_softmax(torch.randn(N_HALF, 2, generator=g, dtype=F32) + _f32([2.0, 0.0]), -1).half()
    u = torch.tensor([1.0, -1.0]).expand(N_HALF, 2).half()
    q = torch.softmax(torch.randn(N_HALF, 2, generator=g, dtype=F32), -1).half()
    d = torch.Tensor.double
    return [
        ("cross_entropy", lambda: O.cross_entropy_loss(logits, labels, rows),
         lambda: O.cross_entropy_loss(d(logits), labels)),
        ("reinforce", lambda: O.reinforce_loss(logp, adv, rows), lambda: O.reinforce_loss(d(logp), d(adv))),
        ("dg", lambda: O.dg_loss(logp, adv, mask=rows), lambda: O.dg_loss(d(logp), d(adv))),
        ("group_pg", lambda: O.group_pg_loss(cand, u, mask=pairs), lambda: O.group_pg_loss(d(cand), d(u))),
        ("tpo", lambda: O.tpo_loss(cand, q, pairs), lambda: O.tpo_loss(d(cand), d(q) / d(q).sum(-1, keepdim=True))),
        ("batch_baseline", lambda: O.batch_baseline_advantages(adv, rows),
         lambda: O.batch_baseline_advantages(d(adv))),
    ]


HALF_CASES = _half_cases()


@pytest.mark.parametrize("case", range(len(HALF_CASES)), ids=[name for name, _, _ in HALF_CASES])
def test_float16_masked_reductions_are_computed_wide(case):
    """Sums and counts of more than 65,504 float16 entries: an all-True mask changes nothing."""
    _, half, wide = HALF_CASES[case]
    got, ref = half(), wide()
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), ref, rtol=2e-3, atol=2e-3)


LOSS_ARGS = ("logp", "logp_old", "advantages", "u", "eta", "beta", "scores", "logits", "q")


def _extreme_call(name: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, lp: torch.Tensor):
    """The loss ``name`` on [2, 3] float32 inputs built from a, b, c, differentiable in lp."""
    if name == "reinforce":
        return O.reinforce_loss(lp, a)
    if name == "dg":
        return O.dg_loss(lp, a, eta=1.0)
    if name == "ppo":
        return O.ppo_loss(lp, b, a)
    if name == "group_pg":
        return O.group_pg_loss(lp, a, eta=1e-3)
    if name == "grpo":
        return O.grpo_loss(lp, b, a, beta=1e38)
    if name == "tpo":
        return O.tpo_loss(lp, torch.softmax(b, -1))
    return O.cross_entropy_loss(lp, torch.tensor([0, 2]))


@pytest.mark.parametrize("name", ["reinforce", "dg", "ppo", "group_pg", "grpo", "tpo", "cross_entropy"])
@settings(max_examples=60, deadline=None)
@given(data=st.lists(extreme32, min_size=18, max_size=18))
@example(data=[1e30, -1e30] * 3 + [-30.0] + [0.0] * 5 + [3e38, -3e38, -1e9, 3e38, 0.0, -3e38])
def test_extreme_finite_inputs_give_a_finite_loss_and_gradient_or_a_named_error(name, data):
    a, b, c = (_f32(data[i:i + 6]).reshape(2, 3) for i in (0, 6, 12))
    lp = c.clone().requires_grad_(True)
    try:
        loss = _extreme_call(name, a, b, c, lp)
    except ValueError as err:
        assert any(arg in str(err) for arg in LOSS_ARGS), err
        return
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all(), (loss, lp.grad)


# ---------------------------------------------------------------------------------------------
# deferred_checks: one read-back per update on a GPU
# ---------------------------------------------------------------------------------------------
def test_deferred_checks_raise_the_same_error_at_the_end_of_the_block() -> None:
    from tpo_gym.objectives import deferred_checks

    logp = torch.log_softmax(torch.randn(3, 4), -1)
    logp[1, 2] = float("nan")
    q = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError) as now:
        O.tpo_loss(logp, q)
    reached = []
    with pytest.raises(ValueError) as later:
        with deferred_checks(force=True):
            O.tpo_loss(logp, q)  # queued, not raised
            reached.append(True)
    assert reached == [True] and str(later.value) == str(now.value) and "index (1, 2)" in str(now.value)
    with deferred_checks(force=True):  # valid inputs: nothing raised
        O.tpo_loss(torch.log_softmax(torch.randn(3, 4), -1), q)
    with pytest.raises(ValueError, match="q must be a target distribution"), deferred_checks(force=True):
        O.tpo_loss(torch.log_softmax(torch.randn(3, 4), -1), q - 1)
    with deferred_checks(), pytest.raises(ValueError, match="must be finite"):  # CPU: immediate unless forced
        O.tpo_loss(logp, q)


def test_an_error_inside_deferred_checks_propagates_and_the_queue_is_dropped() -> None:
    from tpo_gym.objectives import deferred_checks

    bad = torch.tensor([[float("inf"), 0.0]])
    with pytest.raises(KeyError), deferred_checks(force=True):
        O.tpo_loss(bad, torch.tensor([[0.5, 0.5]]))
        raise KeyError("first")
    O.tpo_loss(torch.log_softmax(torch.zeros(1, 2), -1), torch.tensor([[0.5, 0.5]]))  # no stale queue


# ---------------------------------------------------------------------------------------------
# the module
# ---------------------------------------------------------------------------------------------
def test_module_docstring_has_no_path_outside_the_repo():
    assert "SPEC.md" not in (O.__doc__ or "")
    assert "../" not in (O.__doc__ or "")
