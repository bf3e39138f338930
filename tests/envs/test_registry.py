"""Every registered ``tpo_gym/`` id: SB3's checker, determinism, pickling, spec round trip, vectorisation.

Gymnasium's checker runs inside ``check_group_env`` (tests/envs/test_contract.py)."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence

import tpo_gym
from tests.envs.conftest import ALL_IDS, NATIVE_IDS, TEXT_IDS, fast_kwargs


def test_all_expected_ids_registered() -> None:
    expected = {
        "tpo_gym/Bandit-v0",
        "tpo_gym/ContextualBandit-v0",
        "tpo_gym/MNISTBandit-v0",
        "tpo_gym/TokenTask-v0",
        "tpo_gym/TokenReversal-v0",
        "tpo_gym/ReasoningGym-v0",
    }
    assert expected <= set(ALL_IDS)
    assert set(ALL_IDS) == set(tpo_gym.envs.ENV_IDS)


def test_registration_is_idempotent() -> None:
    before = {k: v for k, v in gym.registry.items() if k.startswith("tpo_gym/")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # re-registering would warn "Overriding environment"
        tpo_gym.envs.register_envs()
    after = {k: v for k, v in gym.registry.items() if k.startswith("tpo_gym/")}
    assert before == after


@pytest.mark.parametrize("env_id", [i for i in ALL_IDS if i != "tpo_gym/ReasoningGym-v0"])
def test_sb3_check_env(env_id: str) -> None:
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make(env_id, **fast_kwargs(env_id))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_check_env(env, warn=True)
    assert [str(w.message) for w in caught] == []
    env.close()


def _rollout(env: gym.Env[Any, Any], seed: int, n_steps: int) -> list[tuple[Any, ...]]:
    """Observations, rewards, flags and infos of ``n_steps`` steps with seeded random actions."""
    obs, info = env.reset(seed=seed)
    env.action_space.seed(seed)
    out: list[tuple[Any, ...]] = [(obs, info)]
    for _ in range(n_steps):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        out.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            obs, info = env.reset()
            out.append((obs, info))
    return out


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_same_seed_same_episodes(env_id: str) -> None:
    kw = fast_kwargs(env_id)
    a = _rollout(gym.make(env_id, **kw), seed=7, n_steps=25)
    b = _rollout(gym.make(env_id, **kw), seed=7, n_steps=25)
    assert data_equivalence(a, b)
    c = _rollout(gym.make(env_id, **kw), seed=8, n_steps=25)
    assert not data_equivalence(a, c), "a different seed should give different episodes"


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_pickle_round_trip(env_id: str) -> None:
    env = gym.make(env_id, **fast_kwargs(env_id)).unwrapped
    env.reset(seed=3)
    env.action_space.seed(3)
    action = env.action_space.sample()
    clone = pickle.loads(pickle.dumps(env))
    assert data_equivalence(env.step(action), clone.step(action))
    assert data_equivalence(env.reset(), clone.reset())


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_spec_round_trip(env_id: str) -> None:
    env = gym.make(env_id, **fast_kwargs(env_id))
    assert env.spec is not None
    spec = gym.envs.registration.EnvSpec.from_json(env.spec.to_json())
    assert spec == env.spec
    env2 = gym.make(spec)
    assert data_equivalence(env.reset(seed=1), env2.reset(seed=1))


def _vec_rollout(venv: gym.vector.VectorEnv, seed: int, actions: list[Any]) -> tuple[list[Any], np.ndarray]:
    obs, _ = venv.reset(seed=seed)
    observations, rewards = [obs], []
    for a in actions:
        obs, r, term, trunc, _ = venv.step(a)
        observations.append(obs)
        rewards.append(np.asarray(r, dtype=np.float64))
    venv.close()
    return observations, np.stack(rewards)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_make_vec_modes_agree(env_id: str) -> None:
    kw = fast_kwargs(env_id)
    n = 3
    probe = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync", **kw)
    probe.action_space.seed(11)
    actions = [probe.action_space.sample() for _ in range(23)]
    probe.close()
    modes = ["sync", "async"] + (["vector_entry_point"] if env_id in NATIVE_IDS else [])
    results = {}
    for mode in modes:
        vector_kwargs = {}
        if mode == "async" and env_id in TEXT_IDS:
            # Gymnasium's shared memory cannot carry Text observations (they come back as padding).
            vector_kwargs = {"shared_memory": False}
        venv = gym.make_vec(env_id, num_envs=n, vectorization_mode=mode, vector_kwargs=vector_kwargs, **kw)
        results[mode] = _vec_rollout(venv, 5, actions)
    ref_obs, ref_rewards = results["sync"]
    assert ref_rewards.shape == (23, n)
    for mode, (obs, rewards) in results.items():
        np.testing.assert_array_equal(rewards, ref_rewards, err_msg=f"{mode} rewards differ from sync")
        assert data_equivalence(obs, ref_obs), f"{mode} observations differ from sync"
    if env_id != "tpo_gym/ReasoningGym-v0":  # random text never answers correctly
        assert ref_rewards.sum() > 0, "the test actions should earn some reward"


@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_native_vector_env_conventions(env_id: str) -> None:
    venv = gym.make_vec(env_id, num_envs=4, vectorization_mode="vector_entry_point", **fast_kwargs(env_id))
    single = gym.make(env_id, **fast_kwargs(env_id))
    assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    assert venv.single_observation_space == single.observation_space
    assert venv.single_action_space == single.action_space
    obs, _ = venv.reset(seed=0)
    assert obs in venv.observation_space
    obs, rewards, terminated, truncated, _ = venv.step(venv.action_space.sample())
    assert obs in venv.observation_space
    assert rewards.shape == terminated.shape == truncated.shape == (4,)
    assert terminated.dtype == truncated.dtype == np.bool_
