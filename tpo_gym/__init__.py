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
from tpo_gym.agents import SeedBatch, train_seeds
from tpo_gym.agents.common.registry import builtin_algorithms

# The agent classes (TPO, GRPO, GroupPG, PPO, REINFORCE, DG, CE, ...): every built-in registered algorithm, one
# module each in tpo_gym/agents/algorithms (:func:`tpo_gym.agents.common.registry.builtin_algorithms`).
globals().update(builtin_algorithms())

__all__ = ["__version__", *builtin_algorithms(), "SeedBatch", "train_seeds"]
