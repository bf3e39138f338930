"""tpo-gym: Target Policy Optimization (TPO) for Gymnasium environments.

Five parts:

* :mod:`tpo_gym.objectives` -- the math of TPO and every baseline as small pure torch functions;
* :mod:`tpo_gym.envs` -- registered Gymnasium environments (``gym.make("tpo_gym/...")``);
* :mod:`tpo_gym.agents` -- Stable-Baselines3-style agents (``TPO``, ``GRPO``, ``PPO``, ...);
* :mod:`tpo_gym.evaluation` -- the benchmark harness behind the ``tpo-gym`` command;
* :mod:`tpo_gym.integrations` -- TPO on other libraries' trainers (TRL's ``TargetPOTrainer``).
"""

from __future__ import annotations

__version__ = "0.1.0"

from tpo_gym import envs  # noqa: F401  (registers the tpo_gym/ environments)
from tpo_gym.agents import CE, DG, GRPO, PPO, REINFORCE, TPO, GroupPG, SeedBatch, train_seeds  # noqa: F401
from tpo_gym.agents.registry import algorithm_registry

#: The agent classes (every registered algorithm: :func:`tpo_gym.agents.registry.algorithm_registry`).
__all__ = ["__version__", *algorithm_registry(), "SeedBatch", "train_seeds"]
