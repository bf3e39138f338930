"""check_group_env refuses what the docs call a broken contract: scores that are not float32, and a score_candidates
that draws from the env's random number generators or overwrites the candidates it is given (side effects a
same-seed episode comparison can miss)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from tests.envs.test_checker import RepeatDigitEnv, RepeatDigitVectorEnv
from tpo_gym.envs import GroupEnvError, check_group_env


class _Float64Scores(RepeatDigitEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        return super().score_candidates(candidates).astype(np.float64)


class _Float16Scores(RepeatDigitEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        return super().score_candidates(candidates).astype(np.float16)


class _DrawsFromNpRandom(RepeatDigitEnv):
    """Scores right, but each call draws from the env's RNG (the draw is thrown away)."""

    def score_candidates(self, candidates: Any) -> np.ndarray:
        self.np_random.random()
        return super().score_candidates(candidates)


class _OneStepDrawsFromNpRandom(_DrawsFromNpRandom):
    """One-step episodes (like the docs' GuessEnv): the draw changes nothing a same-seed episode shows."""

    def __init__(self) -> None:
        super().__init__(length=1)


class _DrawsFromItsOwnGenerators(RepeatDigitEnv):
    def __init__(self, kind: str) -> None:
        super().__init__(length=1)
        self.kind = kind
        self.gens = [np.random.default_rng(0)]
        self.legacy = np.random.RandomState(0)
        self.py = random.Random(0)
        self.torch_gen = torch.Generator().manual_seed(0)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        {"list": lambda: self.gens[0].random(), "legacy": self.legacy.rand, "python": self.py.random,
         "torch": lambda: torch.rand(1, generator=self.torch_gen)}[self.kind]()
        return super().score_candidates(candidates)


class _VectorDrawsFromNpRandom(RepeatDigitVectorEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        self.np_random.random()
        return super().score_candidates(candidates)


class _VectorFloat64Scores(RepeatDigitVectorEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        return super().score_candidates(candidates).astype(np.float64)


class _OverwritesCandidates(RepeatDigitEnv):
    """Scores right, then reuses the candidates array as scratch space (the agents keep and train on it)."""

    def score_candidates(self, candidates: Any) -> np.ndarray:
        scores = super().score_candidates(candidates)
        candidates[:] = 0
        return scores


class _VectorSortsCandidates(RepeatDigitVectorEnv):
    def score_candidates(self, candidates: Any) -> np.ndarray:
        scores = super().score_candidates(candidates)
        candidates.sort(axis=1)
        return scores


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (_Float64Scores(), r"must return a floating dtype \(float32\), got float64"),
        (_Float16Scores(), r"must return a floating dtype \(float32\), got float16"),
        (_VectorFloat64Scores(4), r"must return a floating dtype \(float32\), got float64"),
        (_DrawsFromNpRandom(), r"_DrawsFromNpRandom.score_candidates after reset\(seed=0\) drew from the env's random "
                               r"number generator \(_DrawsFromNpRandom.np_random\)"),
        (_OneStepDrawsFromNpRandom(), r"drew from the env's random number generator"),
        (_DrawsFromItsOwnGenerators("list"), r"generator \(_DrawsFromItsOwnGenerators.gens\)"),
        (_DrawsFromItsOwnGenerators("legacy"), r"generator \(_DrawsFromItsOwnGenerators.legacy\)"),
        (_DrawsFromItsOwnGenerators("python"), r"generator \(_DrawsFromItsOwnGenerators.py\)"),
        (_DrawsFromItsOwnGenerators("torch"), r"generator \(_DrawsFromItsOwnGenerators.torch_gen\)"),
        (_VectorDrawsFromNpRandom(4), r"_VectorDrawsFromNpRandom.score_candidates after reset\(seed=0\) drew from"),
        (_OverwritesCandidates(), r"_OverwritesCandidates.score_candidates after reset\(seed=0\) overwrote the "
                                  r"candidates it was given \(candidates\[0\] was 85, left 0\): .*scoring must only "
                                  r"read it"),
        (_VectorSortsCandidates(4), r"_VectorSortsCandidates.score_candidates .* overwrote the candidates it was "
                                    r"given"),
    ],
    ids=["float64", "float16", "vector_float64", "np_random", "np_random_one_step", "generator_list",
         "random_state", "python_random", "torch_generator", "vector_np_random", "overwrites_candidates",
         "vector_sorts_candidates"],
)
def test_check_group_env_raises_on_non_float32_scores_and_rng_side_effects(env: Any, match: str) -> None:
    with pytest.raises(GroupEnvError, match=match):
        check_group_env(env)


def test_an_rng_the_scores_do_not_touch_passes() -> None:
    env = _DrawsFromItsOwnGenerators("list")
    env.score_candidates = RepeatDigitEnv.score_candidates.__get__(env)  # type: ignore[method-assign]
    check_group_env(env)  # holding generators is fine; drawing from them in score_candidates is not
