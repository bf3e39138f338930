"""tpo_gym.objectives.listwise against hand-computed numbers: LPO's target and KL fits, MaxRL's and TailRL's
advantages, the published identity TailRL = MaxRL on 0/1 rewards, masks and bad input refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tpo_gym import objectives as O
from tpo_gym.objectives.listwise import lpo_loss, lpo_target, maxrl_advantages, tailrl_advantages


@pytest.fixture(autouse=True, scope="module")
def _float64_default():
    """float64 within this module only (restored after, so other modules' models stay float32)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _v(x: torch.Tensor) -> float:
    return float(x.detach())


def _grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


# ---------------------------------------------------------------------------------------------
# lpo_target
# ---------------------------------------------------------------------------------------------
S = [0.0, 0.0, 1.0, 5.0]  # mean 1.5; population variance (2 * 1.5^2 + 0.5^2 + 3.5^2) / 4 = 4.25


@pytest.mark.parametrize(("tau", "exponents", "by_hand"), [
    # tau = 1: w ∝ e^s = [1, 1, e, e^5] = [1, 1, 2.7182818, 148.4131591], Z = 153.131441
    ("one", [0.0, 0.0, 1.0, 5.0], [0.006530338, 0.006530338, 0.0177513, 0.969188]),
    (1.0, [0.0, 0.0, 1.0, 5.0], [0.006530338, 0.006530338, 0.0177513, 0.969188]),
    # tau = mean = 1.5: w ∝ [1, 1, e^(2/3), e^(10/3)] = [1, 1, 1.947734, 28.0316249], Z = 31.979359
    ("mean", [0.0, 0.0, 2 / 3, 10 / 3], [0.03127017, 0.03127017, 0.06090598, 0.8765537]),
    # tau = std = sqrt(4.25) = 2.0615528: w ∝ [1, 1, e^0.4850713, e^2.4253563] = [1, 1, 1.6242907, 11.3062566],
    # Z = 14.930547
    ("std", [0.0, 0.0, 1 / math.sqrt(4.25), 5 / math.sqrt(4.25)], [0.06697678, 0.06697678, 0.1087898, 0.7572567]),
    # tau = 0.5: w ∝ [1, 1, e^2, e^10] = [1, 1, 7.3890561, 22026.4657948], Z = 22035.854851
    (0.5, [0.0, 0.0, 2.0, 10.0], [4.538059e-05, 4.538059e-05, 0.0003353197, 0.9995739]),
])
def test_lpo_target_on_a_group_worked_by_hand(tau, exponents: list[float], by_hand: list[float]) -> None:
    w = lpo_target(t(S), tau)
    z = sum(math.exp(e) for e in exponents)
    torch.testing.assert_close(w, t([math.exp(e) / z for e in exponents]), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(w, t(by_hand), rtol=1e-6, atol=0)
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-15)


def test_lpo_target_is_tpo_target_with_a_uniform_prior() -> None:
    """tau='std': w = softmax(u), TPO's target with p_old replaced by the uniform distribution (= TPO-no-anchor)."""
    scores = torch.rand(50, 6, generator=torch.Generator().manual_seed(0)).round()
    u = O.standardize_scores(scores)
    w = lpo_target(scores, "std")
    torch.testing.assert_close(w, torch.softmax(u, -1), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(w, O.tpo_target(torch.zeros_like(scores), u, eta=1.0), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(w, O.tpo_target(torch.randn(50, 6), u, eta=1.0, anchor=False), rtol=1e-12,
                               atol=1e-15)


def test_lpo_target_with_tau_mean_has_maxrls_advantages_as_its_exponent() -> None:
    """On 0/1 rewards, (s - mean) / mean is MaxRL's advantage: log w* = A_MaxRL + const."""
    scores = torch.rand(200, 8, generator=torch.Generator().manual_seed(1)).lt(0.3).double()
    w = lpo_target(scores, "mean")
    log_w = torch.log(w)
    torch.testing.assert_close(log_w - log_w.mean(-1, keepdim=True), maxrl_advantages(scores), rtol=1e-10,
                               atol=1e-12)
    # one success of four: logits s / 0.25 = [4, 0, 0, 0]: w = [e^4, 1, 1, 1] / (e^4 + 3) = [0.947914, 0.017362, ...]
    torch.testing.assert_close(lpo_target(t([1.0, 0.0, 0.0, 0.0]), "mean"), t([0.947914, 0.017362, 0.017362,
                                                                              0.017362]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("tau", ["std", "one", "mean", 0.1])
def test_lpo_target_zero_variance_groups_are_exactly_uniform_and_padding_is_ignored(tau) -> None:
    scores = t([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [7.0, 7.0, 7.0 * (1 + 1e-9)], [2.0, 0.0, 5.0]])
    w = lpo_target(scores, tau)
    assert torch.equal(w[:3], torch.full((3, 3), 1 / 3))
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False], [True, True, True]])
    padded = scores.clone()
    padded[0, 2], padded[2, 0] = math.nan, -math.inf
    wm = lpo_target(padded, tau, mask)
    assert torch.equal(wm[0], t([0.5, 0.5, 0.0]))
    assert torch.equal(wm[1], t([1.0, 0.0, 0.0]))  # one valid candidate: no signal, all of w
    assert torch.equal(wm[2], torch.zeros(3))  # a fully masked group
    torch.testing.assert_close(wm[3], w[3], rtol=0, atol=0)
    # a padded group gives the target of the same group without its padding
    g = t([[3.0, 0.5, 1.0, 2.0]])
    torch.testing.assert_close(lpo_target(torch.cat([g, t([[math.nan]])], -1), tau,
                                          torch.tensor([[True] * 4 + [False]]))[..., :4], lpo_target(g, tau))


def test_lpo_target_invariances_and_extremes() -> None:
    s = t([[0.3, 1.2, 0.0, 2.5, 0.7]])
    torch.testing.assert_close(lpo_target(3.0 * s - 7.0, "std"), lpo_target(s, "std"))
    torch.testing.assert_close(lpo_target(1e-200 * s, "mean"), lpo_target(s, "mean"))
    torch.testing.assert_close(lpo_target(1e300 * s, "mean"), lpo_target(s, "mean"))
    hard = lpo_target(s, 1e-300)  # a tiny fixed tau: the argmax limit, no overflow
    assert torch.equal(hard, t([[0.0, 0.0, 0.0, 1.0, 0.0]]))
    wide = lpo_target(t([[-1.7e308, 1.7e308]]), "one")
    assert torch.equal(wide, t([[0.0, 1.0]]))
    for dtype, out in [(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float32)]:
        assert lpo_target(s.to(dtype), "std").dtype == out


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: lpo_target(t([1.0, 0.0]), "median"), ValueError, r"tau must be one of \['std', 'one', 'mean'\]"),
    (lambda: lpo_target(t([1.0, 0.0]), 0.0), ValueError, "tau must be a finite number > 0, got 0.0"),
    (lambda: lpo_target(t([1.0, 0.0]), math.inf), ValueError, "tau must be a finite number > 0"),
    (lambda: lpo_target(t([1.0, 0.0]), True), ValueError, "tau must be a finite number > 0"),
    (lambda: lpo_target(t([1.0, math.nan]), "std"), ValueError, "scores must be finite at every valid"),
    (lambda: lpo_target(t([1.0, -0.5]), "mean"), ValueError, r"scores must be >= 0 .*tau='mean'.*-0.5"),
    (lambda: lpo_target(torch.tensor([1, 0]), "std"), O.InputTypeError, "scores must be a floating-point"),
    (lambda: lpo_target(t([1.0, 0.0]), "std", torch.tensor([1, 0])), O.InputTypeError, "mask must have dtype"),
    (lambda: lpo_target(t([1.0, 0.0]), "std", torch.tensor([True])), ValueError, "mask has shape"),
    (lambda: lpo_target(t(1.0), "std"), ValueError, "scores must have at least one dimension"),
    (lambda: lpo_target(torch.zeros(2, 0), "std"), ValueError, "scores is empty"),
])
def test_lpo_target_refuses_bad_input_by_name(call, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------------------------------------
# lpo_loss
# ---------------------------------------------------------------------------------------------
def test_lpo_loss_on_a_group_worked_by_hand() -> None:
    """logp - logp_old = [log 2, 0]: p = [2/3, 1/3]; target w = [1/2, 1/2].

    forward: KL(w || p) = 0.5 log(0.5 / (2/3)) + 0.5 log(0.5 / (1/3)) = 0.5 log(9/8) = 0.0588915;
             gradient p - w = [1/6, -1/6].
    reverse: KL(p || w) = 2/3 log(4/3) + 1/3 log(2/3) = 0.1917880 - 0.1351550 = 0.0566330;
             d = log p - log w = [log 4/3, log 2/3] = [0.2876821, -0.4054651];
             gradient p (d - KL) = [2/3 * 0.2310491, 1/3 * -0.4620981] = [0.1540327, -0.1540327].
    """
    logp_old = t([-1.0, -0.5])
    logp = (logp_old + t([math.log(2.0), 0.0])).requires_grad_()
    w = t([0.5, 0.5])
    fwd = lpo_loss(logp, logp_old, w, "forward_kl")
    assert _v(fwd) == pytest.approx(0.5 * math.log(9 / 8), rel=1e-12)
    assert _v(fwd) == pytest.approx(0.0588915, abs=1e-7)
    torch.testing.assert_close(_grad(fwd, logp), t([1 / 6, -1 / 6]), rtol=1e-12, atol=1e-15)
    rev = lpo_loss(logp, logp_old, w, "reverse_kl")
    assert _v(rev) == pytest.approx(2 / 3 * math.log(4 / 3) + 1 / 3 * math.log(2 / 3), rel=1e-12)
    assert _v(rev) == pytest.approx(0.0566330, abs=1e-7)
    torch.testing.assert_close(_grad(rev, logp), t([0.1540327, -0.1540327]), rtol=0, atol=1e-7)


def _reference(logp: torch.Tensor, logp_old: torch.Tensor, w: torch.Tensor, fit: str) -> torch.Tensor:
    """The plain KL through autograd (no masks): an independent check of the value and the gradient."""
    log_p = torch.log_softmax(logp - logp_old, -1)
    if fit == "forward_kl":
        kl = (w * (torch.log(w) - log_p)).sum(-1)
    else:
        kl = (log_p.exp() * (log_p - torch.log(w))).sum(-1)
    return kl.mean()


@pytest.mark.parametrize("fit", ["forward_kl", "reverse_kl"])
@pytest.mark.parametrize("tau", ["std", "one", "mean", 0.3])
def test_lpo_loss_value_and_gradient_are_the_kl_and_its_autograd(fit: str, tau) -> None:
    g = torch.Generator().manual_seed(2)
    scores = torch.rand(16, 5, generator=g).round()
    logp_old = torch.log_softmax(torch.randn(16, 5, generator=g), -1)
    logp = (logp_old + 0.3 * torch.randn(16, 5, generator=g)).requires_grad_()
    w = lpo_target(scores, tau)
    loss = lpo_loss(logp, logp_old, w, fit)
    ref = _reference(logp, logp_old, w, fit)
    assert _v(loss) == pytest.approx(_v(ref), rel=1e-10)
    torch.testing.assert_close(_grad(loss, logp), _grad(ref, logp), rtol=1e-9, atol=1e-12)
    if fit == "forward_kl":  # dL/dlogp = (p - w) / G, p = softmax(logp - logp_old)
        p = torch.softmax(logp.detach() - logp_old, -1)
        torch.testing.assert_close(_grad(lpo_loss(logp, logp_old, w, fit), logp), (p - w) / 16, rtol=1e-12,
                                   atol=1e-15)


@pytest.mark.parametrize("tau", ["std", "mean"])
def test_at_the_on_policy_point_forward_is_uniform_minus_target_and_reverse_is_a_group_policy_gradient(tau) -> None:
    """p = 1/n there. forward: (1/n - w) / G; reverse: -(z - mean z) / (n G), z = (s - mean) / tau: the z-scores
    for tau='std' (a GRPO-like direction), MaxRL's advantages for tau='mean'."""
    g = torch.Generator().manual_seed(3)
    scores = torch.rand(30, 6, generator=g).lt(0.4).double()
    logp_old = torch.log_softmax(torch.randn(30, 6, generator=g), -1)
    logp = logp_old.clone().requires_grad_()
    w = lpo_target(scores, tau)
    torch.testing.assert_close(_grad(lpo_loss(logp, logp_old, w, "forward_kl"), logp), (1 / 6 - w) / 30,
                               rtol=1e-12, atol=1e-15)
    advantage = O.standardize_scores(scores) if tau == "std" else maxrl_advantages(scores)
    torch.testing.assert_close(_grad(lpo_loss(logp, logp_old, w, "reverse_kl"), logp), -advantage / (6 * 30),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("fit", ["forward_kl", "reverse_kl"])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.float64])
def test_an_all_equal_group_at_the_on_policy_point_gives_an_exactly_zero_gradient(fit: str, w_dtype) -> None:
    logp_old = torch.log_softmax(torch.randn(4, 3, generator=torch.Generator().manual_seed(4)), -1)
    logp = logp_old.clone().requires_grad_()
    w = lpo_target(t([[1.0, 1.0, 1.0]] * 4).to(w_dtype), "std")
    loss = lpo_loss(logp, logp_old, w, fit)
    assert _v(loss) == 0.0 if w_dtype == torch.float64 else abs(_v(loss)) < 1e-7  # w rounded to float32
    assert torch.equal(_grad(loss, logp), torch.zeros(4, 3))  # p is rounded as w was: exactly p - w = 0


@pytest.mark.parametrize("fit", ["forward_kl", "reverse_kl"])
def test_the_fixed_point_is_pi_old_times_w_which_for_tau_std_is_tpos_target(fit: str) -> None:
    """Both fits vanish at pi_theta ∝ pi_old * w over the group: for tau='std' that is TPO's q ∝ p_old e^u (eta 1),
    so the uniform prior on the ratio side plays the part of TPO's p_old anchor."""
    g = torch.Generator().manual_seed(5)
    scores = torch.rand(10, 5, generator=g).round()
    logp_old = torch.log_softmax(3 * torch.randn(10, 5, generator=g), -1)
    w = lpo_target(scores, "std")
    logp = (logp_old + torch.log(w)).requires_grad_()
    loss = lpo_loss(logp, logp_old, w, fit)
    assert abs(_v(loss)) < 1e-15
    torch.testing.assert_close(_grad(loss, logp), torch.zeros(10, 5), rtol=0, atol=1e-15)
    q = O.tpo_target(logp_old, O.standardize_scores(scores), eta=1.0)
    torch.testing.assert_close(torch.softmax(logp.detach(), -1), q, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("fit", ["forward_kl", "reverse_kl"])
def test_lpo_loss_ignores_padding_whatever_it_holds(fit: str) -> None:
    g = torch.Generator().manual_seed(6)
    scores = t([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    logp_old = torch.log_softmax(torch.randn(2, 4, generator=g), -1)
    logp = (logp_old + 0.2 * torch.randn(2, 4, generator=g))
    w = lpo_target(scores, "std", mask)
    clean = lpo_loss(logp.requires_grad_(), logp_old, w, fit, mask)
    g_clean = _grad(clean, logp)
    dirty_logp = logp.detach().clone()
    dirty_logp[0, 3] = -math.inf
    dirty_old, dirty_w = logp_old.clone(), w.clone()
    dirty_old[0, 3], dirty_w[0, 3] = math.nan, 7.0
    dirty_logp.requires_grad_()
    dirty = lpo_loss(dirty_logp, dirty_old, dirty_w, fit, mask)
    assert _v(dirty) == _v(clean)
    g_dirty = _grad(dirty, dirty_logp)
    assert torch.equal(g_dirty, g_clean) and g_dirty[0, 3] == 0.0
    # the first group alone, without its padding, gives the same per-group KL (weighted 1 of 2 groups)
    alone = lpo_loss(logp.detach()[:1, :3], logp_old[:1, :3], lpo_target(scores[:1, :3], "std"), fit)
    second = lpo_loss(logp.detach()[1:], logp_old[1:], w[1:], fit)
    assert _v(clean) == pytest.approx((_v(alone) + _v(second)) / 2, rel=1e-12)
    empty = lpo_loss(logp.detach().clone().requires_grad_(), logp_old, w, fit, torch.zeros(2, 4, dtype=torch.bool))
    assert _v(empty) == 0.0


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: lpo_loss(t([0.0, 0.0]), t([0.0, 0.0]), t([0.5, 0.5]), "kl"), ValueError, "fit must be one of"),
    (lambda: lpo_loss(t([0.0, math.nan]), t([0.0, 0.0]), t([0.5, 0.5])), ValueError, "logp must be finite"),
    (lambda: lpo_loss(t([0.0, 0.0]), t([0.0, -math.inf]), t([0.5, 0.5])), ValueError, "logp_old must be finite"),
    (lambda: lpo_loss(t([0.0, 0.0]), t([0.0, 0.0]), t([0.5, 0.6])), ValueError, r"w must be a target .*sums to 1.1"),
    (lambda: lpo_loss(t([0.0, 0.0]), t([0.0, 0.0]), t([1.5, -0.5])), ValueError, r"w must be a target .*w >= 0"),
    (lambda: lpo_loss(t([0.0, 0.0]), t([0.0]), t([0.5, 0.5])), ValueError, "logp_old has shape"),
    (lambda: lpo_loss(t([0.0, 0.0]), t([0.0, 0.0]), t([1.0])), ValueError, "w has shape"),
    (lambda: lpo_loss(t([0.0, 0.0]), t([0.0, 0.0]), t([1.0, 0.0]), "reverse_kl"), ValueError,
     r"w is 0 at index \(1,\).*KL\(p \|\| w\) is infinite"),
    (lambda: lpo_loss(t([0.0, 0.0]), t([0.0, 0.0]), torch.tensor([1, 0])), O.InputTypeError, "w must be a float"),
])
def test_lpo_loss_refuses_bad_input_by_name(call, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_lpo_loss_forward_kl_takes_a_target_with_zeros_and_comes_back_in_the_dtype_of_logp() -> None:
    logp = torch.zeros(2, dtype=torch.float32, requires_grad=True)
    loss = lpo_loss(logp, torch.zeros(2, dtype=torch.float32), t([1.0, 0.0]), "forward_kl")
    assert loss.dtype == torch.float32 and _v(loss) == pytest.approx(math.log(2.0))
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([-0.5, 0.5], dtype=torch.float32))


def test_lpo_value_checks_wait_for_the_end_of_deferred_checks() -> None:
    with pytest.raises(ValueError, match="w must be a target"), O.deferred_checks(force=True):
        lpo_loss(t([0.0, 0.0]), t([0.0, 0.0]), t([0.5, 0.6]))
        reached = True
    assert reached


# ---------------------------------------------------------------------------------------------
# maxrl_advantages
# ---------------------------------------------------------------------------------------------
def test_maxrl_on_groups_worked_by_hand() -> None:
    # one success of 4: mean 1/4, A = (1 - 1/4) / (1/4) = 3 and (0 - 1/4) / (1/4) = -1
    assert torch.equal(maxrl_advantages(t([0.0, 1.0, 0.0, 0.0])), t([-1.0, 3.0, -1.0, -1.0]))
    # 3 of 5: (n - m) / m = 2/3 for a success, -1 for a failure
    torch.testing.assert_close(maxrl_advantages(t([1.0, 1.0, 0.0, 1.0, 0.0])), t([2 / 3, 2 / 3, -1.0, 2 / 3, -1.0]))
    # all fail (mean 0: 0 / 0) and all succeed: exactly 0, no NaN
    assert torch.equal(maxrl_advantages(t([[0.0] * 4, [1.0] * 4])), torch.zeros(2, 4))
    # non-binary, non-negative rewards: the same formula; [0.5, 1.5]: mean 1, A = [-0.5, 0.5]
    assert torch.equal(maxrl_advantages(t([0.5, 1.5])), t([-0.5, 0.5]))


def test_maxrl_masks_scale_and_errors() -> None:
    mask = torch.tensor([True, True, False, True])
    a = maxrl_advantages(t([1.0, 0.0, math.nan, 0.0]), mask)
    torch.testing.assert_close(a, t([2.0, -1.0, 0.0, -1.0]))
    torch.testing.assert_close(maxrl_advantages(1e-300 * t([1.0, 0.0, 0.0])), maxrl_advantages(t([1.0, 0.0, 0.0])))
    torch.testing.assert_close(maxrl_advantages(1e300 * t([1.0, 0.0, 0.0])), maxrl_advantages(t([1.0, 0.0, 0.0])))
    assert maxrl_advantages(t([1.0, 0.0]).half()).dtype == torch.float16
    with pytest.raises(ValueError, match=r"rewards must be >= 0 .*MaxRL divides by the group's mean"):
        maxrl_advantages(t([1.0, -1.0]))
    with pytest.raises(ValueError, match="rewards must be finite"):
        maxrl_advantages(t([1.0, math.inf]))
    with pytest.raises(O.InputTypeError, match="mask must have dtype torch.bool"):
        maxrl_advantages(t([1.0, 0.0]), torch.tensor([1.0, 1.0]))


# ---------------------------------------------------------------------------------------------
# tailrl_advantages
# ---------------------------------------------------------------------------------------------
def test_tailrl_on_a_continuous_group_worked_by_hand() -> None:
    """rewards [0.5, 2, 0, 2, 4.5] (n = 5, a tie at 2).

    sorted       0     0.5    2      2      4.5
    gap g_j      -     0.5    1.5    0      2.5
    survivors    5     4      3      2      1
    n g / surv   0     0.625  2.5    0      12.5
    c (cumsum)   0     0.625  3.125  3.125  15.625      mean 22.5 / 5 = 4.5 (= the range)
    A = c - 4.5  -4.5  -3.875 -1.375 -1.375 11.125      back in the candidates' order:
    """
    got = tailrl_advantages(t([0.5, 2.0, 0.0, 2.0, 4.5]))
    assert torch.equal(got, t([-3.875, -1.375, -4.5, -1.375, 11.125]))
    # the reference code's worked example (r_(0) := 0 there; it does not matter after centring)
    assert torch.equal(tailrl_advantages(t([0.0, 1.0, 3.0])), t([-3.0, -1.5, 4.5]))


def test_tailrl_equals_maxrl_on_binary_rewards_over_many_random_groups() -> None:
    """The published identity: on 0/1 rewards TailRL's advantages are MaxRL's, (n - m) / m and -1."""
    g = torch.Generator().manual_seed(7)
    for k in (2, 3, 4, 5, 8, 16, 32):
        for p in (0.05, 0.3, 0.5, 0.9):
            rewards = torch.rand(500, k, generator=g).lt(p).double()
            torch.testing.assert_close(tailrl_advantages(rewards), maxrl_advantages(rewards), rtol=1e-12, atol=1e-12)
            mask = torch.rand(500, k, generator=g).lt(0.8)
            padded = torch.where(mask, rewards, torch.full_like(rewards, math.nan))
            torch.testing.assert_close(tailrl_advantages(padded, mask), maxrl_advantages(padded, mask), rtol=1e-12,
                                       atol=1e-12)
    m, n = 3, 7
    closed = tailrl_advantages(t([1.0] * m + [0.0] * (n - m)))
    torch.testing.assert_close(closed, t([(n - m) / m] * m + [-1.0] * (n - m)), rtol=1e-15, atol=1e-15)


def _threshold_integral(r: list[float]) -> torch.Tensor:
    """TailRL as MaxRL of the 0/1 rewards 1[r >= t], integrated over the thresholds t (an independent form)."""
    v = sorted(r)
    total = torch.zeros(len(r))
    for lo, hi in zip(v[:-1], v[1:], strict=True):
        if hi > lo:  # on (lo, hi] the rollouts at or above t are those with r >= hi
            total += (hi - lo) * maxrl_advantages(t([1.0 if x >= hi else 0.0 for x in r]))
    return total


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-20, max_value=20, allow_nan=False).map(lambda x: round(x, 2)), min_size=2,
                max_size=9))
def test_tailrl_is_maxrl_integrated_over_reward_thresholds(rewards: list[float]) -> None:
    got = tailrl_advantages(t(rewards))
    if len(set(rewards)) == 1:
        assert torch.equal(got, torch.zeros(len(rewards)))
        return
    torch.testing.assert_close(got, _threshold_integral(rewards), rtol=1e-9, atol=1e-9)
    assert abs(float(got.sum())) < 1e-9 * max(1.0, float(got.abs().max()))
    order = sorted(range(len(rewards)), key=lambda i: rewards[i])
    assert all(got[i] <= got[j] + 1e-12 for i, j in zip(order[:-1], order[1:], strict=True))  # monotone
    torch.testing.assert_close(tailrl_advantages(t(rewards) + 3.25), got, rtol=1e-9, atol=1e-9)  # shift-invariant
    torch.testing.assert_close(tailrl_advantages(2.5 * t(rewards)), 2.5 * got, rtol=1e-12, atol=1e-12)


def test_tailrl_zero_variance_groups_masks_and_dtypes() -> None:
    assert torch.equal(tailrl_advantages(t([[3.0, 3.0, 3.0], [0.0, 0.0, 0.0], [5.0, 5.0, 5.0 + 1e-12]])),
                       torch.zeros(3, 3))
    assert torch.equal(tailrl_advantages(t([4.2])), t([0.0]))
    mask = torch.tensor([[True, False, True, True], [False, False, False, False], [True, False, False, False]])
    rewards = t([[0.0, math.nan, 1.0, 3.0], [math.inf, 0.0, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0]])
    assert torch.equal(tailrl_advantages(rewards, mask), t([[-3.0, 0.0, -1.5, 4.5], [0.0] * 4, [0.0] * 4]))
    assert tailrl_advantages(t([0.0, 1.0, 3.0]).float()).dtype == torch.float32
    assert torch.equal(tailrl_advantages(t([0.0, 1.0, 3.0]).half()), t([-3.0, -1.5, 4.5]).half())
    # float64 extremes: c reaches 3e308 unscaled; each group is scaled by a power of two first (exact)
    assert torch.equal(tailrl_advantages(t([-1e308, 5e307, 0.0])), t([-1.5e308, 1.5e308, 0.0]))
    with pytest.raises(ValueError, match="tailrl_advantages overflows float64"):
        tailrl_advantages(t([-1.7e308, 1.7e308]))
    with pytest.raises(ValueError, match="tailrl_advantages overflows float32.*rewards too large"):
        tailrl_advantages(torch.tensor([-3e38, 3e38], dtype=torch.float32))
    with pytest.raises(ValueError, match="rewards must be finite at every valid"):
        tailrl_advantages(t([0.0, math.nan]))
    with pytest.raises(O.InputTypeError, match="rewards must be a floating-point tensor"):
        tailrl_advantages(torch.tensor([0, 1]))
