"""TPO's objectives: the group standardisation, the target and the cross-entropy fit (the package docstring
has the conventions)."""

from __future__ import annotations

from typing import NoReturn

import torch
import torch.nn.functional as F

from tpo_gym._validation import check_bool, check_float
from tpo_gym.objectives._checks import (
    _LOGP_HINT,
    _WIDE,
    _as_tensor,
    _check_distribution,
    _check_index_range,
    _check_mask,
    _check_same_shape,
    _exclude,
    _fail_if,
    _fits,
    _group_mean,
    _group_stats,
    _masked_log_softmax,
    _over_eta,
    _valid_values,
    _where,
)

__all__ = ["standardize_scores", "tpo_target", "tpo_loss", "onehot_advantage_scores"]


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

