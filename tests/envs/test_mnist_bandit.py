"""tpo_gym.envs.mnist_bandit on the real MNIST: observations, rewards and labels, the test split, the
vector env and the tensor env (value for value the numpy one)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.envs.conftest import assert_same
from tpo_gym.envs import mnist_data


def test_env_observation_reward_and_label(mnist_splits: tuple[np.ndarray, ...]) -> None:
    xtr, ytr, _, _ = mnist_splits
    env = gym.make("tpo_gym/MNISTBandit-v0")
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        assert "label" not in info
        idx = env.unwrapped.index
        np.testing.assert_array_equal(obs, xtr[idx])
        label = int(ytr[idx])
        np.testing.assert_array_equal(env.unwrapped.score_candidates(np.arange(10)), np.arange(10) == label)
        action = label if seed % 2 else (label + 1) % 10
        _, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated) == (float(seed % 2), True, False)
        assert info["label"] == label


def test_test_split_and_vector_env(mnist_splits: tuple[np.ndarray, ...]) -> None:
    _, _, xte, yte = mnist_splits
    venv = gym.make_vec("tpo_gym/MNISTBandit-v0", num_envs=6, vectorization_mode="vector_entry_point", split="test")
    obs, _ = venv.reset(seed=0, options={"group_size": 3})
    idx = venv.unwrapped.indices
    np.testing.assert_array_equal(obs, xte[idx])
    assert idx[0] == idx[1] == idx[2] and idx[3] == idx[4] == idx[5]
    _, rewards, terminated, _, info = venv.step(yte[idx])
    np.testing.assert_array_equal(rewards, np.ones(6))
    np.testing.assert_array_equal(info["label"], yte[idx])


def test_bad_split() -> None:
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'test'\], got 'val'"):
        gym.make("tpo_gym/MNISTBandit-v0", split="val")
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        mnist_data.load_mnist("valid")


def test_mnist_tensor_env_equals_the_numpy_env_step_for_step() -> None:
    from tpo_gym.envs.mnist_bandit import MNISTBanditTensorEnv, MNISTBanditVectorEnv

    ref, env = MNISTBanditVectorEnv(6), MNISTBanditTensorEnv(6)
    assert env.observation_space == ref.observation_space and env.fixed_horizon == 1
    rng = np.random.default_rng(1)
    for episode in range(2):
        opts = {"group_size": 3} if episode else None
        assert_same(ref.reset(seed=episode, options=opts)[0], env.reset(seed=episode, options=opts)[0])
        for _ in range(3):  # a step, the autoreset step, a step
            acts, cand = rng.integers(0, 10, 6), rng.integers(0, 10, (6, 4))
            assert_same(ref.score_candidates(cand), env.score_candidates(torch.from_numpy(cand)))
            out1, out2 = ref.step(acts), env.step(torch.from_numpy(acts))
            for x, y in zip(out1[:4], out2[:4], strict=True):
                assert_same(x, y)
            assert set(out1[4]) == set(out2[4])
            for key in out1[4]:
                assert_same(out1[4][key], out2[4][key])
    other = MNISTBanditTensorEnv(2)
    assert other._images is env._images, "one copy of the split per device"
    other.reset(seed=0)
    with pytest.raises(ValueError, match=r"in \[0, 10\)"):
        other.step(torch.tensor([3, 10]))
