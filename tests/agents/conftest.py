"""Small, fast envs and helpers shared by the agent tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

import tpo_gym  # noqa: F401  (registers the tpo_gym/ environments)
from tpo_gym import TPO


def token_env(
    length: int = 3, vocab_size: int = 2, reward: str = "bag", target: str = "reverse_copy"
) -> gym.Env[Any, Any]:
    """A small token task."""
    return gym.make("tpo_gym/TokenTask-v0", target=target, reward=reward, vocab_size=vocab_size, length=length)


def bandit_env(n_arms: int = 10, correct_arm: int = 3) -> gym.Env[Any, Any]:
    """A single-context bandit with a fixed correct arm (one problem for every seed)."""
    return gym.make("tpo_gym/Bandit-v0", n_arms=n_arms, correct_arm=correct_arm)


def small_tpo(**kw: Any) -> TPO:
    """A small TPO agent on :func:`bandit_env` (batch size 8, seed 0)."""
    return TPO("MlpPolicy", bandit_env(), batch_size=8, seed=0, **kw)


class Boom:
    """Pickling this object makes unpickling create a marker file: proof that code ran on load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (self.marker,))


def params_of(model: Any) -> dict[str, torch.Tensor]:
    """A detached copy of the policy parameters."""
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
