"""What every objective of :mod:`tpo_gym.objectives` shares: the checks of its inputs, the float64 reductions,
the deferred value checks, the ratio helpers and the one zero-variance rule of the package docstring."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple, NoReturn

import torch

#: Relative zero-variance tolerance: a group whose score std is at most ``STD_EPS * max|s|`` (for
#: float16 / bfloat16 the larger ``finfo(dtype).eps / 2 * max|s|``) carries no signal.
STD_EPS = 1e-6
#: Log-ratios are clipped to ``[-LOG_RATIO_CLIP, LOG_RATIO_CLIP]`` before ``exp``.
LOG_RATIO_CLIP = 20.0
#: The dtype of every loss's per-entry products and of every reduction (sums, counts, means).
_WIDE = torch.float64

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


def _check_index_range(name: str, index: torch.Tensor, n: int, valid: torch.Tensor | None) -> None:
    bad = (index < 0) | (index >= n)
    if valid is not None:
        bad = bad & valid

    def fail() -> NoReturn:
        first = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"{name} must lie in [0, {n}), got {int(index[first])} at index {first}")

    _fail_if(bad.any(), fail)


# --------------------------------------------------------------------------------------------
# ratios (PPO and GRPO)
# --------------------------------------------------------------------------------------------
def _log_ratio(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Clipped ``logp - logp_ref`` in float32 or wider (``e^20`` overflows float16)."""
    wide = torch.promote_types(torch.promote_types(logp.dtype, logp_ref.dtype), torch.float32)
    return (logp.to(wide) - logp_ref.to(wide)).clamp(-LOG_RATIO_CLIP, LOG_RATIO_CLIP)


def _clipped_surrogate(
    logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> torch.Tensor:
    """``min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` per entry, in float64 (no overflow of ``rho A``)."""
    ratio = torch.exp(_log_ratio(logp, logp_old.detach()).to(_WIDE))
    adv = advantages.detach().to(_WIDE)
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)


def _check_distribution(x: torch.Tensor, mask: torch.Tensor | None, name: str = "q", builder: str = "tpo_target"
                        ) -> None:
    """``x >= 0`` and each group with a valid candidate sums to 1 within ``n_valid * eps``: the target distribution
    ``name`` of a fit (TPO's ``q``, LPO's ``w``), which ``builder`` makes."""
    def negative() -> NoReturn:
        raise ValueError(f"{name} must be a target distribution ({name} >= 0), got a minimum of {x.min().item()!r}")

    _fail_if((x < 0).any(), negative)
    n = torch.full(x.shape[:-1], x.shape[-1], device=x.device) if mask is None else mask.sum(dim=-1)
    sums = x.to(_WIDE).sum(dim=-1)  # masked entries are 0 already
    eps = max(torch.finfo(x.dtype).eps, torch.finfo(torch.float32).eps)
    off = (n > 0) & ((sums - 1).abs() > n * eps)

    def not_normalised() -> NoReturn:
        first = tuple(off.nonzero()[0].tolist())
        raise ValueError(
            f"{name} must be a target distribution ({name} >= 0 summing to 1 over the valid candidates of each "
            f"group), but group {first} sums to {sums[first].item()!r}; {int(off.sum())} group(s) are off by more "
            f"than n_valid * {eps:.3g} (build {name} with {builder})"
        )

    _fail_if(off.any(), not_normalised)
