"""Bad arguments of every registered id get one clear ``ValueError``: sizes (overflow included), seeds, options."""

from __future__ import annotations

import inspect
import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import load_env_creator
from gymnasium.utils.env_checker import data_equivalence

from tests.envs.conftest import ALL_IDS, NATIVE_IDS, fast_kwargs
from tpo_gym.envs._common import MAX_CONTEXTS, MAX_LENGTH, MAX_NUM_ENVS, MAX_VOCAB, seed_generators
from tpo_gym.envs.group import group_reset, group_rollout_envs

#: Integer kwargs that have no upper limit (a numpy seed of any size is fine).
UNBOUNDED = {"table_seed"}


def _int_kwargs(entry_point: Any) -> list[str]:
    """The integer keyword arguments of an env class (those with an int default), ``num_envs`` aside."""
    params = inspect.signature(load_env_creator(entry_point)).parameters.values()
    return [
        p.name
        for p in params
        if isinstance(p.default, int) and not isinstance(p.default, bool) and p.name != "num_envs"
    ]


SIZE_CASES = [(i, k) for i in ALL_IDS for k in _int_kwargs(gym.spec(i).entry_point) if k not in UNBOUNDED]
NATIVE_SIZE_CASES = [
    (i, k) for i in NATIVE_IDS for k in _int_kwargs(gym.spec(i).vector_entry_point) if k not in UNBOUNDED
]


def test_every_env_with_int_kwargs_is_covered() -> None:
    covered = {i for i, _ in SIZE_CASES}
    assert covered == {i for i in ALL_IDS if i != "tpo_gym/MNISTBandit-v0"}  # MNIST has no int kwargs


@pytest.mark.parametrize("value", [2**63, 2**70])
@pytest.mark.parametrize(("env_id", "kwarg"), SIZE_CASES)
def test_overflowing_int_kwargs_single(env_id: str, kwarg: str, value: int) -> None:
    kw = {**fast_kwargs(env_id), kwarg: value}
    with pytest.raises(ValueError, match=rf"^{kwarg} must be an integer >= \d+ and <= \d+, got {value}.*max "):
        gym.make(env_id, **kw)


@pytest.mark.parametrize("value", [2**63, 2**70])
@pytest.mark.parametrize(("env_id", "kwarg"), NATIVE_SIZE_CASES)
def test_overflowing_int_kwargs_native(env_id: str, kwarg: str, value: int) -> None:
    kw = {**fast_kwargs(env_id), kwarg: value}
    with pytest.raises(ValueError, match=rf"^{kwarg} must be an integer >= \d+ and <= \d+, got {value}.*max "):
        gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point", **kw)


@pytest.mark.parametrize("num_envs", [MAX_NUM_ENVS + 1, 2**63, 2**70, 0, 2.0, True])
@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_bad_num_envs_native(env_id: str, num_envs: Any) -> None:
    with pytest.raises(ValueError, match=r"^num_envs must be an integer >= 1 .*max 2\*\*20"):
        gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **fast_kwargs(env_id))


@pytest.mark.parametrize(
    ("env_id", "kwargs", "match"),
    [
        ("tpo_gym/TokenTask-v0", {"vocab_size": MAX_VOCAB + 1}, r"vocab_size .* <= 4611686018427387904.*max 2\*\*62"),
        ("tpo_gym/TokenTask-v0", {"length": MAX_LENGTH + 1}, r"length .* <= 65536, got 65537 .*max 2\*\*16"),
        ("tpo_gym/ContextualBandit-v0", {"n_contexts": MAX_CONTEXTS + 1}, r"n_contexts .*max 2\*\*24"),
        ("tpo_gym/Bandit-v0", {"n_arms": 2**63}, r"n_arms .*max 2\*\*63 - 1"),
        ("tpo_gym/ReasoningGym-v0", {"size": 2**32 + 1}, r"size .* <= 4294967296, got 4294967297 .*max 2\*\*32"),
        ("tpo_gym/ReasoningGym-v0", {"size": 20, "seed": 2**32 - 19}, r"seed .* <= 4294967276, got 4294967277"),
        ("tpo_gym/ReasoningGym-v0", {"size": 20, "seed": -1}, r"seed must be an integer >= 0"),
        ("tpo_gym/Bandit-v0", {"table_seed": None}, r"table_seed must be an integer >= 0, got None"),
        (
            "tpo_gym/Bandit-v0",
            {"correct_arm": 2**70},
            r"correct_arm must be an integer >= 0 and <= 2, got 1180591620717411303424 \(None draws",
        ),
    ],
)
def test_limits_are_named(env_id: str, kwargs: dict[str, Any], match: str) -> None:
    kw = {**fast_kwargs(env_id), **kwargs}
    with pytest.raises(ValueError, match=match):
        gym.make(env_id, **kw)


def test_limits_themselves_work() -> None:
    """The maxima are real: an env at the limit builds, draws and steps."""
    env = gym.make("tpo_gym/TokenTask-v0", vocab_size=MAX_VOCAB, length=3)
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space and obs[:3].max() < MAX_VOCAB
    assert env.step(int(obs[0]))[0] in env.observation_space
    venv = gym.make_vec("tpo_gym/TokenTask-v0", 2, vectorization_mode="vector_entry_point", vocab_size=MAX_VOCAB)
    assert venv.reset(seed=0)[0] in venv.observation_space
    bandit = gym.make("tpo_gym/Bandit-v0", n_arms=2**63 - 1)
    bandit.reset(seed=0)
    assert bandit.unwrapped.correct_arm < 2**63 - 1
    bandit.step(0)
    # Seeds have no upper limit: a numpy seed of any size is fine (and reproducible).
    a = gym.make("tpo_gym/ContextualBandit-v0", table_seed=2**70).unwrapped.correct_arms
    np.testing.assert_array_equal(a, gym.make("tpo_gym/ContextualBandit-v0", table_seed=2**70).unwrapped.correct_arms)


BAD_RESETS = [
    ({"seed": 1.5}, r"^seed must be .*got 1\.5"),
    ({"seed": -1}, r"^seed must be .*got -1"),
    ({"seed": "x"}, r"^seed must be .*got 'x'"),
    ({"seed": True}, r"^seed must be .*got True"),
    ({"options": "x"}, r"^options must be None or a dict with str keys, got 'x'"),
    ({"options": {1: 2}}, r"^options must be None or a dict with str keys, got \{1: 2\}"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD_RESETS)
@pytest.mark.parametrize("env_id", ALL_IDS)
def test_bad_reset_args_single(env_id: str, kwargs: dict[str, Any], match: str) -> None:
    env = gym.make(env_id, **fast_kwargs(env_id))
    with pytest.raises(ValueError, match=match):
        env.reset(**kwargs)
    env.reset(seed=0)  # still usable


@pytest.mark.parametrize(("kwargs", "match"), BAD_RESETS)
@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_bad_reset_args_native(env_id: str, kwargs: dict[str, Any], match: str) -> None:
    venv = gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point", **fast_kwargs(env_id))
    with pytest.raises(ValueError, match=match):
        venv.reset(**kwargs)
    venv.reset(seed=0)


@pytest.mark.parametrize(
    ("seed", "match"),
    [
        ([1, -1], r"^seed\[1\] must be an integer >= 0, got -1"),
        ([1.5, 2], r"^seed\[0\] must be an integer >= 0, got 1\.5"),
        ([1, "2"], r"^seed\[1\] must be"),
        ([1, 2, 3], r"^seed must be None, an integer >= 0 or a list of 2 seeds"),
        (np.array([[1, 2]]), r"^seed must be None, an integer >= 0 or a list of 2 seeds"),
        ("ab", r"^seed must be None, an integer >= 0 or a list of 2 seeds, got 'ab'"),
    ],
)
def test_bad_seed_lists_native(seed: Any, match: str) -> None:
    venv = gym.make_vec("tpo_gym/TokenReversal-v0", num_envs=2, vectorization_mode="vector_entry_point")
    with pytest.raises(ValueError, match=match):
        venv.reset(seed=seed)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_numpy_int_seeds_single(env_id: str) -> None:
    kw = fast_kwargs(env_id)
    for seed in (np.int64(3), np.uint8(3)):
        assert data_equivalence(gym.make(env_id, **kw).reset(seed=seed), gym.make(env_id, **kw).reset(seed=3))


@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_per_env_seed_lists_native(env_id: str) -> None:
    kw = fast_kwargs(env_id)
    native = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point", **kw)
    sync = gym.make_vec(env_id, num_envs=3, vectorization_mode="sync", **kw)
    seeds = [5, 9, None]
    obs_sync, _ = sync.reset(seed=[5, 9, 2])
    for given in ([np.int64(5), np.uint8(9), 2], (5, 9, 2), np.array([5, 9, 2])):
        obs, _ = native.reset(seed=given)
        np.testing.assert_array_equal(obs, obs_sync)
    obs, _ = native.reset(seed=seeds)  # None: fresh entropy for that sub-env only
    np.testing.assert_array_equal(obs[:2], obs_sync[:2])
    np.testing.assert_array_equal(native.reset(seed=np.int64(7))[0], sync.reset(seed=7)[0])


def test_seed_generators_match_gymnasium_seeding() -> None:
    a = [g.bit_generator.random_raw() for g in seed_generators(np.int64(2**40), 2)]
    b = [g.bit_generator.random_raw() for g in seed_generators([2**40, 2**40 + 1], 2)]
    assert a == b


def test_group_helpers_check_their_arguments() -> None:
    with pytest.raises(ValueError, match=r"^group_size must be an integer >= 1"):
        group_rollout_envs("CartPole-v1", group_size=2**70)
    with pytest.raises(ValueError, match=r"^vectorization_mode must be one of \['sync', 'async'\]"):
        group_rollout_envs("CartPole-v1", group_size=2, vectorization_mode="vector_entry_point")
    venv = group_rollout_envs("CartPole-v1", group_size=2)
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError, match=re.escape("seed must be an integer >= 0")):
            group_reset(venv, seed=bad)  # type: ignore[arg-type]
    obs, _ = group_reset(venv, seed=np.int64(4))
    assert (obs == obs[0]).all()
    venv.close()
