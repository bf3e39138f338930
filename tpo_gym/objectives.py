r"""The objectives of TPO and of every baseline, as small pure torch functions.

Every agent and every experiment of tpo-gym calls these functions; none keeps a second copy of
the math. Each docstring states the equation it implements (``../shared/SPEC.md`` sections 1-2).

Conventions
-----------
* A **group** is the last dimension ``K`` of a tensor shaped ``[..., K]``: the K scored candidates
  of one context (K actions of a bandit, K next tokens of a prefix state, K completions of a
  prompt). Leading dimensions ``...`` index groups and are averaged over.
* ``mask`` (optional, boolean, same shape) marks *valid* candidates; ``False`` entries are padding:
  they receive zero target mass, zero advantage and zero gradient. A fully masked group
  contributes nothing (and produces no NaN).
* Per-step objectives (PPO, REINFORCE, DG) take ``[B, T]`` tensors: ``T`` steps of ``B``
  trajectories; the loss sums over steps and averages over trajectories. A 1-D ``[B]`` tensor is
  read as ``B`` one-step trajectories.
* ``logp`` are log-probabilities of the chosen candidates under the current policy (for a
  sequence, the sum of its token log-probs, no length normalisation); ``logp_old`` the same under
  the rollout-time snapshot ``pi_old``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "STD_EPS",
    "standardize_scores",
    "tpo_target",
    "tpo_loss",
    "onehot_advantage_scores",
    "grpo_advantages",
    "zero_variance_groups",
    "grpo_loss",
    "batch_baseline_advantages",
    "ppo_loss",
    "reinforce_loss",
    "group_pg_loss",
    "dg_gate",
    "dg_loss",
    "cross_entropy_loss",
    "k3_kl",
]

#: Groups whose score standard deviation is at most this carry no signal (``u = 0``).
STD_EPS = 1e-6
#: Log-ratios are clipped to ``[-LOG_RATIO_CLIP, LOG_RATIO_CLIP]`` before ``exp`` (SPEC section 2).
LOG_RATIO_CLIP = 20.0


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
def _as_tensor(name: str, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension (the group/time axis), got a scalar")
    return x


def _check_no_nan(name: str, x: torch.Tensor) -> None:
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN; scores and log-probabilities must be numbers")


def _check_same_shape(ref_name: str, ref: torch.Tensor, name: str, x: torch.Tensor | None) -> None:
    if x is not None and tuple(x.shape) != tuple(ref.shape):
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but {ref_name} has shape {tuple(ref.shape)}; they must match"
        )


def _check_mask(ref_name: str, ref: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a boolean torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must have dtype torch.bool, got {mask.dtype}")
    _check_same_shape(ref_name, ref, "mask", mask)
    return mask


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _check_nonnegative(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def _masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """log_softmax over the last axis restricted to valid entries; invalid entries -> -inf.

    Fully masked groups give all ``-inf`` (callers zero them out with the mask); no NaN is made.
    """
    if mask is None:
        return torch.log_softmax(logits, dim=-1)
    neg_inf = torch.finfo(logits.dtype).min
    filled = logits.masked_fill(~mask, neg_inf)
    out = torch.log_softmax(filled, dim=-1)
    return out.masked_fill(~mask, float("-inf"))


def _group_mean(per_group: torch.Tensor, valid_groups: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over all leading (group) dimensions; with ``valid_groups`` only over those groups."""
    if valid_groups is None:
        return per_group.mean()
    n = valid_groups.sum()
    total = (per_group * valid_groups).sum()
    return total / n.clamp(min=1)


def _steps_mean(per_step: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Sum over the last (time) axis, mean over trajectories; 1-D input = one-step trajectories."""
    if mask is not None:
        per_step = per_step * mask
    if per_step.ndim == 1:
        return per_step.mean()
    return per_step.sum(dim=-1).mean()


# --------------------------------------------------------------------------------------------
# TPO
# --------------------------------------------------------------------------------------------
def standardize_scores(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Within-group z-score of the candidates' scores (SPEC 1.1).

    .. math::
        u_i = \frac{s_i - \bar s}{\sigma(s)}, \qquad
        \bar s = \frac1K \sum_j s_j, \quad \sigma(s) = \sqrt{\tfrac1K \sum_j (s_j - \bar s)^2}

    with the *population* standard deviation over the valid candidates of each group, and
    :math:`u = 0` for every candidate of a group whose :math:`\sigma(s) \le 10^{-6}` (an
    all-equal group carries no signal). Masked candidates get :math:`u = 0`.
    u is invariant to positive affine transforms :math:`s \mapsto a s + b,\ a > 0`.

    :param scores: ``[..., K]`` scores ``s``.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    :return: ``u`` with the shape of ``scores``.
    """
    scores = _as_tensor("scores", scores)
    _check_no_nan("scores", scores)
    mask = _check_mask("scores", scores, mask)
    if mask is None:
        mean = scores.mean(dim=-1, keepdim=True)
        centred = scores - mean
        std = centred.pow(2).mean(dim=-1, keepdim=True).sqrt()
    else:
        m = mask.to(scores.dtype)
        n = m.sum(dim=-1, keepdim=True).clamp(min=1.0)
        mean = (scores * m).sum(dim=-1, keepdim=True) / n
        centred = (scores - mean) * m
        std = centred.pow(2).sum(dim=-1, keepdim=True).div(n).sqrt()
    informative = std > STD_EPS
    u = torch.where(informative, centred / torch.where(informative, std, torch.ones_like(std)), 0.0)
    if mask is not None:
        u = u.masked_fill(~mask, 0.0)
    return u


def tpo_target(
    logp_old: torch.Tensor,
    u: torch.Tensor,
    eta: float = 1.0,
    anchor: bool = True,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""The TPO target distribution over the K candidates of each group (SPEC 1.2).

    .. math::
        q = \operatorname{softmax}\big(\log\operatorname{softmax}(\ell^{old}) + u / \eta\big),
        \qquad q_i \propto p^{old}_i \, e^{u_i/\eta}

    where :math:`p^{old}` is the snapshot policy renormalised over the group. ``q`` is the unique
    maximiser of :math:`\sum_i r_i u_i - \eta\,\mathrm{KL}(r \,\|\, p^{old})` over the simplex.
    ``anchor=False`` (the TPO-no-anchor ablation) drops :math:`p^{old}`: :math:`q =
    \operatorname{softmax}(u/\eta)`. The result is detached (the target is frozen). Masked
    candidates get :math:`q_i = 0`; a fully masked group gets all zeros.

    :param logp_old: ``[..., K]`` log-probabilities (or logits) of the candidates under pi_old.
    :param u: ``[..., K]`` standardised scores (see :func:`standardize_scores`).
    :param eta: temperature > 0 (default 1).
    :param anchor: keep the :math:`p^{old}` anchor (default) or drop it.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    """
    logp_old = _as_tensor("logp_old", logp_old)
    u = _as_tensor("u", u)
    _check_same_shape("logp_old", logp_old, "u", u)
    eta = _check_positive("eta", eta)
    mask = _check_mask("logp_old", logp_old, mask)
    _check_no_nan("logp_old", logp_old)
    _check_no_nan("u", u)
    logp_old = logp_old.detach()
    u = u.detach()
    base = _masked_log_softmax(logp_old, mask) if anchor else torch.zeros_like(logp_old)
    logits = base + u / eta
    if mask is not None:
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    q = torch.softmax(logits, dim=-1)
    if mask is not None:
        q = q.masked_fill(~mask, 0.0)
        q = q * mask.any(dim=-1, keepdim=True)
    return q


def tpo_loss(logp: torch.Tensor, q: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Cross-entropy from the frozen target ``q`` to the policy over each group (SPEC 1.3).

    .. math::
        L = -\frac{1}{G}\sum_{g} \sum_{i=1}^{K} q_{g,i}\,\log\operatorname{softmax}(\ell^\theta_g)_i,
        \qquad \frac{\partial L}{\partial \ell^\theta_{g}} = \frac{1}{G}\,(p^\theta_g - q_g)

    ``q`` is detached. The gradient vanishes when the policy matches the target
    ("self-extinguishing"). The mean runs over the groups that have at least one valid candidate.

    :param logp: ``[..., K]`` current log-probabilities (or logits) of the candidates.
    :param q: ``[..., K]`` target from :func:`tpo_target`.
    :param mask: optional ``[..., K]`` boolean, ``True`` for valid candidates.
    """
    logp = _as_tensor("logp", logp)
    q = _as_tensor("q", q)
    _check_same_shape("logp", logp, "q", q)
    mask = _check_mask("logp", logp, mask)
    logp_group = _masked_log_softmax(logp, mask)
    q = q.detach()
    if mask is not None:
        logp_group = logp_group.masked_fill(~mask, 0.0)
        q = q.masked_fill(~mask, 0.0)
    per_group = -(q * logp_group).sum(dim=-1)
    valid = None if mask is None else mask.any(dim=-1).to(per_group.dtype)
    return _group_mean(per_group, valid)


def onehot_advantage_scores(
    actions: torch.Tensor, rewards: torch.Tensor, probs: torch.Tensor
) -> torch.Tensor:
    r"""Scores over *all* actions from one sampled action (TPO on MNIST-style bandits, SPEC 1).

    .. math::
        s = A\,\mathrm{onehot}(a), \qquad A = r - \sum_k \pi_k^2

    (:math:`\sum_k \pi_k^2` is the expected reward of a one-correct-arm bandit under pi.) Feed the
    result to :func:`standardize_scores` (over the ``n_actions`` axis) and :func:`tpo_target`.

    :param actions: ``[B]`` integer sampled actions.
    :param rewards: ``[B]`` rewards of the sampled actions.
    :param probs: ``[B, n_actions]`` policy probabilities (treated as constants).
    :return: ``[B, n_actions]`` scores.
    """
    probs = _as_tensor("probs", probs).detach()
    rewards = _as_tensor("rewards", rewards)
    if actions.ndim != 1 or rewards.shape != actions.shape or probs.shape[:-1] != actions.shape:
        raise ValueError(
            f"expected actions [B], rewards [B] and probs [B, n_actions]; got actions {tuple(actions.shape)}, "
            f"rewards {tuple(rewards.shape)}, probs {tuple(probs.shape)}"
        )
    advantage = rewards - probs.pow(2).sum(dim=-1)
    return F.one_hot(actions.long(), probs.shape[-1]).to(probs.dtype) * advantage.unsqueeze(-1)


# --------------------------------------------------------------------------------------------
# GRPO
# --------------------------------------------------------------------------------------------
def zero_variance_groups(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Boolean ``[...]``: groups whose population std of scores is :math:`\le 10^{-6}`."""
    scores = _as_tensor("scores", scores)
    mask = _check_mask("scores", scores, mask)
    if mask is None:
        std = scores.std(dim=-1, unbiased=False)
    else:
        m = mask.to(scores.dtype)
        n = m.sum(dim=-1).clamp(min=1.0)
        mean = (scores * m).sum(dim=-1) / n
        std = (((scores - mean.unsqueeze(-1)) * m).pow(2).sum(dim=-1) / n).sqrt()
    return std <= STD_EPS


def grpo_advantages(
    scores: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8
) -> torch.Tensor:
    r"""GRPO group-relative advantages (SPEC 2).

    .. math::
        A_i = \frac{s_i - \bar s}{\sigma(s) + \epsilon}, \quad \epsilon = 10^{-8},

    population std over the valid candidates; zero-variance groups (:math:`\sigma \le 10^{-6}`)
    get :math:`A = 0`; masked candidates get 0.
    """
    scores = _as_tensor("scores", scores)
    _check_no_nan("scores", scores)
    mask = _check_mask("scores", scores, mask)
    m = torch.ones_like(scores) if mask is None else mask.to(scores.dtype)
    n = m.sum(dim=-1, keepdim=True).clamp(min=1.0)
    mean = (scores * m).sum(dim=-1, keepdim=True) / n
    centred = (scores - mean) * m
    std = centred.pow(2).sum(dim=-1, keepdim=True).div(n).sqrt()
    adv = centred / (std + eps)
    return torch.where(std > STD_EPS, adv, torch.zeros_like(adv))


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    r"""The k3 estimator of :math:`\mathrm{KL}(\pi_\theta \,\|\, \pi_{ref})` per sample.

    .. math::
        \rho = e^{\mathrm{clip}(\ell^\theta - \ell^{ref}, -20, 20)}, \qquad
        \mathrm{kl} = \rho^{-1} + \log\rho - 1 \;\ge 0
    """
    log_ratio = (logp - logp_ref).clamp(-LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    return torch.exp(-log_ratio) + log_ratio - 1.0


def _clipped_surrogate(
    logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> torch.Tensor:
    log_ratio = (logp - logp_old.detach()).clamp(-LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)


def grpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    scores: torch.Tensor,
    clip_eps: float = 0.2,
    beta: float = 0.04,
    mask: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
    mask_zero_variance: bool = False,
) -> torch.Tensor:
    r"""The clipped GRPO objective with a k3 KL penalty to the rollout snapshot (SPEC 2).

    Sequence level (``logp`` shaped ``[..., K]`` like ``scores``):

    .. math::
        L = -\frac1G \sum_g \sum_{k=1}^{K}\Big[\min\big(\rho_k A_k,\
            \mathrm{clip}(\rho_k, 1-\epsilon, 1+\epsilon) A_k\big) - \beta\,\mathrm{kl}_k\Big],
        \quad \rho_k = e^{\mathrm{clip}(\ell^\theta_k - \ell^{old}_k, -20, 20)},
        \quad \mathrm{kl}_k = \rho_k^{-1} + \log\rho_k - 1

    with :math:`A` from :func:`grpo_advantages`. Token level (``logp`` and ``logp_old`` shaped
    ``[..., K, T]`` with an optional ``token_mask``): the bracket is computed per token with a
    per-token ratio and averaged over the valid tokens of each candidate before the sum over k.
    ``beta = 0`` is GRPO (no KL). ``mask_zero_variance=True`` (GRPO zv-masked) removes groups with
    :math:`\sigma(s) \le 10^{-6}` from the loss and averages over informative groups only.
    With ``beta = 0`` and no clipping active the first-epoch gradient equals that of z-scored
    REINFORCE (:func:`reinforce_loss` on :math:`A`).

    :param logp: current log-probs, ``[..., K]`` (sequence) or ``[..., K, T]`` (token level).
    :param logp_old: rollout-time log-probs, same shape as ``logp``.
    :param scores: ``[..., K]`` candidate scores.
    :param clip_eps: clip range epsilon >= 0 (default 0.2).
    :param beta: KL coefficient >= 0 (default 0.04).
    :param mask: optional ``[..., K]`` boolean, valid candidates.
    :param token_mask: optional ``[..., K, T]`` boolean, valid tokens (token level only).
    :param mask_zero_variance: drop zero-variance groups from the mean.
    """
    logp = _as_tensor("logp", logp)
    logp_old = _as_tensor("logp_old", logp_old)
    scores = _as_tensor("scores", scores)
    _check_same_shape("logp", logp, "logp_old", logp_old)
    clip_eps = _check_nonnegative("clip_eps", clip_eps)
    beta = _check_nonnegative("beta", beta)
    mask = _check_mask("scores", scores, mask)
    token_level = logp.ndim == scores.ndim + 1
    if not token_level:
        _check_same_shape("scores", scores, "logp", logp)
        if token_mask is not None:
            raise ValueError("token_mask is only allowed with token-level logp shaped [..., K, T]")
    elif tuple(logp.shape[:-1]) != tuple(scores.shape):
        raise ValueError(
            f"token-level logp has shape {tuple(logp.shape)}; expected scores.shape + (T,) with "
            f"scores.shape = {tuple(scores.shape)}"
        )
    else:
        token_mask = _check_mask("logp", logp, token_mask)

    adv = grpo_advantages(scores, mask)
    if token_level:
        per_token = _clipped_surrogate(logp, logp_old, adv.unsqueeze(-1), clip_eps)
        per_token = per_token - beta * k3_kl(logp, logp_old.detach())
        if token_mask is None:
            per_cand = per_token.mean(dim=-1)
        else:
            tm = token_mask.to(per_token.dtype)
            per_cand = (per_token * tm).sum(dim=-1) / tm.sum(dim=-1).clamp(min=1.0)
    else:
        per_cand = _clipped_surrogate(logp, logp_old, adv, clip_eps) - beta * k3_kl(logp, logp_old.detach())
    if mask is not None:
        per_cand = per_cand * mask
    per_group = -per_cand.sum(dim=-1)
    valid = None if mask is None else mask.any(dim=-1).to(per_group.dtype)
    if mask_zero_variance:
        informative = (~zero_variance_groups(scores, mask)).to(per_group.dtype)
        valid = informative if valid is None else valid * informative
    return _group_mean(per_group, valid)


# --------------------------------------------------------------------------------------------
# single-sample baselines: PPO, REINFORCE, DG
# --------------------------------------------------------------------------------------------
def batch_baseline_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Per-position batch-mean baseline (PPO, REINFORCE and DG in SPEC 2).

    .. math::
        A_{b,t} = r_{b,t} - \frac{1}{B}\sum_{b'} r_{b',t}

    :param rewards: ``[B, T]`` (or ``[B]``) rewards; the mean runs over the batch axis 0 per
        position, over the valid entries of ``mask`` only.
    """
    rewards = _as_tensor("rewards", rewards)
    _check_no_nan("rewards", rewards)
    mask = _check_mask("rewards", rewards, mask)
    if mask is None:
        return rewards - rewards.mean(dim=0, keepdim=True)
    m = mask.to(rewards.dtype)
    mean = (rewards * m).sum(dim=0, keepdim=True) / m.sum(dim=0, keepdim=True).clamp(min=1.0)
    return (rewards - mean) * m


def ppo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Critic-free clipped PPO surrogate with a per-token ratio (SPEC 2).

    .. math::
        L = -\frac1B \sum_b \sum_t \min\big(\rho_{b,t} A_{b,t},\
            \mathrm{clip}(\rho_{b,t}, 1-\epsilon, 1+\epsilon) A_{b,t}\big),
        \quad \rho = e^{\mathrm{clip}(\ell^\theta - \ell^{old}, -20, 20)}

    No value function, no GAE, no entropy bonus; ``A`` from :func:`batch_baseline_advantages`.

    :param logp: ``[B, T]`` (or ``[B]``) current log-probs of the taken actions.
    :param logp_old: rollout-time log-probs, same shape.
    :param advantages: same shape.
    :param clip_eps: clip range epsilon >= 0 (default 0.2).
    :param mask: optional boolean, valid steps.
    """
    logp = _as_tensor("logp", logp)
    logp_old = _as_tensor("logp_old", logp_old)
    advantages = _as_tensor("advantages", advantages)
    _check_same_shape("logp", logp, "logp_old", logp_old)
    _check_same_shape("logp", logp, "advantages", advantages)
    clip_eps = _check_nonnegative("clip_eps", clip_eps)
    mask = _check_mask("logp", logp, mask)
    return -_steps_mean(_clipped_surrogate(logp, logp_old, advantages, clip_eps), mask)


def reinforce_loss(
    logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""REINFORCE / policy gradient with a baseline (SPEC 2).

    .. math::
        L = -\frac1B \sum_b \sum_t A_{b,t}\,\log\pi_\theta(a_{b,t})

    ``A`` is detached: e.g. :func:`batch_baseline_advantages`, or :math:`r - \sum_k\pi_k^2` on
    MNIST, or group z-scores (then it is "z-scored REINFORCE").
    """
    logp = _as_tensor("logp", logp)
    advantages = _as_tensor("advantages", advantages)
    _check_same_shape("logp", logp, "advantages", advantages)
    mask = _check_mask("logp", logp, mask)
    return -_steps_mean(advantages.detach() * logp, mask)


def group_pg_loss(
    logp: torch.Tensor, u: torch.Tensor, eta: float = 1.0, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Group PG: TPO's candidates and scores, scalar weighting instead of target matching (SPEC 2).

    .. math::
        L = -\frac1G \sum_g \sum_{k=1}^{K} \frac{u_{g,k}}{\eta}\,\ell^\theta_{g,k}
    """
    logp = _as_tensor("logp", logp)
    u = _as_tensor("u", u)
    _check_same_shape("logp", logp, "u", u)
    eta = _check_positive("eta", eta)
    mask = _check_mask("logp", logp, mask)
    per_cand = (u.detach() / eta) * logp
    if mask is not None:
        per_cand = per_cand.masked_fill(~mask, 0.0)
    per_group = -per_cand.sum(dim=-1)
    valid = None if mask is None else mask.any(dim=-1).to(per_group.dtype)
    return _group_mean(per_group, valid)


def dg_gate(advantages: torch.Tensor, logp: torch.Tensor, eta: float = 1.0) -> torch.Tensor:
    r"""The Delightful Policy Gradient gate (SPEC 2), detached.

    .. math::
        w = \sigma\!\left(\frac{A \cdot \ell}{\eta}\right), \qquad \ell = -\log\pi(a)
        \ \text{(surprisal)},\qquad w \in (0, 1)
    """
    advantages = _as_tensor("advantages", advantages)
    logp = _as_tensor("logp", logp)
    _check_same_shape("logp", logp, "advantages", advantages)
    eta = _check_positive("eta", eta)
    surprisal = -logp.detach()
    return torch.sigmoid(advantages.detach() * surprisal / eta)


def dg_loss(
    logp: torch.Tensor, advantages: torch.Tensor, eta: float = 1.0, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Delightful Policy Gradient (Osband 2026; SPEC 2). Use with one optimiser step per batch.

    .. math::
        L = -\frac1B \sum_b \sum_t \mathrm{sg}\big(w_{b,t} A_{b,t}\big)\log\pi_\theta(a_{b,t}),
        \qquad w = \sigma\big(A\cdot(-\log\pi(a))/\eta\big)
    """
    w = dg_gate(advantages, logp, eta)
    mask = _check_mask("logp", logp, mask)
    return -_steps_mean((w * advantages).detach() * logp, mask)


def cross_entropy_loss(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Supervised cross-entropy on the true label: the CE oracle (SPEC 2).

    .. math::
        L = -\frac1B \sum_b \log\operatorname{softmax}(z_b)_{y_b}

    :param logits: ``[B, n_actions]``.
    :param labels: ``[B]`` integer labels in ``[0, n_actions)``.
    :param mask: optional ``[B]`` boolean, rows to include.
    """
    logits = _as_tensor("logits", logits)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels has shape {tuple(labels.shape)}; expected logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    if labels.numel() and (labels.min() < 0 or labels.max() >= logits.shape[-1]):
        raise ValueError(f"labels must lie in [0, {logits.shape[-1]}), got range "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    per_row = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), reduction="none")
    per_row = per_row.reshape(labels.shape)
    if mask is None:
        return per_row.mean()
    mask = _check_mask("labels", labels.to(logits.dtype), mask)
    return (per_row * mask).sum() / mask.sum().clamp(min=1)
