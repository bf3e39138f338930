"""The supervised cross-entropy oracle (docs/method.md section 2)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.registry import AlgorithmSpec, register_algorithm
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import LabelBatch
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.objectives import cross_entropy_loss

__all__ = ["CE"]


@register_algorithm
class CE(GroupAlgorithm):
    """Supervised cross-entropy on the true label: the oracle of MNIST and the bandits.

    At every visited state all ``n_actions`` actions are scored through the env's group API
    (``score_candidates``, no env step); the true label is the best-scoring action (for MNIST and
    the bandits: the only one with reward 1; for bag-of-tokens tasks: the target token). The loss is
    :func:`~tpo_gym.objectives.cross_entropy_loss`, one full-batch step per batch by default. The
    env must have the tpo_gym group API.

    :param env: a tpo_gym env instance or id (with the group API).
    :param n_epochs: full-batch steps per batch (default 1).
    """

    spec = AlgorithmSpec(sampling="oracle", tabular="ce",
                         run_kinds=("token", "mnist", "tabular_single", "tabular_multi"))
    fixed_params: ClassVar[dict[str, Any]] = {"group_size": 1, "level": "auto", "budget": "prompt"}

    def __init__(
        self, policy: str | type[CategoricalPolicy], env: GymEnv | str | None, *, n_epochs: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(policy, env, n_epochs=n_epochs, **kwargs)

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[LabelBatch, dict[str, Any]]:
        """True labels: the argmax of the scores of all actions."""
        assert batch.candidate_scores is not None
        return LabelBatch(labels=batch.candidate_scores.argmax(dim=-1)), {}

    def compute_loss(self, batch: RolloutBatch, prepared: LabelBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.cross_entropy_loss` (log-probs are valid logits)."""
        return cross_entropy_loss(current, prepared.labels, batch.step_mask)
