"""The single-sample baselines (PPO, REINFORCE, DG), Group PG and the CE oracle (the package docstring has the
conventions)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from tpo_gym._validation import check_float
from tpo_gym.objectives._checks import (
    _LOGP_HINT,
    _WIDE,
    _as_tensor,
    _check_index_range,
    _check_mask,
    _check_same_shape,
    _clipped_surrogate,
    _fits,
    _group_mean,
    _over_eta,
    _steps_mean,
    _valid_values,
    _where,
)

__all__ = ["batch_baseline_advantages", "ppo_loss", "reinforce_loss", "group_pg_loss", "dg_gate", "dg_loss",
           "cross_entropy_loss"]

_REWARDS_ADVICE = "rewards too large in magnitude for their dtype"


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
