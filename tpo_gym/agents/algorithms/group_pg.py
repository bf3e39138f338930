"""Group PG: TPO's candidates and z-scores with scalar weighting (docs/method.md section 2)."""

from __future__ import annotations

from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_choice, check_float
from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.grouping import Grouping, resolve_grouping
from tpo_gym.agents.common.registry import (
    GROUP_DIAGNOSTICS,
    TEXT_DIAGNOSTICS,
    UPDATE_DIAGNOSTICS,
    AlgorithmSpec,
    register_algorithm,
)
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import GroupAdvantageBatch
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.objectives import group_pg_loss, standardize_scores

__all__ = ["GroupPG"]


@register_algorithm
class GroupPG(GroupAlgorithm):
    """Group policy gradient: loss ``-mean sum_k (u_k / eta) * log pi(y_k)`` over TPO's groups.

    The ablation that keeps TPO's candidates and standardised scores ``u`` but replaces target
    matching by scalar weighting (:func:`~tpo_gym.objectives.group_pg_loss`). Same groups as
    :class:`~tpo_gym.agents.TPO` (``level="token"``: K candidates per state; ``"sequence"``: K
    rollouts per context).

    ``GroupPG(candidates="single")`` is the reference code's Group PG on MNIST (docs/method.md
    section 4b): one sampled action per context, the one-hot scores ``s = A onehot(a)`` of
    ``TPO(candidates="single")`` z-scored over all actions, and the weight of the sampled action
    only: loss ``-mean_b (u_{b,a_b} / eta) log pi(a_b)``.

    :param eta: temperature of the weights ``u / eta``, > 0 (default 1).
    :param candidates: ``"sampled"`` (K candidates / rollouts per context, default) or ``"single"``.
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), tabular="group_pg",
        run_kinds=("token", "mnist", "llm", "tabular_single", "gym"),
        diagnostics=(*UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS, *TEXT_DIAGNOSTICS),
    )

    def __init__(
        self, policy: str | type[CategoricalPolicy], env: GymEnv | str | None, *, eta: float = 1.0,
        candidates: str = "sampled", **kwargs: Any
    ) -> None:
        self.eta = check_float("eta", eta, 0.0, strict_min=True)
        self.candidates = check_choice("candidates", candidates, ("sampled", "single"))
        super().__init__(policy, env, **kwargs)

    def choose_grouping(self, native: bool) -> Grouping:
        return resolve_grouping(self.sampling, self.level, self.group_size, native=native, text=self.is_text,
                                single_candidate=self.candidates == "single")

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[GroupAdvantageBatch, dict[str, Any]]:
        """Standardised scores ``u`` of every group (``"single"``: kept at the sampled action only)."""
        if self.candidates == "single":
            scores, mask, diagnostics = self.single_candidate_scores(batch)
            u = standardize_scores(scores, mask)
            sampled = torch.nn.functional.one_hot(batch.actions.long(), scores.shape[-1]).to(u.dtype)
            return GroupAdvantageBatch(u=u * sampled, mask=mask), diagnostics
        scores, mask = self.group_scores(batch)
        return GroupAdvantageBatch(u=standardize_scores(scores, mask), mask=mask), self.group_diagnostics(scores, mask)

    def compute_loss(self, batch: RolloutBatch, prepared: GroupAdvantageBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.group_pg_loss`."""
        return group_pg_loss(current, prepared.u, self.eta, prepared.mask)
