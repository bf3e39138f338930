"""Target Policy Optimization (SPEC section 1)."""

from __future__ import annotations

from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from tpo_gym.agents.base import GroupAlgorithm, _check_choice, _check_positive, inherit_param_docs
from tpo_gym.agents.policies import CategoricalPolicy
from tpo_gym.agents.sampling import RolloutBatch
from tpo_gym.objectives import onehot_advantage_scores, standardize_scores, tpo_loss, tpo_target

__all__ = ["TPO"]

CANDIDATES = ("sampled", "single")


def winner_loser_means(values: torch.Tensor, u: torch.Tensor, mask: torch.Tensor | None) -> tuple[float, float]:
    """Mean of ``values`` over winners (``u > 0``) and over losers (``u < 0``) among valid candidates."""
    valid = torch.ones_like(u, dtype=torch.bool) if mask is None else mask
    out = []
    for sel in (valid & (u > 0), valid & (u < 0)):
        out.append(float(values[sel].mean()) if bool(sel.any()) else float("nan"))
    return out[0], out[1]


@inherit_param_docs
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
        learning_rate: float | Schedule = 1e-3,
        batch_size: int = 100,
        group_size: int = 8,
        n_epochs: int = 4,
        eta: float = 1.0,
        anchor: bool = True,
        candidates: str = "sampled",
        level: str = "auto",
        budget: str = "prompt",
        max_grad_norm: float | None = None,
        n_threads: int | None = 1,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: torch.device | str = "cpu",
        _init_setup_model: bool = True,
    ) -> None:
        self.eta = _check_positive("eta", eta)
        self.anchor = bool(anchor)
        self.candidates = _check_choice("candidates", candidates, CANDIDATES)
        super().__init__(
            policy, env, learning_rate, batch_size, group_size, n_epochs, level, budget, max_grad_norm,
            n_threads, stats_window_size, tensorboard_log, policy_kwargs, verbose, seed, device, _init_setup_model,
        )

    def _groups_of_candidates(self) -> bool:
        return self.candidates == "sampled"

    def _group_logp(self, logp: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """Log-probs of the group members: all actions, K candidates, or K rollouts."""
        if self.candidates == "single":
            return logp
        if self.level == "sequence":
            return self.sequence_logp(logp, batch)
        return self.candidate_logp(logp, batch)

    def prepare(self, batch: RolloutBatch) -> tuple[dict[str, Any], dict[str, float]]:
        """Scores, z-scores ``u`` and the frozen target ``q`` of every group."""
        if self.candidates == "single":
            n, t, n_actions = batch.logp_old.shape
            scores = onehot_advantage_scores(
                batch.actions.reshape(-1), batch.rewards.reshape(-1), batch.logp_old.exp().reshape(-1, n_actions)
            ).reshape(n, t, n_actions)
            mask = None if batch.step_mask is None else batch.step_mask.unsqueeze(-1).expand(n, t, n_actions)
            step_mask = None if batch.step_mask is None else batch.step_mask.unsqueeze(-1)
            diagnostics = self.group_diagnostics(batch.rewards.unsqueeze(-1), step_mask)
            diagnostics.pop("zero_variance_fraction")
        else:
            scores, mask = self.group_scores(batch)
            diagnostics = self.group_diagnostics(scores, mask)
        u = standardize_scores(scores, mask)
        q = tpo_target(self._group_logp(batch.logp_old, batch), u, self.eta, self.anchor, mask)
        diagnostics["mean_q_winners"], diagnostics["mean_q_losers"] = winner_loser_means(q, u, mask)
        return {"q": q, "mask": mask}, diagnostics

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.tpo_loss` of the group log-probs against the frozen target."""
        return tpo_loss(self._group_logp(logp, batch), fixed["q"], fixed["mask"])
