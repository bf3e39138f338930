"""The env contract the agents rely on, for every registered id: the group API (``check_group_env``), batched
spaces, ``info["score"]`` / ``info["error"]``, ``reward_credit``."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import load_env_creator
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector.utils import batch_space

from tests.envs.conftest import ALL_IDS, NATIVE_IDS, fast_kwargs
from tpo_gym.envs import GroupEnv, GroupVectorEnv, check_group_env

EPISODE_CREDIT_IDS = {"tpo_gym/TokenReversalTerminal-v0"}


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_every_registered_env_passes_check_group_env(env_id: str) -> None:
    """Gymnasium's checker and the group checks, without a warning, on the single env, its native vector env
    and that env's on-device form (on the CPU) where they exist."""
    kw = fast_kwargs(env_id)
    envs: list[Any] = [gym.make(env_id, **kw)]
    spec = gym.spec(env_id)
    if env_id in NATIVE_IDS:
        envs.append(gym.make_vec(env_id, num_envs=4, vectorization_mode="vector_entry_point", **kw))
        tensor_env = load_env_creator(spec.vector_entry_point).tensor_env
        if tensor_env is not None:
            envs.append(tensor_env(num_envs=4, device="cpu", **{**spec.kwargs, **kw}))
    assert isinstance(envs[0].unwrapped, GroupEnv)
    assert all(isinstance(venv, GroupVectorEnv) for venv in envs[1:])
    for env in envs:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_group_env(env)
        env.close()


@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_native_spaces_equal_sync_spaces(env_id: str) -> None:
    kw = fast_kwargs(env_id)
    native = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point", **kw)
    sync = gym.make_vec(env_id, num_envs=3, vectorization_mode="sync", **kw)
    assert native.observation_space == sync.observation_space
    assert native.action_space == sync.action_space
    assert native.observation_space == batch_space(native.single_observation_space, 3)
    assert native.action_space == batch_space(native.single_action_space, 3)
    assert native.single_observation_space == sync.single_observation_space
    assert native.single_action_space == sync.single_action_space
    obs_native, _ = native.reset(seed=0)
    obs_sync, _ = sync.reset(seed=0)
    for obs in (obs_native, obs_sync):
        assert obs in native.observation_space and obs in sync.observation_space
    actions = sync.action_space.sample()
    assert actions in native.action_space
    for obs in (native.step(actions)[0], sync.step(actions)[0]):
        assert obs in native.observation_space and obs in sync.observation_space


def _ends_episode(env_id: str, kw: dict[str, Any]) -> list[tuple[float, bool, dict[str, Any]]]:
    """Seeded random episodes: ``(reward, done, info)`` of every step."""
    env = gym.make(env_id, **kw)
    env.reset(seed=0)
    env.action_space.seed(0)
    out = []
    for _ in range(30):
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        out.append((float(reward), bool(terminated or truncated), info))
        if terminated or truncated:
            env.reset()
    return out


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_every_env_reports_score_and_error_when_an_episode_ends(env_id: str) -> None:
    steps = _ends_episode(env_id, fast_kwargs(env_id))
    assert any(done for _, done, _ in steps)
    episode_return, n_steps = 0.0, 0
    for reward, done, info in steps:
        episode_return += reward
        n_steps += 1
        if not done:
            assert "score" not in info and "error" not in info
            continue
        assert type(info["score"]) is float and type(info["error"]) is float
        assert 0.0 <= info["score"] <= 1.0 and 0.0 <= info["error"] <= 1.0
        if env_id.startswith("tpo_gym/Token"):
            terminal = env_id in EPISODE_CREDIT_IDS
            assert info["score"] == pytest.approx(episode_return if terminal else episode_return / n_steps)
            expected_error = 1.0 - float(info["exact_match"]) if terminal else info["token_error"]
            assert info["error"] == pytest.approx(expected_error)
        else:  # one-step tasks: score = reward, error = 1 - reward
            assert (info["score"], info["error"]) == (reward, 1.0 - reward)
        episode_return, n_steps = 0.0, 0


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_reward_credit(env_id: str) -> None:
    expected = "episode" if env_id in EPISODE_CREDIT_IDS else "step"
    env = gym.make(env_id, **fast_kwargs(env_id))
    assert env.unwrapped.reward_credit == expected
    assert env.get_wrapper_attr("reward_credit") == expected
    if env_id in NATIVE_IDS:
        venv = gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point", **fast_kwargs(env_id))
        assert venv.reward_credit == expected
        assert venv.unwrapped.reward_credit == expected


@pytest.mark.parametrize(("reward", "credit"), [("bag", "step"), ("sequential", "step"), ("terminal", "episode")])
def test_reward_credit_follows_the_reward_kwarg(reward: str, credit: str) -> None:
    assert gym.make("tpo_gym/TokenTask-v0", reward=reward).unwrapped.reward_credit == credit
    venv = gym.make_vec("tpo_gym/TokenTask-v0", 2, vectorization_mode="vector_entry_point", reward=reward)
    assert venv.reward_credit == credit


@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_native_info_equals_sync_info(env_id: str) -> None:
    """Same seeds and actions: identical infos (keys, masks, values, dtypes), autoreset steps included."""
    kw = fast_kwargs(env_id)
    n = 4
    native = gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point", **kw)
    sync = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync", **kw)
    sync.action_space.seed(3)
    _, info_native = native.reset(seed=3)
    _, info_sync = sync.reset(seed=3)
    assert data_equivalence(info_native, info_sync, exact=True)
    seen_end = False
    for t in range(25):
        actions = sync.action_space.sample()
        *_, term_native, _, info_native = native.step(actions)
        *_, term_sync, _, info_sync = sync.step(actions)
        np.testing.assert_array_equal(term_native, term_sync)
        assert data_equivalence(info_native, info_sync, exact=True), f"step {t}: {info_native} != {info_sync}"
        if term_sync.any():
            seen_end = True
            for key in ("score", "error"):
                np.testing.assert_array_equal(info_native["_" + key], term_sync)
                assert info_native[key].dtype == np.float64
    assert seen_end


def test_native_score_and_error_by_hand() -> None:
    """Token vector env: score / error with their masks on hand-made episodes (V=3, H=3, copy)."""
    from tpo_gym.envs.token_task import TokenTaskVectorEnv

    prompt = [0, 2, 1]  # copy: the target is the prompt
    actions = np.array([[0, 2, 1], [0, 0, 1], [1, 2, 1]])  # all right; middle wrong; first wrong
    expected = {  # (score per env, error per env), worked out by hand
        "bag": ([1, 2 / 3, 2 / 3], [0, 1 / 3, 1 / 3]),
        "sequential": ([1, 1 / 3, 0], [0, 1 / 3, 1 / 3]),
        "terminal": ([1, 0, 0], [0, 1, 1]),
    }
    for reward, (score, error) in expected.items():
        venv = TokenTaskVectorEnv(num_envs=3, target="copy", reward=reward, vocab_size=3, length=3)
        venv.reset(seed=0)
        venv._assign_contexts(np.arange(3), np.array([prompt] * 3))  # white-box: fix the prompt
        for t in range(2):
            info = venv.step(actions[:, t])[4]
            assert "score" not in info and "error" not in info
        *_, terminated, _, info = venv.step(actions[:, 2])
        assert terminated.all()
        np.testing.assert_array_equal(info["_score"], [True] * 3)
        np.testing.assert_array_equal(info["_error"], [True] * 3)
        np.testing.assert_allclose(info["score"], score, err_msg=reward)
        np.testing.assert_allclose(info["error"], error, err_msg=reward)
        info = venv.step(actions[:, 0])[4]  # the autoreset step ends nothing
        assert "score" not in info
