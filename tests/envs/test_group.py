"""Group helpers for any Gymnasium env, and the wrapper-agnostic score_candidates."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from tpo_gym.envs.group import group_reset, group_rollout_envs, score_candidates


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cartpole_group_rollouts_share_the_initial_state(mode: str) -> None:
    venv = group_rollout_envs("CartPole-v1", group_size=4, vectorization_mode=mode)
    obs, _ = group_reset(venv, seed=123)
    assert obs.shape == (4, 4)
    assert (obs == obs[0]).all()
    other, _ = group_reset(venv, seed=124)
    assert not np.array_equal(other[0], obs[0])
    # Same seed again: same context, and the same actions give the same rollout.
    again, _ = venv.reset(seed=[123] * 4)
    np.testing.assert_array_equal(again, obs)
    out = venv.step(np.array([0, 0, 1, 1]))[0]
    np.testing.assert_array_equal(out[0], out[1])
    assert not np.array_equal(out[1], out[2])
    venv.close()


def test_group_rollout_envs_from_factory_and_bad_args() -> None:
    venv = group_rollout_envs(lambda: gym.make("CartPole-v1"), group_size=3)
    obs, _ = group_reset(venv, seed=0)
    assert (obs == obs[0]).all()
    with pytest.raises(ValueError, match="group_size"):
        group_rollout_envs("CartPole-v1", group_size=0)
    with pytest.raises(ValueError, match="vectorization_mode"):
        group_rollout_envs("CartPole-v1", group_size=2, vectorization_mode="vector_entry_point")


def test_group_reset_gives_each_group_of_copies_its_own_seed() -> None:
    venv = group_rollout_envs("CartPole-v1", group_size=6)
    obs, _ = group_reset(venv, seed=np.array([5, 9, 5]))  # three groups of two, as the agents' rollouts use it
    np.testing.assert_array_equal(obs, venv.reset(seed=[5, 5, 9, 9, 5, 5])[0])
    assert (obs[0] == obs[1]).all() and (obs[2] == obs[3]).all() and not np.array_equal(obs[1], obs[2])
    np.testing.assert_array_equal(obs[4:], obs[:2])
    with pytest.raises(ValueError, match=r"num_envs=6 divisible by G, got 4 seeds"):
        group_reset(venv, seed=[1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"^seed\[1\] must be an integer >= 0"):
        group_reset(venv, seed=[1, -2])
    venv.close()


def test_score_candidates_through_wrappers() -> None:
    env = gym.make("tpo_gym/Bandit-v0", n_arms=4, correct_arm=1)
    env.reset(seed=0)
    np.testing.assert_array_equal(score_candidates(env, [0, 1]), [0, 1])
    venv = gym.make_vec(
        "tpo_gym/Bandit-v0", num_envs=2, vectorization_mode="vector_entry_point", n_arms=4, correct_arm=1
    )
    venv.reset(seed=0)
    np.testing.assert_array_equal(score_candidates(venv, [[1, 0], [0, 1]]), [[1, 0], [0, 1]])
    cart = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match="group_rollout_envs"):
        score_candidates(cart, [0, 1])
