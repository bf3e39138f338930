"""Metrics of docs/method.md section 5 against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpo_gym.evaluation import metrics as M


def test_steps_to_threshold_uses_the_seed_mean_and_is_zero_indexed() -> None:
    # seed means: [0.5, 0.25, 0.015, 0.005, 0.0]: first strictly below 0.01 is index 3
    curves = np.array([[0.6, 0.3, 0.02, 0.00, 0.0],
                       [0.4, 0.2, 0.01, 0.01, 0.0]])
    assert M.steps_to_threshold(curves, 0.01) == 3.0
    # a single seed reaching 0.0 at index 3 does not count: it is the mean that must cross
    assert M.steps_to_threshold(curves, 0.005) == 4.0
    # strict inequality: a mean exactly at the threshold does not count
    assert M.steps_to_threshold(np.array([[0.5, 0.01, 0.009]]), 0.01) == 2.0
    # never reached -> None
    assert M.steps_to_threshold(curves, 0.0) is None
    # with logged step values (every 200 steps)
    assert M.steps_to_threshold(curves, 0.01, steps=[0, 200, 400, 600, 800]) == 600.0
    # 1-D input is one seed
    assert M.steps_to_threshold(np.array([0.9, 0.5, 0.001]), 0.01) == 2.0


def test_seed_mean_ignores_missing_values() -> None:
    curves = np.array([[1.0, np.nan, 0.0], [3.0, 0.5, np.nan]])
    np.testing.assert_allclose(M.seed_mean_curve(curves), [2.0, 0.5, 0.0])
    np.testing.assert_allclose(M.final_value(curves), [0.0, 0.5])


def test_mean_and_se_uses_sample_std() -> None:
    mean, se = M.mean_and_se([1.0, 2.0, 3.0, 6.0])
    assert mean == pytest.approx(3.0)
    # sample variance = (4 + 1 + 0 + 9) / 3 = 14/3; se = sqrt(14/3) / 2
    assert se == pytest.approx(math.sqrt(14 / 3) / 2)
    m1, s1 = M.mean_and_se([5.0])
    assert m1 == 5.0 and math.isnan(s1)
    m0, s0 = M.mean_and_se([])
    assert math.isnan(m0) and math.isnan(s0)


def test_iqm_matches_trimmed_mean() -> None:
    # n = 8: cut int(0.25 * 8) = 2 from each end -> mean(3, 4, 5, 6) = 4.5
    assert M.iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)
    # n = 5: cut 1 from each end -> mean(2, 3, 4) = 3
    assert M.iqm([1, 2, 3, 4, 100]) == pytest.approx(3.0)


def test_stratified_bootstrap_interval() -> None:
    # constant scores: the interval collapses onto the point
    point, lo, hi = M.stratified_bootstrap_ci({"a": [2.0] * 5, "b": [2.0] * 3})
    assert point == lo == hi == 2.0
    rng = np.random.default_rng(0)
    scores = {"a": rng.normal(0, 1, 20), "b": rng.normal(5, 1, 20)}
    point, lo, hi = M.stratified_bootstrap_ci(scores, reps=500)
    assert lo < point < hi
    assert point == pytest.approx(M.iqm(np.concatenate(list(scores.values()))))
    # stratified: every replicate keeps 20 runs of each task, so the pooled IQM stays between the tasks
    assert 0.5 < lo and hi < 4.5
    # deterministic for a fixed seed
    assert M.stratified_bootstrap_ci(scores, reps=200, seed=3) == M.stratified_bootstrap_ci(scores, reps=200, seed=3)


def test_bootstrap_se_of_steps_to_threshold() -> None:
    identical = np.tile(np.array([0.5, 0.1, 0.001]), (4, 1))
    assert M.bootstrap_se(identical, lambda m: M.steps_to_threshold(m, 0.01)) == 0.0
    assert math.isnan(M.bootstrap_se(identical[:1], lambda m: M.steps_to_threshold(m, 0.01)))


@pytest.mark.parametrize(
    ("ours", "se", "paper", "dash", "expected"),
    [
        (60.0, 2.0, 58, "never", True),       # |2| <= 2*2
        (63.0, 2.0, 58, "never", False),      # |5| > 4
        (None, 0.0, "-", "never", True),      # both never reached
        (300.0, 5.0, "-", "never", False),    # we reach it, the paper never did
        (None, 0.0, 100, "never", False),     # we never reach it, the paper did
        (97.0, 1.0, "-", ">95", True),        # paper's dash = above 95%
        (50.0, 1.0, "-", ">95", False),
        (99.5, 0.1, ">99", "never", True),
        (2.0, 0.5, "<2.3", "never", True),
        (5.0, 0.5, "<2.3", "never", False),
        (5.0, 0.5, None, "never", None),      # no paper number: nothing to compare
        (7.4, float("nan"), 7.4, "never", True),
    ],
)
def test_paper_agrees(ours, se, paper, dash, expected) -> None:
    assert M.paper_agrees(ours, se, paper, dash) is expected


def test_per_seed_steps_to_threshold_reads_each_seed_alone() -> None:
    import numpy as np

    from tpo_gym.evaluation.metrics import per_seed_steps_to_threshold, steps_to_threshold

    curves = np.array([[0.5, 0.2, 0.05, 0.01], [0.5, 0.5, 0.5, 0.5], [0.04, 0.5, np.nan, 0.01]])
    got = per_seed_steps_to_threshold(curves, 0.1, steps=[0, 10, 20, 30])
    assert got.tolist() == [20.0, float("inf"), 0.0]
    # the seed mean never drops below 0.1 although two of three seeds do
    assert steps_to_threshold(curves, 0.1, [0, 10, 20, 30]) is None
