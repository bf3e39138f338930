"""Metric values of a report: the metric-type registry, the cells of stored runs and their numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tpo_gym.agents.common.registry import reported_diagnostics
from tpo_gym.evaluation import claims as C
from tpo_gym.evaluation import metrics as M

if TYPE_CHECKING:  # presets imports this module's metric types
    from tpo_gym.evaluation.presets import Preset

#: Diagnostics the agents log (docs/method.md section 5), as their classes declare them in the algorithm registry
#: (:func:`~tpo_gym.agents.common.registry.reported_diagnostics`), and the tabular runs' ``misalignment``; reported
#: when present in the rows. (The report reads the registry as it stands: :func:`_diagnostic_keys`.)
DIAGNOSTIC_KEYS = (*reported_diagnostics(), "misalignment")


def _diagnostic_keys() -> tuple[str, ...]:
    """:data:`DIAGNOSTIC_KEYS` of the registry as it stands (with algorithms registered since import)."""
    return (*reported_diagnostics(), "misalignment")


#: Every metric type a report computes (:func:`_metric_value`), from :mod:`~tpo_gym.evaluation.metrics` (the one
#: vocabulary: presets validate against it, claims label with it).
METRIC_TYPES, TABLE_METRIC_TYPES = M.METRIC_TYPES, M.TABLE_METRIC_TYPES


@dataclass
class Cell:
    """All seeds of one method x setting."""

    method: str
    setting: str
    seeds: list[int] = field(default_factory=list)
    rows: list[list[dict[str, Any]]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    #: per seed in :attr:`rows`, the record's ``env_interactions`` and ``reward_queries`` (``tpo-gym import``)
    counts: list[dict[str, Any]] = field(default_factory=list)

    def matrix(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, [n_seeds, n_steps] values)`` of logged ``key``, ``NaN`` where a seed lacks it."""
        steps = sorted({r["step"] for rows in self.rows for r in rows if key in r})
        index = {s: i for i, s in enumerate(steps)}
        mat = np.full((len(self.rows), len(steps)), np.nan)
        for i, rows in enumerate(self.rows):
            for r in rows:
                if key in r and r[key] is not None:
                    mat[i, index[r["step"]]] = float(r[key])
        return np.asarray(steps, dtype=float), mat

    def keys(self) -> set[str]:
        return {k for rows in self.rows for r in rows for k in r} - {"step"}

def _metric_value(cell: Cell, metric: dict[str, Any]) -> C.Stat:
    """The cell's value of ``metric``: ``value`` ``None`` = never reached, ``NaN`` = no data."""
    key = metric.get("key", "error")
    steps, mat = cell.matrix(key)
    if mat.size == 0:
        return C.Stat(math.nan)
    if metric["type"] == M.STEPS_TO_THRESHOLD:
        thr = float(metric["threshold"])
        value = M.steps_to_threshold(mat, thr, steps)
        se = M.bootstrap_se(mat, lambda m: M.steps_to_threshold(m, thr, steps))
        return C.Stat(value, se)
    if metric["type"] == M.RATIO:
        mean = M.seed_mean_curve(mat)
        ok = mean[np.isfinite(mean)]
        if ok.size == 0 or ok[0] == 0:
            return C.Stat(math.nan)
        return C.Stat(float(ok[-1] / ok[0]))
    if metric["type"] == M.INITIAL:
        finals = M.first_value(mat)
    else:
        finals = M.final_value(mat, int(metric.get("window", 1)))
    finals = finals * float(metric.get("scale", 1.0))
    mean, se = M.mean_and_se(finals)
    return C.Stat(mean, se)


def _fmt(v: float | None, metric: dict[str, Any]) -> str:
    if v is None:
        return "never"
    if not math.isfinite(v):
        return "n/a"
    if metric["type"] == M.STEPS_TO_THRESHOLD:
        return f"{v:.0f}"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _fmt_se(se: float, metric: dict[str, Any]) -> str:
    if not math.isfinite(se):
        return ""
    return f" ± {se:.0f}" if metric["type"] == M.STEPS_TO_THRESHOLD or se >= 100 else f" ± {se:.2g}"


def _fmt_stat(stat: C.Stat, metric: dict[str, Any]) -> str:
    return _fmt(stat.value, metric) + ("" if stat.value is None else _fmt_se(stat.se, metric))


def _paper(preset: Preset, metric_id: str, method: str, setting: str) -> Any:
    return preset.data.get("paper", {}).get(metric_id, {}).get(method, {}).get(setting)


_metric_label = C.metric_label
