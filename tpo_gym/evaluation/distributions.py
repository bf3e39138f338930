"""Compare two samples of runs statistically: the cross-machine contract of tpo-gym.

Two machines (another CPU, a GPU, the JAX reference) cannot reproduce a training curve bit for bit: where a group
carries no signal, TPO's true gradient is 0, the rounding noise left (grad-norm ~1e-6) is normalised by Muon or Adam
into a full step, and the runs part ways (docs/method.md, "Rounding noise and what it means for comparisons"). What
two correct implementations share is the *distribution* of each outcome over seeds: steps to 1% and final error.
So a cross-platform check trains the same seeds on both sides and asks a two-sample test whether the outcomes
could come from one distribution.

The test is Mann-Whitney's U (rank-based: a seed that never reaches the threshold is ``inf`` and simply ranks last),
with a two-sided p-value from ``n_resamples`` random permutations of the pooled sample (exact enough at the sizes
used, and valid for ties). Its power is stated, not assumed: :func:`detectable_shift` is the location shift, in
pooled standard deviations, that the test detects with probability ``power`` at level ``alpha`` for the given
sample sizes (normal approximation with U's asymptotic efficiency 3/pi relative to the t-test):

.. math::

    \\Delta = \\frac{z_{1-\\alpha/2} + z_{\\text{power}}}{\\sqrt{3/\\pi}} \\sqrt{\\frac{1}{n_a} + \\frac{1}{n_b}}

(10 seeds a side: 1.28 s.d. at 80% power and alpha = 0.05; 20 a side: 0.91).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["TestResult", "mann_whitney", "detectable_shift", "compare_samples"]


@dataclass(frozen=True)
class TestResult:
    """The outcome of :func:`compare_samples` for one metric."""

    metric: str
    a: tuple[float, ...]
    b: tuple[float, ...]
    u: float
    p_value: float
    alpha: float
    power: float
    detectable_sd: float

    @property
    def same(self) -> bool:
        """Whether the test finds no difference at level :attr:`alpha`."""
        return self.p_value >= self.alpha

    def describe(self) -> str:
        """One line: medians, U, p, the verdict and the power statement."""
        def med(x: tuple[float, ...]) -> str:
            m = float(np.median(x))
            return "never" if math.isinf(m) else f"{m:.4g}"
        verdict = "same distribution (not rejected)" if self.same else "DIFFERENT"
        return (f"{self.metric}: median {med(self.a)} vs {med(self.b)} (n = {len(self.a)}, {len(self.b)}), "
                f"U = {self.u:g}, p = {self.p_value:.3g}: {verdict} at alpha = {self.alpha}; the test detects a "
                f"shift of {self.detectable_sd:.2f} s.d. with {self.power:.0%} power")


def _sample(values: Sequence[float], name: str) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"{name} must be a 1-D sequence of at least 2 numbers, got shape {x.shape}")
    if np.isnan(x).any():
        raise ValueError(f"{name} holds NaN at positions {np.flatnonzero(np.isnan(x)).tolist()}; allowed: finite "
                         "numbers, or inf for a threshold never reached")
    return x


def _u_statistic(ranks: np.ndarray, n_a: int) -> np.ndarray:
    """U of sample a for each row of ``ranks`` (pooled midranks, a's first ``n_a`` columns)."""
    return ranks[..., :n_a].sum(axis=-1) - n_a * (n_a + 1) / 2.0


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` with ties averaged (``inf`` ties with ``inf``)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    sorted_x = x[order]
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def mann_whitney(a: Sequence[float], b: Sequence[float], n_resamples: int = 20000,
                 seed: int = 0) -> tuple[float, float]:
    """Mann-Whitney U of ``a`` against ``b`` and its two-sided permutation p-value.

    :math:`U = R_a - n_a (n_a + 1) / 2` with :math:`R_a` the sum of a's midranks in the pooled sample; the p-value
    is the fraction of ``n_resamples`` random relabellings (plus the observed one) whose
    :math:`|U - n_a n_b / 2|` is at least the observed one. ``inf`` (never reached) ranks last.

    :return: ``(U, p)``.
    """
    x, y = _sample(a, "a"), _sample(b, "b")
    if not isinstance(n_resamples, int) or n_resamples < 100:
        raise ValueError(f"n_resamples must be an int >= 100, got {n_resamples!r}")
    pooled = np.concatenate([x, y])
    ranks = _midranks(pooled)
    centre = x.size * y.size / 2.0
    observed = abs(float(_u_statistic(ranks, x.size)) - centre)
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((n_resamples, pooled.size)), axis=1)
    resampled = np.abs(_u_statistic(ranks[perms], x.size) - centre)
    p = (1 + int(np.count_nonzero(resampled >= observed - 1e-9))) / (n_resamples + 1)
    return float(_u_statistic(ranks, x.size)), min(1.0, p)


def detectable_shift(n_a: int, n_b: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The location shift, in pooled standard deviations, that a two-sided Mann-Whitney test at level ``alpha``
    detects with probability ``power`` (module docstring's equation)."""
    if not (isinstance(n_a, int) and isinstance(n_b, int) and n_a >= 2 and n_b >= 2):
        raise ValueError(f"sample sizes must be ints >= 2, got {n_a!r} and {n_b!r}")
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha!r} and {power!r}")
    z = statistics.NormalDist().inv_cdf
    return (z(1 - alpha / 2) + z(power)) / math.sqrt(3 / math.pi) * math.sqrt(1 / n_a + 1 / n_b)


def compare_samples(metric: str, a: Sequence[float], b: Sequence[float], alpha: float = 0.05,
                    power: float = 0.8, n_resamples: int = 20000) -> TestResult:
    """Two-sample comparison of one per-seed metric (e.g. steps to 1%, final error) of two sides."""
    x, y = _sample(a, f"{metric} of the first sample"), _sample(b, f"{metric} of the second sample")
    u, p = mann_whitney(x, y, n_resamples)
    return TestResult(metric, tuple(float(v) for v in x), tuple(float(v) for v in y), u, p, alpha, power,
                      detectable_shift(x.size, y.size, alpha, power))
