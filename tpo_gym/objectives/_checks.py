r"""The objectives of TPO and of every baseline, as small pure torch functions.

Every agent and every experiment of tpo-gym calls these functions; none keeps a second copy of
the math. Each docstring states the equation it implements: TPO's group standardisation, target
and cross-entropy fit as the TPO paper (Target Policy Optimization, arXiv 2604.06159) defines them
in its method, the baselines (GRPO and its variants, PPO, REINFORCE, Group PG, the CE oracle) as
that paper runs them in its experiments, and DG as Osband 2026 ("Delightful Policy Gradient",
arXiv 2603.14608) defines it.

Conventions
-----------
* A **group** is the last dimension ``K`` of a tensor shaped ``[..., K]``: the K scored candidates
  of one context (K actions of a bandit, K next tokens of a prefix state, K completions of a
  prompt). Leading dimensions ``...`` index groups and are averaged over.
* ``mask`` (optional, boolean, same shape) marks *valid* candidates; ``False`` entries are padding.
  Padding is **ignored whatever it holds** (0, NaN, ``-inf`` log-probs, ...): masked entries are
  replaced (``torch.where``, never a multiplication by 0) before any arithmetic, so they receive
  zero target mass, zero advantage and an exactly zero, finite gradient, and the result equals
  the one for the same batch with the masked entries set to 0.
* **Means over rows.** Group losses (:func:`tpo_loss`, :func:`grpo_loss`, :func:`group_pg_loss`)
  sum over the candidates of a group and average over the groups with at least one valid
  candidate. Per-step losses (:func:`ppo_loss`, :func:`reinforce_loss`, :func:`dg_loss`) take
  ``[B, T]`` tensors (``T`` steps of ``B`` trajectories; a 1-D ``[B]`` tensor is ``B`` one-step
  trajectories), sum over the valid steps of a trajectory and average over the trajectories
  with at least one valid step. :func:`cross_entropy_loss` averages over its valid rows. A fully
  masked group, trajectory or row contributes nothing; a fully masked batch gives a loss of 0
  with a zero gradient (never NaN).
* **Wide arithmetic.** Every sum, count and mean of a reduction, and every product of a loss
  (advantage times log-prob, ``u / eta`` times log-prob, ratio times advantage), is computed in
  float64 whatever the input dtype (a float16 batch of more than 65,504 groups, or an all-True
  mask, is exact), and the result comes back in the inputs' dtype (float32 or wider for the
  ratio-based :func:`ppo_loss` and :func:`grpo_loss`). So finite inputs never give NaN: a loss
  whose value or gradient weights lie beyond the range of that dtype is refused with a
  ``ValueError`` saying which inputs to shrink (see each function), never returned as ``inf``.
* ``logp`` are log-probabilities of the chosen candidates under the current policy (for a
  sequence, the sum of its token log-probs, no length normalisation); ``logp_old`` the same under
  the rollout-time snapshot ``pi_old``.
* **Zero-variance groups.** A group carries no signal (``u = 0``, GRPO advantage 0) when the
  population standard deviation of its valid scores is at most a tolerance *relative to their
  magnitude*:

  .. math::
      \sigma(s) \le \tau \cdot \max_i |s_i|, \qquad
      \tau = \max\big(\mathrm{STD\_EPS},\ \varepsilon_{\mathrm{dtype}} / 2\big),

  with :data:`STD_EPS` ``= 1e-6`` and :math:`\varepsilon_{\mathrm{dtype}} / 2` the unit roundoff
  of the scores' dtype (``torch.finfo(dtype).eps / 2``): :math:`\tau = 10^{-6}` for float32 and
  float64, :math:`2^{-11}` for float16, :math:`2^{-8}` for bfloat16. So scores that differ by
  about one unit in the last place of their dtype (rounding noise) carry no signal, and for
  scores of order one (e.g. 0/1 rewards, :math:`\max_i |s_i| = 1`) this is the paper's
  :math:`\sigma(s) \le 10^{-6}`. Being relative, the rule is invariant to scaling (``u(a s) =
  u(s)`` for every ``a > 0``, ``[0, 1e-7, 0, 1e-7]`` gives ``u = [-1, 1, -1, 1]``), and
  ``u(a s + b) = u(s)`` whenever both groups have a relative spread
  :math:`\sigma / \max_i |s_i|` above :math:`\tau`; a shift that makes the spread smaller than
  :math:`\tau` times the magnitude (``[1, 1 + 1e-7, 1]``) removes the signal. The statistics are
  computed in float32 or wider (float16 and bfloat16 are upcast; results come back in the input
  dtype) by a shifted two-pass algorithm: ``d = s - min(s)`` over the valid scores (exactly 0
  for an all-equal group, no cancellation against a large offset), divided by its range before
  squaring (no overflow, no underflow), then centred. An exactly all-equal group, a group with
  fewer than two valid candidates and an all-zero group always have :math:`\sigma = 0` exactly
  and get exactly :math:`u = 0`, whatever the magnitude and dtype. :func:`standardize_scores`,
  :func:`grpo_advantages` and :func:`zero_variance_groups` share this one computation and always
  agree.

Errors
------
Every tensor argument is checked before any arithmetic. A ``ValueError`` naming the argument is
raised for NaN or ``±inf`` at a valid (unmasked) position (a log-probability of ``-inf`` means a
sampled candidate had probability 0: mask it out instead), for an empty tensor (no group, no
trajectory, ``K = 0`` or ``T = 0``), a 0-d tensor, mismatched shapes, labels or actions out of
range. A tensor of the wrong *kind* (not a tensor; an integer or bool dtype where floating point
is needed; a non-bool mask; a non-integer dtype for labels or actions, even 2.0) raises
:class:`InputTypeError`, which is both a ``TypeError`` and a ``ValueError``. Scalar arguments
(``eta``, ``clip_eps``, ``beta``, ``eps``, ``anchor``, ``mask_zero_variance``) are checked by
:mod:`tpo_gym._validation` with its shared messages (``"eta must be a finite number > 0, got
0.0"``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple, NoReturn

import torch
import torch.nn.functional as F

from tpo_gym._validation import check_bool, check_float

__all__ = [
    "STD_EPS",
    "at_least_float32",
    "working_dtype",
    "LOG_RATIO_CLIP",
    "InputTypeError",
    "standardize_scores",
    "tpo_target",
    "tpo_loss",
    "onehot_advantage_scores",
    "grpo_advantages",
    "zero_variance_groups",
    "grpo_loss",
    "kl_penalty",
    "batch_baseline_advantages",
    "ppo_loss",
    "reinforce_loss",
    "group_pg_loss",
    "dg_gate",
    "dg_loss",
    "cross_entropy_loss",
    "k3_kl",
    "deferred_checks",
]

#: Relative zero-variance tolerance: a group whose score std is at most ``STD_EPS * max|s|`` (for
#: float16 / bfloat16 the larger ``finfo(dtype).eps / 2 * max|s|``) carries no signal.
STD_EPS = 1e-6
#: Log-ratios are clipped to ``[-LOG_RATIO_CLIP, LOG_RATIO_CLIP]`` before ``exp``.
LOG_RATIO_CLIP = 20.0
#: The dtype of every loss's per-entry products and of every reduction (sums, counts, means).
_WIDE = torch.float64

_REWARDS_ADVICE = "rewards too large in magnitude for their dtype"
_LOGP_HINT = (
    "; a log-probability of -inf means a sampled candidate had probability 0: mark padding with the mask"
)


class InputTypeError(TypeError, ValueError):
    """A tensor argument of the wrong kind (not a tensor, or a dtype of the wrong kind).

    Both a ``TypeError`` and a ``ValueError``: every bad argument of the objectives is a
    ``ValueError`` that names it.
    """


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
_DEFERRED = threading.local()


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in its working dtype: float32 or wider (bf16 / fp16 are upcast; float32 and float64 stay as they are).

    A policy built in float64 (``torch.set_default_dtype(torch.float64)``) so keeps float64 through rollouts and
    updates, which the golden histories rely on (tests/golden).
    """
    return x.to(torch.promote_types(x.dtype, torch.float32))


def working_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype a module's log-probs are kept in: its first parameter's, float32 or wider
    (:func:`at_least_float32`)."""
    return torch.promote_types(next(module.parameters()).dtype, torch.float32)


@contextlib.contextmanager
def deferred_checks(force: bool = False) -> Iterator[None]:
    """Check the objectives' input *values* once, at the end of the block, instead of call by call.

    Every objective checks that its inputs are finite (where valid), that a target is a distribution
    and that indices are in range; each such check reads a device value back, which on a GPU
    synchronises the device. Inside this block, checks on non-CPU tensors (every check with
    ``force=True``) only queue their device-side flag; leaving the block reads all the flags back at
    once and raises the first failed check's usual ``ValueError``. Checks of shapes, dtypes and
    arguments stay immediate. The agents wrap each update in it; on CPU nothing changes.
    """
    previous = (getattr(_DEFERRED, "queue", None), getattr(_DEFERRED, "force", False))
    queue: list[tuple[torch.Tensor, Callable[[], NoReturn]]] = []
    _DEFERRED.queue, _DEFERRED.force = queue, force
    try:
        yield
    finally:
        _DEFERRED.queue, _DEFERRED.force = previous
    if queue:
        flags = torch.stack([flag.reshape(()).to(queue[0][0].device) for flag, _ in queue])
        if bool(flags.any()):
            queue[int(flags.to(torch.uint8).argmax())][1]()


def _fail_if(bad: torch.Tensor, fail: Callable[[], NoReturn]) -> None:
    """Call ``fail`` (which raises) if the 0-d bool ``bad`` is true: now, or at the end of :func:`deferred_checks`."""
    queue = getattr(_DEFERRED, "queue", None)
    if queue is not None and (bad.device.type != "cpu" or _DEFERRED.force):
        queue.append((bad, fail))
    elif bool(bad):
        fail()


def _as_tensor(name: str, x: torch.Tensor, kind: str = "float") -> torch.Tensor:
    """``x`` if it is a non-empty tensor with at least one dimension of the right dtype kind."""
    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if kind == "float" and not torch.is_floating_point(x):
        raise InputTypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if kind == "int" and (x.dtype == torch.bool or x.is_floating_point() or x.is_complex()):
        raise InputTypeError(
            f"{name} must have an integer dtype (e.g. torch.int64), got dtype {x.dtype}; "
            "convert integral floats with .long()"
        )
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension (the group/time axis), got a scalar")
    if x.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(x.shape)}); it needs at least one group (trajectory) and one "
            "candidate (step)"
        )
    return x


def _check_same_shape(ref_name: str, ref: torch.Tensor, name: str, x: torch.Tensor) -> None:
    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but {ref_name} has shape {tuple(ref.shape)}; they must match"
        )


def _check_mask(
    ref_name: str, ref: torch.Tensor, mask: torch.Tensor | None, name: str = "mask"
) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise InputTypeError(f"{name} must be a boolean torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise InputTypeError(f"{name} must have dtype torch.bool, got {mask.dtype}")
    _check_same_shape(ref_name, ref, name, mask)
    return mask


def _valid_values(name: str, x: torch.Tensor, valid: torch.Tensor | None, hint: str = "") -> torch.Tensor:
    """Check ``x`` is finite where ``valid``; return it with the invalid entries replaced by 0.

    ``torch.where`` (not a product with the mask) keeps whatever the padding holds out of the
    forward and backward passes: the gradient at invalid entries is exactly 0.
    """
    bad = ~torch.isfinite(x)
    if valid is not None:
        bad = bad & valid

    def fail() -> NoReturn:
        first = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{name} must be finite at every valid (unmasked) position, got "
            f"{x[first].item()!r} at index {first} ({int(bad.sum())} non-finite value(s)){hint}"
        )

    _fail_if(bad.any(), fail)
    return x if valid is None else _where(valid, x)


def _where(valid: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` where ``valid``, else 0 (a selection, not a product: NaN / inf in ``x`` never leak)."""
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _over_eta(x: torch.Tensor, eta: float) -> torch.Tensor:
    """``x / eta`` with ``0 / eta = 0`` even where ``eta`` underflows to 0 in the dtype of ``x``."""
    return _where(x != 0, x / eta)


def _exclude(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` with masked entries at ``-inf`` for a softmax over the valid ones.

    A fully masked group gets all zeros instead, so its softmax stays finite (callers zero it).
    """
    pad = torch.where(mask.any(dim=-1, keepdim=True), float("-inf"), 0.0).to(logits.dtype)
    return torch.where(mask, logits, pad)


def _masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """log_softmax over the valid entries of the last axis; masked entries (and fully masked groups) -> 0.

    ``logits`` must already be finite at the valid entries.
    """
    if mask is None:
        return torch.log_softmax(logits, dim=-1)
    return _where(mask, torch.log_softmax(_exclude(logits, mask), dim=-1))


def _group_mean(per_group: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over all entries of ``per_group``; with the boolean ``valid``, over the valid ones only (0 if none).

    Sum, count and quotient in float64 (:data:`_WIDE`), whatever the dtype of ``per_group``.
    """
    per_group = per_group.to(_WIDE)
    if valid is None:
        return per_group.mean()
    return _where(valid, per_group).sum() / valid.sum().clamp(min=1).to(_WIDE)


def _steps_mean(per_step: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Sum over the valid steps of the last (time) axis, mean over trajectories with a valid step, in float64.

    A 1-D input is ``B`` one-step trajectories: the mean over its valid entries.
    """
    per_step = per_step.to(_WIDE)
    if per_step.ndim == 1:
        return _group_mean(per_step, mask)
    if mask is None:
        return per_step.sum(dim=-1).mean()
    return _group_mean(_where(mask, per_step).sum(dim=-1), mask.any(dim=-1))


def _fits(what: str, x: torch.Tensor, dtype: torch.dtype, advice: str) -> torch.Tensor:
    """``x`` (computed in float64) cast to ``dtype``; a ``ValueError`` if an entry is not finite there.

    Finite inputs whose result lies beyond the range of ``dtype`` (or of float64) are refused with
    an error saying which inputs to shrink, never returned as ``inf`` or NaN.
    """
    out = x.to(dtype)
    bad = ~torch.isfinite(out)

    def fail() -> NoReturn:
        first = x[bad].flatten()[0].item()
        raise ValueError(
            f"{what} overflows {str(dtype).removeprefix('torch.')}: got {first:.4g} (computed in float64); {advice}"
        )

    _fail_if(bad.any(), fail)
    return out


# --------------------------------------------------------------------------------------------
# group statistics: the one zero-variance rule
# --------------------------------------------------------------------------------------------
class _GroupStats(NamedTuple):
    """Statistics of each group in the working dtype (float32 or wider), in units of its range.

    ``centred`` ``[..., K]`` is ``(s - mean) / range`` (0 at masked entries) and ``std`` the
    population std in the same unit; ``per_unit`` converts a quantity in the units of the scores
    to that unit (``inf`` for a sub-normal range); ``informative`` is the rule's verdict. All but
    ``centred`` are shaped ``[..., 1]``.
    """

    centred: torch.Tensor
    std: torch.Tensor
    per_unit: torch.Tensor
    informative: torch.Tensor


def _group_stats(scores: torch.Tensor, mask: torch.Tensor | None) -> _GroupStats:
    """Mean, population std and the zero-variance rule of the module docstring, per group.

    Shifted two-pass algorithm: ``d = s - min(s)`` (exactly 0 for an all-equal group, no
    cancellation against a large offset), divided by its range before squaring (no overflow or
    underflow), then centred. Groups with ``max|s|`` above a quarter of the dtype's maximum are
    first scaled by 1/4 (exact), so ``d`` cannot overflow.
    """
    scores = _as_tensor("scores", scores)
    mask = _check_mask("scores", scores, mask)
    work = torch.promote_types(scores.dtype, torch.float32)
    s = _valid_values("scores", scores, mask).to(work)
    valid = torch.ones_like(s, dtype=torch.bool) if mask is None else mask
    zero, one = torch.zeros((), dtype=work, device=s.device), torch.ones((), dtype=work, device=s.device)
    n = valid.sum(dim=-1, keepdim=True).clamp(min=1).to(work)
    magnitude = s.abs().amax(dim=-1, keepdim=True)
    halve = torch.where(magnitude > torch.finfo(work).max / 4, 0.25 * one, one)
    s, magnitude = s * halve, magnitude * halve
    low = torch.where(valid, s, float("inf")).amin(dim=-1, keepdim=True)
    low = torch.where(torch.isfinite(low), low, zero)  # fully masked group
    shifted = torch.where(valid, s - low, zero)  # >= 0; exactly 0 for an all-equal group
    spread = shifted.amax(dim=-1, keepdim=True)
    unit = torch.where(spread > 0, spread, one)
    x = shifted / unit  # in [0, 1]
    centred = torch.where(valid, x - x.sum(dim=-1, keepdim=True) / n, zero)
    std = (centred.square().sum(dim=-1, keepdim=True) / n).sqrt()
    tol = max(STD_EPS, torch.finfo(scores.dtype).eps / 2)
    informative = std > tol * (magnitude / unit)  # sigma(s) > tau * max|s|, in units of the range
    return _GroupStats(centred, std, halve / unit, informative)


# --------------------------------------------------------------------------------------------
# TPO
# --------------------------------------------------------------------------------------------
def standardize_scores(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Within-group z-score of the candidates' scores (TPO paper, method: group standardisation).

    .. math::
        u_i = \frac{s_i - \bar s}{\sigma(s)}, \qquad
        \bar s = \frac1n \sum_j s_j, \quad \sigma(s) = \sqrt{\tfrac1n \sum_j (s_j - \bar s)^2}

    with the *population* standard deviation over the ``n`` valid candidates of each group, and
    :math:`u = 0` for every candidate of a zero-variance group,
    :math:`\sigma(s) \le \tau \max_i |s_i|` with :math:`\tau = \max(10^{-6}, \varepsilon_{dtype}/2)`
    (an all-equal group carries no signal; see the module docstring for the exact rule). Masked
    candidates get :math:`u = 0` whatever they hold. u is invariant to scaling
    :math:`s \mapsto a s,\ a > 0`, and to :math:`s \mapsto a s + b` wherever both groups have a
    relative spread above :math:`\tau`. Statistics in float32 or wider; ``u`` in the dtype of
    ``scores``.

    :param scores: ``[..., K]`` scores ``s``, finite at the valid candidates.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    :return: ``u`` with the shape and dtype of ``scores``.
    """
    stats = _group_stats(scores, mask)
    std = torch.where(stats.informative, stats.std, torch.ones_like(stats.std))
    u = torch.where(stats.informative, stats.centred / std, torch.zeros_like(stats.centred))
    return u.to(scores.dtype)


def tpo_target(
    logp_old: torch.Tensor,
    u: torch.Tensor,
    eta: float = 1.0,
    anchor: bool = True,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""The TPO target distribution over the K candidates of each group (TPO paper, method: target).

    .. math::
        q = \operatorname{softmax}\big(\log\operatorname{softmax}(\ell^{old}) + u / \eta\big),
        \qquad q_i \propto p^{old}_i \, e^{u_i/\eta}

    where :math:`p^{old}` is the snapshot policy renormalised over the valid candidates of the
    group. ``q`` is the unique maximiser of :math:`\sum_i r_i u_i - \eta\,\mathrm{KL}(r \,\|\,
    p^{old})` over the simplex. ``anchor=False`` (the TPO-no-anchor ablation) drops
    :math:`p^{old}`: :math:`q = \operatorname{softmax}(u/\eta)`. The result is detached (the target
    is frozen). ``u / eta`` is taken relative to the group's largest ``u`` (softmax is
    shift-invariant), so a tiny ``eta`` gives the argmax limit instead of an overflow. Masked
    candidates get :math:`q_i = 0` whatever ``logp_old`` and ``u`` hold there (``-inf`` padding is
    fine); a fully masked group gets all zeros.

    :param logp_old: ``[..., K]`` log-probabilities (or logits) of the candidates under pi_old,
        finite at the valid candidates.
    :param u: ``[..., K]`` standardised scores (see :func:`standardize_scores`), finite where valid.
    :param eta: temperature, a finite number > 0 (default 1).
    :param anchor: keep the :math:`p^{old}` anchor (default) or drop it.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    """
    logp_old = _as_tensor("logp_old", logp_old)
    u = _as_tensor("u", u)
    _check_same_shape("logp_old", logp_old, "u", u)
    eta = check_float("eta", eta, minimum=0.0, strict_min=True)
    anchor = check_bool("anchor", anchor)
    mask = _check_mask("logp_old", logp_old, mask)
    logp_old = _valid_values("logp_old", logp_old.detach(), mask, _LOGP_HINT)
    u = _valid_values("u", u.detach(), mask)
    base = _masked_log_softmax(logp_old, mask) if anchor else torch.zeros_like(logp_old)
    top = (u if mask is None else _exclude(u, mask)).amax(dim=-1, keepdim=True)
    shift = _over_eta(u - top, eta)  # <= 0, exactly 0 at the group's best candidate
    # keep every valid logit finite, even where base + shift would underflow to -inf
    logits = (base + shift).clamp(min=torch.finfo(base.dtype).min)
    if mask is None:
        return torch.softmax(logits, dim=-1)
    return _where(mask, torch.softmax(_exclude(logits, mask), dim=-1))


def tpo_loss(logp: torch.Tensor, q: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Cross-entropy from the frozen target ``q`` to the policy over each group (TPO paper, method: loss).

    .. math::
        L = -\frac{1}{G}\sum_{g} \sum_{i=1}^{K} q_{g,i}\,\log\operatorname{softmax}(\ell^\theta_g)_i,
        \qquad \frac{\partial L}{\partial \ell^\theta_{g}} = \frac{1}{G}\,(p^\theta_g - q_g)

    ``q`` is detached. The gradient vanishes when the policy matches the target
    ("self-extinguishing"). It is returned exactly as :math:`(p^\theta - q)/G` (first-order autograd:
    the value is the cross-entropy, the backward pass uses ``p - q`` computed the way
    :func:`tpo_target` computes ``q``), so a group whose target is the policy itself (all-equal
    scores on the first epoch) contributes an exactly zero gradient, not rounding noise. The
    softmax runs over the valid candidates of each group and the mean
    over the ``G`` groups that have at least one valid candidate (0 if there is none); masked
    entries of ``logp`` and ``q`` are ignored whatever they hold.

    ``q`` must be a distribution over the valid candidates of every group with one (a fully masked
    group may hold anything; :func:`tpo_target` gives it zeros): ``q >= 0`` and
    :math:`|\sum_i q_{g,i} - 1| \le n_g\,\varepsilon` with :math:`n_g` its valid candidates and
    :math:`\varepsilon` the machine epsilon of ``q``'s dtype, at least float32's (so a float32 target
    cast up passes); only then is :math:`p - q` the gradient of the value. The value is computed
    in float64 with :math:`0 \cdot \log 0 = 0` (a candidate with :math:`q_i = 0` adds exactly 0, even
    where its log-probability underflows to ``-inf``, e.g. logits ``[3e38, -3e38]``), counts and
    means in float64, and returned in the dtype of ``logp`` and ``q``; a value beyond that dtype's
    range is refused with a ``ValueError``. The gradient is bounded, :math:`|p - q| / G \le 1`.

    :param logp: ``[..., K]`` current log-probabilities (or logits), finite at valid candidates.
    :param q: ``[..., K]`` target from :func:`tpo_target`: finite, >= 0 and summing to 1 over the
        valid candidates of each group.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    """
    logp = _as_tensor("logp", logp)
    q = _as_tensor("q", q)
    _check_same_shape("logp", logp, "q", q)
    mask = _check_mask("logp", logp, mask)
    logp = _valid_values("logp", logp, mask, _LOGP_HINT)
    q = _valid_values("q", q.detach(), mask)
    _check_distribution(q, mask)
    out = torch.promote_types(logp.dtype, q.dtype)
    valid = None if mask is None else mask.any(dim=-1)
    with torch.no_grad():
        log_p = _masked_log_softmax(logp.to(_WIDE), mask)
        per_group = -torch.where(q > 0, q.to(_WIDE) * log_p, torch.zeros((), dtype=_WIDE, device=q.device)).sum(-1)
        value = _fits("tpo_loss", _group_mean(per_group, valid), out,
                      "logp spans too wide a range of log-probabilities for this dtype")
        # the gradient p - q, with p computed exactly as tpo_target computes q from log-probs: where
        # the target is the policy itself (u = 0 and logp == logp_old) the gradient is exactly 0
        base = _masked_log_softmax(logp, mask).clamp(min=torch.finfo(logp.dtype).min)
        p = torch.softmax(base, dim=-1) if mask is None else _where(mask, torch.softmax(_exclude(base, mask), dim=-1))
        weight = p - q if mask is None else _where(mask, p - q)
        n = per_group.numel() if valid is None else valid.sum().clamp(min=1).to(_WIDE)
        weight = weight.to(_WIDE) / n
    # value in the forward pass (the added term is exactly 0), gradient exactly (p - q) / G backward
    return value + (weight * (logp.to(_WIDE) - logp.detach().to(_WIDE))).sum().to(out)


def _check_distribution(q: torch.Tensor, mask: torch.Tensor | None) -> None:
    """``q >= 0`` and each group with a valid candidate sums to 1 within ``n_valid * eps`` (see :func:`tpo_loss`)."""
    def negative_q() -> NoReturn:
        raise ValueError(f"q must be a target distribution (q >= 0), got a minimum of {q.min().item()!r}")

    _fail_if((q < 0).any(), negative_q)
    n = torch.full(q.shape[:-1], q.shape[-1], device=q.device) if mask is None else mask.sum(dim=-1)
    sums = q.to(_WIDE).sum(dim=-1)  # masked entries are 0 already
    eps = max(torch.finfo(q.dtype).eps, torch.finfo(torch.float32).eps)
    off = (n > 0) & ((sums - 1).abs() > n * eps)

    def not_normalised() -> NoReturn:
        first = tuple(off.nonzero()[0].tolist())
        raise ValueError(
            f"q must be a target distribution (q >= 0 summing to 1 over the valid candidates of each group), but "
            f"group {first} sums to {sums[first].item()!r}; {int(off.sum())} group(s) are off by more than "
            f"n_valid * {eps:.3g} (build q with tpo_target)"
        )

    _fail_if(off.any(), not_normalised)


def onehot_advantage_scores(
    actions: torch.Tensor, rewards: torch.Tensor, probs: torch.Tensor
) -> torch.Tensor:
    r"""Scores over *all* actions from one sampled action (TPO on MNIST-style bandits, TPO paper).

    .. math::
        s = A\,\mathrm{onehot}(a), \qquad A = r - \sum_k \pi_k^2

    (:math:`\sum_k \pi_k^2` is the expected reward of a one-correct-arm bandit under pi.) Feed the
    result to :func:`standardize_scores` (over the ``n_actions`` axis) and :func:`tpo_target`. The
    sum runs in float64; an ``A`` beyond the range of the inputs' dtype is refused with a ``ValueError``.

    :param actions: ``[B]`` sampled actions, an integer dtype (bool and float, even integral
        floats, are rejected), each in ``[0, n_actions)``.
    :param rewards: ``[B]`` finite rewards of the sampled actions.
    :param probs: ``[B, n_actions]`` finite, non-negative policy probabilities (treated as constants).
    :return: ``[B, n_actions]`` scores, in the dtype of ``probs``.
    """
    actions = _as_tensor("actions", actions, kind="int")
    rewards = _as_tensor("rewards", rewards)
    probs = _as_tensor("probs", probs).detach()
    if actions.ndim != 1:
        raise ValueError(f"actions must have shape [B], got shape {tuple(actions.shape)}")
    _check_same_shape("actions", actions, "rewards", rewards)
    if probs.ndim != 2 or probs.shape[0] != actions.shape[0]:
        raise ValueError(
            f"probs has shape {tuple(probs.shape)}; expected [B, n_actions] with B = {actions.shape[0]}"
        )
    rewards = _valid_values("rewards", rewards, None)
    probs = _valid_values("probs", probs, None)
    def negative_probs() -> NoReturn:
        raise ValueError(f"probs must be probabilities (>= 0), got a minimum of {probs.min().item()!r}")

    _fail_if((probs < 0).any(), negative_probs)
    n_actions = probs.shape[-1]
    _check_index_range("actions", actions, n_actions, None)
    advantage = rewards.to(_WIDE) - probs.to(_WIDE).pow(2).sum(dim=-1)
    advantage = _fits("onehot_advantage_scores", advantage, torch.promote_types(rewards.dtype, probs.dtype),
                      "rewards or probs too large in magnitude")
    return F.one_hot(actions.long(), n_actions).to(probs.dtype) * advantage.unsqueeze(-1)


def _check_index_range(name: str, index: torch.Tensor, n: int, valid: torch.Tensor | None) -> None:
    bad = (index < 0) | (index >= n)
    if valid is not None:
        bad = bad & valid

    def fail() -> NoReturn:
        first = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"{name} must lie in [0, {n}), got {int(index[first])} at index {first}")

    _fail_if(bad.any(), fail)


# --------------------------------------------------------------------------------------------
# GRPO
# --------------------------------------------------------------------------------------------
def zero_variance_groups(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Boolean ``[...]``: the zero-variance groups, :math:`\sigma(s) \le \tau \max_i |s_i|`.

    :math:`\tau = \max(10^{-6}, \varepsilon_{dtype}/2)`, the rule of the module docstring over the
    valid candidates: exactly the groups to which :func:`standardize_scores` and
    :func:`grpo_advantages` give all zeros. A group with fewer than two valid candidates (fully
    masked included) is zero-variance.

    :param scores: ``[..., K]`` scores, finite at the valid candidates.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    """
    return ~_group_stats(scores, mask).informative.squeeze(-1)


def grpo_advantages(
    scores: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8
) -> torch.Tensor:
    r"""GRPO group-relative advantages.

    .. math::
        A_i = \frac{s_i - \bar s}{\sigma(s) + \epsilon}, \quad \epsilon = 10^{-8},

    population std over the valid candidates; zero-variance groups
    (:math:`\sigma(s) \le \tau \max_i |s_i|`, exactly those of :func:`zero_variance_groups`) get
    :math:`A = 0`; masked candidates get 0 whatever they hold. Statistics in float32 or wider,
    ``A`` in the dtype of ``scores``.

    :param scores: ``[..., K]`` scores, finite at the valid candidates.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    :param eps: the denominator's epsilon, a finite number >= 0 (in the units of the scores).
    """
    eps = check_float("eps", eps, minimum=0.0)
    stats = _group_stats(scores, mask)
    # all in units of the group's range; per_unit may be inf (sub-normal range): skip it for eps = 0
    adv = stats.centred / (stats.std if eps == 0.0 else stats.std + eps * stats.per_unit)
    adv = torch.where(stats.informative, adv, torch.zeros_like(adv))
    return adv.to(scores.dtype)


def _log_ratio(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Clipped ``logp - logp_ref`` in float32 or wider (``e^20`` overflows float16)."""
    wide = torch.promote_types(torch.promote_types(logp.dtype, logp_ref.dtype), torch.float32)
    return (logp.to(wide) - logp_ref.to(wide)).clamp(-LOG_RATIO_CLIP, LOG_RATIO_CLIP)


def _k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    log_ratio = _log_ratio(logp, logp_ref)
    return torch.exp(-log_ratio) + log_ratio - 1.0


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""The k3 estimator of :math:`\mathrm{KL}(\pi_\theta \,\|\, \pi_{ref})` per sample.

    .. math::
        \rho = e^{\mathrm{clip}(\ell^\theta - \ell^{ref}, -20, 20)}, \qquad
        \mathrm{kl} = \rho^{-1} + \log\rho - 1 \;\ge 0

    computed in float32 or wider (the result of float16 / bfloat16 inputs is float32).

    :param logp: log-probs under the current policy, any shape, finite at valid entries.
    :param logp_ref: log-probs under the reference policy, same shape, finite at valid entries.
    :param mask: optional boolean of the same shape; masked entries get ``kl = 0``.
    """
    logp = _as_tensor("logp", logp)
    logp_ref = _as_tensor("logp_ref", logp_ref)
    _check_same_shape("logp", logp, "logp_ref", logp_ref)
    mask = _check_mask("logp", logp, mask)
    logp = _valid_values("logp", logp, mask, _LOGP_HINT)
    logp_ref = _valid_values("logp_ref", logp_ref, mask, _LOGP_HINT)
    kl = _k3(logp, logp_ref)
    return kl if mask is None else _where(mask, kl)


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""The per-token k3 KL to a reference, averaged per completion, then over completions (0-d tensor).

    .. math::
        \mathrm{KL} = \frac1N \sum_{i=1}^{N} \frac{\sum_t m_{i,t}\, \mathrm{kl}_{i,t}}{\max(1, \sum_t m_{i,t})},
        \qquad \mathrm{kl}_{i,t} = e^{\ell^{ref}_{i,t} - \ell^\theta_{i,t}} - (\ell^{ref}_{i,t} - \ell^\theta_{i,t}) - 1

    with :func:`k3_kl` per token (its log-ratio clipped to +-20) and GRPO's ``loss_type="grpo"``
    averaging (TRL's and verl's per-token KL loss). What TPO adds as ``beta * kl_penalty`` (the paper's
    GSM8K recipe, docs/method.md section 7); its gradient per token is
    :math:`(1 - e^{\ell^{ref} - \ell^\theta})\nabla\ell^\theta / (N \sum_t m_{i,t})`. Sums and counts in float64.

    :param logp: ``[N, T]`` token log-probs of the N completions under the policy (with gradient).
    :param logp_ref: ``[N, T]`` under the frozen reference.
    :param token_mask: optional ``[N, T]`` boolean, valid tokens; masked tokens are ignored whatever they hold.
    """
    logp = _as_tensor("logp", logp)
    if logp.ndim != 2:
        raise ValueError(f"kl_penalty needs [N, T] token log-probs, got shape {tuple(logp.shape)}")
    kl = k3_kl(logp, logp_ref, token_mask).to(_WIDE)
    if token_mask is None:
        per_row = kl.mean(dim=-1)
    else:
        per_row = kl.sum(dim=-1) / token_mask.sum(dim=-1).clamp(min=1).to(_WIDE)
    out = torch.promote_types(logp.dtype, torch.float32)
    return per_row.mean().to(out)


def _clipped_surrogate(
    logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> torch.Tensor:
    """``min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` per entry, in float64 (no overflow of ``rho A``)."""
    ratio = torch.exp(_log_ratio(logp, logp_old.detach()).to(_WIDE))
    adv = advantages.detach().to(_WIDE)
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)


def _token_validity(
    logp: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor | None, token_mask: torch.Tensor | None
) -> tuple[bool, torch.Tensor | None]:
    """Whether ``logp`` is token level, and the validity of its entries (candidate and token masks)."""
    if logp.ndim != scores.ndim + 1:
        _check_same_shape("scores", scores, "logp", logp)
        if token_mask is not None:
            raise ValueError("token_mask is only allowed with token-level logp shaped [..., K, T]")
        return False, mask
    if tuple(logp.shape[:-1]) != tuple(scores.shape):
        raise ValueError(
            f"token-level logp has shape {tuple(logp.shape)}; expected scores.shape + (T,) with "
            f"scores.shape = {tuple(scores.shape)}"
        )
    token_mask = _check_mask("logp", logp, token_mask, name="token_mask")
    if mask is None:
        return True, token_mask
    cand = mask.unsqueeze(-1).expand(logp.shape)
    return True, cand if token_mask is None else token_mask & cand


def grpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    scores: torch.Tensor,
    clip_eps: float = 0.2,
    beta: float = 0.04,
    mask: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
    mask_zero_variance: bool = False,
    logp_ref: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""The clipped GRPO objective with a k3 KL penalty to the rollout snapshot (or a reference).

    Sequence level (``logp`` shaped ``[..., K]`` like ``scores``):

    .. math::
        L = -\frac1G \sum_g \sum_{k=1}^{K}\Big[\min\big(\rho_k A_k,\
            \mathrm{clip}(\rho_k, 1-\epsilon, 1+\epsilon) A_k\big) - \beta\,\mathrm{kl}_k\Big],
        \quad \rho_k = e^{\mathrm{clip}(\ell^\theta_k - \ell^{old}_k, -20, 20)},
        \quad \mathrm{kl}_k = \rho_k^{-1} + \log\rho_k - 1

    with :math:`A` from :func:`grpo_advantages`, the sum over the valid candidates and the mean
    over the ``G`` groups with at least one valid candidate. Token level (``logp`` and
    ``logp_old`` shaped ``[..., K, T]`` with an optional ``token_mask``): the bracket is computed
    per token with a per-token ratio and averaged over the valid tokens of each candidate (a
    candidate without valid tokens contributes 0) before the sum over k. Masked candidates and
    tokens are ignored whatever they hold (``-inf`` log-prob padding is fine). ``beta = 0`` is GRPO
    (no KL). ``mask_zero_variance=True`` (GRPO zv-masked) removes the zero-variance groups
    (:func:`zero_variance_groups`) from the loss and averages over informative groups only. With
    ``beta = 0`` and no clipping active the first-epoch gradient equals that of z-scored
    REINFORCE (:func:`reinforce_loss` on :math:`A`). Ratios and KL are computed in float32 or
    wider (``e^{20}`` overflows float16), products, counts and means in float64; the loss comes
    back in the inputs' dtype, float32 or wider. A ``beta`` so large that a per-entry term or the
    value overflows that dtype is refused with a ``ValueError``. ``logp_ref`` (same shape as ``logp``) replaces the KL's
    reference :math:`\ell^{old}` by a frozen reference model's log-probs,
    :math:`\mathrm{kl}_k = e^{\ell^{ref}_k - \ell^\theta_k} + (\ell^\theta_k - \ell^{ref}_k) - 1` (TRL's
    meaning of ``beta``); the ratio :math:`\rho` stays relative to the snapshot.

    :param logp: current log-probs, ``[..., K]`` (sequence) or ``[..., K, T]`` (token level),
        finite at the valid entries.
    :param logp_old: rollout-time log-probs, same shape as ``logp``, finite at the valid entries.
    :param scores: ``[..., K]`` candidate scores, finite at the valid candidates.
    :param clip_eps: clip range epsilon, a finite number >= 0 (default 0.2).
    :param beta: KL coefficient, a finite number >= 0 (default 0.04).
    :param mask: optional ``[..., K]`` boolean, valid candidates.
    :param token_mask: optional ``[..., K, T]`` boolean, valid tokens (token level only).
    :param mask_zero_variance: drop zero-variance groups from the mean.
    :param logp_ref: optional reference log-probs for the KL, same shape as ``logp``.
    """
    logp = _as_tensor("logp", logp)
    logp_old = _as_tensor("logp_old", logp_old)
    scores = _as_tensor("scores", scores)
    _check_same_shape("logp", logp, "logp_old", logp_old)
    clip_eps = check_float("clip_eps", clip_eps, minimum=0.0)
    beta = check_float("beta", beta, minimum=0.0)
    mask_zero_variance = check_bool("mask_zero_variance", mask_zero_variance)
    mask = _check_mask("scores", scores, mask)
    token_level, valid = _token_validity(logp, scores, mask, token_mask)
    logp = _valid_values("logp", logp, valid, _LOGP_HINT)
    logp_old = _valid_values("logp_old", logp_old.detach(), valid, _LOGP_HINT)
    reference = logp_old
    if logp_ref is not None:
        logp_ref = _as_tensor("logp_ref", logp_ref)
        _check_same_shape("logp", logp, "logp_ref", logp_ref)
        reference = _valid_values("logp_ref", logp_ref.detach(), valid, _LOGP_HINT)

    adv = grpo_advantages(scores, mask)
    out = functools.reduce(torch.promote_types, (logp.dtype, logp_old.dtype, reference.dtype, adv.dtype, torch.float32))
    if token_level:
        adv = adv.unsqueeze(-1)
    per_entry = _clipped_surrogate(logp, logp_old, adv, clip_eps) - beta * _k3(logp, reference).to(_WIDE)
    _fits("grpo_loss's per-entry term", per_entry.detach(), out, "beta too large")
    if not token_level:
        per_cand = per_entry
    elif valid is None:
        per_cand = per_entry.mean(dim=-1)
    else:
        per_cand = _where(valid, per_entry).sum(dim=-1) / valid.sum(dim=-1).clamp(min=1).to(_WIDE)
    if mask is not None:
        per_cand = _where(mask, per_cand)
    per_group = -per_cand.sum(dim=-1)
    groups = None if mask is None else mask.any(dim=-1)
    if mask_zero_variance:
        informative = ~zero_variance_groups(scores, mask)
        groups = informative if groups is None else groups & informative
    return _fits("grpo_loss", _group_mean(per_group, groups), out, "beta too large")


# --------------------------------------------------------------------------------------------
# single-sample baselines: PPO, REINFORCE, DG
# --------------------------------------------------------------------------------------------
def batch_baseline_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Per-position batch-mean baseline (PPO, REINFORCE and DG).

    .. math::
        A_{b,t} = r_{b,t} - \frac{1}{|\{b' : m_{b',t}\}|}\sum_{b' : m_{b',t}} r_{b',t}

    Sums, counts and differences in float64, ``A`` in the dtype of ``rewards``; rewards whose
    advantages overflow that dtype (e.g. float16 rewards of both signs near its maximum) are
    refused with a ``ValueError``.

    :param rewards: ``[B, T]`` (or ``[B]``) rewards, finite at the valid entries; the mean runs over
        the batch axis 0 per position, over the valid entries of ``mask`` only.
    :param mask: optional boolean of the same shape; masked entries get ``A = 0`` whatever they hold.
    """
    rewards = _as_tensor("rewards", rewards)
    mask = _check_mask("rewards", rewards, mask)
    r = _valid_values("rewards", rewards, mask).to(_WIDE)
    if mask is None:
        return _fits("batch_baseline_advantages", r - r.mean(dim=0, keepdim=True), rewards.dtype, _REWARDS_ADVICE)
    count = mask.sum(dim=0, keepdim=True).clamp(min=1).to(_WIDE)
    mean = r.sum(dim=0, keepdim=True) / count  # masked entries are 0 already
    return _fits("batch_baseline_advantages", _where(mask, r - mean), rewards.dtype, _REWARDS_ADVICE)


def _check_steps(tensors: dict[str, torch.Tensor], mask: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Validate per-step tensors of one shape and their mask; return them with masked entries 0."""
    (ref_name, ref), *rest = ((n, _as_tensor(n, x)) for n, x in tensors.items())
    for name, x in rest:
        _check_same_shape(ref_name, ref, name, x)
    mask = _check_mask(ref_name, ref, mask)
    return (*(_valid_values(n, x, mask, _LOGP_HINT if n.startswith("logp") else "") for n, x in tensors.items()),
            mask)


def ppo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Critic-free clipped PPO surrogate with a per-token ratio.

    .. math::
        L = -\frac1B \sum_b \sum_t \min\big(\rho_{b,t} A_{b,t},\
            \mathrm{clip}(\rho_{b,t}, 1-\epsilon, 1+\epsilon) A_{b,t}\big),
        \quad \rho = e^{\mathrm{clip}(\ell^\theta - \ell^{old}, -20, 20)}

    No value function, no GAE, no entropy bonus; ``A`` from :func:`batch_baseline_advantages`.
    The sum runs over the valid steps, the mean over the ``B`` trajectories with a valid step.
    The ratio is computed in float32 or wider, the products and means in float64 (advantages near
    :math:`\pm 10^{30}` of mixed sign give no ``inf - inf``); the loss comes back in the dtype of
    the inputs (float32 or wider). Inputs whose value or per-step term :math:`\rho A / B` (the
    gradient of an unclipped step) overflow that dtype, e.g. float32 :math:`|A| > 7 \cdot 10^{29}`
    at a ratio of :math:`e^{20}` with ``B = 1``, are refused with a ``ValueError`` naming ``advantages``.

    :param logp: ``[B, T]`` (or ``[B]``) current log-probs of the taken actions, finite where valid.
    :param logp_old: rollout-time log-probs, same shape, finite where valid.
    :param advantages: same shape, finite where valid.
    :param clip_eps: clip range epsilon, a finite number >= 0 (default 0.2).
    :param mask: optional boolean, valid steps; masked entries are ignored whatever they hold.
    """
    logp, logp_old, advantages, mask = _check_steps(
        {"logp": logp, "logp_old": logp_old, "advantages": advantages}, mask
    )
    clip_eps = check_float("clip_eps", clip_eps, minimum=0.0)
    out = functools.reduce(torch.promote_types, (logp.dtype, logp_old.dtype, advantages.dtype, torch.float32))
    advice = "advantages too large in magnitude for the ratio exp(logp - logp_old)"
    per_step = _clipped_surrogate(logp, logp_old, advantages, clip_eps)
    if mask is None:
        n = per_step.numel() if per_step.ndim == 1 else per_step[..., 0].numel()
    else:
        n = (mask if mask.ndim == 1 else mask.any(dim=-1)).sum().clamp(min=1).to(_WIDE)
    _fits("ppo_loss's gradient rho * A / B", per_step.detach() / n, out, advice)
    return _fits("ppo_loss", -_steps_mean(per_step, mask), out, advice)


def reinforce_loss(
    logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""REINFORCE / policy gradient with a baseline.

    .. math::
        L = -\frac1B \sum_b \sum_t A_{b,t}\,\log\pi_\theta(a_{b,t})

    ``A`` is detached: e.g. :func:`batch_baseline_advantages`, or :math:`r - \sum_k\pi_k^2` on
    MNIST, or group z-scores (then it is "z-scored REINFORCE"). The sum runs over the valid steps,
    the mean over the ``B`` trajectories with a valid step. Products and means are computed in
    float64 (advantages near :math:`\pm 10^{30}` of mixed sign give no ``inf - inf``); the loss comes
    back in the dtype of ``logp`` and ``advantages``, and a value beyond its range is refused with
    a ``ValueError``. The gradient :math:`-A/B` is always finite.

    :param logp: ``[B, T]`` (or ``[B]``) log-probs of the taken actions, finite where valid.
    :param advantages: same shape, finite where valid.
    :param mask: optional boolean, valid steps; masked entries are ignored whatever they hold.
    """
    logp, advantages, mask = _check_steps({"logp": logp, "advantages": advantages}, mask)
    out = torch.promote_types(logp.dtype, advantages.dtype)
    value = -_steps_mean(advantages.detach().to(_WIDE) * logp.to(_WIDE), mask)
    return _fits("reinforce_loss", value, out, "advantages or logp too large in magnitude")


def group_pg_loss(
    logp: torch.Tensor, u: torch.Tensor, eta: float = 1.0, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Group PG: TPO's candidates and scores, scalar weighting instead of target matching.

    .. math::
        L = -\frac1G \sum_g \sum_{k=1}^{K} \frac{u_{g,k}}{\eta}\,\ell^\theta_{g,k}

    The sum runs over the valid candidates, the mean over the ``G`` groups with a valid candidate.
    ``u / eta``, the products and the means are computed in float64 (no ``inf - inf`` from large
    ``u`` of mixed sign, no ``0 / 0`` from a tiny ``eta``); the loss comes back in the dtype of
    ``logp`` and ``u``. Inputs whose weights :math:`u/\eta` (the gradient, up to :math:`1/G`) or
    whose value overflow that dtype (e.g. ``eta=1e-40`` with float32 ``u`` of order 1) are refused
    with a ``ValueError`` naming ``eta`` and ``u``; ``u = 0`` gives 0 for every ``eta``.

    :param logp: ``[..., K]`` log-probs of the candidates, finite at the valid candidates.
    :param u: ``[..., K]`` standardised scores (detached), finite at the valid candidates.
    :param eta: temperature, a finite number > 0 (default 1).
    :param mask: optional ``[..., K]`` boolean, valid candidates; masked entries are ignored.
    """
    logp = _as_tensor("logp", logp)
    u = _as_tensor("u", u)
    _check_same_shape("logp", logp, "u", u)
    eta = check_float("eta", eta, minimum=0.0, strict_min=True)
    mask = _check_mask("logp", logp, mask)
    logp = _valid_values("logp", logp, mask, _LOGP_HINT)
    u = _valid_values("u", u.detach(), mask)
    out = torch.promote_types(logp.dtype, u.dtype)
    advice = f"use a larger eta (got {eta!r}) or smaller u"
    weight = u.to(_WIDE) / eta
    _fits("group_pg_loss's weight u / eta", weight, out, advice)
    per_group = -(weight * logp.to(_WIDE)).sum(dim=-1)
    return _fits("group_pg_loss", _group_mean(per_group, None if mask is None else mask.any(dim=-1)), out,
                 advice + " or logp")


def _gate(advantages: torch.Tensor, logp: torch.Tensor, eta: float) -> torch.Tensor:
    """``sigmoid(A * -logp / eta)`` in float64: the product of two large finite inputs does not saturate it."""
    return torch.sigmoid(_over_eta(advantages.detach().to(_WIDE) * -logp.detach().to(_WIDE), eta))


def dg_gate(
    advantages: torch.Tensor, logp: torch.Tensor, eta: float = 1.0, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""The Delightful Policy Gradient gate (Osband 2026), detached.

    .. math::
        w = \sigma\!\left(\frac{A \cdot \ell}{\eta}\right), \qquad \ell = -\log\pi(a)
        \ \text{(surprisal)},\qquad w \in [0, 1]

    computed in float64 (``A`` near ``1e30`` times a surprisal near ``1e9`` over a large ``eta`` gives
    the exact gate, not a saturated 0 or 1) and returned in the inputs' dtype.

    :param advantages: advantages ``A``, any shape, finite at the valid entries.
    :param logp: log-probs of the taken actions, same shape, finite at the valid entries.
    :param eta: temperature, a finite number > 0 (default 1).
    :param mask: optional boolean of the same shape; masked entries get ``w = 0``.
    """
    advantages, logp, mask = _check_steps({"advantages": advantages, "logp": logp}, mask)
    eta = check_float("eta", eta, minimum=0.0, strict_min=True)
    w = _gate(advantages, logp, eta).to(torch.promote_types(advantages.dtype, logp.dtype))
    return w if mask is None else _where(mask, w)


def dg_loss(
    logp: torch.Tensor, advantages: torch.Tensor, eta: float = 1.0, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Delightful Policy Gradient (Osband 2026). Use with one optimiser step per batch.

    .. math::
        L = -\frac1B \sum_b \sum_t \mathrm{sg}\big(w_{b,t} A_{b,t}\big)\log\pi_\theta(a_{b,t}),
        \qquad w = \sigma\big(A\cdot(-\log\pi(a))/\eta\big)

    The sum runs over the valid steps, the mean over the ``B`` trajectories with a valid step.
    Products and means in float64 and the result in the inputs' dtype, as :func:`reinforce_loss`
    (a value beyond its range is refused with a ``ValueError``; the gradient is always finite).

    :param logp: ``[B, T]`` (or ``[B]``) log-probs of the taken actions, finite where valid.
    :param advantages: same shape, finite where valid.
    :param eta: gate temperature, a finite number > 0 (default 1).
    :param mask: optional boolean, valid steps; masked entries are ignored whatever they hold.
    """
    logp, advantages, mask = _check_steps({"logp": logp, "advantages": advantages}, mask)
    eta = check_float("eta", eta, minimum=0.0, strict_min=True)
    out = torch.promote_types(logp.dtype, advantages.dtype)
    weight = (_gate(advantages, logp, eta).to(_WIDE) * advantages.to(_WIDE)).detach()
    return _fits("dg_loss", -_steps_mean(weight * logp.to(_WIDE), mask), out,
                 "advantages or logp too large in magnitude")


def cross_entropy_loss(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Supervised cross-entropy on the true label: the CE oracle.

    .. math::
        L = -\frac1B \sum_b \log\operatorname{softmax}(z_b)_{y_b}

    the mean over the ``B`` valid rows (0 if there is none). The log-softmax runs in float32 or
    wider, the mean in float64; the loss comes back in the dtype of ``logits``, and a value beyond
    its range (finite logits further apart than the dtype's maximum) is refused with a ``ValueError``.

    :param logits: ``[..., n_actions]`` (e.g. ``[B, n_actions]``), finite at the valid rows.
    :param labels: ``logits.shape[:-1]`` labels of an integer dtype (bool and float dtypes, even
        integral floats, are rejected), in ``[0, n_actions)`` at the valid rows.
    :param mask: optional boolean shaped like ``labels``, rows to include; masked rows are ignored
        whatever their logits and labels hold (e.g. ``-100`` label padding).
    """
    logits = _as_tensor("logits", logits)
    labels = _as_tensor("labels", labels, kind="int")
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"labels has shape {tuple(labels.shape)}; expected logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    mask = _check_mask("labels", labels, mask)
    n_actions = logits.shape[-1]
    _check_index_range("labels", labels, n_actions, mask)
    rows = None if mask is None else mask.unsqueeze(-1).expand(logits.shape)
    logits = _valid_values("logits", logits, rows)
    if mask is not None:
        labels = _where(mask, labels)
    wide = torch.promote_types(logits.dtype, torch.float32)
    per_row = F.cross_entropy(logits.reshape(-1, n_actions).to(wide), labels.reshape(-1).long(), reduction="none")
    return _fits("cross_entropy_loss", _group_mean(per_row.reshape(labels.shape), mask), logits.dtype,
                 "logits too far apart for this dtype")
