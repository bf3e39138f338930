"""Group PG: TPO's candidates and z-scores with scalar weighting (SPEC section 2)."""

from __future__ import annotations

from typing import Any

import torch

from tpo_gym.agents.grpo import GRPO
from tpo_gym.agents.sampling import RolloutBatch
from tpo_gym.agents.tpo import TPO
from tpo_gym.objectives import group_pg_loss, standardize_scores

__all__ = ["GroupPG"]


class GroupPG(TPO):
    """Group policy gradient: loss ``-mean sum_k (u_k / eta) * log pi(y_k)`` over TPO's groups.

    The ablation that keeps TPO's candidates and standardised scores ``u`` but replaces target
    matching by scalar weighting (:func:`~tpo_gym.objectives.group_pg_loss`). Same arguments as
    :class:`~tpo_gym.agents.TPO` (``anchor`` is unused; ``candidates`` must be ``"sampled"``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("candidates", "sampled") != "sampled":
            raise ValueError(f"GroupPG needs candidates='sampled', got {kwargs['candidates']!r}")
        super().__init__(*args, **kwargs)

    _group_logp = GRPO._group_logp  # type: ignore[assignment]

    def prepare(self, batch: RolloutBatch) -> tuple[dict[str, Any], dict[str, float]]:
        """Standardised scores ``u`` of every group."""
        scores, mask = self.group_scores(batch)
        return {"u": standardize_scores(scores, mask), "mask": mask}, self.group_diagnostics(scores, mask)

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.group_pg_loss`."""
        return group_pg_loss(self._group_logp(logp, batch), fixed["u"], self.eta, fixed["mask"])
