"""Single- and multi-context bandits: rewards, seeding of the correct arm, group API, bad input."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest

from tpo_gym.envs.bandit import BanditEnv, BanditVectorEnv, ContextualBanditEnv, correct_arm_table


def test_bandit_fixed_arm_rewards() -> None:
    env = gym.make("tpo_gym/Bandit-v0", correct_arm=42)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, [0.0])
    assert env.step(42)[1:4] == (1.0, True, False)
    env.reset()
    obs, reward, terminated, truncated, info = env.step(41)
    assert (reward, terminated, truncated, info["is_success"]) == (0.0, True, False, False)
    assert env.action_space == gym.spaces.Discrete(100)


def test_bandit_arm_fixed_by_table_seed_not_by_reset_seed() -> None:
    arms = set()
    for table_seed in range(20):
        env = BanditEnv(table_seed=table_seed)
        arm = env.correct_arm
        for seed in (None, 0, 1, 12345):  # resets, seeded or not, never change the problem
            env.reset(seed=seed)
            assert env.correct_arm == arm
        assert BanditEnv(table_seed=table_seed).correct_arm == arm
        arms.add(arm)
    assert len(arms) > 5
    assert BanditEnv(correct_arm=7, table_seed=3).correct_arm == 7
    venv = gym.make_vec("tpo_gym/Bandit-v0", num_envs=4, vectorization_mode="vector_entry_point", table_seed=5)
    venv.reset(seed=0)
    assert (venv.unwrapped.correct_arm == BanditEnv(table_seed=5).correct_arm).all()


def test_bandit_score_candidates() -> None:
    env = BanditEnv(n_arms=5, correct_arm=2)
    env.reset(seed=0)
    state = copy.deepcopy(env.np_random.bit_generator.state)
    np.testing.assert_array_equal(env.score_candidates([0, 2, 2, 4]), [0, 1, 1, 0])
    assert env.np_random.bit_generator.state == state
    assert env.step(2)[1] == 1.0
    with pytest.raises(RuntimeError, match="reset"):
        env.score_candidates([1])


def test_bandit_vector_groups_share_arm() -> None:
    venv = BanditVectorEnv(num_envs=6, n_arms=50)
    venv.reset(seed=1, options={"group_size": 3})
    assert (venv.correct_arm[:3] == venv.correct_arm[0]).all() and (venv.correct_arm[3:] == venv.correct_arm[3]).all()
    cand = np.tile(np.arange(50), (6, 1))
    scores = venv.score_candidates(cand)
    np.testing.assert_array_equal(scores.argmax(axis=1), venv.correct_arm)
    np.testing.assert_array_equal(scores.sum(axis=1), np.ones(6))
    _, rewards, terminated, _, _ = venv.step(venv.correct_arm)
    np.testing.assert_array_equal(rewards, np.ones(6))
    assert terminated.all()
    np.testing.assert_array_equal(venv.score_candidates(cand), 0)  # awaiting autoreset
    _, rewards, terminated, _, _ = venv.step(venv.correct_arm)  # autoreset step
    assert not terminated.any() and not rewards.any()


def test_contextual_bandit_table_and_rewards() -> None:
    table = correct_arm_table(100, 10, 0)
    env = gym.make("tpo_gym/ContextualBandit-v0")
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (100,), np.float32)
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        assert obs.sum() == 1.0 and obs.dtype == np.float32
        ctx = int(obs.argmax())
        np.testing.assert_array_equal(env.unwrapped.score_candidates(np.arange(10)), np.arange(10) == table[ctx])
        assert env.step(int(table[ctx]))[1] == 1.0
    other = ContextualBanditEnv(table_seed=1)
    assert not np.array_equal(other.correct_arms, table)
    np.testing.assert_array_equal(ContextualBanditEnv(table_seed=0).correct_arms, table)


def test_contextual_vector_oracle_and_groups() -> None:
    venv = gym.make_vec("tpo_gym/ContextualBandit-v0", num_envs=8, vectorization_mode="vector_entry_point")
    obs, _ = venv.reset(seed=2, options={"group_size": 2})
    ctx = obs.argmax(axis=1)
    assert (ctx[0::2] == ctx[1::2]).all()
    oracle = correct_arm_table(100, 10, 0)[ctx]
    _, rewards, *_ = venv.step(oracle)
    np.testing.assert_array_equal(rewards, np.ones(8))


@pytest.mark.parametrize(
    ("env_id", "kwargs", "match"),
    [
        ("tpo_gym/Bandit-v0", {"n_arms": 1}, "n_arms must be an integer >= 2, got 1"),
        ("tpo_gym/Bandit-v0", {"correct_arm": 100}, r"correct_arm must be an integer >= 0 and <= 99, got 100"),
        ("tpo_gym/Bandit-v0", {"correct_arm": 1.5}, "correct_arm"),
        ("tpo_gym/ContextualBandit-v0", {"n_arms": 0}, "n_arms must be an integer >= 2, got 0"),
        ("tpo_gym/ContextualBandit-v0", {"n_contexts": 0}, "n_contexts must be an integer >= 1.*, got 0"),
        ("tpo_gym/ContextualBandit-v0", {"table_seed": -1}, "table_seed"),
    ],
)
def test_bad_kwargs(env_id: str, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gym.make(env_id, **kwargs)
    with pytest.raises(ValueError, match=match):
        gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point", **kwargs)


@pytest.mark.parametrize("env_id", ["tpo_gym/Bandit-v0", "tpo_gym/ContextualBandit-v0"])
@pytest.mark.parametrize("action", [100, -1, 1.0, None, np.array([1])])
def test_bad_actions(env_id: str, action: object) -> None:
    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(action)
    venv = gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point")
    venv.reset(seed=0)
    with pytest.raises(ValueError, match="actions"):
        venv.step(np.array([action, action]) if action is not None else None)
