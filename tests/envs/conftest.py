"""Shared fixtures of the environment tests: the registered ids and small, fast kwargs for each."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import tpo_gym  # noqa: F401  (registers the tpo_gym/ environments)

gym.register_envs(tpo_gym)

ALL_IDS: list[str] = sorted(env_id for env_id in gym.registry if env_id.startswith("tpo_gym/"))
NATIVE_IDS: list[str] = [i for i in ALL_IDS if gym.spec(i).vector_entry_point is not None]
TEXT_IDS: list[str] = [i for i in ALL_IDS if i not in NATIVE_IDS]

#: Kwargs that keep each env small in tests (few arms so random actions hit; small datasets).
FAST_KWARGS: dict[str, dict[str, Any]] = {
    "tpo_gym/Bandit-v0": {"n_arms": 3},
    "tpo_gym/ReasoningGym-v0": {"dataset": "basic_arithmetic", "size": 20},
    "tpo_gym/TokenReversalTerminal-v0": {"length": 2},  # so random actions sometimes succeed
}


def fast_kwargs(env_id: str) -> dict[str, Any]:
    """Test kwargs for ``env_id`` (empty when the registered defaults are already fast)."""
    return dict(FAST_KWARGS.get(env_id, {}))


def assert_same(a: Any, b: Any) -> None:
    """``a`` (numpy) and ``b`` (numpy, or a torch tensor on any device) hold the same values."""
    b = b.cpu().numpy() if isinstance(b, torch.Tensor) else b
    np.testing.assert_array_equal(np.asarray(a), b)


@pytest.fixture(scope="module")
def mnist_splits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The real MNIST: train images and labels, then test images and labels."""
    from tpo_gym.envs import mnist_data

    assert mnist_data.is_verified(), f"MNIST missing: run {mnist_data.fetch_command()} before the tests"
    return (*mnist_data.load_mnist("train"), *mnist_data.load_mnist("test"))
