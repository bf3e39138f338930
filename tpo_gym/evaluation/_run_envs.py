"""The envs of the benchmark's runs and the greedy test error, shared by tpo-gym's agents
(:mod:`tpo_gym.evaluation.experiments`) and Stable-Baselines3's (:mod:`tpo_gym.evaluation.sb3_runs`)."""

from __future__ import annotations

from typing import Any

__all__ = ["make_env", "greedy_error"]


def make_env(env_id: str, env_kwargs: dict[str, Any]) -> Any:
    """``gym.make(env_id, **env_kwargs)`` with the ``tpo_gym/`` envs registered."""
    import gymnasium as gym

    import tpo_gym  # noqa: F401  (registers the tpo_gym/ namespace)

    return gym.make(env_id, **env_kwargs)


def greedy_error(model: Any, images: Any, labels: Any) -> float:
    """The fraction of ``images`` whose greedy (deterministic) action is not the label."""
    import numpy as np

    actions, _ = model.predict(images, deterministic=True)
    return float(np.mean(np.asarray(actions).reshape(-1) != labels))
