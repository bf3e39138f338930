"""Stored runs of a report: the manifest, the run records and the ``results.jsonl`` rows."""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tpo_gym.agents.common.registry import AlgorithmReferenceError
from tpo_gym.evaluation._io import parse_json, read_json
from tpo_gym.evaluation._manifest_index import imported_methods
from tpo_gym.evaluation._provenance import restore_algorithms
from tpo_gym.evaluation.derived import reapply_budget
from tpo_gym.evaluation.presets import (
    Preset,
    PresetError,
    available_presets,
    is_packaged_source,
    load_preset,
    validate_preset,
)
from tpo_gym.evaluation.records import RecordError, validate_record
from tpo_gym.evaluation.report.values import Cell
from tpo_gym.evaluation.runner import stored_record


class NoStoredRuns(FileNotFoundError):
    """A directory with a report but no stored run to rebuild it from."""


class BadManifest(ValueError):
    """``manifest.json`` is unreadable or is not a manifest written by ``tpo-gym bench``."""

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
        current = reapply_budget(current, run_preset)  # runs at another budget (bench --episodes/--steps)
    except PresetError:
        current = None
    same = current is not None and (
        {r.run_id: r.config_hash for r in current.runs(1)} == {r.run_id: r.config_hash for r in run_preset.runs(1)})
    if not same:
        packaged = is_packaged_source(run_preset.name, run_preset.source)
        note = (f"The packaged preset `{run_preset.name}` has changed since these runs; this report shows the "
                "preset as it was run.") if packaged else None
        return run_preset, [m["name"] for m in run_preset.methods], note
    return Preset(data=current.data, source=run_preset.source), [m["name"] for m in full.methods], None


def _jsonl_lines(out: Path) -> list[tuple[int, str | None, str, dict[str, Any] | None]]:
    """``(line number, run_id, line, row)`` of each non-blank line of ``results.jsonl``; ``run_id`` and ``row``
    are ``None`` for a line that is not a JSON object with a ``run_id`` (kept as text, never parsed again)."""
    path = out / "results.jsonl"
    if not path.is_file():
        return []
    lines: list[tuple[int, str | None, str, dict[str, Any] | None]] = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = parse_json(raw, f"{path} line {number}")
        except ValueError:
            row = None
        ok = isinstance(row, dict) and isinstance(row.get("run_id"), str)
        lines.append((number, row["run_id"] if ok else None, raw.decode("utf-8", "replace"), row if ok else None))
    return lines


def _jsonl_runs(out: Path, metric_keys: Collection[str], refused: list[str]) -> dict[str, dict[str, Any]]:
    """Runs rebuilt from ``results.jsonl``: ``{run_id: {"status", "rows", "config_hash"}}``, each passed by the
    record validator (a run that fails it is left out, its one-line reason appended to ``refused``; lines that
    are not a JSON object with a ``run_id`` are skipped)."""
    runs: dict[str, dict[str, Any]] = {}
    lines: dict[str, list[str]] = {}
    for number, run_id, _, row in _jsonl_lines(out):
        if row is None:
            continue
        row = dict(row)
        row.pop("run_id")
        run = runs.setdefault(run_id, {"status": "ok", "rows": [], "config_hash": row.get("config_hash")})
        for k in ("method", "setting", "seed", "config_hash"):
            row.pop(k, None)
        run["rows"].append(row)
        lines.setdefault(run_id, []).append(f"line {number}")
    valid = {}
    for run_id, run in runs.items():
        try:
            valid[run_id] = validate_record(run, f"{out / 'results.jsonl'} (run {run_id})", metric_keys,
                                            lines[run_id])
        except RecordError as exc:
            refused.append(str(exc))
    return valid


def _load_runs(preset: Preset, out: Path, n_seeds: int) -> tuple[dict[str, dict[str, Any]], int, list[str]]:
    """``({run_id: record}, number of runs taken from results.jsonl, refused)`` of every stored run of
    ``preset``; ``refused``: one line per stored record (or ``results.jsonl`` run) that cannot be read or is
    invalid (:func:`~tpo_gym.evaluation.records.validate_record`), never used."""
    records: dict[str, dict[str, Any]] = {}
    lacking = []
    refused: list[str] = []
    for spec in preset.runs(n_seeds):
        try:
            rec = stored_record(out, spec, preset.metric_keys)
        except RecordError as exc:
            refused.append(str(exc))
            rec = None
        if rec is None:
            lacking.append(spec)
        else:
            records[spec.run_id] = rec
    from_jsonl = 0
    if lacking:
        stored = _jsonl_runs(out, preset.metric_keys, refused)
        for spec in lacking:
            run = stored.get(spec.run_id)
            if run is None or (run["config_hash"] is not None and run["config_hash"] != spec.config_hash):
                continue
            records[spec.run_id] = {"status": "ok", "rows": run["rows"], "wall_s": None}
            from_jsonl += 1
    return records, from_jsonl, refused


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
            cell.counts.append({k: rec.get(k) for k in ("env_interactions", "reward_queries")})
            wall = rec.get("wall_s")
            if isinstance(wall, int | float) and math.isfinite(wall):
                cell.walls.append(float(wall))
        else:
            cell.failed.append(rec)
    return cells


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
        raise BadManifest(f"{exc}; move it away and rerun `tpo-gym bench` with the same --out to write a new one "
                          "(the stored runs are kept)") from None
    _check_manifest(manifest, str(manifest_path))
    return manifest_path, manifest


def _check_manifest(manifest: Any, where: str) -> None:
    """:class:`BadManifest` unless ``manifest`` (or one entry of its ``other_presets``, ``where`` naming it)
    holds a valid preset and a seed count it can expand (at most
    :data:`~tpo_gym.evaluation.presets.MAX_RUNS` runs), and imported runs listed as ``tpo-gym import`` lists them
    (:func:`~tpo_gym.evaluation.importer.imported_methods`)."""
    seeds = manifest.get("seeds") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("preset"), dict) \
            or isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise BadManifest(f"{where} is not a manifest written by tpo-gym bench: it needs a JSON object "
                          "with a 'preset' object and 'seeds' (an integer >= 1)")
    try:
        restore_algorithms(manifest.get("algorithms"))
    except AlgorithmReferenceError as exc:
        raise BadManifest(f"{where}: {exc}") from None
    try:
        validate_preset(manifest["preset"], source=where)
        if isinstance(manifest.get("whole_preset"), dict):
            validate_preset(manifest["whole_preset"], source=f"{where} (whole_preset)")
        Preset(data=manifest["preset"], source=where).run_count(seeds)
    except PresetError as exc:
        raise BadManifest(str(exc)) from None
    try:
        imported_methods(manifest)
    except ValueError as exc:
        raise BadManifest(f"{where}: {exc}") from None
