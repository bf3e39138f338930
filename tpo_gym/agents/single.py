"""The single-sample baselines of the paper: critic-free PPO, REINFORCE and DG (SPEC section 2).

Each rolls out one behaviour trajectory per context (B, or B*K with ``budget="interaction"``) and uses
the per-position batch-mean baseline ``A_t = r_t - mean_b r_{b,t}``
(:func:`~tpo_gym.objectives.batch_baseline_advantages`). With a terminal reward every position is
credited with the episode's reward, ``r_t = 1{all correct}`` (SPEC section 3;
:meth:`~tpo_gym.agents.sampling.RolloutBatch.credited_rewards`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from tpo_gym.agents.base import GroupAlgorithm, _check_choice, _check_positive, inherit_param_docs
from tpo_gym.agents.policies import CategoricalPolicy
from tpo_gym.agents.sampling import RolloutBatch
from tpo_gym.objectives import batch_baseline_advantages, dg_loss, ppo_loss, reinforce_loss

__all__ = ["PPO", "REINFORCE", "DG"]


class _SingleSample(GroupAlgorithm):
    """Shared rollouts and advantages of PPO, REINFORCE and DG."""

    sampling: ClassVar[str] = "single"

    def advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """``A_t = r_t - mean_b r_{b,t}`` over the batch, per position (terminal: ``r_t`` = episode reward)."""
        return batch_baseline_advantages(batch.credited_rewards(), batch.step_mask)

    def prepare(self, batch: RolloutBatch) -> tuple[dict[str, Any], dict[str, float]]:
        """Advantages and the rollout-time log-probs of the behaviour actions."""
        return {"adv": self.advantages(batch), "logp_old": self.action_logp(batch.logp_old, batch)}, {}


_BASE_ARGS = """
    :param learning_rate: learning rate (multiplied by ``sqrt(group_size)`` with ``budget="interaction"``).
    :param batch_size: B, contexts (trajectories) per iteration.
    :param group_size: K, only used by ``budget="interaction"`` (B*K trajectories, lr * sqrt(K)).
    :param budget: ``"prompt"`` (B trajectories, default) or ``"interaction"``.
"""


@inherit_param_docs
class PPO(_SingleSample):
    __doc__ = (
        """The paper's critic-free PPO baseline (not Stable-Baselines3's PPO).

    Loss :func:`~tpo_gym.objectives.ppo_loss`: per-token ratio clipped at ``1 +- clip_range``,
    advantages ``A_t = r_t - mean_b r_{b,t}`` (immediate reward minus the per-position batch mean),
    ``n_epochs`` (4) full-batch steps. Differences from ``stable_baselines3.PPO`` (which runs on
    tpo_gym envs unchanged, e.g. ``stable_baselines3.PPO("MlpPolicy", "tpo_gym/TokenReversal-v0")``):
    no value function / critic, no GAE or returns-to-go, no advantage normalisation, no entropy bonus,
    no minibatches (each epoch is one full-batch step), and rollouts are whole episodes of B prompts
    rather than ``n_steps`` per env.
"""
        + _BASE_ARGS
        + """    :param n_epochs: full-batch steps per batch (default 4).
    :param clip_range: ratio clip epsilon >= 0 (default 0.2).
"""
    )

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-3,
        batch_size: int = 100,
        group_size: int = 8,
        n_epochs: int = 4,
        clip_range: float = 0.2,
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
        self.clip_range = float(clip_range)
        super().__init__(
            policy, env, learning_rate, batch_size, group_size, n_epochs, "auto", budget, max_grad_norm,
            n_threads, stats_window_size, tensorboard_log, policy_kwargs, verbose, seed, device, _init_setup_model,
        )

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.ppo_loss` on the behaviour actions."""
        logp_actions = self.action_logp(logp, batch)
        return ppo_loss(logp_actions, fixed["logp_old"], fixed["adv"], self.clip_range, batch.step_mask)


@inherit_param_docs
class REINFORCE(_SingleSample):
    __doc__ = (
        """REINFORCE / policy gradient with a baseline: loss ``-mean_b sum_t A_t log pi(a_t)``.

    ``baseline="batch"`` (default): ``A_t = r_t - mean_b r_{b,t}``; ``baseline="expected"``:
    ``A_t = r_t - sum_k pi_old(k)^2``, the expected reward of a one-correct-answer task (the paper's
    PG on MNIST). One full-batch step per batch by default.
"""
        + _BASE_ARGS
        + """    :param n_epochs: full-batch steps per batch (default 1).
    :param baseline: ``"batch"`` or ``"expected"``.
"""
    )

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-3,
        batch_size: int = 100,
        group_size: int = 8,
        n_epochs: int = 1,
        baseline: str = "batch",
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
        self.baseline = _check_choice("baseline", baseline, ("batch", "expected"))
        super().__init__(
            policy, env, learning_rate, batch_size, group_size, n_epochs, "auto", budget, max_grad_norm,
            n_threads, stats_window_size, tensorboard_log, policy_kwargs, verbose, seed, device, _init_setup_model,
        )

    def advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Batch-mean or expected-reward baseline."""
        if self.baseline == "batch":
            return super().advantages(batch)
        adv = batch.credited_rewards() - batch.logp_old.exp().pow(2).sum(dim=-1)
        return adv if batch.step_mask is None else adv * batch.step_mask

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.reinforce_loss`."""
        return reinforce_loss(self.action_logp(logp, batch), fixed["adv"], batch.step_mask)


@inherit_param_docs
class DG(_SingleSample):
    __doc__ = (
        """Delightful Policy Gradient (Osband 2026): REINFORCE gated by ``sigmoid(A * surprisal / eta)``.

    Loss :func:`~tpo_gym.objectives.dg_loss` with ``A_t = r_t - mean_b r_{b,t}``; **one** optimiser
    step per batch by default (more epochs diverge, DG paper Appendix E).
"""
        + _BASE_ARGS
        + """    :param n_epochs: full-batch steps per batch (default 1).
    :param eta: gate temperature > 0 (default 1).
"""
    )

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-3,
        batch_size: int = 100,
        group_size: int = 8,
        n_epochs: int = 1,
        eta: float = 1.0,
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
        self.eta = _check_positive("eta", eta)
        super().__init__(
            policy, env, learning_rate, batch_size, group_size, n_epochs, "auto", budget, max_grad_norm,
            n_threads, stats_window_size, tensorboard_log, policy_kwargs, verbose, seed, device, _init_setup_model,
        )

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.dg_loss`."""
        return dg_loss(self.action_logp(logp, batch), fixed["adv"], self.eta, batch.step_mask)
