"""GRPO as the paper runs it (docs/method.md section 2)."""

from __future__ import annotations

from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_bool, check_choice, check_float
from tpo_gym.agents.algorithms.tpo import winner_loser_means
from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.registry import (
    GROUP_DIAGNOSTICS,
    TEXT_DIAGNOSTICS,
    UPDATE_DIAGNOSTICS,
    AlgorithmSpec,
    Diagnostic,
    register_algorithm,
)
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import ClippedGroupBatch
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.objectives import grpo_advantages, grpo_loss, zero_variance_groups

__all__ = ["GRPO"]


@register_algorithm
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
    :param kl_reference: the KL's reference: ``"snapshot"`` (the rollout-time policy, as the paper) or
        ``"initial"`` (a frozen copy of the initial model, TRL's meaning of ``beta``; language models
        only).
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), tabular="grpo", clipped_surrogate=True,
        run_kinds=("token", "mnist", "llm", "tabular_single", "tabular_multi", "gym"),
        diagnostics=(*UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS, Diagnostic("mean_abs_adv_winners"),
                     Diagnostic("mean_abs_adv_losers"), *TEXT_DIAGNOSTICS),
    )

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        *,
        clip_range: float = 0.2,
        beta: float = 0.04,
        mask_zero_variance: bool = False,
        kl_reference: str = "snapshot",
        **kwargs: Any,
    ) -> None:
        self.clip_range = check_float("clip_range", clip_range, 0.0)
        self.beta = check_float("beta", beta, 0.0)
        self.mask_zero_variance = check_bool("mask_zero_variance", mask_zero_variance)
        self.kl_reference = check_choice("kl_reference", kl_reference, ("snapshot", "initial"))
        super().__init__(policy, env, **kwargs)
        if self.kl_reference == "initial" and not self.is_text:
            raise ValueError("kl_reference='initial' needs policy='CausalLMPolicy' (a frozen reference model)")

    def needs_reference(self) -> bool:
        return self.kl_reference == "initial" and self.beta > 0

    def group_weights(self, prepared: ClippedGroupBatch, n_groups: int) -> torch.Tensor:
        """Informative groups only when zero-variance groups are masked out of the mean."""
        if not self.mask_zero_variance:
            return super().group_weights(prepared, n_groups)
        informative = ~zero_variance_groups(prepared.scores, prepared.mask)
        return informative.reshape(n_groups, -1).any(dim=-1).double()

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[ClippedGroupBatch, dict[str, Any]]:
        """Group scores and the rollout-time log-probs of the candidates."""
        scores, mask = self.group_scores(batch)
        diagnostics = self.group_diagnostics(scores, mask)
        adv = grpo_advantages(scores, mask)
        winners, losers = winner_loser_means(adv.abs(), adv, mask)
        diagnostics["mean_abs_adv_winners"], diagnostics["mean_abs_adv_losers"] = winners, losers
        ref = getattr(batch, "logp_ref", None) if self.kl_reference == "initial" else None
        return ClippedGroupBatch(scores=scores, mask=mask, logp_old=old, logp_ref=ref), diagnostics

    def compute_loss(self, batch: RolloutBatch, prepared: ClippedGroupBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.grpo_loss`."""
        return grpo_loss(
            current,
            prepared.logp_old,
            prepared.scores,
            clip_eps=self.clip_range,
            beta=self.beta,
            mask=prepared.mask,
            mask_zero_variance=self.mask_zero_variance,
            **({"logp_ref": prepared.logp_ref} if prepared.logp_ref is not None else {}),
        )
