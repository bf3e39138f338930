"""Target Policy Optimization (docs/method.md section 1)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_bool, check_choice, check_float
from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.grouping import Grouping, resolve_grouping
from tpo_gym.agents.common.registry import (
    GROUP_DIAGNOSTICS,
    TEXT_DIAGNOSTICS,
    UPDATE_DIAGNOSTICS,
    AlgorithmSpec,
    Diagnostic,
    register_algorithm,
)
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import TargetBatch
from tpo_gym.agents.lm.policy import entropy
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.agents.policies.gaussian import is_box_policy
from tpo_gym.objectives import kl_penalty, standardize_scores, tpo_loss, tpo_target

__all__ = ["TPO", "collapsed_target_fraction", "collapse_warning", "COLLAPSE_Q", "COLLAPSE_WARN_FRACTION"]

CANDIDATES = ("sampled", "single")


def winner_loser_means(values: torch.Tensor, u: torch.Tensor, mask: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values`` over winners (``u > 0``) and over losers (``u < 0``) among valid candidates
    (NaN where there are none), as 0-d tensors: computed on the device, read back with the iteration's record."""
    valid = torch.ones_like(u, dtype=torch.bool) if mask is None else mask
    out = []
    for sel in (valid & (u > 0), valid & (u < 0)):
        count = sel.sum()
        total = torch.where(sel, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()
        out.append(torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, math.nan)))
    return out[0], out[1]


#: A group's target has collapsed when its best-scored candidates get at most this much of q.
COLLAPSE_Q = 0.01


def collapsed_target_fraction(q: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    r"""Fraction of the informative groups whose target has collapsed onto ``p_old`` (a 0-d tensor, NaN if none).

    A group is informative when its scores are not all equal
    (:func:`~tpo_gym.objectives.zero_variance_groups`); its target has collapsed when the q mass on its
    best-scored candidates is at most :data:`COLLAPSE_Q`:
    :math:`\sum_{i:\,s_i = \max_j s_j} q_i \le 0.01`. With summed log-probs of completions of varied
    length, :math:`p^{old}` over a group is near one-hot, so :math:`q \propto p^{old} e^{u/\eta}` keeps
    (almost) all its mass on one completion whatever the scores say, and the update is near zero.
    """
    from tpo_gym.objectives import zero_variance_groups

    valid = torch.ones_like(q, dtype=torch.bool) if mask is None else mask
    informative = ~zero_variance_groups(scores, mask)
    best = valid & (scores == scores.masked_fill(~valid, -math.inf).amax(dim=-1, keepdim=True))
    best_mass = torch.where(best, q, torch.zeros_like(q)).sum(dim=-1)
    collapsed = informative & (best_mass <= COLLAPSE_Q)
    n = informative.sum()
    return torch.where(n > 0, collapsed.sum() / n.clamp(min=1), torch.full((), math.nan, device=q.device))


#: Above this collapsed_target_fraction in one iteration, TPO warns (once per run).
COLLAPSE_WARN_FRACTION = 0.5


def collapse_warning(fraction: float, settings: dict[str, Any], length_remedy: str, length_setting: str) -> str:
    """The one text of the collapsed-target warning (native loop and TRL path): the fraction, the settings that
    decide it (``settings``: name -> value) and the remedies, ``length_remedy`` naming how to set
    ``length_normalize`` and ``length_setting`` the completion-length bound of that path."""
    shown = ", ".join(f"{name}={value}" for name, value in settings.items())
    return (f"TPO's target has collapsed in {fraction:.0%} of the informative groups: the best-scored completions "
            f"get q <= {COLLAPSE_Q} because p_old over a group is near one-hot (summed log-probs of completions of "
            f"different lengths; {shown}), so the update is near zero. Remedies: {length_remedy}, a larger eta, or "
            f"a shorter {length_setting} (docs/method.md section 7). Logged as collapsed_target_fraction.")


@register_algorithm
class TPO(GroupAlgorithm):
    """Target Policy Optimization: fit the policy to a frozen target over each group of candidates.

    For each context (a state for ``level="token"``, a prompt for ``level="sequence"``) K candidates
    are drawn from pi_old and scored; the scores are z-scored within the group (``u``), the target is
    ``q = softmax(log p_old + u / eta)`` over the K candidates, and each of the ``n_epochs``
    full-batch steps minimises the cross-entropy from ``q`` to the policy renormalised over the group
    (:func:`~tpo_gym.objectives.tpo_loss`; gradient ``p_theta - q``).

    * ``TPO(level="token")`` is TPO_token: one behaviour trajectory per prompt, K next-token candidates
      per prefix state, each state its own group (B*H groups per iteration). On one-step tasks
      (bandits) it is K candidate actions per context.
    * ``TPO(level="sequence")``: K complete rollouts per prompt, score = mean per-token reward
      (terminal reward: 0/1 exact match); also works on any Gymnasium env with Discrete actions
      (same-seed groups of K episodes, score = return / max_episode_steps).
    * ``TPO(candidates="single")``: the full-class variant for one-correct-answer tasks, **the
      documented choice for MNIST** (as the paper): one sampled action per context, scores
      ``A * onehot(a)`` over all actions with ``A = r - sum_k pi_k^2``, target over all actions.
    * ``TPO(anchor=False)``: the TPO-no-anchor ablation, ``q = softmax(u / eta)``.

    Diagnostics in ``history`` / the logger: ``zero_variance_fraction``, ``all_fail_fraction``,
    ``any_success_fraction``, ``mean_q_winners``, ``mean_q_losers``; on language models (and on episodes of a
    Box action space, sequence level) also ``entropy_q``, ``entropy_p_old`` and ``collapsed_target_fraction``
    (:func:`collapsed_target_fraction`). When most informative groups of an iteration have a collapsed
    target, a ``UserWarning`` (once per agent) says so and names the remedies: ``length_normalize=True``,
    a larger ``eta``, shorter ``max_new_tokens`` (on Box actions ``length_normalize=True`` is the default:
    :mod:`tpo_gym.agents.policies.gaussian`).

    :param eta: temperature of the target, > 0 (default 1).
    :param anchor: keep the ``p_old`` anchor of the target (default); ``False`` is the ablation.
    :param candidates: ``"sampled"`` (K candidates / rollouts per context, default) or ``"single"``
        (one-hot full-class scores from a single sample; ``group_size`` and ``level`` are then unused).
    :param beta: KL coefficient >= 0 (default 0, the paper's TPO): language models only, the loss becomes
        ``tpo_loss + beta * kl_penalty`` (:func:`~tpo_gym.objectives.kl_penalty`: the per-token k3 KL to
        a frozen reference, the initial model, averaged per completion and then over completions as GRPO
        and TRL average it; with LoRA the reference is the base model with the adapters disabled, no
        copy). The paper's GSM8K recipe: ``beta=1e-3`` with LoRA rank 32 (docs/method.md section 7).
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), tabular="tpo",
        run_kinds=("token", "mnist", "llm", "tabular_single", "tabular_multi", "gym"),
        diagnostics=(
            *UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS,
            Diagnostic("mean_q_winners", "*winners* / *losers*: candidates above / below their group's mean score; "
                                         "`mean_q_*` is their mean target probability q_i (TPO), `mean_abs_adv_*` "
                                         "their mean |A_i| (GRPO)"),
            Diagnostic("mean_q_losers"),
            Diagnostic("entropy_q", "`entropy_q` / `entropy_p_old`: mean entropy (nats) of the target q and of pi_old "
                                    "renormalised over each group's K completions (near 0: one completion takes all "
                                    "the weight)"),
            Diagnostic("entropy_p_old"),
            *TEXT_DIAGNOSTICS,
            Diagnostic("collapsed_target_fraction", "`collapsed_target_fraction`: fraction of the informative groups "
                                                    "(scores not all equal) whose best-scored completions get at most "
                                                    "1% of the target q (TPO): p_old is near one-hot there, so the "
                                                    "update is near zero"),
        ),
    )

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        *,
        eta: float = 1.0,
        anchor: bool = True,
        candidates: str = "sampled",
        beta: float = 0.0,
        **kwargs: Any,
    ) -> None:
        self.eta = check_float("eta", eta, 0.0, strict_min=True)
        self.anchor = check_bool("anchor", anchor)
        self.candidates = check_choice("candidates", candidates, CANDIDATES)
        self.beta = check_float("beta", beta, 0.0)
        super().__init__(policy, env, **kwargs)
        if self.beta > 0 and not self.is_text:
            raise ValueError(f"beta={beta} (a KL penalty to a frozen reference model) needs policy='CausalLMPolicy'; "
                             "TPO on other policies has no KL term (beta=0)")

    def needs_reference(self) -> bool:
        return self.beta > 0

    def token_penalty(self, batch: Any, start: int, stop: int, token_logp: torch.Tensor) -> torch.Tensor | None:
        """``beta * kl_penalty`` of the completions of groups ``start .. stop-1`` (``None`` at ``beta = 0``)."""
        if self.beta == 0:
            return None
        rows = batch.group_rows(start, stop)
        return self.beta * kl_penalty(token_logp, batch.token_logp_ref[rows], batch.token_mask[rows])

    def choose_grouping(self, native: bool) -> Grouping:
        return resolve_grouping(self.sampling, self.level, self.group_size, native=native, text=self.is_text,
                                single_candidate=self.candidates == "single")

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[TargetBatch, dict[str, Any]]:
        """Scores, z-scores ``u`` and the frozen target ``q`` of every group."""
        if self.candidates == "single":
            scores, mask, diagnostics = self.single_candidate_scores(batch)
        else:
            scores, mask = self.group_scores(batch)
            diagnostics = self.group_diagnostics(scores, mask)
        u = standardize_scores(scores, mask)
        q = tpo_target(old, u, self.eta, self.anchor, mask)
        diagnostics["mean_q_winners"], diagnostics["mean_q_losers"] = winner_loser_means(q, u, mask)
        if self.require_grouping().kind == "rollouts":  # sequence groups: is p_old (and so q) near one-hot?
            diagnostics["entropy_q"] = entropy(torch.log(q.clamp(min=1e-30)))
            diagnostics["entropy_p_old"] = entropy(old)
        box_episodes = is_box_policy(self.policy) and self.require_grouping().kind == "rollouts"
        if (self.is_text or box_episodes) and self.candidates == "sampled":  # summed log-probs of sequences
            collapsed = collapsed_target_fraction(q, scores, mask)
            diagnostics["collapsed_target_fraction"] = collapsed
            self._warn_if_collapsed(float(collapsed))  # one read-back per iteration, language models and Box only
        return TargetBatch(q=q, mask=mask), diagnostics

    def _warn_if_collapsed(self, fraction: float) -> None:
        """Warn once per agent when most informative groups have a collapsed target."""
        if getattr(self, "_collapse_warned", False) or not fraction > COLLAPSE_WARN_FRACTION:
            return
        self._collapse_warned = True
        policy = self.policy
        if is_box_policy(policy):  # episodes of a Box action space: their length is the env's
            settings = {"iteration": self.iteration, "length_normalize": policy.length_normalize,
                        "horizon": self.get_rollout_env().horizon, "eta": self.eta}
            warnings.warn(collapse_warning(fraction, settings, "policy_kwargs={'length_normalize': True} (the "
                                           "default for Box actions)", "episode (max_episode_steps)"),
                          UserWarning, stacklevel=2)
            return
        settings = {"iteration": self.iteration, "length_normalize": getattr(policy, "length_normalize", None),
                    "max_new_tokens": getattr(policy, "max_new_tokens", None), "eta": self.eta}
        warnings.warn(collapse_warning(fraction, settings, "policy_kwargs={'length_normalize': True}",
                                       "max_new_tokens"), UserWarning, stacklevel=2)

    def compute_loss(self, batch: RolloutBatch, prepared: TargetBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.tpo_loss` of the group log-probs against the frozen target."""
        return tpo_loss(current, prepared.q, prepared.mask)
