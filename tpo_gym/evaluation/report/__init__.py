"""Build the benchmark report of an output directory from its stored runs.

``build_report(OUT)`` reads ``OUT/manifest.json`` and the stored runs -- ``OUT/runs/*.json`` or ``*.json.gz`` (see
:mod:`tpo_gym.evaluation.runner`), or, for runs without a record there, their rows in
``OUT/results.jsonl`` -- and writes, atomically and readable by others:

* ``report.md`` -- setup (versions, git commit, command, seeds, wall time), the terms used, one
  table per preset table and metric laid out as in the paper (rows methods, columns settings) with
  our value ± s.e. beside the paper's and a flag where they differ by more than 2 s.e., the paper's
  claims checked against this run's numbers, an IQM aggregate over common settings, the agents'
  diagnostics, the figures with captions, and failed runs with their traceback;
* ``curves_<key>.png`` -- seed-mean ± s.e. curves, one colour per method in every figure
  (:func:`method_colors`), log axes that show exact zeros (:func:`zero_safe_scale`);
* ``results.jsonl`` -- one row per run per logged step;
* ``summary.csv`` -- one row per method x setting with every metric and the paper's value: columns named with
  the metric's unit (``final_error_pct``), numbers or nothing in numeric columns (a threshold never reached is
  empty, with ``<metric>_reached`` False), so ``pandas.read_csv`` reads them as floats.

The report's text (description, paper numbers, claims, notes) comes from the packaged preset of the
same name when its runs are exactly the runs stored here, so corrected text reaches old runs; the
runs themselves are always the ones in the manifest.

The package's modules: :mod:`~tpo_gym.evaluation.report.runs` (manifest and stored runs),
:mod:`~tpo_gym.evaluation.report.values` (the one metric-type registry and the metric values),
:mod:`~tpo_gym.evaluation.report.figures`, :mod:`~tpo_gym.evaluation.report.sections` (the sections of
``report.md``, the glossary among them) and :mod:`~tpo_gym.evaluation.report.build`. Their names load on first use
(:mod:`~tpo_gym.evaluation.presets` imports the metric-type registry, and the report imports the presets).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DIAGNOSTIC_KEYS", "PALETTE", "BadManifest", "NoStoredRuns", "Scale", "build_report", "method_colors",
           "zero_safe_scale"]

#: ``{name: module}``: where each name of the package lives (public, and the helpers the tests read).
_NAMES = {
    "values": ("DIAGNOSTIC_KEYS", "METRIC_TYPES", "TABLE_METRIC_TYPES", "Cell", "_fmt_stat"),
    "runs": ("BadManifest", "NoStoredRuns"),
    "figures": ("MAX_DECADES", "PALETTE", "Scale", "method_colors", "zero_safe_scale", "_complementary", "_gaps",
                "_save"),
    "sections": ("_setting_groups", "_aggregate", "_claims", "_min_max_normalised"),
    "build": ("build_report", "select_report", "_summary_csv"),
}
_HOME = {name: module for module, names in _NAMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """``name`` from the module of this package that defines it, imported on first use."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
