"""The paper's critic-free PPO baseline (docs/method.md section 2)."""

from __future__ import annotations

from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_float
from tpo_gym.agents.algorithms.single import SingleSampleAlgorithm
from tpo_gym.agents.common.registry import AlgorithmSpec, register_algorithm
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import StepAdvantageBatch
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.objectives import ppo_loss

__all__ = ["PPO"]


@register_algorithm
class PPO(SingleSampleAlgorithm):
    """The paper's critic-free PPO baseline (not Stable-Baselines3's PPO).

    Loss :func:`~tpo_gym.objectives.ppo_loss`: per-token ratio clipped at ``1 +- clip_range``,
    advantages ``A_t = r_t - mean_b r_{b,t}`` (immediate reward minus the per-position batch mean),
    ``n_epochs`` (4) full-batch steps. Differences from ``stable_baselines3.PPO`` (which runs on
    tpo_gym envs unchanged, e.g. ``stable_baselines3.PPO("MlpPolicy", "tpo_gym/TokenReversal-v0")``):
    no value function / critic, no GAE or returns-to-go, no advantage normalisation, no entropy bonus,
    no minibatches (each epoch is one full-batch step), and rollouts are whole episodes of B prompts
    rather than ``n_steps`` per env. ``group_size`` is only used by ``budget="interaction"`` (B*K
    trajectories, ``learning_rate * sqrt(K)``).

    :param clip_range: ratio clip epsilon >= 0 (default 0.2).
    """

    spec = AlgorithmSpec(sampling="single", run_kinds=("token", "mnist", "gym"), clipped_surrogate=True)

    def __init__(
        self, policy: str | type[CategoricalPolicy], env: GymEnv | str | None, *, clip_range: float = 0.2,
        **kwargs: Any,
    ) -> None:
        self.clip_range = check_float("clip_range", clip_range, 0.0)
        super().__init__(policy, env, **kwargs)

    def compute_loss(self, batch: RolloutBatch, prepared: StepAdvantageBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.ppo_loss` on the behaviour actions."""
        return ppo_loss(current, prepared.logp_old, prepared.adv, self.clip_range, batch.step_mask)
