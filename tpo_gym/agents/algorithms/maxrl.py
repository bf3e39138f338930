r"""MaxRL: Group PG with MaxRL's advantages (Tajwar et al. 2026, arXiv:2602.02710)."""

from __future__ import annotations

from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym.agents.common.base import GroupAlgorithm
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
from tpo_gym.objectives import group_pg_loss
from tpo_gym.objectives.listwise import maxrl_advantages

__all__ = ["MaxRL"]


@register_algorithm
class MaxRL(GroupAlgorithm):
    r"""Maximum-likelihood RL: TPO's groups weighted by MaxRL's advantages ``(r - mean) / mean``.

    The Group PG family (:class:`~tpo_gym.agents.GroupPG`'s groups and loss) with another advantage estimator:

    .. math::
        A_i = \frac{r_i - \bar r}{\bar r}, \qquad
        L = -\frac1G \sum_g \sum_{k=1}^{K} A_{g,k}\, \log\pi_\theta(y_{g,k})

    (:func:`~tpo_gym.objectives.listwise.maxrl_advantages`, :func:`~tpo_gym.objectives.group_pg_loss`). On 0/1
    rewards with m successes of K this weights a success by :math:`(K - m)/m` and a failure by -1: the sample
    estimate of :math:`\nabla \log p_\theta(x)`, the log pass rate, instead of :math:`\nabla p_\theta(x)`, so
    hard contexts (small m) get more weight. An all-fail group (mean 0) and every all-equal group get exactly
    ``A = 0``. Rewards must be non-negative (else a ``ValueError`` at the update); on rewards other than 0/1 the
    same formula estimates :math:`\nabla \log \mathbb{E}[r]` (:class:`~tpo_gym.agents.TailRL` is the published
    continuous generalisation). ``level="token"``: K candidates per state, each scored by its reward;
    ``"sequence"``: K rollouts per context, scored by the episode (with the terminal reward, 0/1 exact match);
    a language model: K completions per prompt.

    Diagnostics: ``zero_variance_fraction``, ``all_fail_fraction``, ``any_success_fraction`` (and on language
    models ``completion_length``, ``mean_score``).
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), run_kinds=("token", "mnist", "llm"),
        diagnostics=(*UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS, *TEXT_DIAGNOSTICS),
    )

    def __init__(self, policy: str | type[CategoricalPolicy], env: GymEnv | str | None, **kwargs: Any) -> None:
        super().__init__(policy, env, **kwargs)

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[GroupAdvantageBatch, dict[str, Any]]:
        """MaxRL's advantages of every group (kept in ``u``, the weights of the group policy gradient)."""
        scores, mask = self.group_scores(batch)
        return GroupAdvantageBatch(u=maxrl_advantages(scores, mask), mask=mask), self.group_diagnostics(scores, mask)

    def compute_loss(self, batch: RolloutBatch, prepared: GroupAdvantageBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.group_pg_loss` with ``u = A`` and ``eta = 1``."""
        return group_pg_loss(current, prepared.u, 1.0, prepared.mask)
