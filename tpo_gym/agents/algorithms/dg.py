"""Delightful Policy Gradient, Osband 2026 (docs/method.md section 2)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_choice, check_float
from tpo_gym.agents.algorithms.single import SingleSampleAlgorithm
from tpo_gym.agents.common.registry import AlgorithmSpec, register_algorithm
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import StepAdvantageBatch
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.objectives import dg_loss

__all__ = ["DG"]


@register_algorithm
class DG(SingleSampleAlgorithm):
    """Delightful Policy Gradient (Osband 2026): REINFORCE gated by ``sigmoid(A * surprisal / eta)``.

    Loss :func:`~tpo_gym.objectives.dg_loss` with ``A_t = r_t - mean_b r_{b,t}`` (``baseline="batch"``,
    default) or ``A_t = r_t - sum_k pi_old(k)^2`` (``baseline="expected"``, the reference code's DG on
    MNIST); **one** optimiser step per batch by default (more epochs diverge, DG paper Appendix E).

    :param n_epochs: full-batch steps per batch (default 1).
    :param eta: gate temperature > 0 (default 1).
    :param baseline: ``"batch"`` or ``"expected"``.
    """

    spec = AlgorithmSpec(sampling="single", run_kinds=("token", "mnist", "tabular_single", "tabular_multi", "gym"),
                         tabular="dg")
    baselines: ClassVar[tuple[str, ...]] = ("batch", "expected")

    def __init__(
        self, policy: str | type[CategoricalPolicy], env: GymEnv | str | None, *, n_epochs: int = 1,
        eta: float = 1.0, baseline: str = "batch", **kwargs: Any,
    ) -> None:
        self.eta = check_float("eta", eta, 0.0, strict_min=True)
        self.baseline = check_choice("baseline", baseline, self.baselines)
        super().__init__(policy, env, n_epochs=n_epochs, **kwargs)

    def compute_loss(self, batch: RolloutBatch, prepared: StepAdvantageBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.dg_loss`."""
        return dg_loss(current, prepared.adv, self.eta, batch.step_mask)
