"""GRPO's objectives: the group-relative advantages, the k3 KL and the clipped loss (the package docstring has
the conventions)."""

from __future__ import annotations

import functools

import torch

from tpo_gym._validation import check_bool, check_float
from tpo_gym.objectives._checks import (
    _LOGP_HINT,
    _WIDE,
    _as_tensor,
    _check_mask,
    _check_same_shape,
    _clipped_surrogate,
    _fits,
    _group_mean,
    _group_stats,
    _log_ratio,
    _valid_values,
    _where,
)

__all__ = ["zero_variance_groups", "grpo_advantages", "k3_kl", "kl_penalty", "grpo_loss"]


def zero_variance_groups(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Boolean ``[...]``: the zero-variance groups, :math:`\sigma(s) \le \tau \max_i |s_i|`.

    :math:`\tau = \max(10^{-6}, \varepsilon_{dtype}/2)`, the rule of the module docstring over the
    valid candidates: exactly the groups to which :func:`~tpo_gym.objectives.standardize_scores` and
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
    REINFORCE (:func:`~tpo_gym.objectives.reinforce_loss` on :math:`A`). Ratios and KL are computed in float32 or
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

