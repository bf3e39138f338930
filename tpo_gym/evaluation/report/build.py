"""Build the report of an output directory (:func:`build_report`) or point it at another selection."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from tpo_gym.evaluation import claims as C
from tpo_gym.evaluation import metrics as M
from tpo_gym.evaluation._io import atomic_write_json, atomic_write_text
from tpo_gym.evaluation.derived import method_notes, reapply_budget
from tpo_gym.evaluation.importer import ImportedPreset, imported_preset
from tpo_gym.evaluation.presets import Preset, PresetError, is_packaged_source, load_preset
from tpo_gym.evaluation.report.budget import budget_table, budget_used, not_comparable
from tpo_gym.evaluation.report.figures import _figures
from tpo_gym.evaluation.report.runs import (
    NoStoredRuns,
    _check_manifest,
    _collect,
    _jsonl_lines,
    _load_runs,
    _presentation,
    _read_manifest,
)
from tpo_gym.evaluation.report.sections import (
    _aggregate,
    _claims,
    _diagnostics,
    _results,
    _seed_steps_table,
    _setup,
    _terms,
)
from tpo_gym.evaluation.report.values import _metric_value, _paper
from tpo_gym.evaluation.runner import switch_preset


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
    if is_packaged_source(current.name, source):
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
    chosen = reapply_budget(whole.subset(settings, methods, setups), current)
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


def _number(value: Any) -> Any:
    """A numeric csv cell: the number, or empty (NaN for pandas) when it is missing or not finite."""
    return value if isinstance(value, int | float) and math.isfinite(value) else ""


def _summary_csv(preset: Preset, cells: dict[tuple[str, str], Any], values: dict[tuple[str, str, str], C.Stat],
                 used: dict[tuple[str, str], tuple[Any, Any]] | None = None) -> str:
    """``summary.csv``: a row per method x setting. Per metric (its column named with its unit, see
    :func:`~tpo_gym.evaluation.metrics.summary_column`): the value, its s.e., the paper's number, whether they
    agree within 2 s.e. (empty for a setting run at another budget than the paper's); a steps metric also has
    ``<column>_reached``. Numeric columns hold numbers or nothing: a threshold never reached is empty with
    ``_reached`` False, and so is its s.e.; the paper's entries that are not numbers (``-``, ``>99``, ``<2.3``) are
    in ``<column>_paper_text``, its number column empty. Last, ``env_steps`` and ``reward_queries``: the median
    over seeds of each run's final count (``used``, :func:`~tpo_gym.evaluation.report.budget.budget_used`)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    header = ["preset", "method", "setting", "n_ok", "n_failed"]
    for metric in preset.metrics:
        col = M.summary_column(metric)
        header += [col, *([f"{col}_reached"] if metric["type"] == M.STEPS_TO_THRESHOLD else []), f"{col}_se",
                   f"{col}_paper", f"{col}_paper_text", f"{col}_within_2se"]
    writer.writerow([*header, "env_steps", "reward_queries"])
    for setting in preset.settings:
        for method in preset.setting_methods(setting):
            cell = cells[(method["name"], setting["name"])]
            row: list[Any] = [preset.name, method["name"], setting["name"], len(cell.rows), len(cell.failed)]
            for metric in preset.metrics:
                stat = values[(metric["id"], method["name"], setting["name"])]
                paper = _paper(preset, metric["id"], method["name"], setting["name"])
                agree = M.paper_agrees(stat.value, stat.se, paper, metric.get("paper_dash", "never")) \
                    if stat.has_data and not not_comparable(preset, setting["name"]) else None
                row.append(_number(stat.value))
                if metric["type"] == M.STEPS_TO_THRESHOLD:
                    row.append(stat.value is not None if stat.has_data else "")
                number = paper if isinstance(paper, int | float) and not isinstance(paper, bool) else None
                se = stat.se if stat.value is not None else None  # a threshold never reached has no s.e.
                row += [_number(se), _number(number), "" if paper is None or number is not None else paper,
                        "" if agree is None else agree]
            env, queries = (used or {}).get((method["name"], setting["name"]), (None, None))
            writer.writerow([*row, *(_number(int(v) if v is not None and float(v).is_integer() else v)
                                     for v in (env, queries))])
    return buf.getvalue()


def _imported_note(preset: Preset) -> list[str]:
    """A paragraph naming the methods whose runs ``tpo-gym import`` added (none: nothing)."""
    if not isinstance(preset, ImportedPreset) or not preset.imported:
        return []
    names = ", ".join(f"`{m['name']}` (algo `{m['algo']}`)" for m in preset.methods if m.get("imported"))
    return [f"Imported methods: {names}: runs of scripts outside the bench (run records added by `tpo-gym import`), "
            "reported as the preset's methods are; the paper's numbers and claims were not written with them in "
            "mind.\n"]


def build_report(out: str | Path, manifest: dict[str, Any] | None = None,
                 refused: list[str] | None = None) -> dict[str, Path]:
    """Rebuild every report file of ``out`` from its manifest and stored runs.

    ``manifest``: another selection of the runs (from :func:`select_report`), written to
    ``manifest.json`` only once the report is built. ``results.jsonl`` holds the rows of the report's
    runs and keeps those of every other run it held (for a directory without ``runs/*.json``, such as a
    committed report, it is the only copy).

    A stored record (or ``results.jsonl`` run) that cannot be read or is invalid
    (:func:`~tpo_gym.evaluation.records.validate_record`) is never used: the report lists it under "Failed and
    missing runs", and its one-line reason is appended to ``refused`` (when given).

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
    preset = imported_preset(preset, manifest)  # the methods `tpo-gym import` added, as rows of their own
    n_seeds = int(manifest["seeds"])
    records, from_jsonl, damaged = _load_runs(preset, out, n_seeds)
    if refused is not None:
        refused += damaged
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
    lines += [line for _, run_id, line, _ in _jsonl_lines(out) if run_id not in reported]  # other runs' rows stay
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

    used = budget_used(preset, cells)
    summary = _summary_csv(preset, cells, values, used)
    written["summary.csv"] = atomic_write_text(out / "summary.csv", summary)

    present = set().union(*(c.keys() for c in cells.values())) if cells else set()
    md = [f"# {preset.name}: benchmark report\n",
          f"{preset.data['description']}  \nPaper: {preset.data['paper_ref']}\n"]
    if drift:
        md.append(drift + "\n")
    md += _setup(preset, manifest, cells, n_seeds, from_jsonl)
    md += _imported_note(preset)
    md += _terms(preset, present)
    md += _results(preset, cells, values, n_seeds)
    md += _seed_steps_table(preset, cells)
    md += _claims(preset, full_methods, cells, values)
    notes = [*preset.data.get("notes", []), *method_notes(preset, manifest.get("algorithms"))]
    if notes:
        md += ["## Notes\n", *[f"- {n}" for n in notes], ""]
    md += budget_table(preset, used)
    md += _aggregate(preset, cells)
    md += _diagnostics(preset, cells, present)
    if figures:
        md.append("## Figures\n")
        for fig in figures:
            md += [f"### {fig.title[0].upper() + fig.title[1:]}\n", f"![{fig.title}]({fig.name})\n",
                   f"*{fig.caption}*\n"]
    failures = [rec for cell in cells.values() for rec in cell.failed]
    imported = set(preset.imported) if isinstance(preset, ImportedPreset) else set()
    missing = sum(n_seeds - len(c.rows) - len(c.failed) for c in cells.values() if c.method not in imported)
    not_imported = sum(n_seeds - len(c.rows) - len(c.failed) for c in cells.values() if c.method in imported)
    if failures or missing or not_imported or damaged:
        md.append("## Failed and missing runs\n")
        md.append(f"{len(failures)} failed, {missing} not run yet (`tpo-gym bench` with this preset, selection, "
                  "seeds and --out runs them; finished runs are kept)"
                  + (f"; {not_imported} seeds of imported methods not imported (`tpo-gym import` adds them)"
                     if not_imported else "") + ".\n")
        for rec in failures:
            tb = (rec.get("traceback") or "").strip().splitlines()
            md.append(f"- `{rec.get('run_id')}`: `{tb[-1] if tb else 'unknown error'}`")
        if damaged:
            md.append(f"- {len(damaged)} stored record(s) cannot be read or are invalid, and were not used (a run "
                      "refused under runs/ is shown from results.jsonl where it has a valid copy, else as not run "
                      "yet; a bench rerun redoes it):")
            md += [f"  - `{line.replace('`', chr(39))}`" for line in damaged]
        md.append("")
    written["report.md"] = atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    if selected:
        atomic_write_json(manifest_path, manifest)
        written["manifest.json"] = manifest_path
    return written
