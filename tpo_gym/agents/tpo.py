"""Target Policy Optimization (docs/method.md section 1)."""

from __future__ import annotations

import math
from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_bool, check_choice, check_float
from tpo_gym.agents.base import GroupAlgorithm, Grouping
from tpo_gym.agents.lm import entropy
from tpo_gym.agents.policies import CategoricalPolicy
from tpo_gym.agents.sampling import RolloutBatch
from tpo_gym.objectives import standardize_scores, tpo_loss, tpo_target

__all__ = ["TPO"]

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
    ``any_success_fraction``, ``mean_q_winners``, ``mean_q_losers``.

    :param eta: temperature of the target, > 0 (default 1).
    :param anchor: keep the ``p_old`` anchor of the target (default); ``False`` is the ablation.
    :param candidates: ``"sampled"`` (K candidates / rollouts per context, default) or ``"single"``
        (one-hot full-class scores from a single sample; ``group_size`` and ``level`` are then unused).
    """

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        *,
        eta: float = 1.0,
        anchor: bool = True,
        candidates: str = "sampled",
        **kwargs: Any,
    ) -> None:
        self.eta = check_float("eta", eta, 0.0, strict_min=True)
        self.anchor = check_bool("anchor", anchor)
        self.candidates = check_choice("candidates", candidates, CANDIDATES)
        super().__init__(policy, env, **kwargs)

    def _grouping(self, native: bool) -> Grouping:
        if self.candidates == "single":
            return Grouping("actions")
        return super()._grouping(native)

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[dict[str, Any], dict[str, float]]:
        """Scores, z-scores ``u`` and the frozen target ``q`` of every group."""
        if self.candidates == "single":
            scores, mask, diagnostics = self.single_candidate_scores(batch)
        else:
            scores, mask = self.group_scores(batch)
            diagnostics = self.group_diagnostics(scores, mask)
        u = standardize_scores(scores, mask)
        q = tpo_target(old, u, self.eta, self.anchor, mask)
        diagnostics["mean_q_winners"], diagnostics["mean_q_losers"] = winner_loser_means(q, u, mask)
        if self._require_grouping().kind == "rollouts":  # sequence groups: is p_old (and so q) near one-hot?
            diagnostics["entropy_q"] = entropy(torch.log(q.clamp(min=1e-30)))
            diagnostics["entropy_p_old"] = entropy(old)
        return {"q": q, "mask": mask}, diagnostics

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.tpo_loss` of the group log-probs against the frozen target."""
        return tpo_loss(current, fixed["q"], fixed["mask"])
