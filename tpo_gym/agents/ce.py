"""The supervised cross-entropy oracle (SPEC section 2)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from tpo_gym.agents.base import GroupAlgorithm, inherit_param_docs
from tpo_gym.agents.policies import CategoricalPolicy
from tpo_gym.agents.sampling import RolloutBatch
from tpo_gym.objectives import cross_entropy_loss

__all__ = ["CE"]


@inherit_param_docs
class CE(GroupAlgorithm):
    """Supervised cross-entropy on the true label: the oracle of MNIST and the bandits.

    At every visited state all ``n_actions`` actions are scored through the env's group API
    (``score_candidates``, no env step); the true label is the best-scoring action (for MNIST and
    the bandits: the only one with reward 1; for bag-of-tokens tasks: the target token). The loss is
    :func:`~tpo_gym.objectives.cross_entropy_loss`, one full-batch step per batch by default. The
    env must have the tpo_gym group API.

    :param policy: ``"MlpPolicy"``, ``"TransformerPolicy"`` or a policy class.
    :param env: a tpo_gym env instance or id.
    :param learning_rate: learning rate.
    :param batch_size: B, contexts per iteration.
    :param n_epochs: full-batch steps per batch (default 1).
    """

    sampling: ClassVar[str] = "oracle"

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-3,
        batch_size: int = 100,
        n_epochs: int = 1,
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
        super().__init__(
            policy, env, learning_rate, batch_size, 1, n_epochs, "auto", "prompt", max_grad_norm,
            n_threads, stats_window_size, tensorboard_log, policy_kwargs, verbose, seed, device, _init_setup_model,
        )

    def prepare(self, batch: RolloutBatch) -> tuple[dict[str, Any], dict[str, float]]:
        """True labels: the argmax of the scores of all actions."""
        assert batch.candidate_scores is not None
        return {"labels": batch.candidate_scores.argmax(dim=-1)}, {}

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.cross_entropy_loss` (log-probs are valid logits)."""
        return cross_entropy_loss(logp, fixed["labels"], batch.step_mask)
