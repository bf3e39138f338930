"""The base of the group methods that only swap Group PG's advantage estimator (MaxRL, TailRL): not a method."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import GroupAdvantageBatch
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.objectives import group_pg_loss

__all__ = ["GroupAdvantageAlgorithm"]


class GroupAdvantageAlgorithm(GroupAlgorithm):
    r"""TPO's groups and Group PG's loss :math:`L = -\frac1G \sum_g \sum_k A_{g,k} \log\pi_\theta(y_{g,k})` with
    the advantages :math:`A` of :attr:`group_advantages` (a pure function of ``objectives``: ``(scores, mask) ->
    A``); a subclass names that function and its spec."""

    #: ``(scores [..., K], mask) -> advantages [..., K]``, one of :mod:`tpo_gym.objectives`.
    group_advantages: ClassVar[Callable[..., torch.Tensor]]

    def __init__(self, policy: str | type[CategoricalPolicy], env: GymEnv | str | None, **kwargs: Any) -> None:
        super().__init__(policy, env, **kwargs)

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[GroupAdvantageBatch, dict[str, Any]]:
        """The advantages of every group (kept in ``u``, the weights of the group policy gradient)."""
        scores, mask = self.group_scores(batch)
        advantages = type(self).group_advantages(scores, mask)
        return GroupAdvantageBatch(u=advantages, mask=mask), self.group_diagnostics(scores, mask)

    def compute_loss(self, batch: RolloutBatch, prepared: GroupAdvantageBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.group_pg_loss` with ``u = A`` and ``eta = 1``."""
        return group_pg_loss(current, prepared.u, 1.0, prepared.mask)
