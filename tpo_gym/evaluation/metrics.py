r"""Metrics of docs/method.md section 5 and the rliable-style aggregate, as small pure functions.

Conventions
-----------
* A *curve* is a 1-D array of one logged quantity (usually the error) over logged steps; a
  *curve matrix* is ``[n_seeds, n_steps]``, one row per seed, ``NaN`` where a seed did not log.
* Every "seed-mean" ignores ``NaN`` entries (``numpy.nanmean``).
* Standard errors use the *sample* standard deviation (``ddof=1``): ``s.e. = std(x, ddof=1) /
  sqrt(n)``. (The paper's reference code uses ``ddof=0``; the two differ by ``sqrt(n/(n-1))``.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "METRIC_TYPES",
    "TABLE_METRIC_TYPES",
    "STEPS_TO_THRESHOLD",
    "FINAL",
    "INITIAL",
    "RATIO",
    "seed_mean_curve",
    "steps_to_threshold",
    "final_value",
    "first_value",
    "mean_and_se",
    "bootstrap_se",
    "iqm",
    "stratified_bootstrap_ci",
    "paper_agrees",
]

#: The metric types of a preset or claim (``{"type": ...}``), the one vocabulary the report computes
#: (``report.values``), presets validate and claims label: steps until the seed-mean curve falls below a
#: threshold, the final or initial value (a seed mean), and the last / first ratio of the seed-mean curve.
METRIC_TYPES = ("steps_to_threshold", "final", "initial", "ratio")
#: Steps until the seed-mean curve first falls below the threshold (``None`` where it never does).
STEPS_TO_THRESHOLD = METRIC_TYPES[0]
#: The seed mean of the last logged value.
FINAL = METRIC_TYPES[1]
#: The seed mean of the first logged value.
INITIAL = METRIC_TYPES[2]
#: The last / first ratio of the seed-mean curve.
RATIO = METRIC_TYPES[3]
#: The metric types a preset's tables may use (all but ``"ratio"``, which only a claim's inline metric may use).
TABLE_METRIC_TYPES = (STEPS_TO_THRESHOLD, FINAL, INITIAL)


#: ``summary.csv`` column suffixes of metric units (a preset metric's ``"unit"``); another unit is spelled out
#: in lower case, its non-word characters as ``_`` (``"s"`` -> ``_s``).
UNIT_SUFFIXES = {"%": "pct"}


def unit_suffix(unit: str) -> str:
    """The column suffix of ``unit`` (``"%"`` -> ``"pct"``); ``""`` when it has no letter or digit to spell."""
    return UNIT_SUFFIXES.get(unit) or re.sub(r"\W+", "_", unit).strip("_").lower()


def summary_column(metric: Mapping[str, Any]) -> str:
    """The ``summary.csv`` column of ``metric``: its id with its unit (``final_error`` in ``%`` ->
    ``final_error_pct``); a metric without a unit (steps to a threshold, a misalignment, a score) keeps its id,
    as does an id that already ends with the unit's suffix."""
    unit = metric.get("unit")
    suffix = unit_suffix(unit) if unit else ""
    if not suffix or metric["id"].endswith(f"_{suffix}"):
        return metric["id"]
    return f"{metric['id']}_{suffix}"


def seed_mean_curve(curves: np.ndarray) -> np.ndarray:
    """Seed-mean of a ``[n_seeds, n_steps]`` curve matrix, ignoring ``NaN`` (``NaN`` where all are)."""
    curves = np.asarray(curves, dtype=float)
    if curves.ndim != 2:
        raise ValueError(f"curves must be [n_seeds, n_steps], got shape {curves.shape}")
    out = np.full(curves.shape[1], np.nan)
    has = ~np.all(np.isnan(curves), axis=0)
    out[has] = np.nanmean(curves[:, has], axis=0)
    return out


def steps_to_threshold(
    curves: np.ndarray, threshold: float, steps: Sequence[float] | None = None
) -> float | None:
    """Steps to threshold (docs/method.md section 5): the first step at which the *seed-mean* curve is below
    ``threshold``.

    :param curves: ``[n_seeds, n_steps]`` error curves (a 1-D curve is read as one seed).
    :param threshold: strict bound: the first index ``i`` with ``mean_i < threshold`` counts.
    :param steps: the step value of each column (default: the 0-indexed column index, i.e. the
        paper's 0-indexed episode); use it for curves logged every N steps (MNIST).
    :return: ``steps[i]`` of that first column, or ``None`` if the mean never goes below.
    """
    curves = np.asarray(curves, dtype=float)
    if curves.ndim == 1:
        curves = curves[None, :]
    mean = seed_mean_curve(curves)
    below = np.flatnonzero(mean < threshold)  # NaN compares False
    if below.size == 0:
        return None
    i = int(below[0])
    return float(steps[i]) if steps is not None else float(i)


def per_seed_steps_to_threshold(
    curves: np.ndarray, threshold: float, steps: Sequence[float] | None = None
) -> np.ndarray:
    """Per seed, the first step at which *that seed's* curve is below ``threshold`` (``inf``: never).

    The seed-mean crossing of :func:`steps_to_threshold` is what the paper reports; this is the
    distribution behind it (plateau lengths are heavy-tailed, so a few slow seeds can move the
    seed-mean crossing far from the typical seed).

    :param curves: ``[n_seeds, n_steps]`` error curves (``NaN`` = not logged).
    :return: ``[n_seeds]`` float array of step values, ``inf`` where the seed never goes below.
    """
    curves = np.asarray(curves, dtype=float)
    if curves.ndim == 1:
        curves = curves[None, :]
    values = np.asarray(steps, dtype=float) if steps is not None else np.arange(curves.shape[1], dtype=float)
    out = np.full(curves.shape[0], np.inf)
    for i, row in enumerate(curves):
        below = np.flatnonzero(row < threshold)  # NaN compares False
        if below.size:
            out[i] = values[below[0]]
    return out


def first_value(curves: np.ndarray) -> np.ndarray:
    """Per-seed first logged (non-``NaN``) value of a ``[n_seeds, n_steps]`` matrix (``NaN`` if none)."""
    curves = np.asarray(curves, dtype=float)
    return final_value(curves[..., ::-1])


def final_value(curves: np.ndarray, window: int = 1) -> np.ndarray:
    """Per-seed last logged (non-``NaN``) value of a ``[n_seeds, n_steps]`` matrix (``NaN`` if none);
    with ``window > 1`` the mean of each seed's last ``window`` logged values (a noisy per-step metric)."""
    curves = np.asarray(curves, dtype=float)
    if curves.ndim == 1:
        curves = curves[None, :]
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = np.full(curves.shape[0], np.nan)
    for s, row in enumerate(curves):
        ok = np.flatnonzero(~np.isnan(row))
        if ok.size:
            out[s] = float(np.mean(row[ok[-window:]]))
    return out


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error ``std(ddof=1) / sqrt(n)`` of the finite values.

    :return: ``(mean, se)``; ``se`` is ``NaN`` for fewer than two values, both ``NaN`` for none.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1:
        return float(x[0]), math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))


def bootstrap_se(
    curves: np.ndarray,
    statistic: Callable[[np.ndarray], float | None],
    reps: int = 200,
    seed: int = 0,
) -> float:
    """Bootstrap standard error of a statistic of a whole curve matrix (seeds resampled with replacement).

    Used for steps-to-threshold, which is a statistic of the seed-mean curve, not a per-seed value.
    Resamples where the statistic is ``None`` (never reached) are dropped; ``NaN`` if fewer than
    two resamples remain or there are fewer than two seeds.
    """
    curves = np.asarray(curves, dtype=float)
    n = curves.shape[0]
    if n < 2:
        return math.nan
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(reps):
        v = statistic(curves[rng.integers(0, n, size=n)])
        if v is not None and math.isfinite(v):
            vals.append(v)
    if len(vals) < 2:
        return math.nan
    return float(np.std(vals, ddof=1))


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% (``scipy.stats.trim_mean(x, 0.25)``, as rliable).

    ``int(0.25 * n)`` values are cut from each end of the sorted finite values.
    """
    x = np.sort(np.asarray(values, dtype=float)[np.isfinite(np.asarray(values, dtype=float))])
    if x.size == 0:
        return math.nan
    cut = int(0.25 * x.size)
    return float(x[cut : x.size - cut].mean())


def stratified_bootstrap_ci(
    scores: Mapping[str, Sequence[float]],
    statistic: Callable[[np.ndarray], float] = iqm,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Point estimate and percentile interval of an aggregate over tasks (rliable-style).

    :param scores: ``{task: per-run scores}``; each bootstrap replicate resamples runs (seeds)
        with replacement *within* each task, pools the tasks and applies ``statistic``.
    :return: ``(point, low, high)``; ``low``/``high`` are the ``(1-confidence)/2`` and
        ``(1+confidence)/2`` percentiles of the replicates.
    """
    tasks = [np.asarray(v, dtype=float) for v in scores.values()]
    tasks = [t[np.isfinite(t)] for t in tasks]
    tasks = [t for t in tasks if t.size]
    if not tasks:
        return math.nan, math.nan, math.nan
    point = statistic(np.concatenate(tasks))
    rng = np.random.default_rng(seed)
    reps_vals = np.empty(reps)
    for r in range(reps):
        reps_vals[r] = statistic(np.concatenate([t[rng.integers(0, t.size, size=t.size)] for t in tasks]))
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(reps_vals, [100 * alpha, 100 * (1 - alpha)])
    return float(point), float(low), float(high)


def paper_agrees(ours: float | None, se: float, paper: float | str | None, dash: str = "never") -> bool | None:
    """Whether our value is within 2 s.e. of the paper's (``None`` = nothing to compare).

    :param ours: our value; ``None`` means "never reached" (steps to threshold).
    :param se: its standard error (``NaN`` is read as 0: an exact comparison).
    :param paper: the paper's number, ``"-"``, ``">x"`` / ``"<x"`` bounds, or ``None`` (not reported).
    :param dash: what the paper's ``"-"`` means: ``"never"`` (threshold never reached) or a bound
        such as ``">95"``.
    """
    if paper is None:
        return None
    se = 0.0 if se is None or not math.isfinite(se) else float(se)
    if isinstance(paper, str):
        if paper == "-":
            if dash == "never":
                return ours is None
            paper = dash
        op, bound = paper[0], float(paper[1:])
        if ours is None:
            return op == ">"
        return ours + 2 * se >= bound if op == ">" else ours - 2 * se <= bound
    if ours is None:
        return False
    return abs(ours - float(paper)) <= 2 * se
