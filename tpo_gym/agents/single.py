"""The single-sample baselines of the paper: critic-free PPO, REINFORCE and DG (docs/method.md section 2).

Each rolls out one behaviour trajectory per context (B, or B*K with ``budget="interaction"``) and uses
the per-position batch-mean baseline ``A_t = r_t - mean_b r_{b,t}``
(:func:`~tpo_gym.objectives.batch_baseline_advantages`). Where the env's ``reward_credit`` is
``"episode"`` (the terminal task, ``r_t = 1{all correct}`` at every position) every step is credited
with the episode's reward (:meth:`~tpo_gym.agents.sampling.RolloutBatch.credited_rewards`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_choice, check_float
from tpo_gym.agents.base import GroupAlgorithm
from tpo_gym.agents.policies import CategoricalPolicy
from tpo_gym.agents.registry import AlgorithmSpec, register_algorithm
from tpo_gym.agents.sampling import RolloutBatch
from tpo_gym.agents.update import StepAdvantageBatch
from tpo_gym.objectives import batch_baseline_advantages, dg_loss, grpo_advantages, ppo_loss, reinforce_loss

__all__ = ["PPO", "REINFORCE", "DG"]


class _SingleSample(GroupAlgorithm):
    """Shared rollouts and advantages of PPO, REINFORCE and DG (``view`` = behaviour-action log-probs)."""

    fixed_params: ClassVar[dict[str, Any]] = {"level": "auto"}

    #: the advantage baselines this method accepts (``baseline=``)
    baselines: ClassVar[tuple[str, ...]] = ("batch",)
    baseline: str = "batch"

    def advantages(self, batch: RolloutBatch) -> torch.Tensor:
        r"""The advantages of ``self.baseline``, per position (credited rewards :math:`r`):

        * ``"batch"``: :math:`A_t = r_t - \mathrm{mean}_b\, r_{b,t}`;
        * ``"expected"``: :math:`A_t = r_t - \sum_k \pi_{old}(k)^2` (the expected reward of a
          one-correct-answer task);
        * ``"standardized"``: :math:`A_t = (r_t - \mathrm{mean}_b r_{b,t}) / (\sigma_b(r_{\cdot,t}) + 10^{-8})`
          (population std over the batch; 0 where every reward is equal).
        """
        rewards = batch.credited_rewards()
        if self.baseline == "expected":
            adv = rewards - batch.logp_old.exp().pow(2).sum(dim=-1)
            return adv if batch.step_mask is None else adv * batch.step_mask
        if self.baseline == "standardized":
            mask = None if batch.step_mask is None else batch.step_mask.T.bool()
            return grpo_advantages(rewards.T, mask).T
        return batch_baseline_advantages(rewards, batch.step_mask)

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[StepAdvantageBatch, dict[str, Any]]:
        """Advantages and the rollout-time log-probs of the behaviour actions."""
        return StepAdvantageBatch(adv=self.advantages(batch), logp_old=old), {}


@register_algorithm
class PPO(_SingleSample):
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


@register_algorithm
class REINFORCE(_SingleSample):
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


@register_algorithm
class DG(_SingleSample):
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
