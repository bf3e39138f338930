"""Build the benchmark report of an output directory from its stored runs.

``build_report(OUT)`` reads ``OUT/manifest.json`` and the stored runs -- ``OUT/runs/*.json`` (see
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
* ``summary.csv`` -- one row per method x setting with every metric and the paper's value.

The report's text (description, paper numbers, claims, notes) comes from the packaged preset of the
same name when its runs are exactly the runs stored here, so corrected text reaches old runs; the
runs themselves are always the ones in the manifest.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tpo_gym.agents.registry import algorithm_spec, reported_diagnostics
from tpo_gym.evaluation import claims as C
from tpo_gym.evaluation import metrics as M
from tpo_gym.evaluation._io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from tpo_gym.evaluation._provenance import git_commit, package_versions
from tpo_gym.evaluation.presets import Preset, PresetError, available_presets, load_preset, validate_preset
from tpo_gym.evaluation.runner import load_record, record_path, switch_preset

__all__ = ["DIAGNOSTIC_KEYS", "PALETTE", "BadManifest", "NoStoredRuns", "Scale", "build_report", "method_colors",
           "zero_safe_scale"]

#: Diagnostics the agents log (docs/method.md section 5), as their classes declare them in the algorithm registry
#: (:func:`~tpo_gym.agents.registry.reported_diagnostics`), and the tabular runs' ``misalignment``; reported
#: when present in the rows. (The report reads the registry as it stands: :func:`_diagnostic_keys`.)
DIAGNOSTIC_KEYS = (*reported_diagnostics(), "misalignment")


def _diagnostic_keys() -> tuple[str, ...]:
    """:data:`DIAGNOSTIC_KEYS` of the registry as it stands (with algorithms registered since import)."""
    return (*reported_diagnostics(), "misalignment")
#: The one colour list of every report: method i of the preset gets ``PALETTE[i % len(PALETTE)]``.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
_FLAG = "⚠"
_WEIGHT_KEYS = {"mean_q_winners": ("q", "winners"), "mean_q_losers": ("q", "losers"),
                "mean_abs_adv_winners": ("|A|", "winners"), "mean_abs_adv_losers": ("|A|", "losers")}
_ERROR_KEYS = ("error", "test_error", "misalignment")
#: At most this many decades on a log axis; below, a symlog axis turns linear.
MAX_DECADES = 8


class NoStoredRuns(FileNotFoundError):
    """A directory with a report but no stored run to rebuild it from."""


class BadManifest(ValueError):
    """``manifest.json`` is unreadable or is not a manifest written by ``tpo-gym bench``."""


def method_colors(methods: list[str]) -> dict[str, str]:
    """``{method: colour}``: the colour of each method in every figure of a report (preset order)."""
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}


@dataclass(frozen=True)
class Scale:
    """A y-axis scale: ``"linear"``, ``"log"`` or ``"symlog"`` (linear below ``linthresh``)."""

    kind: str
    linthresh: float | None = None
    floor: float | None = None

    @property
    def note(self) -> str:
        if self.kind == "symlog":
            return f"symlog, linear below {self.linthresh:.0e}"
        return "log" if self.kind == "log" else ""


def zero_safe_scale(values: Any, max_decades: int = MAX_DECADES) -> Scale:
    """The log-like y scale that draws ``values`` honestly.

    All values positive and within ``max_decades`` decades: ``log``. Any value ``<= 0`` (an exact
    zero: a log axis would cut it off or draw it at an arbitrary floor) or a wider range: ``symlog``,
    linear below a threshold -- the smallest positive value rounded down to a power of ten, raised
    so that at most ``max_decades`` decades are drawn logarithmically. No positive value: ``linear``.
    """
    x = np.asarray(values, dtype=float).ravel()
    x = x[np.isfinite(x)]
    pos = x[x > 0]
    if pos.size == 0:
        return Scale("linear")
    top = 10.0 ** math.ceil(math.log10(float(np.max(np.abs(x)))))
    low = 10.0 ** math.floor(math.log10(float(pos.min())))
    if np.any(x <= 0) or top / low > 10.0 ** max_decades:
        thresh = max(low, top / 10.0 ** max_decades)
        return Scale("symlog", linthresh=thresh, floor=0.0 if np.all(x >= 0) else None)
    return Scale("log", floor=low)


@dataclass
class Cell:
    """All seeds of one method x setting."""

    method: str
    setting: str
    seeds: list[int] = field(default_factory=list)
    rows: list[list[dict[str, Any]]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)

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


# ---------------------------------------------------------------------------------------------
# stored runs
# ---------------------------------------------------------------------------------------------
def _presentation(run_preset: Preset) -> tuple[Preset, list[str], str | None]:
    """``(preset to present, method names of the full preset, note)``.

    The packaged preset of the same name, cut to the settings and methods that ran, when it
    expands into exactly the stored runs (same ids and configuration hashes); else the preset as run.
    """
    if run_preset.name not in available_presets():
        return run_preset, [m["name"] for m in run_preset.methods], None
    try:
        full = load_preset(run_preset.name)
        current = full.subset([s["name"] for s in run_preset.settings], [m["name"] for m in run_preset.methods])
    except PresetError:
        current = None
    same = current is not None and (
        {r.run_id: r.config_hash for r in current.runs(1)} == {r.run_id: r.config_hash for r in run_preset.runs(1)})
    if not same:
        source = Path(run_preset.source)
        packaged = source.name == f"{run_preset.name}.json" and source.parent.name == "presets"
        note = (f"The packaged preset `{run_preset.name}` has changed since these runs; this report shows the "
                "preset as it was run.") if packaged else None
        return run_preset, [m["name"] for m in run_preset.methods], note
    return Preset(data=current.data, source=run_preset.source), [m["name"] for m in full.methods], None


def _jsonl_lines(out: Path) -> list[tuple[str | None, str, dict[str, Any] | None]]:
    """``(run_id, line, row)`` of each non-blank line of ``results.jsonl``; ``run_id`` and ``row`` are
    ``None`` for a line that is not a JSON object with a ``run_id`` (kept as text, never parsed again)."""
    path = out / "results.jsonl"
    if not path.is_file():
        return []
    lines: list[tuple[str | None, str, dict[str, Any] | None]] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        ok = isinstance(row, dict) and isinstance(row.get("run_id"), str)
        lines.append((row["run_id"] if ok else None, line, row if ok else None))
    return lines


def _jsonl_runs(out: Path) -> dict[str, dict[str, Any]]:
    """Runs rebuilt from ``results.jsonl``: ``{run_id: {"rows", "config_hash"?}}`` (unreadable lines skipped)."""
    runs: dict[str, dict[str, Any]] = {}
    for run_id, _, row in _jsonl_lines(out):
        if row is None:
            continue
        row = dict(row)
        row.pop("run_id")
        run = runs.setdefault(run_id, {"rows": [], "config_hash": row.get("config_hash")})
        for k in ("method", "setting", "seed", "config_hash"):
            row.pop(k, None)
        run["rows"].append(row)
    return runs


def _unreadable(path: Path) -> bool:
    """Whether the run record at ``path`` exists but is not a JSON object (a damaged file)."""
    if not path.is_file():
        return False
    try:
        return not isinstance(read_json(path), dict)
    except (OSError, ValueError):
        return True


def _load_runs(preset: Preset, out: Path, n_seeds: int) -> tuple[dict[str, dict[str, Any]], int, list[str]]:
    """``({run_id: record}, number of runs taken from results.jsonl, run records that cannot be read)``
    of every stored run of ``preset``."""
    records: dict[str, dict[str, Any]] = {}
    lacking = []
    damaged = []
    for spec in preset.runs(n_seeds):
        rec = load_record(out, spec)
        if rec is None:
            lacking.append(spec)
            if _unreadable(record_path(out, spec)):
                damaged.append(spec.run_id)
        else:
            records[spec.run_id] = rec
    from_jsonl = 0
    if lacking:
        stored = _jsonl_runs(out)
        for spec in lacking:
            run = stored.get(spec.run_id)
            if run is None or (run["config_hash"] is not None and run["config_hash"] != spec.config_hash):
                continue
            records[spec.run_id] = {"status": "ok", "rows": run["rows"], "wall_s": None}
            from_jsonl += 1
    return records, from_jsonl, damaged


def _collect(preset: Preset, records: dict[str, dict[str, Any]], n_seeds: int) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    for spec in preset.runs(n_seeds):
        cell = cells.setdefault((spec.method, spec.setting), Cell(spec.method, spec.setting))
        rec = records.get(spec.run_id)
        if rec is None:
            continue
        if rec.get("status") == "ok":
            cell.seeds.append(spec.seed)
            cell.rows.append(rec["rows"])
            wall = rec.get("wall_s")
            if isinstance(wall, int | float) and math.isfinite(wall):
                cell.walls.append(float(wall))
        else:
            cell.failed.append(rec)
    return cells


# ---------------------------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------------------------
def _metric_value(cell: Cell, metric: dict[str, Any]) -> C.Stat:
    """The cell's value of ``metric``: ``value`` ``None`` = never reached, ``NaN`` = no data."""
    key = metric.get("key", "error")
    steps, mat = cell.matrix(key)
    if mat.size == 0:
        return C.Stat(math.nan)
    if metric["type"] == "steps_to_threshold":
        thr = float(metric["threshold"])
        value = M.steps_to_threshold(mat, thr, steps)
        se = M.bootstrap_se(mat, lambda m: M.steps_to_threshold(m, thr, steps))
        return C.Stat(value, se)
    if metric["type"] == "ratio":
        mean = M.seed_mean_curve(mat)
        ok = mean[np.isfinite(mean)]
        if ok.size == 0 or ok[0] == 0:
            return C.Stat(math.nan)
        return C.Stat(float(ok[-1] / ok[0]))
    if metric["type"] == "initial":
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
    if metric["type"] == "steps_to_threshold":
        return f"{v:.0f}"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _fmt_se(se: float, metric: dict[str, Any]) -> str:
    if not math.isfinite(se):
        return ""
    return f" ± {se:.0f}" if metric["type"] == "steps_to_threshold" or se >= 100 else f" ± {se:.2g}"


def _fmt_stat(stat: C.Stat, metric: dict[str, Any]) -> str:
    return _fmt(stat.value, metric) + ("" if stat.value is None else _fmt_se(stat.se, metric))


def _paper(preset: Preset, metric_id: str, method: str, setting: str) -> Any:
    return preset.data.get("paper", {}).get(metric_id, {}).get(method, {}).get(setting)


_metric_label = C.metric_label


# ---------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------
@dataclass
class Figure:
    """One written figure: file name, heading and caption for report.md."""

    name: str
    title: str
    caption: str


def _band(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, s.e., seeds with a value)`` per column of a curve matrix."""
    mean = M.seed_mean_curve(mat)
    n = np.sum(~np.isnan(mat), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        se = np.where(n > 1, np.nanstd(mat, axis=0, ddof=1) / np.sqrt(np.maximum(n, 1)), 0.0)
    return mean, np.nan_to_num(se), n


def _apply_scale(ax: Any, scale: Scale) -> None:
    if scale.kind == "log":
        from matplotlib.ticker import LogFormatterSciNotation

        ax.set_yscale("log")
        # label some minor ticks too when the axis spans only a decade or two (e.g. 2% .. 90% error)
        ax.yaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    elif scale.kind == "symlog":
        ax.set_yscale("symlog", linthresh=scale.linthresh, linscale=0.5)
        if scale.floor is not None:
            ax.set_ylim(bottom=0.0)


def _label_panel(ax: Any, title: str, ylabel: str, scale: Scale) -> None:
    """Title, axis labels and grid of a curve panel over steps. The y-scale's note ("symlog, linear below
    1e-04") goes under the x-axis, where it has the panel's width, not beside the y-axis, where a long label
    runs past the panel's height into its neighbours."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step" + (f"\ny: {scale.note}" if scale.note else ""), fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.grid(alpha=0.3)


def _draw(ax: Any, steps: np.ndarray, mat: np.ndarray, color: Any, scale: Scale, nonneg: bool,
          style: str = "-", label: str | None = None, lw: float = 1.4, method: str | None = None,
          upper: float | None = None) -> Any:
    """One seed-mean line with its ± s.e. band; ``method`` is kept as the line's gid (tests read it)."""
    mean, se, _ = _band(mat)
    (line,) = ax.plot(steps, mean, style, color=color, lw=lw, label=label, gid=method)
    low, high = mean - se, mean + se
    if nonneg:
        low = np.maximum(low, 0.0)
    if upper is not None:
        high = np.minimum(high, upper)
    if scale.kind == "log" and scale.floor is not None:
        low = np.maximum(low, scale.floor)
    ax.fill_between(steps, low, high, color=color, alpha=0.18, lw=0)
    return line


def _width(method: str, colors: dict[str, str]) -> float:
    """Earlier methods draw wider, so a line that a later one overlaps still shows at its edges."""
    order = list(colors)
    return 2.2 - 1.0 * order.index(method) / max(1, len(order) - 1)


def _new_figure(n_panels: int, width: float = 4.2, height: float = 3.2) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(4, n_panels)
    nrows = math.ceil(n_panels / ncols)
    if n_panels == 1:
        width = 6.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + 0.5), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _save(fig: Any, path: Path, handles: list[Any], labels: list[str], title: str) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=11)
    bottom = 0.0
    if handles:
        column = 0.75 + 0.07 * max(len(label) for label in labels)  # inches per legend column
        ncol = max(1, min(len(labels), int(fig.get_figwidth() // column)))
        rows = math.ceil(len(labels) / ncol)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
        bottom = (0.1 + 0.2 * rows) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _settings_with(preset: Preset, cells: dict[tuple[str, str], Cell], keys: tuple[str, ...]) -> list[str]:
    return [s["name"] for s in preset.settings
            if any(k in c.keys() for (_, st), c in cells.items() if st == s["name"] for k in keys)]


def _gaps(cells: dict[tuple[str, str], Cell], keys: tuple[str, ...]) -> list[str]:
    """Where every seed lacks ``keys`` while the run goes on (every group had zero variance).

    Only steps on the key's own logging grid count: a key logged every N steps (a held-out score)
    has no gaps between its evaluations."""
    out = []
    logged: set[float] = set()
    for cell in cells.values():
        for k in keys:
            if cell.rows and k in cell.keys():
                ksteps, mat = cell.matrix(k)
                if mat.size:
                    logged |= {s for s, col in zip(ksteps, (~np.isnan(mat)).any(axis=0), strict=True) if col}
    grid = sorted(logged)
    stride = min(b - a for a, b in zip(grid, grid[1:], strict=False)) if len(grid) > 1 else 1.0

    def expected(step: float) -> bool:
        return stride <= 1 or not grid or (step - grid[0]) % stride == 0

    for (method, setting), cell in cells.items():
        if not cell.rows or not any(k in cell.keys() for k in keys):
            continue
        steps, err = cell.matrix("zero_variance_fraction")
        if err.size == 0:
            continue
        blank = np.ones(len(steps), dtype=bool)
        for k in keys:
            ksteps, mat = cell.matrix(k)
            if mat.size == 0:
                continue
            have = {s for s, col in zip(ksteps, (~np.isnan(mat)).any(axis=0), strict=True) if col}
            blank &= np.array([s not in have and expected(s) for s in steps])
        zero_var = np.nanmin(err, axis=0) >= 1.0 - 1e-9
        both = blank & zero_var
        if both.any():
            first = int(steps[np.flatnonzero(both)[0]])
            out.append(f"{method} in {setting}: {int(both.sum())} of {len(steps)} steps, first at step {first}")
    return out


def _seeds_note(cells: dict[tuple[str, str], Cell], n_seeds: int) -> str:
    short = [f"{c.method} in {c.setting} ({len(c.rows)})" for c in cells.values() if 0 < len(c.rows) < n_seeds]
    base = f"Seed mean ± s.e. over {n_seeds} seeds"
    return base + (f" (fewer seeds: {', '.join(short)})" if short else "") + "."


def _fig_curves(preset: Preset, cells: dict[tuple[str, str], Cell], key: str, colors: dict[str, str],
                log: bool, path: Path, n_seeds: int) -> Figure | None:
    settings = _settings_with(preset, cells, (key,))
    if not settings:
        return None
    fig, axes = _new_figure(len(settings))
    handles: dict[str, Any] = {}
    notes = []
    for ax, setting in zip(axes, settings, strict=True):
        drawn = [(m, *cells[(m, setting)].matrix(key)) for m in colors
                 if (m, setting) in cells and cells[(m, setting)].rows]
        drawn = [(m, s, mat) for m, s, mat in drawn if mat.size]
        means = np.concatenate([M.seed_mean_curve(mat) for _, _, mat in drawn]) if drawn else np.array([])
        nonneg = bool(np.all(means[np.isfinite(means)] >= -1e-12)) if means.size else True
        scale = zero_safe_scale(means) if log else Scale("linear")
        for method, steps, mat in drawn:
            handles[method] = _draw(ax, steps, mat, colors[method], scale, nonneg, method=method,
                                    upper=1.0 if key.endswith("_fraction") else None, lw=_width(method, colors))
        _apply_scale(ax, scale)
        if scale.kind == "symlog":
            notes.append(f"{setting}: symlog, linear below {scale.linthresh:.0e}")
        _label_panel(ax, setting, key, scale)
    order = [m for m in colors if m in handles]
    _save(fig, path, [handles[m] for m in order], order, f"{key}: seed mean ± s.e.")
    caption = _seeds_note(cells, n_seeds)
    if log:
        caption += " Log y-axis."
        if notes:
            caption += (" Panels whose curves reach exactly 0 (or span more than "
                        f"{MAX_DECADES} decades) use a symlog axis, linear below the stated threshold, so zeros "
                        "are drawn at 0 instead of being cut off: " + "; ".join(notes) + ".")
    gaps = _gaps({k: c for k, c in cells.items() if k[1] in settings}, (key,))
    if gaps:
        caption += (" Lines break where every seed had only zero-variance groups (nothing to log): "
                    + "; ".join(gaps) + ".")
    return Figure(path.name, key.replace("_", " "), caption)


def _fig_loss(preset: Preset, cells: dict[tuple[str, str], Cell], colors: dict[str, str], path: Path,
              n_seeds: int) -> Figure | None:
    methods = [m for m in colors if any(c.method == m and "loss" in c.keys() for c in cells.values())]
    if not methods:
        return None
    fig, axes = _new_figure(len(methods))
    setting_names = [s["name"] for s in preset.settings]
    for ax, method in zip(axes, methods, strict=True):
        mine = [s for s in setting_names if (method, s) in cells and "loss" in cells[(method, s)].keys()]
        for i, setting in enumerate(mine):
            steps, mat = cells[(method, setting)].matrix("loss")
            shade = _shade(colors[method], i, len(mine))
            _draw(ax, steps, mat, shade, Scale("linear"), nonneg=False, label=setting if len(mine) > 1 else None,
                  method=f"{method} | {setting}")
        ax.set_title(method, fontsize=10, color=colors[method])
        ax.set_xlabel("step")
        ax.set_ylabel("loss (first epoch)", fontsize=9)
        ax.grid(alpha=0.3)
        if len(mine) > 1:
            ax.legend(fontsize=6, ncol=2)
        elif mine:
            ax.text(0.98, 0.95, mine[0], transform=ax.transAxes, ha="right", va="top", fontsize=7, color="0.4")
    _save(fig, path, [], [], "loss: one panel per method (the objectives differ)")
    caption = (_seeds_note(cells, n_seeds) + " One panel per method, each on its own y-axis: every method "
               "minimises a different objective (TPO: cross-entropy to its target q; GRPO and PPO: clipped "
               "surrogates; REINFORCE, DG: policy-gradient losses), so their values are not comparable. "
               "Darker shades of a method's colour are later settings of the preset.")
    algos = {m["name"]: m["algo"] for m in preset.methods}
    if any(m in algos and algorithm_spec(algos[m]).clipped_surrogate for m in methods):
        caption += (" At the first epoch the ratio to the rollout policy is 1, so a clipped surrogate equals minus "
                    "the mean advantage, about 0 with zero-mean advantages: GRPO's and PPO's first-epoch loss says "
                    "little about learning.")
    return Figure(path.name, "loss", caption)


def _shade(color: str, i: int, n: int) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(color))
    if n <= 1:
        return tuple(rgb)
    mix = 0.65 * (1 - i / (n - 1))  # first setting lightest, last the method's colour
    return tuple(rgb + (1 - rgb) * mix)


def _fig_weights(preset: Preset, cells: dict[tuple[str, str], Cell], colors: dict[str, str], path: Path,
                 n_seeds: int) -> Figure | None:
    keys = tuple(_WEIGHT_KEYS)
    settings = _settings_with(preset, cells, keys)
    if not settings:
        return None
    from matplotlib.lines import Line2D

    fig, axes = _new_figure(len(settings))
    used: dict[str, str] = {}
    for ax, setting in zip(axes, settings, strict=True):
        drawn = []
        for method in colors:
            cell = cells.get((method, setting))
            if cell is None or not cell.rows:
                continue
            for key, (what, side) in _WEIGHT_KEYS.items():
                steps, mat = cell.matrix(key)
                if mat.size:
                    drawn.append((method, what, side, steps, mat))
        means = np.concatenate([M.seed_mean_curve(mat) for *_, mat in drawn]) if drawn else np.array([])
        scale = zero_safe_scale(means)
        for method, what, side, steps, mat in drawn:
            _draw(ax, steps, mat, colors[method], scale, nonneg=True, style="-" if side == "winners" else "--",
                  method=method)
            used[method] = what
        _apply_scale(ax, scale)
        _label_panel(ax, setting, "weight per candidate", scale)
    order = [m for m in colors if m in used]
    handles = [Line2D([], [], color=colors[m], lw=1.6) for m in order]
    labels = [f"{m}: mean {used[m]}" for m in order]
    handles += [Line2D([], [], color="0.3", lw=1.4), Line2D([], [], color="0.3", lw=1.4, ls="--")]
    labels += ["winners (u > 0)", "losers (u < 0)"]
    _save(fig, path, handles, labels, "weight on winners vs losers: seed mean ± s.e.")
    caption = (_seeds_note(cells, n_seeds) + " Solid: candidates that beat their group's mean score (u > 0); "
               "dashed: candidates below it. The weight is the mean target probability q_i for TPO-style "
               "methods and the mean |A_i| for GRPO (docs/method.md section 5); log y-axis, symlog where the "
               "panel reaches 0.")
    gaps = _gaps({k: c for k, c in cells.items() if k[1] in settings}, keys)
    if gaps:
        caption += (" Lines break where every group of every seed had zero variance, so there was no winner "
                    "or loser to weigh: " + "; ".join(gaps) + ".")
    return Figure(path.name, "winners vs losers", caption)


def _fig_seed_steps(preset: Preset, cells: dict[tuple[str, str], Cell], metric: dict[str, Any],
                    colors: dict[str, str], path: Path) -> Figure | None:
    """Per-seed steps to the threshold, one dot per seed, beside the seed-mean crossing (a black bar)."""
    key, thr = metric.get("key", "error"), float(metric["threshold"])
    settings = _settings_with(preset, cells, (key,))
    if not settings:
        return None
    fig, axes = _new_figure(len(settings))
    rng = np.random.default_rng(0)
    handles: dict[str, Any] = {}
    never_any = False
    for ax, setting in zip(axes, settings, strict=True):
        methods = [m for m in colors if (m, setting) in cells and cells[(m, setting)].rows]
        top = 1.0
        per: dict[str, tuple[np.ndarray, float | None, float]] = {}
        for m in methods:
            steps, mat = cells[(m, setting)].matrix(key)
            if not mat.size:
                continue
            per[m] = (M.per_seed_steps_to_threshold(mat, thr, steps), M.steps_to_threshold(mat, thr, steps),
                      float(np.max(steps)))
            top = max(top, per[m][2])
        never_y = top * 1.15
        panel_never = False
        for x, m in enumerate(per):
            values, crossing, _ = per[m]
            jitter = rng.uniform(-0.18, 0.18, values.size)
            reached = np.isfinite(values)
            handles[m] = ax.scatter(x + jitter[reached], values[reached], s=18, color=colors[m], alpha=0.8, gid=m)
            if (~reached).any():
                never_any = panel_never = True
                ax.scatter(x + jitter[~reached], np.full((~reached).sum(), never_y), s=22, facecolors="none",
                           edgecolors=colors[m], gid=m)
            if crossing is not None:
                ax.hlines(crossing, x - 0.32, x + 0.32, color="black", lw=1.6)
        ax.set_xticks(range(len(per)), list(per), fontsize=8, rotation=20)
        finite = [v for vals, _, _ in per.values() for v in vals[np.isfinite(vals)] if v > 0]
        if finite and max(finite) / max(min(finite), 1e-9) > 20:
            ax.set_yscale("log")
        ax.set_xlim(-0.6, len(per) - 0.4)
        if panel_never:
            ax.axhline(never_y, color="grey", lw=0.6, ls=":")
            ax.text(-0.55, never_y, "never", ha="left", va="bottom", fontsize=7, color="grey")
        ax.set_title(setting, fontsize=10)
        ax.set_ylabel(f"steps to {key} < {thr:g}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    order = [m for m in colors if m in handles]
    _save(fig, path, [handles[m] for m in order], order, f"per-seed steps to {key} < {thr:g}")
    caption = (f"One dot per seed: the first step at which that seed's own {key} is below {thr:g}; the black bar "
               "is the step at which the seed-mean curve first is (the table's value). Plateau lengths are "
               "heavy-tailed: a few slow seeds can put the seed-mean crossing far above the typical seed.")
    if never_any:
        caption += " Open circles on the dotted line: seeds that never got there within the run."
    return Figure(path.name, f"per-seed steps to {key} < {thr:g}", caption)


def _seed_steps_table(preset: Preset, cells: dict[tuple[str, str], Cell]) -> list[str]:
    """Median and quartiles of the per-seed steps to each threshold, and how many seeds never got there."""
    md: list[str] = []
    for metric in preset.metrics:
        if metric["type"] != "steps_to_threshold":
            continue
        key, thr = metric.get("key", "error"), float(metric["threshold"])
        settings = [s["name"] for s in preset.settings]
        label = C.metric_label(metric)
        md += [f"### Per seed: {label[0].lower() + label[1:]}\n", "| Method | " + " | ".join(settings) + " |",
               "|---|" + "---|" * len(settings)]
        for method in [m["name"] for m in preset.methods]:
            texts = []
            for setting in settings:
                cell = cells.get((method, setting))
                steps, mat = cell.matrix(key) if cell is not None and cell.rows else (None, np.empty(0))
                if not mat.size:
                    texts.append("n/a")
                    continue
                values = M.per_seed_steps_to_threshold(mat, thr, steps)
                never = int(np.sum(~np.isfinite(values)))
                # quartiles with "never" as +inf: a quartile that lands on a never-seed reads "never"
                q1, med, q3 = (float(np.quantile(values, q, method="lower")) for q in (0.25, 0.5, 0.75))
                fmt = lambda v: "never" if not math.isfinite(v) else f"{v:.0f}"  # noqa: E731
                texts.append(f"{fmt(med)} [{fmt(q1)}–{fmt(q3)}]"
                             + (f", never {never}/{values.size}" if never else ""))
            md.append(f"| {method} | " + " | ".join(texts) + " |")
        md += ["", "Cells: **median [lower quartile – upper quartile]** of the per-seed steps (each seed's own first "
               "step below the threshold), and the seeds that never got there.\n"]
    return md


def _complementary(cells: dict[tuple[str, str], Cell], a: str, b: str) -> bool:
    """Whether ``a == 1 - b`` wherever both are logged (then plotting ``a`` only repeats ``b``)."""
    seen = False
    for cell in cells.values():
        for rows in cell.rows:
            for r in rows:
                if a in r and b in r and r[a] is not None and r[b] is not None:
                    x, y = float(r[a]), float(r[b])
                    if math.isfinite(x) and math.isfinite(y):
                        seen = True
                        if abs(x + y - 1.0) > 1e-6:
                            return False
    return seen


def _figures(preset: Preset, cells: dict[tuple[str, str], Cell], out: Path, n_seeds: int) -> list[Figure]:
    colors = method_colors([m["name"] for m in preset.methods])
    present = set().union(*(c.keys() for c in cells.values())) if cells else set()
    log = bool(preset.data.get("log_y", False))
    wanted = list(preset.data.get("curves", ["error"]))
    wanted += [k for k in _diagnostic_keys() if k in present and k not in wanted]
    skip_any = _complementary(cells, "any_success_fraction", "all_fail_fraction")
    figures: list[Figure] = []
    done: set[str] = set()
    for key in wanted:
        name = "weights" if key in _WEIGHT_KEYS else key
        if name in done or (name != "weights" and key not in present):
            continue
        done.add(name)
        path = out / f"curves_{name}.png"
        if name == "weights":
            fig = _fig_weights(preset, cells, colors, path, n_seeds)
        elif key == "loss":
            fig = _fig_loss(preset, cells, colors, path, n_seeds)
        elif key == "any_success_fraction" and skip_any:
            continue
        else:
            fraction = key.endswith("_fraction")
            fig = _fig_curves(preset, cells, key, colors, (log and key in _ERROR_KEYS) or key == "grad_norm",
                              path, n_seeds)
            if fig is not None and key == "grad_norm":
                fig.caption = ("L2 norm of the gradient of the first epoch of each step. " + fig.caption)
            if fig is not None and key == "all_fail_fraction" and skip_any:
                fig.caption += (" The fraction of groups with at least one success is 1 − this fraction in "
                                "this run (every score is 0 or 1), so it is not drawn separately.")
            if fig is not None and fraction:
                fig.caption = f"Fraction of groups per step. {fig.caption}"
        if fig is not None:
            figures.append(fig)
    for metric in preset.metrics:
        if metric["type"] == "steps_to_threshold":
            fig = _fig_seed_steps(preset, cells, metric, colors, out / f"seeds_{metric['id']}.png")
            if fig is not None:
                figures.append(fig)
    return figures


# ---------------------------------------------------------------------------------------------
# report.md sections
# ---------------------------------------------------------------------------------------------
_STEP_TERMS = {
    "tabular_single": "single-context bandit: one normalised update of the logit table from B sampled actions",
    "tabular_multi": "multi-context bandit: one exact (population) update of all N x K logits, normalised",
    "token": ("token task: one iteration, an *episode* in the paper: B prompts rolled out with the current policy "
              "(B·K complete rollouts for sequence-level methods, and for single-sample methods under the "
              "interaction budget), then E full-batch optimiser steps on them"),
    "mnist": ("MNIST: one batch of B training images, one sampled class each, and the method's update on it; "
              "test error is measured every `eval_every` steps"),
    "llm": ("language model: one iteration: B prompts, K sampled completions each scored by the dataset's own "
            "scorer, then E optimiser steps over micro-batches of whole groups; step 0 is the base model"),
}
_ERROR_TERMS = {
    "tabular_single": "single-context bandit: 1 − π(y*), the probability not on the correct arm",
    "tabular_multi": "multi-context bandit: 1 − mean over contexts of π_n(y_n)",
    "token": ("token task: 1 − mean reward of the training rollouts (sampled, not greedy): per-token error with "
              "bag-of-tokens reward, credit up to the first mistake with sequential reward, exact-match error with "
              "terminal reward"),
    "mnist": ("MNIST: `test_error` is the greedy (argmax) error on the 10,000 test images; `error` the training "
              "error averaged over the last `eval_every` steps"),
    "llm": ("language model: `mean_score` is the train mean score of the step's B x K sampled completions "
            "(`error` = 1 − it); `test_score` the mean score of greedy completions of the first `eval_size` "
            "held-out questions (the same dataset with another seed), every `eval_every` steps; `test_accuracy` "
            "the fraction of those scored 1"),
}


def _terms(preset: Preset, present: set[str]) -> list[str]:
    kinds = list(dict.fromkeys(s["kind"] for s in preset.settings))
    md = ["## Terms\n"]
    md.append("- **step** — " + "; ".join(_STEP_TERMS.get(k, k) for k in kinds) + ".")
    md.append("- **error** — " + "; ".join(_ERROR_TERMS.get(k, k) for k in kinds) + ".")
    if "misalignment" in present:
        md.append("- **misalignment** — 1 − cos(g, g*) between the update direction g a method takes and the "
                  "oracle direction g*: π(y*)(e_y* − π) on the single-context bandit, the cross-entropy (CE) "
                  "direction on the multi-context bandit. 0 = the oracle's direction, 1 = orthogonal to it.")
    if any(m["type"] == "steps_to_threshold" for m in preset.metrics):
        md.append("- **steps to X** — the first (0-indexed) step at which the seed-mean curve is below X; "
                  "`never` = not within the budget. Its ± is a bootstrap s.e. (200 resamples of the seeds).")
    md.append("- **±** — standard error over seeds, std (ddof = 1) / sqrt(n). **⚠** — outside 2 s.e. of the "
              "paper's value; the paper's `-` means never reached (steps) or above the stated bound (error). "
              "**n/a** — the setting does not run this method, or no run finished.")
    for key, text in reported_diagnostics().items():  # the glossary entries the agent classes declare
        if text and key in present:
            md.append(f"- {text}.")
    md.append("- Method definitions, tasks and the paper's numbers: docs/method.md of the tpo-gym repository "
              "(sections 1-6).")
    md.append("")
    return md


def _results(preset: Preset, cells: dict[tuple[str, str], Cell], values: dict[tuple[str, str, str], C.Stat],
             n_seeds: int) -> list[str]:
    md = ["## Results\n"]
    titled = bool(preset.data.get("tables"))
    compared = flagged = 0
    for table in preset.tables():
        settings = table.get("settings") or [s["name"] for s in preset.settings]
        methods = table.get("methods") or [m["name"] for m in preset.methods]
        for metric in preset.metrics:
            label = _metric_label(metric)
            md.append(f"### {table['title']}: {label[0].lower() + label[1:]}\n" if titled else f"### {label}\n")
            md.append("| Method | " + " | ".join(settings) + " |")
            md.append("|---|" + "---|" * len(settings))
            for method in methods:
                texts = []
                for setting in settings:
                    cell = cells.get((method, setting))
                    if cell is None:
                        texts.append("n/a")
                        continue
                    stat = values[(metric["id"], method, setting)]
                    txt = _fmt_stat(stat, metric)
                    paper = _paper(preset, metric["id"], method, setting)
                    if paper is not None:
                        txt += f" ({paper})"
                        if stat.has_data:
                            compared += 1
                            if M.paper_agrees(stat.value, stat.se, paper, metric.get("paper_dash", "never")) is False:
                                txt += f" {_FLAG}"
                                flagged += 1
                    if cell.failed:
                        txt += f" [{len(cell.failed)} failed]"
                    if not cell.rows and not cell.failed:
                        txt = "not run yet"
                    elif len(cell.rows) < n_seeds:
                        txt += f" [n={len(cell.rows)}]"
                    texts.append(txt)
                md.append(f"| {method} | " + " | ".join(texts) + " |")
            md.append("")
    md.append("Cells: **ours ± s.e. (paper)**." if compared else "Cells: **ours ± s.e.**")
    if compared:
        md.append(f"{flagged} of {compared} cells with a published number differ from it by more than 2 s.e. "
                  f"({_FLAG}).\n")
    else:
        md.append("Nothing was compared with the paper: no cell of this run has a published number.\n")
    return md


def _direction_text(preset: Preset) -> str:
    higher = [C.metric_label(m) for m in preset.metrics if C.higher_is_better(m)]
    if not higher:
        return "lower is better for every metric"
    if len(higher) == len(preset.metrics):
        return "higher is better for every metric"
    return "higher is better for " + ", ".join(f"*{h[0].lower() + h[1:]}*" for h in higher) + ", lower for the rest"


def _claims(preset: Preset, full_methods: list[str], cells: dict[tuple[str, str], Cell],
            values: dict[tuple[str, str, str], C.Stat]) -> list[str]:
    claims = preset.data.get("paper_claims", [])
    omitted = int(preset.data.get("omitted_claims", 0))
    if not claims and not omitted:
        return []
    run_methods = [m["name"] for m in preset.methods]
    ran = {s["name"]: [m["name"] for m in preset.setting_methods(s)] for s in preset.settings}
    extra: dict[tuple[str, str, str], C.Stat] = {}

    def lookup(metric: dict[str, Any], method: str, setting: str) -> C.Stat | None:
        cell = cells.get((method, setting))
        if cell is None:
            return None
        key = (metric["id"], method, setting)
        if key in values and any(m["id"] == metric["id"] for m in preset.metrics):
            return values[key]
        if key not in extra:
            extra[key] = _metric_value(cell, metric)
        return extra[key]

    md = ["## Claims\n", "The paper's claims for this experiment, checked against this run's numbers "
          f"({_direction_text(preset)}; `never` ranks last).\n"]
    skipped = omitted
    by_setup: dict[str, dict[str, str]] = {}  # unexpanded claim -> {setup: verdict}
    for claim in claims:
        text = claim if isinstance(claim, str) else claim["text"]
        others = set(full_methods) - set(run_methods)
        if (C.claim_methods(claim) - set(run_methods)) or C.mentioned_methods(text, sorted(others)):
            skipped += 1
            continue
        verdict = C.evaluate_claim(claim, preset.metrics, ran, lookup, _fmt_stat,
                                   lambda mid, m, s: _paper(preset, mid, m, s))
        md.append(f"- **{verdict.status}** — {text}")
        md.extend(f"  - {line}" for line in verdict.evidence)
        if isinstance(claim, dict) and "setup" in claim:
            by_setup.setdefault(claim["claim"], {})[claim["setup"]] = verdict.status
    if skipped:
        md.append(f"\n{skipped} more claim(s) of the full preset concern methods or settings this run did not "
                  "include.")
    md.append("")
    setups = [u for u in preset.setups if any(u in v for v in by_setup.values())]
    if len(setups) > 1:
        md += ["### Claims under each setup\n",
               "Whether each claim holds under the reference code's setup and under ours (docs/method.md "
               "section 4b): a claim that holds under one only depends on the setup.\n",
               "| Claim | " + " | ".join(setups) + " |", "|---" * (len(setups) + 1) + "|"]
        md += [f"| {text} | " + " | ".join(v.get(u, "n/a") for u in setups) + " |" for text, v in by_setup.items()]
        md.append("")
    return md


def _setting_groups(methods: list[str], covered: dict[str, list[str]]) -> list[tuple[list[str], list[str]]]:
    """``[(settings, methods compared over exactly those settings)]`` for the IQM aggregate.

    Candidates: the settings every method ran, and each method's own settings; a group compares every
    method that ran all of its settings. Groups comparing a single method are dropped unless nothing
    else is left; the widest groups come first.
    """
    sets = []
    common = [s for s in next(iter(covered.values()), []) if all(s in covered[m] for m in covered)]
    for cand in [common, *covered.values()]:
        if cand and cand not in sets:
            sets.append(cand)
    groups = [(s, [m for m in methods if m in covered and all(x in covered[m] for x in s)]) for s in sets]
    multi = [g for g in groups if len(g[1]) > 1]
    groups = multi or groups[:1]
    return sorted(groups, key=lambda g: (-len(g[0]), -len(g[1])))


def _aggregate(preset: Preset, cells: dict[tuple[str, str], Cell]) -> list[str]:
    metrics = [m for m in preset.metrics if m["type"] == "final"] or [
        {"id": "final_error", "type": "final", "key": preset.data.get("curves", ["error"])[0]}]
    methods = [m["name"] for m in preset.methods]
    setting_order = [s["name"] for s in preset.settings]
    md = ["## Aggregate (IQM)\n",
          "Interquartile mean of the per-seed final values with a 95% stratified-bootstrap interval (2000 "
          "replicates resampling seeds within each setting). As rliable recommends, each column pools the same "
          "settings for every method it compares; a method that did not run all of a column's settings reads "
          "n/a there.\n"]
    for metric in metrics:
        key = metric.get("key", "error")
        scores: dict[str, dict[str, np.ndarray]] = {}
        for (method, setting), cell in cells.items():
            if cell.rows:
                _, mat = cell.matrix(key)
                if mat.size:
                    scores.setdefault(method, {})[setting] = (M.final_value(mat, int(metric.get("window", 1)))
                                                              * float(metric.get("scale", 1.0)))
        covered = {m: [s for s in setting_order if s in scores[m]] for m in methods if m in scores}
        if not covered:
            continue
        groups = _setting_groups(methods, covered)
        heads = []
        for settings, _ in groups:
            heads.append(f"over {settings[0]}" if len(settings) == 1 else
                         f"over {len(settings)} settings" + ("" if len(settings) == len(setting_order) else
                                                             f" ({', '.join(settings)})"))
        md.append(f"### IQM {_metric_label(metric)[0].lower() + _metric_label(metric)[1:]}\n")
        md.append("| Method | " + " | ".join(heads) + " |")
        md.append("|---|" + "---|" * len(groups))
        for method in methods:
            if method not in covered:
                continue
            texts = []
            for settings, members in groups:
                if method not in members:
                    texts.append("n/a")
                    continue
                point, lo, hi = M.stratified_bootstrap_ci({s: scores[method][s] for s in settings})
                texts.append(f"{point:.3g} [{lo:.3g}, {hi:.3g}]")
            md.append(f"| {method} | " + " | ".join(texts) + " |")
        md.append("")
    return md


def _diagnostics(preset: Preset, cells: dict[tuple[str, str], Cell], present: set[str]) -> list[str]:
    diag = [k for k in _diagnostic_keys() if k in present]
    if not diag:
        return []
    groups: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for setting in preset.settings:
        for method in preset.setting_methods(setting):
            cell = cells[(method["name"], setting["name"])]
            if cell.rows:
                keys = tuple(k for k in diag if k in cell.keys())
                if keys:
                    groups.setdefault(keys, []).append((method["name"], setting["name"]))
    md = ["## Diagnostics\n", "Seed mean at the first logged step → the last; one table per set of logged "
          "diagnostics, n/a where a method does not log one.\n"]
    for keys, members in groups.items():
        columns = [k for k in diag if k in keys or any(k in cells[m].keys() for m in members)]
        md.append("| Method | Setting | " + " | ".join(f"`{k}`" for k in columns) + " |")
        md.append("|---|---|" + "---|" * len(columns))
        for method, setting in members:
            parts = []
            for key in columns:
                _, mat = cells[(method, setting)].matrix(key)
                mean = M.seed_mean_curve(mat) if mat.size else np.array([])
                ok = mean[~np.isnan(mean)] if mean.size else mean
                parts.append(f"{ok[0]:.3g} → {ok[-1]:.3g}" if ok.size else "n/a")
            md.append(f"| {method} | {setting} | " + " | ".join(parts) + " |")
        md.append("")
    return md


def _setup(preset: Preset, manifest: dict[str, Any], cells: dict[tuple[str, str], Cell], n_seeds: int,
           from_jsonl: int) -> list[str]:
    invocations = manifest.get("invocations", [])
    bench_env = invocations[-1] if invocations else {}
    md = ["## Setup\n", "| | |", "|---|---|"]
    for name, ver in (bench_env.get("versions") or package_versions()).items():
        md.append(f"| {name} | {ver} |")
    commits = sorted({i["git_commit"] for i in invocations if i.get("git_commit")})
    md.append(f"| git commit (runs) | {', '.join(f'`{c}`' for c in commits) or 'unknown'} |")
    md.append(f"| git commit (report) | `{git_commit()}` |")
    md.append(f"| command | `{manifest.get('command', '')}` |")
    md.append(f"| seeds | {n_seeds} (0..{n_seeds - 1}) |")
    md.append(f"| backend / workers | {manifest.get('backend')} / {manifest.get('workers')} |")
    if invocations:
        last = invocations[-1]
        md.append(f"| wall time (last invocation) | {last['wall_s']:.1f} s ({last['executed']} runs executed, "
                  f"{last['skipped']} resumed, {last['failed']} failed) |")
        md.append(f"| wall time (all invocations) | {sum(i['wall_s'] for i in invocations):.1f} s |")
    walls = [w for c in cells.values() for w in c.walls]
    n_ok = sum(len(c.rows) for c in cells.values())
    if walls:
        md.append(f"| compute time (sum over runs) | {sum(walls):.1f} s"
                  + (f" ({n_ok - len(walls)} runs without a stored time)" if len(walls) < n_ok else "") + " |")
    elif n_ok:
        md.append("| compute time (sum over runs) | not stored |")
    if from_jsonl:
        md.append(f"| run source | {from_jsonl} runs rebuilt from `results.jsonl` (no per-run record in `runs/`) |")
    md.append("")
    return md


def _read_manifest(out: Path) -> tuple[Path, dict[str, Any]]:
    """``out``'s manifest path and its content, the preset in it validated.

    :raises FileNotFoundError: ``out`` has no ``manifest.json``.
    :raises PresetError: the manifest's preset does not validate.
    """
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{out} has no manifest.json: run `tpo-gym bench --out {out}` first")
    try:
        manifest = read_json(manifest_path)
    except ValueError as exc:
        raise BadManifest(f"{manifest_path} is not valid JSON ({exc}); move it away and rerun `tpo-gym bench` "
                          "with the same --out to write a new one (the stored runs are kept)") from None
    _check_manifest(manifest, str(manifest_path))
    return manifest_path, manifest


def _check_manifest(manifest: Any, where: str) -> None:
    """:class:`BadManifest` unless ``manifest`` (or one entry of its ``other_presets``, ``where`` naming it)
    holds a valid preset and a seed count it can expand (at most
    :data:`~tpo_gym.evaluation.presets.MAX_RUNS` runs)."""
    seeds = manifest.get("seeds") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("preset"), dict) \
            or isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise BadManifest(f"{where} is not a manifest written by tpo-gym bench: it needs a JSON object "
                          "with a 'preset' object and 'seeds' (an integer >= 1)")
    try:
        validate_preset(manifest["preset"], source=where)
        if isinstance(manifest.get("whole_preset"), dict):
            validate_preset(manifest["whole_preset"], source=f"{where} (whole_preset)")
        Preset(data=manifest["preset"], source=where).run_count(seeds)
    except PresetError as exc:
        raise BadManifest(str(exc)) from None


def _packaged(name: str, source: str) -> bool:
    """Whether a preset named ``name`` loaded from ``source`` is the packaged preset of that name (a preset
    file may carry a packaged preset's name)."""
    path = Path(source)
    return name in available_presets() and path.name == f"{name}.json" and path.parent.name == "presets"


def select_report(out: str | Path, settings: list[str] | None = None, methods: list[str] | None = None,
                  setups: list[str] | None = None, seeds: int | None = None,
                  preset: str | None = None) -> dict[str, Any]:
    """The manifest of ``out`` pointed at another selection of its preset's runs; nothing runs, nothing is
    written (pass the result to :func:`build_report`, which writes it once the report is built).

    The report then covers these settings, methods, setups and seeds ``0 .. seeds-1``; each ``None``:
    as the manifest has it now. Names are chosen from the whole preset the runs came from (the packaged
    preset of that name, or the preset file as a bench run read it), so a selection can widen again.
    Runs of the selection that are not stored show as not run yet. Several ``tpo-gym bench``
    invocations that filled one directory piece by piece (a method at a time, say) are reported
    together this way.

    ``preset``: report another preset whose runs ``out`` stores (a bench with ``replace_preset`` made
    another preset's the report there): the selection and seeds it had there when replaced, else the
    named preset or preset file as a whole with its default seeds.

    :raises FileNotFoundError: ``out`` has no ``manifest.json``.
    :raises BadManifest: the manifest cannot be read.
    :raises PresetError: a name outside the preset (with close matches), an empty list, seeds < 1, or an
        unknown ``preset``.
    """
    manifest_path, manifest = _read_manifest(Path(out))
    if preset is not None and preset != manifest["preset"]["name"]:
        manifest = _other_preset(manifest, preset, manifest_path)
    source = manifest.get("preset_source", str(manifest_path))
    current = Preset(data=manifest["preset"], source=source)
    if _packaged(current.name, source):
        whole = load_preset(current.name)
    elif isinstance(manifest.get("whole_preset"), dict):
        whole = Preset(data=manifest["whole_preset"], source=source)
    else:  # a manifest of an older tpo-gym: only the preset as run
        whole = current
    for flag, names in (("settings", settings), ("methods", methods), ("setups", setups)):
        if names is not None and not names:
            raise PresetError(f"--{flag}: an empty list selects nothing; leave it out to keep the manifest's")
    if settings is None:
        settings = list(dict.fromkeys(x.get("base", x["name"]) for x in current.settings))
    if methods is None:
        methods = [m["name"] for m in current.methods]
    if setups is None and whole.setups:
        setups = current.setups or None
    chosen = whole.subset(settings, methods, setups)
    if seeds is not None:
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise PresetError(f"seeds must be an integer >= 1, got {seeds!r}")
        manifest["seeds"] = seeds
    return dict(manifest, preset=chosen.data, whole_preset=chosen.whole_data, preset_source=chosen.source)


def _other_preset(manifest: dict[str, Any], name: str, manifest_path: Path) -> dict[str, Any]:
    """``manifest`` switched to preset ``name``: as kept under its ``other_presets``, else loaded (a
    packaged name or a preset file) with its default seeds."""
    kept = manifest.get("other_presets")
    kept = kept if isinstance(kept, dict) else {}
    chosen = None if name in kept else load_preset(name)
    if chosen is not None and chosen.name in kept:
        name, chosen = chosen.name, None
    if chosen is None:
        _check_manifest(kept[name], f"{manifest_path} (other_presets.{name})")
        return switch_preset(manifest, name)
    return dict(switch_preset(manifest, chosen.name), preset=chosen.data, whole_preset=chosen.whole_data,
                preset_source=chosen.source, seeds=chosen.seeds)


def build_report(out: str | Path, manifest: dict[str, Any] | None = None) -> dict[str, Path]:
    """Rebuild every report file of ``out`` from its manifest and stored runs.

    ``manifest``: another selection of the runs (from :func:`select_report`), written to
    ``manifest.json`` only once the report is built. ``results.jsonl`` holds the rows of the report's
    runs and keeps those of every other run it held (for a directory without ``runs/*.json``, such as a
    committed report, it is the only copy).

    :return: ``{name: path}`` of the files written.
    :raises FileNotFoundError: ``out`` has no ``manifest.json`` (nothing was benchmarked there).
    :raises BadManifest: the manifest cannot be read.
    :raises NoStoredRuns: ``out`` has a report but none of its selected runs is stored (nothing to rebuild
        it from; every file is left as it is).
    """
    out = Path(out)
    manifest_path, stored_manifest = _read_manifest(out)
    selected = manifest is not None
    manifest = stored_manifest if manifest is None else manifest
    run_preset = Preset(data=manifest["preset"], source=manifest.get("preset_source", str(manifest_path)))
    preset, full_methods, drift = _presentation(run_preset)
    n_seeds = int(manifest["seeds"])
    records, from_jsonl, damaged = _load_runs(preset, out, n_seeds)
    if not records and (out / "report.md").is_file():
        what = "the selected runs" if selected else "its preset"
        raise NoStoredRuns(f"{out} holds no stored run (runs/*.json or results.jsonl) of {what}: nothing to "
                           "rebuild the report from; it is left as it is")
    cells = _collect(preset, records, n_seeds)
    written: dict[str, Path] = {}

    lines = []
    reported = set()
    for spec in preset.runs(n_seeds):
        rec = records.get(spec.run_id)
        if rec is None or rec.get("status") != "ok":
            continue
        reported.add(spec.run_id)
        for row in rec["rows"]:
            lines.append(json.dumps({"run_id": spec.run_id, "method": spec.method, "setting": spec.setting,
                                     "seed": spec.seed, "config_hash": spec.config_hash, **row}))
    lines += [line for run_id, line, _ in _jsonl_lines(out) if run_id not in reported]  # other runs' rows stay
    written["results.jsonl"] = atomic_write_text(out / "results.jsonl", "\n".join(lines) + ("\n" if lines else ""))

    figures = _figures(preset, cells, out, n_seeds)
    for fig in figures:
        written[fig.name] = out / fig.name
    for stale in [*out.glob("curves_*.png"), *out.glob("seeds_*.png")]:  # figures of an earlier layout
        if stale.name not in written:
            stale.unlink()

    values: dict[tuple[str, str, str], C.Stat] = {}
    for (method, setting), cell in cells.items():
        for metric in preset.metrics:
            values[(metric["id"], method, setting)] = _metric_value(cell, metric)

    buf = io.StringIO()
    writer = csv.writer(buf)
    header = ["preset", "method", "setting", "n_ok", "n_failed"]
    for metric in preset.metrics:
        header += [metric["id"], f"{metric['id']}_se", f"{metric['id']}_paper", f"{metric['id']}_within_2se"]
    writer.writerow(header)
    for setting in preset.settings:
        for method in preset.setting_methods(setting):
            cell = cells[(method["name"], setting["name"])]
            row: list[Any] = [preset.name, method["name"], setting["name"], len(cell.rows), len(cell.failed)]
            for metric in preset.metrics:
                stat = values[(metric["id"], method["name"], setting["name"])]
                paper = _paper(preset, metric["id"], method["name"], setting["name"])
                agree = M.paper_agrees(stat.value, stat.se, paper, metric.get("paper_dash", "never")) \
                    if stat.has_data else None
                row += ["never" if stat.value is None else stat.value, stat.se, "" if paper is None else paper,
                        "" if agree is None else agree]
            writer.writerow(row)
    written["summary.csv"] = atomic_write_text(out / "summary.csv", buf.getvalue())

    present = set().union(*(c.keys() for c in cells.values())) if cells else set()
    md = [f"# {preset.name}: benchmark report\n",
          f"{preset.data['description']}  \nPaper: {preset.data['paper_ref']}\n"]
    if drift:
        md.append(drift + "\n")
    md += _setup(preset, manifest, cells, n_seeds, from_jsonl)
    md += _terms(preset, present)
    md += _results(preset, cells, values, n_seeds)
    md += _seed_steps_table(preset, cells)
    md += _claims(preset, full_methods, cells, values)
    notes = preset.data.get("notes", [])
    if notes:
        md += ["## Notes\n", *[f"- {n}" for n in notes], ""]
    md += _aggregate(preset, cells)
    md += _diagnostics(preset, cells, present)
    if figures:
        md.append("## Figures\n")
        for fig in figures:
            md += [f"### {fig.title[0].upper() + fig.title[1:]}\n", f"![{fig.title}]({fig.name})\n",
                   f"*{fig.caption}*\n"]
    failures = [rec for cell in cells.values() for rec in cell.failed]
    missing = sum(n_seeds - len(c.rows) - len(c.failed) for c in cells.values())
    if failures or missing or damaged:
        md.append("## Failed and missing runs\n")
        md.append(f"{len(failures)} failed, {missing} not run yet (`tpo-gym bench` with this preset, selection, "
                  "seeds and --out runs them; finished runs are kept).\n")
        for rec in failures:
            tb = (rec.get("traceback") or "").strip().splitlines()
            md.append(f"- `{rec.get('run_id')}`: `{tb[-1] if tb else 'unknown error'}`")
        if damaged:
            md.append(f"- {len(damaged)} run record(s) under runs/ cannot be read (not a JSON object; shown from "
                      "results.jsonl where it has them, else as not run yet; a bench rerun redoes them): "
                      + ", ".join(f"`{r}`" for r in damaged))
        md.append("")
    written["report.md"] = atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    if selected:
        atomic_write_json(manifest_path, manifest)
        written["manifest.json"] = manifest_path
    return written
