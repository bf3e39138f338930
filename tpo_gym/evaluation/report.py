"""Build the benchmark report of an output directory from its stored run records.

``build_report(OUT)`` reads ``OUT/manifest.json`` and ``OUT/runs/*.json`` (see
:mod:`tpo_gym.evaluation.runner`) and writes, atomically:

* ``report.md`` -- header (versions, git commit, command, seeds, wall time), one table per preset
  table and metric laid out as in the paper (rows methods, columns settings) with our value ± s.e.
  beside the paper's and a flag where they differ by more than 2 s.e., an IQM table with stratified
  bootstrap 95% intervals, the agents' diagnostics, and failed runs with their traceback;
* ``curves_<key>.png`` -- learning curves (seed-mean ± s.e. shading), one panel per setting;
* ``results.jsonl`` -- one row per run per logged step;
* ``summary.csv`` -- one row per method x setting with every metric and the paper's value.
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

from tpo_gym.evaluation import metrics as M
from tpo_gym.evaluation._io import atomic_write_bytes, atomic_write_text, read_json
from tpo_gym.evaluation._provenance import git_commit, package_versions
from tpo_gym.evaluation.presets import Preset, validate_preset
from tpo_gym.evaluation.runner import load_record

__all__ = ["DIAGNOSTIC_KEYS", "build_report"]

#: Diagnostics the agents log (SPEC 5); reported when present in the rows.
DIAGNOSTIC_KEYS = (
    "grad_norm", "loss", "zero_variance_fraction", "all_fail_fraction", "any_success_fraction",
    "mean_q_winners", "mean_q_losers", "mean_abs_adv_winners", "mean_abs_adv_losers", "misalignment",
)
_FLAG = "⚠"


@dataclass
class Cell:
    """All seeds of one method x setting."""

    method: str
    setting: str
    seeds: list[int] = field(default_factory=list)
    rows: list[list[dict[str, Any]]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)

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


def _collect(preset: Preset, out: Path, n_seeds: int) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    for spec in preset.runs(n_seeds):
        cell = cells.setdefault((spec.method, spec.setting), Cell(spec.method, spec.setting))
        rec = load_record(out, spec)
        if rec is None:
            continue
        if rec.get("status") == "ok":
            cell.seeds.append(spec.seed)
            cell.rows.append(rec["rows"])
        else:
            cell.failed.append(rec)
    return cells


def _metric_value(cell: Cell, metric: dict[str, Any]) -> tuple[float | None, float, list[float]]:
    """``(value, s.e., per-seed values)``; value ``None`` = never reached; ``NaN`` = no data."""
    key = metric.get("key", "error")
    steps, mat = cell.matrix(key)
    if mat.size == 0:
        return math.nan, math.nan, []
    if metric["type"] == "steps_to_threshold":
        thr = float(metric["threshold"])
        value = M.steps_to_threshold(mat, thr, steps)
        se = M.bootstrap_se(mat, lambda m: M.steps_to_threshold(m, thr, steps))
        return value, se, []
    scale = float(metric.get("scale", 1.0))
    finals = list(M.final_value(mat) * scale)
    mean, se = M.mean_and_se(finals)
    return mean, se, finals


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


def _paper(preset: Preset, metric_id: str, method: str, setting: str) -> Any:
    return preset.data.get("paper", {}).get(metric_id, {}).get(method, {}).get(setting)


def _plot(preset: Preset, cells: dict[tuple[str, str], Cell], key: str, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s["name"] for s in preset.settings
                if any(key in c.keys() for (m, st), c in cells.items() if st == s["name"])]
    if not settings:
        return False
    ncols = min(4, len(settings))
    nrows = math.ceil(len(settings) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows), squeeze=False)
    log_y = bool(preset.data.get("log_y", False)) and key in ("error", "test_error", "misalignment")
    for ax, setting in zip(axes.flat, settings, strict=False):
        for method in [m["name"] for m in preset.methods]:
            cell = cells.get((method, setting))
            if cell is None or not cell.rows:
                continue
            steps, mat = cell.matrix(key)
            if mat.size == 0:
                continue
            mean = M.seed_mean_curve(mat)
            n = np.sum(~np.isnan(mat), axis=0)
            with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                se = np.where(n > 1, np.nanstd(mat, axis=0, ddof=min(1, mat.shape[0] - 1)) / np.sqrt(n), 0.0)
            (line,) = ax.plot(steps, mean, label=f"{method} (n={len(cell.rows)})", lw=1.4)
            ax.fill_between(steps, mean - se, mean + se, color=line.get_color(), alpha=0.2, lw=0)
        if log_y:
            ax.set_yscale("log")
            low, high = ax.get_ylim()
            ax.set_ylim(max(low, 1e-8), high)
        ax.set_title(setting, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(settings):]:
        ax.set_visible(False)
    fig.suptitle(f"{preset.name}: {key} (seed mean ± s.e.)", fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return True


def build_report(out: str | Path) -> dict[str, Path]:
    """Rebuild every report file of ``out`` from its manifest and stored run records.

    :return: ``{name: path}`` of the files written.
    :raises FileNotFoundError: ``out`` has no ``manifest.json`` (nothing was benchmarked there).
    """
    out = Path(out)
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{out} has no manifest.json: run `tpo-gym bench --out {out}` first")
    manifest = read_json(manifest_path)
    validate_preset(manifest["preset"], source=str(manifest_path))
    preset = Preset(data=manifest["preset"], source=manifest.get("preset_source", str(manifest_path)))
    n_seeds = int(manifest["seeds"])
    cells = _collect(preset, out, n_seeds)
    written: dict[str, Path] = {}

    # results.jsonl: one row per run per logged step
    lines = []
    for spec in preset.runs(n_seeds):
        rec = load_record(out, spec)
        if rec is None or rec.get("status") != "ok":
            continue
        for row in rec["rows"]:
            lines.append(json.dumps({"run_id": spec.run_id, "method": spec.method, "setting": spec.setting,
                                     "seed": spec.seed, **row}))
    written["results.jsonl"] = atomic_write_text(out / "results.jsonl", "\n".join(lines) + ("\n" if lines else ""))

    # PNG curves
    curve_keys = list(preset.data.get("curves", ["error"]))
    present = set().union(*(c.keys() for c in cells.values())) if cells else set()
    curve_keys += [k for k in DIAGNOSTIC_KEYS if k in present and k not in curve_keys]
    pngs = []
    for key in curve_keys:
        name = f"curves_{key}.png"
        if _plot(preset, cells, key, out / name):
            written[name] = out / name
            pngs.append((key, name))

    # metrics per cell
    values: dict[tuple[str, str, str], tuple[float | None, float, list[float]]] = {}
    for (method, setting), cell in cells.items():
        for metric in preset.metrics:
            values[(metric["id"], method, setting)] = _metric_value(cell, metric)

    # summary.csv
    buf = io.StringIO()
    writer = csv.writer(buf)
    header = ["preset", "method", "setting", "n_ok", "n_failed"]
    for metric in preset.metrics:
        header += [metric["id"], f"{metric['id']}_se", f"{metric['id']}_paper", f"{metric['id']}_within_2se"]
    writer.writerow(header)
    n_flags = 0
    for setting in preset.settings:
        for method in preset.setting_methods(setting):
            cell = cells[(method["name"], setting["name"])]
            row: list[Any] = [preset.name, method["name"], setting["name"], len(cell.rows), len(cell.failed)]
            for metric in preset.metrics:
                v, se, _ = values[(metric["id"], method["name"], setting["name"])]
                paper = _paper(preset, metric["id"], method["name"], setting["name"])
                agree = None if (v is not None and not math.isfinite(v)) else M.paper_agrees(
                    v, se, paper, metric.get("paper_dash", "never"))
                row += ["never" if v is None else v, se, "" if paper is None else paper,
                        "" if agree is None else agree]
            writer.writerow(row)
    written["summary.csv"] = atomic_write_text(out / "summary.csv", buf.getvalue())

    # report.md
    md: list[str] = []
    invocations = manifest.get("invocations", [])
    total_run_s = sum(float(rec_s) for rec_s in _run_walls(preset, out, n_seeds))
    md.append(f"# tpo-gym benchmark: `{preset.name}`\n")
    md.append(f"{preset.data['description']}  \nPaper reference: {preset.data['paper_ref']}\n")
    bench_env = invocations[-1] if invocations else {}
    md.append("| | |\n|---|---|")
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
    md.append(f"| compute time (sum over runs) | {total_run_s:.1f} s |")
    md.append("")
    md.append("Cells: **ours ± s.e. (paper)**. s.e. of a final value = std(ddof=1)/sqrt(n) over seeds; "
              "s.e. of steps-to-threshold = bootstrap s.e. (200 resamples of seeds) of the step at which the "
              f"seed-mean curve first drops below the threshold. {_FLAG} = outside 2 s.e. of the paper's value. "
              "`never` = threshold not reached within the budget; paper `-` = "
              "never reached (steps) or above the stated bound (error).\n")
    for table in preset.tables():
        settings = table.get("settings") or [s["name"] for s in preset.settings]
        methods = table.get("methods") or [m["name"] for m in preset.methods]
        for metric in preset.metrics:
            unit = metric.get("unit", "")
            desc = (f"steps to {metric.get('key', 'error')} < {metric['threshold']}"
                    if metric["type"] == "steps_to_threshold"
                    else f"final {metric.get('key', 'error')}{' (' + unit + ')' if unit else ''}")
            md.append(f"## {table['title']} — {desc}\n")
            md.append("| Method | " + " | ".join(settings) + " |")
            md.append("|---|" + "---|" * len(settings))
            for method in methods:
                cells_txt = []
                for setting in settings:
                    cell = cells.get((method, setting))
                    if cell is None:
                        cells_txt.append("")
                        continue
                    v, se, _ = values[(metric["id"], method, setting)]
                    paper = _paper(preset, metric["id"], method, setting)
                    txt = _fmt(v, metric) + ("" if v is None else _fmt_se(se, metric))
                    if paper is not None:
                        txt += f" ({paper})"
                        agree = None if (v is not None and not math.isfinite(v)) else M.paper_agrees(
                            v, se, paper, metric.get("paper_dash", "never"))
                        if agree is False:
                            txt += f" {_FLAG}"
                            n_flags += 1
                    if cell.failed:
                        txt += f" [{len(cell.failed)} failed]"
                    if len(cell.rows) < n_seeds:
                        txt += f" [n={len(cell.rows)}]"
                    cells_txt.append(txt)
                md.append(f"| {method} | " + " | ".join(cells_txt) + " |")
            md.append("")
    md.append(f"{n_flags} cell(s) differ from the paper by more than 2 s.e.\n")

    claims = preset.data.get("paper_claims", [])
    if claims:
        md.append("## The paper's claims for this experiment\n")
        md.extend(f"- {c}" for c in claims)
        md.append("")

    md.append("## Aggregate: IQM with stratified bootstrap 95% interval\n")
    md.append("Interquartile mean of the per-seed final values, pooled over the settings each method ran "
              "(rliable: 2000 replicates resampling seeds within each setting).\n")
    iqm_metrics = [m for m in preset.metrics if m["type"] == "final"] or [
        {"id": "final_error", "type": "final", "key": preset.data.get("curves", ["error"])[0]}]
    for metric in iqm_metrics:
        unit = f" ({metric['unit']})" if metric.get("unit") else ""
        md.append(f"| Method | IQM final {metric.get('key', 'error')}{unit} | 95% CI | settings |")
        md.append("|---|---|---|---|")
        for method in [m["name"] for m in preset.methods]:
            scores = {}
            for (meth, setting), cell in cells.items():
                if meth == method and cell.rows:
                    _, mat = cell.matrix(metric.get("key", "error"))
                    scores[setting] = M.final_value(mat) * float(metric.get("scale", 1.0))
            if not scores:
                continue
            point, lo, hi = M.stratified_bootstrap_ci(scores)
            md.append(f"| {method} | {point:.4g} | [{lo:.4g}, {hi:.4g}] | {len(scores)} |")
        md.append("")

    diag = [k for k in DIAGNOSTIC_KEYS if k in present]
    if diag:
        md.append("## Diagnostics (seed mean: first logged step → last logged step)\n")
        md.append("| Method | Setting | " + " | ".join(diag) + " |")
        md.append("|---|---|" + "---|" * len(diag))
        for setting in preset.settings:
            for method in preset.setting_methods(setting):
                cell = cells[(method["name"], setting["name"])]
                if not cell.rows:
                    continue
                parts = []
                for key in diag:
                    _, mat = cell.matrix(key)
                    mean = M.seed_mean_curve(mat) if mat.size else np.array([])
                    ok = mean[~np.isnan(mean)] if mean.size else mean
                    parts.append(f"{ok[0]:.3g} → {ok[-1]:.3g}" if ok.size else "")
                md.append(f"| {method['name']} | {setting['name']} | " + " | ".join(parts) + " |")
        md.append("")

    if pngs:
        md.append("## Learning curves\n")
        for key, name in pngs:
            md.append(f"![{key}]({name})\n")

    failures = [rec for cell in cells.values() for rec in cell.failed]
    missing = sum(n_seeds - len(c.rows) - len(c.failed) for c in cells.values())
    if failures or missing:
        md.append("## Failed and missing runs\n")
        md.append(f"{len(failures)} failed, {missing} not run yet (rerun the command to resume).\n")
        for rec in failures:
            tb = (rec.get("traceback") or "").strip().splitlines()
            md.append(f"- `{rec.get('run_id')}`: `{tb[-1] if tb else 'unknown error'}`")
        md.append("")
    written["report.md"] = atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    return written


def _run_walls(preset: Preset, out: Path, n_seeds: int) -> list[float]:
    walls = []
    for spec in preset.runs(n_seeds):
        rec = load_record(out, spec)
        if rec is not None and isinstance(rec.get("wall_s"), int | float) and math.isfinite(rec["wall_s"]):
            walls.append(rec["wall_s"])
    return walls
