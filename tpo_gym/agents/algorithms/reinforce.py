"""REINFORCE with a batch-mean, expected-reward or standardised baseline (docs/method.md section 2)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_choice
from tpo_gym.agents.algorithms.single import SingleSampleAlgorithm
from tpo_gym.agents.common.registry import AlgorithmSpec, register_algorithm
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import StepAdvantageBatch
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.objectives import reinforce_loss

__all__ = ["REINFORCE"]


@register_algorithm
class REINFORCE(SingleSampleAlgorithm):
    """REINFORCE / policy gradient with a baseline: loss ``-mean_b sum_t A_t log pi(a_t)``.

    ``baseline="batch"`` (default): ``A_t = r_t - mean_b r_{b,t}``; ``baseline="expected"``:
    ``A_t = r_t - sum_k pi_old(k)^2``, the expected reward of a one-correct-answer task (the paper's
    PG on MNIST); ``baseline="standardized"``: rewards z-scored over the batch, which is what the
    reference code runs as "GRPO" on MNIST (docs/method.md section 4b). One full-batch step per
    batch by default.

    :param n_epochs: full-batch steps per batch (default 1).
    :param baseline: ``"batch"``, ``"expected"`` or ``"standardized"``.
    """

    spec = AlgorithmSpec(sampling="single", run_kinds=("token", "mnist", "tabular_single", "gym"), tabular="pg")
    baselines: ClassVar[tuple[str, ...]] = ("batch", "expected", "standardized")

    def __init__(
        self, policy: str | type[CategoricalPolicy], env: GymEnv | str | None, *, n_epochs: int = 1,
        baseline: str = "batch", **kwargs: Any,
    ) -> None:
        self.baseline = check_choice("baseline", baseline, self.baselines)
        super().__init__(policy, env, n_epochs=n_epochs, **kwargs)

    def compute_loss(self, batch: RolloutBatch, prepared: StepAdvantageBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.reinforce_loss`."""
        return reinforce_loss(current, prepared.adv, batch.step_mask)
