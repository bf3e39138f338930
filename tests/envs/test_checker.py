"""check_group_env on a tiny custom group env (single and native vector), and on broken variants of it."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec

from tpo_gym.envs import GroupEnv, GroupEnvError, GroupVectorEnv, NativeVectorEnv, check_group_env


class _RepeatDigitBase(gym.Env[np.ndarray, np.int64]):
    """Write a hidden digit ``length`` times: reward 1 per right digit; the observation is the step count."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, n_digits: int = 100, length: int = 2) -> None:
        self.n_digits, self.length = n_digits, length
        self.action_space = spaces.Discrete(n_digits)
        self.observation_space = spaces.Box(0.0, float(length), (1,), np.float32)
        self.digit, self.t, self.hits = 0, 0, 0

    def _draw_digit(self) -> int:
        return int(self.np_random.integers(self.n_digits))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.digit, self.t, self.hits = self._draw_digit(), 0, 0
        return np.array([0.0], np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = float(action == self.digit)
        self.t, self.hits = self.t + 1, self.hits + int(reward)
        done = self.t == self.length
        info = {"score": self.hits / self.length, "error": 1.0 - self.hits / self.length} if done else {}
        return np.array([self.t], np.float32), reward, done, False, info


class RepeatDigitEnv(_RepeatDigitBase):
    """The group env: ``score_candidates`` gives each candidate's reward at the current step."""

    def score_candidates(self, candidates: Any) -> np.ndarray:
        return (np.asarray(candidates) == self.digit).astype(np.float32)


class RepeatDigitVectorEnv(NativeVectorEnv):
    """Its native vector env: reset, seeding, autoreset and groups come from the public base class."""

    def __init__(self, num_envs: int = 1, n_digits: int = 100, length: int = 2) -> None:
        super().__init__(num_envs)
        self.n_digits, self.length = n_digits, length
        self._set_spaces(spaces.Box(0.0, float(length), (1,), np.float32), spaces.Discrete(n_digits))
        self.digits = np.zeros(num_envs, np.int64)
        self.t = np.zeros(num_envs, np.int64)
        self.hits = np.zeros(num_envs, np.int64)

    def _draw_contexts(self, gens: list[np.random.Generator], seeded: bool) -> np.ndarray:
        return np.array([g.integers(self.n_digits) for g in gens], dtype=np.int64)

    def _assign_contexts(self, env_ids: np.ndarray, contexts: np.ndarray) -> None:
        self.digits[env_ids], self.t[env_ids], self.hits[env_ids] = contexts, 0, 0

    def _observations(self) -> np.ndarray:
        return self.t[:, None].astype(np.float32)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_has_reset()
        active = ~self._needs_reset
        rewards = ((np.asarray(actions) == self.digits) & active).astype(np.float64)
        self._reset_subenvs(self._needs_reset.copy())
        self.t += active
        self.hits += rewards.astype(np.int64)
        ended = active & (self.t == self.length)
        self._needs_reset = ended.copy()
        info: dict[str, Any] = {}
        if ended.any():
            self._episode_info(info, ended, self.hits / self.length, 1.0 - self.hits / self.length)
        return self._observations(), rewards, ended, np.zeros(self.num_envs, np.bool_), info

    def score_candidates(self, candidates: Any) -> np.ndarray:
        self._check_has_reset()
        return ((np.asarray(candidates) == self.digits[:, None]) & ~self._needs_reset[:, None]).astype(np.float32)


def test_a_custom_group_env_and_its_native_vector_env_pass_check_group_env() -> None:
    env, venv = RepeatDigitEnv(), RepeatDigitVectorEnv(num_envs=4)
    assert isinstance(env, GroupEnv) and isinstance(venv, GroupVectorEnv)
    assert not isinstance(_RepeatDigitBase(), GroupEnv) and not isinstance(gym.make("CartPole-v1"), GroupEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a correct env: neither Gymnasium's checker nor ours warns
        check_group_env(env)
        check_group_env(gym.wrappers.TimeLimit(env, 10))  # wrappers are looked through, as the agents do
        check_group_env(venv)
        check_group_env(RepeatDigitVectorEnv(num_envs=1), n_candidates=1, seed=3)


def test_the_native_vector_base_is_public_and_the_old_private_path_still_imports_it() -> None:
    from tpo_gym.envs import NativeTensorEnv, _vector, vector

    assert _vector.NativeVectorEnv is vector.NativeVectorEnv is NativeVectorEnv
    assert _vector.NativeTensorEnv is vector.NativeTensorEnv is NativeTensorEnv
    assert RepeatDigitVectorEnv.tensor_env is None  # no on-device form unless a subclass names one


def test_agents_see_the_group_api_of_a_custom_env_and_train_tpo_token_on_it() -> None:
    from tpo_gym import TPO
    from tpo_gym.agents.common.sampling import RolloutSource, group_api_available

    spec = EnvSpec("RepeatDigit-v0", entry_point=RepeatDigitEnv, vector_entry_point=RepeatDigitVectorEnv,
                   kwargs={"n_digits": 4})
    assert group_api_available(RolloutSource(spec))
    assert not group_api_available(RolloutSource(EnvSpec("Plain-v0", entry_point=RepeatDigitEnv,
                                                         vector_entry_point=_RepeatDigitBase)))
    model = TPO("MlpPolicy", gym.make(spec), batch_size=8, group_size=4, seed=0)
    assert model.grouping is not None and model.grouping.kind == "candidates"  # level="token": scored candidates
    model.learn(total_timesteps=2 * model.steps_per_iteration)
    assert len(model.history) == 2 and 0.0 <= model.history[-1]["error"] <= 1.0


# --------------------------------------------------------------------------------------------
# broken variants: each fails with GroupEnvError naming what is wrong
# --------------------------------------------------------------------------------------------
class _ScoreAsColumn(RepeatDigitEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        return super().score_candidates(candidates)[:, None]


class _IntegerScores(RepeatDigitEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        return super().score_candidates(candidates).astype(np.int64)


class _NaNScores(RepeatDigitEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        return super().score_candidates(candidates) * np.float32("nan")


class _NoisyScores(RepeatDigitEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        noise = np.random.default_rng().random(len(candidates)).astype(np.float32)  # not the env's RNG
        return super().score_candidates(candidates) + noise


class _ScoresAreNotRewards(RepeatDigitEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        return 1.0 - super().score_candidates(candidates)


class _ContextIgnoresTheSeed(RepeatDigitEnv):
    resets = 0

    def _draw_digit(self) -> int:  # a new digit at every reset, whatever the seed
        type(self).resets += 1
        return type(self).resets % self.n_digits


class _ScoringAdvancesTheEpisode(RepeatDigitEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        self.t = max(self.t, 1)  # a side effect that leaves the scores as they are
        return super().score_candidates(candidates)


class _BadRewardCredit(RepeatDigitEnv):
    reward_credit = "sequence"


class _BadSummary(RepeatDigitEnv):
    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, done, truncated, info = super().step(action)
        return obs, reward, done, truncated, {**info, "error": 2.0} if done else info


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (_RepeatDigitBase(), r"_RepeatDigitBase has no score_candidates\(candidates\) method"),
        (gym.make("CartPole-v1"), r"CartPoleEnv has no score_candidates"),
        (_ScoreAsColumn(), r"must return shape \(101,\) \(one score per candidate\), got \(101, 1\)"),
        (_IntegerScores(), r"must return a floating dtype \(float32\), got int64"),
        (_NaNScores(), r"must return finite scores"),
        (_NoisyScores(), r"different scores for the same candidates at the same state"),
        (_ScoresAreNotRewards(), r"scored candidate 0 .* but step\(\) paid"),
        (_ContextIgnoresTheSeed(), r"different scores at step 0 after two resets with seed=0"),
        (_ScoringAdvancesTheEpisode(), r"calling score_candidates changed"),
        (_BadRewardCredit(), r"reward_credit must be 'step' or 'episode' .*got 'sequence'"),
        (_BadSummary(), r"info\['error'\] of the step that ends an episode must be a real number in \[0, 1\], got 2.0"),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, str) else "error",
)
def test_broken_single_envs_fail_check_group_env_naming_the_fault(env: gym.Env[Any, Any], match: str) -> None:
    with pytest.raises(GroupEnvError, match=match):
        check_group_env(env)


class _IgnoresGroupSize(RepeatDigitVectorEnv):
    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        return super().reset(seed=seed)


class _AcceptsAnyGroupSize(RepeatDigitVectorEnv):
    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        try:
            return super().reset(seed=seed, options=options)
        except ValueError:
            return super().reset(seed=seed)


class _UnbatchedSpace(RepeatDigitVectorEnv):
    def __init__(self, num_envs: int = 1) -> None:
        super().__init__(num_envs)
        self.observation_space = self.single_observation_space


class _VectorScoresNotRewards(RepeatDigitVectorEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        return 1.0 - super().score_candidates(candidates)


class _MaskedWrongly(RepeatDigitVectorEnv):
    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        out = super().step(actions)
        if "_score" in out[4]:
            out[4]["_score"] = ~out[4]["_score"]
        return out


@pytest.mark.parametrize(
    ("venv", "match"),
    [
        (gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"), r"SyncVectorEnv has no score_candidates"),
        (_UnbatchedSpace(4), r"observation_space must be batch_space\(single_observation_space, num_envs=4\)"),
        (_VectorScoresNotRewards(4), r"scored candidate 0 .* but step\(\) paid"),
        (_MaskedWrongly(4), r"info\['score'\] and its mask info\['_score'\] must have one entry per sub-env"),
        (_IgnoresGroupSize(4), r"sub-envs of one group gave different scores for the same candidates"),
        (_AcceptsAnyGroupSize(4), r"reset\(options=\{'group_size': 5\}\) must raise ValueError .*it returned"),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, str) else "error",
)
def test_broken_vector_envs_fail_check_group_env_naming_the_fault(venv: gym.vector.VectorEnv, match: str) -> None:
    with pytest.raises(GroupEnvError, match=match):
        check_group_env(venv)


class _NoSummary(RepeatDigitEnv):
    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return (*super().step(action)[:4], {})


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (_NoSummary(), r"has no \['score', 'error'\]; the agents then use score = return / horizon"),
        (RepeatDigitEnv(length=2000), r"no episode ended within max_steps=1000"),
    ],
    ids=["no_episode_summary", "episode_longer_than_max_steps"],
)
def test_check_group_env_warns_where_the_contract_is_kept_but_unusual(env: gym.Env[Any, Any], match: str) -> None:
    with pytest.warns(UserWarning, match=match):
        check_group_env(env)


def test_check_group_env_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match=r"needs a gymnasium.Env or gymnasium.vector.VectorEnv, got object"):
        check_group_env(object())  # type: ignore[arg-type]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"^n_candidates must be an integer >= 1"):
            check_group_env(RepeatDigitEnv(), n_candidates=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^seed must be an integer >= 0"):
        check_group_env(RepeatDigitEnv(), seed=-1)
