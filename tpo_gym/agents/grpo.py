"""GRPO as the paper runs it (SPEC section 2)."""

from __future__ import annotations

from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from tpo_gym.agents.base import GroupAlgorithm, _check_positive, inherit_param_docs
from tpo_gym.agents.policies import CategoricalPolicy
from tpo_gym.agents.sampling import RolloutBatch
from tpo_gym.agents.tpo import winner_loser_means
from tpo_gym.objectives import grpo_advantages, grpo_loss

__all__ = ["GRPO"]


@inherit_param_docs
class GRPO(GroupAlgorithm):
    """Group Relative Policy Optimization with a k3 KL penalty to the rollout snapshot.

    Same candidates as :class:`~tpo_gym.agents.TPO` (``level="token"``: K next-token candidates per
    state, GRPO_token; ``level="sequence"``: K rollouts per prompt with a sequence-level ratio).
    Advantages ``A = (s - mean) / (std + 1e-8)`` within each group, zero for zero-variance groups;
    loss :func:`~tpo_gym.objectives.grpo_loss` (clipped ratio, ``beta * kl``), ``n_epochs`` full-batch
    steps. Names follow TRL where they exist (``beta``; TRL's ``epsilon`` is ``clip_range`` here, as
    in SB3). Ablations: ``GRPO(beta=0.0)`` (no KL), ``GRPO(mask_zero_variance=True)``.

    Diagnostics: ``zero_variance_fraction``, ``all_fail_fraction``, ``any_success_fraction``,
    ``mean_abs_adv_winners``, ``mean_abs_adv_losers``.

    :param clip_range: ratio clip epsilon >= 0 (default 0.2).
    :param beta: KL coefficient >= 0 (default 0.04).
    :param mask_zero_variance: drop zero-variance groups from the loss mean.
    """

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-3,
        batch_size: int = 100,
        group_size: int = 8,
        n_epochs: int = 4,
        clip_range: float = 0.2,
        beta: float = 0.04,
        mask_zero_variance: bool = False,
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
        if clip_range != 0:
            _check_positive("clip_range", clip_range)
        if beta != 0:
            _check_positive("beta", beta)
        self.clip_range = float(clip_range)
        self.beta = float(beta)
        self.mask_zero_variance = bool(mask_zero_variance)
        super().__init__(
            policy, env, learning_rate, batch_size, group_size, n_epochs, level, budget, max_grad_norm,
            n_threads, stats_window_size, tensorboard_log, policy_kwargs, verbose, seed, device, _init_setup_model,
        )

    def _group_logp(self, logp: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        if self.level == "sequence":
            return self.sequence_logp(logp, batch)
        return self.candidate_logp(logp, batch)

    def prepare(self, batch: RolloutBatch) -> tuple[dict[str, Any], dict[str, float]]:
        """Group scores and the rollout-time log-probs of the candidates."""
        scores, mask = self.group_scores(batch)
        diagnostics = self.group_diagnostics(scores, mask)
        adv = grpo_advantages(scores, mask)
        winners, losers = winner_loser_means(adv.abs(), adv, mask)
        diagnostics["mean_abs_adv_winners"], diagnostics["mean_abs_adv_losers"] = winners, losers
        return {"scores": scores, "mask": mask, "logp_old": self._group_logp(batch.logp_old, batch)}, diagnostics

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.grpo_loss`."""
        return grpo_loss(
            self._group_logp(logp, batch),
            fixed["logp_old"],
            fixed["scores"],
            clip_eps=self.clip_range,
            beta=self.beta,
            mask=fixed["mask"],
            mask_zero_variance=self.mask_zero_variance,
        )
