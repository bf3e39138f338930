"""The base of the paper's single-sample baselines, critic-free PPO, REINFORCE and DG (docs/method.md section 2).

Each rolls out one behaviour trajectory per context (B, or B*K with ``budget="interaction"``) and uses
the per-position batch-mean baseline ``A_t = r_t - mean_b r_{b,t}``
(:func:`~tpo_gym.objectives.batch_baseline_advantages`). Where the env's ``reward_credit`` is
``"episode"`` (the terminal task, ``r_t = 1{all correct}`` at every position) every step is credited
with the episode's reward (:meth:`~tpo_gym.agents.common.sampling.RolloutBatch.credited_rewards`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import StepAdvantageBatch
from tpo_gym.objectives import batch_baseline_advantages, grpo_advantages

__all__ = ["SingleSampleAlgorithm"]


class SingleSampleAlgorithm(GroupAlgorithm):
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
