r"""Listwise group objectives beside TPO: LPO's target and KL fits, MaxRL's and TailRL's group advantages.

Pure torch functions, as :mod:`tpo_gym.objectives`, whose conventions they follow exactly: a group is the last
dimension ``K`` of a ``[..., K]`` tensor, ``mask`` marks the valid candidates and padding is ignored whatever it
holds (``torch.where``, never a product with 0), sums, means and products run in float64, a group whose scores
are all equal (the zero-variance rule of :mod:`tpo_gym.objectives`: :math:`\sigma(s) \le \tau \max_i |s_i|`)
carries no signal, and every tensor argument is checked first (NaN / inf at a valid position, shapes, dtypes:
a ``ValueError`` naming the argument).

Sources:

* **LPO** (listwise policy optimisation, arXiv:2605.06139, no public code): the target
  :math:`w^* = \operatorname{softmax}(R / \tau)` over a group with a *uniform* prior, fitted by a forward or a
  reverse KL to the policy side :math:`\operatorname{softmax}(\log \pi_\theta - \log \pi_{old})` over the group
  (uniform at the on-policy point), with :math:`\tau` the group's standard deviation, 1, or its mean.
  :func:`lpo_target`, :func:`lpo_loss`.
* **MaxRL** (Tajwar et al., *Maximum Likelihood Reinforcement Learning*, arXiv:2602.02710):
  :math:`A_i = (r_i - \bar r) / \bar r` on 0/1 rewards, the estimator of :math:`\nabla \log p_\theta` (the
  log pass rate). :func:`maxrl_advantages`.
* **TailRL** (Ramasubramanian et al., *Tail-Likelihood Reinforcement Learning*, arXiv:2609.02987, public code
  github.com/Zanette-Labs/TailRL): sort the group, divide each gap between consecutive rewards by the number
  of rollouts at or above it, accumulate, scale by ``N`` and centre. On 0/1 rewards it is MaxRL exactly.
  :func:`tailrl_advantages`.

MaxRL's and TailRL's advantages are used as Group PG uses its weights:
:func:`tpo_gym.objectives.group_pg_loss` with ``u = A`` and ``eta = 1``.
"""

from __future__ import annotations

from typing import NoReturn

import torch

from tpo_gym._validation import check_choice, check_float
from tpo_gym.objectives._checks import (
    _LOGP_HINT,
    _WIDE,
    _as_tensor,
    _check_distribution,
    _check_mask,
    _check_same_shape,
    _exclude,
    _fail_if,
    _fits,
    _group_mean,
    _valid_values,
    _where,
)
from tpo_gym.objectives.grpo import zero_variance_groups
from tpo_gym.objectives.single import _REWARDS_ADVICE
from tpo_gym.objectives.tpo import standardize_scores

__all__ = ["LPO_TAUS", "LPO_FITS", "lpo_target", "lpo_loss", "maxrl_advantages", "tailrl_advantages"]

#: The named temperatures of :func:`lpo_target` (a finite number > 0 is a fixed temperature).
LPO_TAUS = ("std", "one", "mean")
#: The fits of :func:`lpo_loss`: ``KL(w* || p)`` or ``KL(p || w*)``.
LPO_FITS = ("forward_kl", "reverse_kl")


def _check_tau(tau: str | float) -> str | float:
    """``tau`` as :func:`lpo_target` takes it: one of :data:`LPO_TAUS`, or a finite float > 0."""
    if isinstance(tau, str):
        return check_choice("tau", tau, LPO_TAUS)
    return check_float("tau", tau, 0.0, strict_min=True)


def _check_non_negative(name: str, x: torch.Tensor, valid: torch.Tensor | None, why: str) -> None:
    """A ``ValueError`` naming ``name`` if a valid entry of ``x`` (already finite there) is negative."""
    bad = x < 0
    if valid is not None:
        bad = bad & valid

    def fail() -> NoReturn:
        first = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"{name} must be >= 0 at every valid (unmasked) position ({why}), got "
                         f"{x[first].item()!r} at index {first}")

    _fail_if(bad.any(), fail)


def _power_of_two_scale(x: torch.Tensor) -> torch.Tensor:
    """``[..., 1]`` powers of two ``2^e`` about ``max_i |x_i|`` (1 for an all-zero group): dividing by them is exact and
    brings every group into ``[-2, 2]``, so no sum of a group overflows (``x`` is float64, masked entries 0)."""
    _, exponent = torch.frexp(x.abs().amax(dim=-1, keepdim=True))
    return torch.exp2(exponent.clamp(-1000, 1023).to(x.dtype))


def _masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax over the valid entries of the last axis; masked entries and fully masked groups get 0."""
    if mask is None:
        return torch.softmax(logits, dim=-1)
    return _where(mask, torch.softmax(_exclude(logits, mask), dim=-1))


def _masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """log_softmax over the valid entries of the last axis; masked entries and fully masked groups get 0."""
    if mask is None:
        return torch.log_softmax(logits, dim=-1)
    return _where(mask, torch.log_softmax(_exclude(logits, mask), dim=-1))


# --------------------------------------------------------------------------------------------
# LPO
# --------------------------------------------------------------------------------------------
def lpo_target(scores: torch.Tensor, tau: str | float = "std", mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""LPO's target over the K candidates of each group: a softmax of the scores with a *uniform* prior.

    .. math::
        w^*_i = \frac{e^{(s_i - \bar s)/\tau}}{\sum_j e^{(s_j - \bar s)/\tau}}, \qquad
        \tau = \begin{cases} \sigma(s) & \texttt{"std"} \text{ (GRPO-like: } w^* = \operatorname{softmax}(u)
        \text{, } u \text{ the z-scores)} \\ 1 & \texttt{"one"} \\
        \bar s & \texttt{"mean"} \text{ (MaxRL-like: the exponent is MaxRL's } (s_i - \bar s)/\bar s) \\
        c & \text{a number } c > 0 \end{cases}

    with :math:`\bar s` and :math:`\sigma(s)` the mean and the population standard deviation of the valid scores
    of the group. :math:`w^*` is the maximiser of :math:`\sum_i r_i s_i / \tau + H(r)` over the simplex: TPO's
    target (:func:`~tpo_gym.objectives.tpo_target`) with the uniform distribution in place of :math:`p^{old}`.
    Every valid candidate of a zero-variance group (the rule of :mod:`tpo_gym.objectives`, as
    :func:`~tpo_gym.objectives.standardize_scores`; fewer than two valid candidates included) gets exactly
    :math:`w^*_i = 1/n`; masked candidates get 0 whatever they hold and a fully masked group all zeros.
    ``"std"`` uses :func:`~tpo_gym.objectives.standardize_scores` (so :math:`w^*` is invariant to
    :math:`s \mapsto a s + b`, :math:`a > 0`), ``"mean"`` is invariant to :math:`s \mapsto a s` and needs
    :math:`s \ge 0` (0/1 rewards; an informative group then has :math:`\bar s > 0`). The softmax runs in float64
    relative to the group's largest score (a tiny fixed ``tau`` gives the argmax limit, not an overflow); ``w`` is
    detached and comes back in the dtype of ``scores``, float32 or wider (float16 and bfloat16 are upcast). The
    agents build it from float64 scores, so that a candidate far below the best keeps a positive weight (what
    ``fit="reverse_kl"`` of :func:`lpo_loss` needs).

    :param scores: ``[..., K]`` scores (rewards), finite at the valid candidates; ``>= 0`` for ``tau="mean"``.
    :param tau: ``"std"`` (default), ``"one"``, ``"mean"`` or a finite number > 0.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    :return: ``w`` shaped like ``scores``: >= 0, summing to 1 over the valid candidates of each group.
    """
    tau = _check_tau(tau)
    scores = _as_tensor("scores", scores)
    mask = _check_mask("scores", scores, mask)
    s = _valid_values("scores", scores, mask).detach().to(_WIDE)
    informative = ~zero_variance_groups(scores, mask).unsqueeze(-1)
    out = torch.promote_types(scores.dtype, torch.float32)
    zero = torch.zeros((), dtype=_WIDE, device=s.device)
    if tau == "std":
        u = standardize_scores(scores, mask).detach().to(_WIDE)
        top = (u if mask is None else _exclude(u, mask)).amax(dim=-1, keepdim=True)
        logits = u - top
    else:
        if tau == "mean":
            _check_non_negative("scores", scores, mask, "tau='mean' divides by the group's mean score")
        x = s / _power_of_two_scale(s)  # exact; in [-1, 1]
        top = (x if mask is None else _exclude(x, mask)).amax(dim=-1, keepdim=True)
        if tau == "mean":
            n = x.shape[-1] if mask is None else mask.sum(dim=-1, keepdim=True).clamp(min=1).to(_WIDE)
            mean = x.sum(dim=-1, keepdim=True) / n  # > 0 in an informative group of scores >= 0
            logits = (x - top) / torch.where(informative, mean, torch.ones_like(mean))
        else:
            fixed = 1.0 if tau == "one" else float(tau)
            logits = (s - (s if mask is None else _exclude(s, mask)).amax(dim=-1, keepdim=True)) / fixed
    logits = torch.where(informative, logits, zero)
    # keep every valid logit finite (a huge (s - max) / tau is the argmax limit)
    logits = torch.nan_to_num(logits, nan=0.0, neginf=torch.finfo(_WIDE).min).clamp(min=torch.finfo(_WIDE).min)
    return _masked_softmax(logits, mask).to(out)


def lpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    w: torch.Tensor,
    fit: str = "forward_kl",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""LPO's projection of the policy onto the target ``w`` by a forward or a reverse KL, over each group.

    The policy side is the policy *relative to the snapshot*, renormalised over the group:

    .. math::
        p^\theta_i = \operatorname{softmax}\big(\ell^\theta - \ell^{old}\big)_i
        = \frac{\pi_\theta(y_i) / \pi_{old}(y_i)}{\sum_j \pi_\theta(y_j) / \pi_{old}(y_j)}

    (uniform, :math:`1/n`, at the on-policy point: the K candidates were drawn from :math:`\pi_{old}`), and

    .. math::
        L_{fwd} = \frac1G \sum_g \mathrm{KL}(w_g \,\|\, p^\theta_g), \qquad
        \frac{\partial L_{fwd}}{\partial \ell^\theta_{g,i}} = \frac{1}{G}\,(p^\theta_{g,i} - w_{g,i})

    .. math::
        L_{rev} = \frac1G \sum_g \mathrm{KL}(p^\theta_g \,\|\, w_g), \qquad
        \frac{\partial L_{rev}}{\partial \ell^\theta_{g,i}} = \frac{1}{G}\,p^\theta_{g,i}
        \Big(d_{g,i} - \sum_j p^\theta_{g,j} d_{g,j}\Big), \quad d = \log p^\theta - \log w

    At the on-policy point the forward gradient is :math:`(1/n - w_i)/G` and the reverse one
    :math:`-(z_i - \bar z)/(nG)` with :math:`z` the exponent of :func:`lpo_target` (``"std"``: the z-scores,
    ``"mean"``: MaxRL's advantages): a group policy gradient. The fixed point of both fits is
    :math:`\pi_\theta(y_i) \propto \pi_{old}(y_i)\, w_i` over the group, which for ``tau="std"`` is TPO's target
    :math:`q \propto p^{old} e^{u}` at ``eta=1``: the uniform prior on the ratio side is TPO's anchor.

    The sum runs over the valid candidates, the mean over the ``G`` groups with a valid candidate (0 if none);
    masked entries of every input are ignored whatever they hold. ``w`` is detached and must be a distribution
    over the valid candidates of each group (as :func:`lpo_target` builds it); for the reverse KL it must be
    positive wherever :math:`p^\theta` is (else the loss is infinite: a ``ValueError`` names ``w``). The value
    is the KL itself (0 at the fixed point, :math:`0 \log 0 = 0`), computed in float64 and returned in the dtype
    of ``logp`` and ``logp_old``; the gradient is returned exactly as above (first-order autograd, as
    :func:`~tpo_gym.objectives.tpo_loss`), with :math:`p^\theta` computed as :func:`lpo_target` computes ``w`` and
    rounded to the dtype of ``w``: where the policy equals the target (an all-equal group at the on-policy
    point) the gradient is exactly 0, not rounding noise.

    :param logp: ``[..., K]`` current log-probabilities of the candidates, finite at the valid candidates.
    :param logp_old: ``[..., K]`` rollout-time log-probabilities (detached), finite at the valid candidates.
    :param w: ``[..., K]`` target from :func:`lpo_target`.
    :param fit: ``"forward_kl"`` (default, :math:`\mathrm{KL}(w \| p^\theta)`) or ``"reverse_kl"``
        (:math:`\mathrm{KL}(p^\theta \| w)`).
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    """
    fit = check_choice("fit", fit, LPO_FITS)
    logp = _as_tensor("logp", logp)
    logp_old = _as_tensor("logp_old", logp_old)
    w = _as_tensor("w", w)
    _check_same_shape("logp", logp, "logp_old", logp_old)
    _check_same_shape("logp", logp, "w", w)
    mask = _check_mask("logp", logp, mask)
    logp = _valid_values("logp", logp, mask, _LOGP_HINT)
    logp_old = _valid_values("logp_old", logp_old.detach(), mask, _LOGP_HINT)
    w = _valid_values("w", w.detach(), mask)
    _check_distribution(w, mask, "w", "lpo_target")
    out = torch.promote_types(logp.dtype, logp_old.dtype)
    valid = None if mask is None else mask.any(dim=-1)
    zero = torch.zeros((), dtype=_WIDE, device=logp.device)
    with torch.no_grad():
        z = logp.to(_WIDE) - logp_old.to(_WIDE)
        log_p = _masked_log_softmax(z, mask)  # finite at the valid entries
        p = _masked_softmax(z, mask).to(w.dtype).to(_WIDE)  # as lpo_target computes w, in w's dtype
        w64 = w.to(_WIDE)
        if fit == "forward_kl":
            per_entry = torch.where(w64 > 0, w64 * (torch.log(w64.clamp(min=torch.finfo(_WIDE).tiny)) - log_p), zero)
            weight = p - w64
        else:
            infinite = (w64 == 0) & (p > 0) if mask is None else mask & (w64 == 0) & (p > 0)

            def fail() -> NoReturn:
                first = tuple(infinite.nonzero()[0].tolist())
                raise ValueError(f"w is 0 at index {first}, where the policy side p is not: KL(p || w) is infinite "
                                 "there; build w from float64 scores with lpo_target, use a larger tau, or "
                                 "fit='forward_kl'")

            _fail_if(infinite.any(), fail)
            log_w = torch.log(w64.clamp(min=torch.finfo(_WIDE).tiny))
            d = torch.where(p > 0, torch.log(p.clamp(min=torch.finfo(_WIDE).tiny)) - log_w, zero)
            per_entry = torch.where(p > 0, p * (log_p - log_w), zero)
            weight = p * (d - (p * d).sum(dim=-1, keepdim=True))
        if mask is not None:
            per_entry, weight = _where(mask, per_entry), _where(mask, weight)
        value = _fits("lpo_loss", _group_mean(per_entry.sum(dim=-1), valid), out,
                      "the target w puts too little mass where the policy side does (use a larger tau)")
        n = per_entry[..., 0].numel() if valid is None else valid.sum().clamp(min=1).to(_WIDE)
        weight = weight / n
    # the value in the forward pass (the added term is exactly 0), the gradient exactly weight in the backward
    return value + (weight * (logp.to(_WIDE) - logp.detach().to(_WIDE))).sum().to(out)


# --------------------------------------------------------------------------------------------
# MaxRL and TailRL: group advantages
# --------------------------------------------------------------------------------------------
def maxrl_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""MaxRL's group advantages (Tajwar et al. 2026): the rewards relative to their group mean, divided by it.

    .. math::
        A_i = \frac{r_i - \bar r}{\bar r}, \qquad \bar r = \frac1n \sum_{j} r_j, \qquad
        A_i = 0 \text{ for every } i \text{ where } \bar r = 0

    over the ``n`` valid candidates of each group. On 0/1 rewards with ``m`` successes of ``n`` this is
    :math:`(n - m)/m` for a success and :math:`-1` for a failure, and
    :math:`\frac1n \sum_i A_i \nabla \log\pi(y_i)` is the unbiased estimator of :math:`\nabla \log p_\theta`
    (the log pass rate) that MaxRL uses. An all-fail group (:math:`\bar r = 0`, where the formula is
    :math:`0/0`) gets exactly :math:`A = 0`, as does every zero-variance group (the rule of
    :mod:`tpo_gym.objectives`; an all-success group gives 0 by the formula). Rewards must be non-negative
    (the formula divides by their mean); on other non-negative rewards it is the same estimator of
    :math:`\nabla \log \mathbb{E}[r]`, but no longer equal to :func:`tailrl_advantages`. ``A`` is invariant
    to :math:`r \mapsto a r` (:math:`a > 0`), lies in :math:`[-1, n - 1]`, and comes back in the dtype of
    ``rewards`` (statistics in float64, each group first scaled by a power of two: exact); masked
    candidates get 0 whatever they hold.

    :param rewards: ``[..., K]`` rewards, finite and ``>= 0`` at the valid candidates (0/1: MaxRL as published).
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    """
    rewards = _as_tensor("rewards", rewards)
    mask = _check_mask("rewards", rewards, mask)
    r = _valid_values("rewards", rewards, mask).detach().to(_WIDE)
    _check_non_negative("rewards", rewards, mask, "MaxRL divides by the group's mean reward; TailRL takes any "
                                                  "rewards")
    x = r / _power_of_two_scale(r)
    n = x.shape[-1] if mask is None else mask.sum(dim=-1, keepdim=True).clamp(min=1).to(_WIDE)
    mean = x.sum(dim=-1, keepdim=True) / n
    informative = (~zero_variance_groups(rewards, mask)).unsqueeze(-1) & (mean > 0)
    adv = torch.where(informative, (x - mean) / torch.where(informative, mean, torch.ones_like(mean)),
                      torch.zeros_like(x))
    if mask is not None:
        adv = _where(mask, adv)
    return adv.to(rewards.dtype)


def tailrl_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""TailRL's group advantages (Ramasubramanian et al. 2026): the tail-likelihood estimator of continuous rewards.

    Sort the ``n`` valid rewards of a group ascending, :math:`r_{(1)} \le \dots \le r_{(n)}`; then

    .. math::
        g_j = r_{(j)} - r_{(j-1)}, \qquad
        c_{(i)} = n \sum_{j \le i} \frac{g_j}{n - j + 1}, \qquad
        A_{(i)} = c_{(i)} - \frac1n \sum_{k=1}^{n} c_{(k)}

    each gap divided by the number of rollouts at or above it (the rank itself included), accumulated, scaled by
    ``n`` and mean-centred, then put back in the candidates' order. ``r_(0)`` does not matter: it moves every
    :math:`c` by the same amount, which the centring removes (the reference code takes :math:`r_{(0)} = 0`;
    here :math:`g_1 = 0`). Equivalently :math:`A_i = \int_{r_{(1)}}^{r_{(n)}} \mathrm{MaxRL}_i\big(
    \mathbb{1}[r \ge t]\big)\, dt`: MaxRL's advantage of the 0/1 reward "at least t", integrated over the
    thresholds t, so on 0/1 rewards TailRL *is* MaxRL (:func:`maxrl_advantages`): :math:`(n - m)/m` and
    :math:`-1`. Tied rewards get equal advantages (a gap of 0 adds nothing), the lowest reward gets
    :math:`-(r_{(n)} - r_{(1)})`, advantages sum to 0 and grow with the reward; ``A`` is invariant to a shift
    :math:`r \mapsto r + b` and scales with :math:`r \mapsto a r` (:math:`a > 0`). Zero-variance groups (the
    rule of :mod:`tpo_gym.objectives`; an all-equal group, fewer than two valid candidates) get exactly
    :math:`A = 0`; masked candidates get 0 whatever they hold. Computed in float64 (each group first scaled by a
    power of two: exact), ``A`` in the dtype of ``rewards``; rewards whose advantages overflow that dtype are
    refused with a ``ValueError``.

    :param rewards: ``[..., K]`` rewards, finite at the valid candidates (any sign, continuous or 0/1).
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    """
    rewards = _as_tensor("rewards", rewards)
    mask = _check_mask("rewards", rewards, mask)
    r = _valid_values("rewards", rewards, mask).detach().to(_WIDE)
    scale = _power_of_two_scale(r)
    x = r / scale
    k = x.shape[-1]
    if mask is None:
        n = torch.full((*x.shape[:-1], 1), float(k), dtype=_WIDE, device=x.device)
        keyed = x
    else:
        n = mask.sum(dim=-1, keepdim=True).to(_WIDE)
        keyed = torch.where(mask, x, float("inf"))  # padding sorts last
    v, order = torch.sort(keyed, dim=-1, stable=True)
    rank = torch.arange(k, device=x.device, dtype=_WIDE)  # j - 1
    inside = rank < n  # the valid ranks of each group
    zero = torch.zeros((), dtype=_WIDE, device=x.device)
    v = torch.where(inside, v, zero)
    gaps = torch.where(inside & (rank > 0), v - torch.cat([v[..., :1], v[..., :-1]], dim=-1), zero)
    survivors = (n - rank).clamp(min=1)
    c = torch.cumsum(gaps * n / survivors, dim=-1)
    c = torch.where(inside, c, zero)
    centred = torch.where(inside, c - c.sum(dim=-1, keepdim=True) / n.clamp(min=1), zero)
    adv = torch.zeros_like(x).scatter(-1, order, centred)
    informative = (~zero_variance_groups(rewards, mask)).unsqueeze(-1)
    adv = torch.where(informative, adv, zero) * scale
    return _fits("tailrl_advantages", adv, rewards.dtype, _REWARDS_ADVICE)
