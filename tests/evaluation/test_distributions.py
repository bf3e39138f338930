"""The two-sample comparison behind cross-machine checks (tpo_gym.evaluation.distributions)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tpo_gym.evaluation.distributions import compare_samples, detectable_shift, mann_whitney


def _exact_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact p of U by enumerating every relabelling (small samples only)."""
    pooled = a + b
    ranks = {v: np.mean([i + 1 for i, w in enumerate(sorted(pooled)) if w == v]) for v in pooled}
    centre = len(a) * len(b) / 2

    def dev(group: tuple[int, ...]) -> float:
        return abs(sum(ranks[pooled[i]] for i in group) - len(a) * (len(a) + 1) / 2 - centre)

    observed = dev(tuple(range(len(a))))
    groups = list(itertools.combinations(range(len(pooled)), len(a)))
    return sum(dev(g) >= observed - 1e-9 for g in groups) / len(groups)


def test_the_permutation_p_value_matches_the_exact_one() -> None:
    a, b = [3.0, 5.0, 8.0, 9.0, 12.0], [1.0, 2.0, 4.0, 6.0, 7.0]
    u, p = mann_whitney(a, b, n_resamples=20000)
    assert u == 20.0  # a's ranks 3, 5, 8, 9, 10 sum to 35; 35 - 15
    assert abs(p - _exact_p(a, b)) < 0.01


def test_same_distribution_is_not_rejected_and_a_large_shift_is() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=12), rng.normal(size=12)
    assert compare_samples("x", a, b).same
    shifted = compare_samples("x", a, b + 3.0)
    assert not shifted.same and shifted.p_value < 0.001


def test_never_reached_ranks_last_and_ties_are_handled() -> None:
    fast = [10.0, 12.0, 11.0, 13.0, 9.0, 10.0]
    slow = [math.inf] * 6
    assert mann_whitney(fast, slow)[1] < 0.01
    assert mann_whitney(slow, [math.inf] * 6)[1] == 1.0


def test_the_stated_power_holds_by_simulation() -> None:
    """At the shift :func:`detectable_shift` states, normal samples of 10 a side are told apart ~80% of the time."""
    shift = detectable_shift(10, 10)
    assert 1.2 < shift < 1.35
    rng = np.random.default_rng(2)
    rejected = [mann_whitney(rng.normal(size=10), rng.normal(size=10) + shift, n_resamples=1000, seed=i)[1] < 0.05
                for i in range(200)]
    assert 0.7 < np.mean(rejected) < 0.9


@pytest.mark.parametrize(("a", "message"), [([1.0, float("nan")], "NaN"), ([1.0], "at least 2"),
                                           ([[1.0, 2.0]], "1-D")])
def test_bad_samples_are_refused_clearly(a: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compare_samples("steps to 1%", a, [1.0, 2.0])


def test_bad_settings_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="n_resamples"):
        mann_whitney([1.0, 2.0], [3.0, 4.0], n_resamples=5)
    with pytest.raises(ValueError, match="alpha and power"):
        detectable_shift(10, 10, alpha=1.5)
