"""``tpo-gym import``: add the runs of your own scripts to a bench folder, reported exactly like built-in runs.

A script writes one run record per run (:class:`~tpo_gym.evaluation.run_logger.RunLogger`, or any code that writes
the schema of :mod:`~tpo_gym.evaluation.records`); :func:`import_records` checks each against that schema
(``validate_record(strict=True)``) and against the folder (its preset, the setting's kind, a method name of its
own), stores it under ``runs/`` like a bench's record, and lists it in the folder's ``manifest.json`` under
``"imported"``::

    "imported": {"MyPG": {"algo": "MyPG", "runs": {"<run_id>": {"setting": ..., "seed": 0,
                                                                 "config_hash": ..., "source": "/path/rec.json"}}}}

The report (:func:`~tpo_gym.evaluation.report.build_report`) adds each imported method as a row of its own
(:func:`imported_preset`) in the settings it has runs in: every table, figure, claim check, IQM column, the
diagnostics and ``summary.csv`` then show it as they show the preset's methods. An imported run's configuration
hash is its own record's (:attr:`~tpo_gym.evaluation.presets.RunSpec.config_hash` of its spec): a record replaced
by hand with another is not used.

Rules, each refused in one line naming the file and the field (nothing is imported when one record is refused):
the record's ``spec.preset`` is the folder's preset and ``spec.setting`` one of its settings (of the whole preset
the bench selected from; a setting outside the report's selection is stored and shows once selected); the spec's
``kind`` is that setting's; ``spec.method`` is none of the preset's methods; a method has one ``algo``; one
record per method x setting x seed per import; a run of ``tpo-gym bench`` is never replaced. A seed beyond the
report's seeds is stored, and shows with ``tpo-gym report DIR --seeds N``. Importing a record again changes
nothing.
"""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

from tpo_gym.evaluation._io import atomic_write_json
from tpo_gym.evaluation._manifest_index import IMPORTED_FIELD, imported_methods
from tpo_gym.evaluation.presets import Preset, RunSpec
from tpo_gym.evaluation.records import RECORD_SCHEMA_VERSION, RecordError, validate_record
from tpo_gym.evaluation.run_logger import RunLogger
from tpo_gym.evaluation.runner import bench_lock, read_stored, record_path, write_record

__all__ = ["IMPORTED_FIELD", "ImportRefused", "ImportSummary", "ImportedPreset", "ImportedRunSpec", "RunLogger",
           "add_import_command", "import_records", "imported_methods", "imported_preset", "run_import_command"]

#: The hash of a seed of an imported method that was not imported: matches no stored record.
_NOT_IMPORTED = "(not imported)"


class ImportRefused(ValueError):
    """Records that cannot be imported: :attr:`lines`, one per refused record (the file and the field)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass
class ImportSummary:
    """What :func:`import_records` did: the methods imported, the runs stored (``new``: written now;
    ``unchanged``: stored already, as they are) and ``notes``, one line per run stored that the report does not
    show yet (and how to show it)."""

    out: Path
    methods: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ImportedRunSpec(RunSpec):
    """A run of an imported method: its configuration hash is its imported record's (:attr:`imported_hash`)."""

    imported_hash: str = _NOT_IMPORTED

    @property
    def config_hash(self) -> str:
        """The hash the imported record's spec gave it when it was imported."""
        return self.imported_hash


@dataclass
class ImportedPreset(Preset):
    """A preset with the imported methods added as rows (``"imported": true`` in :attr:`data`'s methods);
    :meth:`runs` gives their runs the hashes of the imported records (:attr:`hashes`, by run id)."""

    hashes: dict[str, str] = field(default_factory=dict)

    @property
    def imported(self) -> list[str]:
        """The names of the imported methods, in the order they were first imported."""
        return [m["name"] for m in self.methods if m.get("imported")]

    def runs(self, n_seeds: int | None = None) -> list[RunSpec]:
        """:meth:`Preset.runs`, the runs of an imported method as :class:`ImportedRunSpec`."""
        names = set(self.imported)
        return [ImportedRunSpec(**{f.name: getattr(s, f.name) for f in fields(RunSpec)},
                                imported_hash=self.hashes.get(s.run_id, _NOT_IMPORTED)) if s.method in names else s
                for s in super().runs(n_seeds)]


def imported_preset(preset: Preset, manifest: dict[str, Any]) -> Preset:
    """``preset`` with the imported methods of ``manifest`` added (:class:`ImportedPreset`), each to the settings
    of ``preset`` where it has runs, and to every table holding one of those; ``preset`` itself when none has.
    A name that is one of ``preset``'s methods is left out (the preset's own runs are reported)."""
    index = imported_methods(manifest)
    own = {m["name"] for m in preset.methods}
    names = [m["name"] for m in preset.methods]
    present = {s["name"] for s in preset.settings}
    where = {method: {r["setting"] for r in entry["runs"].values()} & present for method, entry in index.items()
             if method not in own}
    where = {method: settings for method, settings in where.items() if settings}
    if not where:
        return preset
    data = copy.deepcopy(preset.data)
    data["methods"] += [{"name": m, "algo": index[m]["algo"], "kwargs": {}, "imported": True} for m in where]
    for setting in data["settings"]:  # every setting lists its methods: an imported one only where it ran
        extra = [m for m, settings in where.items() if setting["name"] in settings]
        setting["methods"] = [*(setting.get("methods") or names), *extra]
    for table in data.get("tables") or []:
        table["methods"] = [*table.get("methods", []),
                            *[m for m, settings in where.items() if settings & set(table.get("settings", []))]]
    hashes = {run_id: run["config_hash"] for m in where for run_id, run in index[m]["runs"].items()}
    return ImportedPreset(data=data, source=preset.source, whole=preset.whole, hashes=hashes)


def _record_files(paths: list[str | Path]) -> tuple[list[Path], list[str]]:
    """``(files, refused)``: each path, a directory as its ``*.json`` and ``*.json.gz`` files (sorted)."""
    files, refused = [], []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
            files += found
            if not found:
                refused.append(f"{path}: a directory without .json or .json.gz run records")
        elif not path.exists():
            refused.append(f"{path}: no such file")
        else:
            files.append(path)
    return files, refused


def _check_against(source: str, rec: dict[str, Any], whole: Preset, index: dict[str, dict[str, Any]]) -> RunSpec:
    """The run of a valid external record, checked against the folder's whole preset and what it imported."""
    spec = rec["spec"]
    if spec["preset"] != whole.name:
        raise RecordError(f"{source}: field 'spec.preset' is {spec['preset']!r}, but the folder holds preset "
                          f"{whole.name!r}")
    settings = {s["name"]: s for s in whole.settings}
    if spec["setting"] not in settings:
        raise RecordError(f"{source}: field 'spec.setting' {spec['setting']!r} is not a setting of preset "
                          f"{whole.name!r}; its settings: {', '.join(settings)}")
    kind = settings[spec["setting"]]["kind"]
    if spec["kind"] != kind:
        raise RecordError(f"{source}: field 'spec.kind' is {spec['kind']!r}, but setting {spec['setting']!r} is "
                          f"of kind {kind!r}")
    own = [m["name"] for m in whole.methods]
    run = RunSpec(preset=whole.name, kind=kind, method=spec["method"], algo=spec["algo"], setting=spec["setting"],
                  seed=spec["seed"], params=spec["params"], method_kwargs=spec.get("method_kwargs", {}))
    clash = [m for m in own if m.casefold() == run.method.casefold()
             or RunSpec(whole.name, kind, m, "", run.setting, run.seed).run_id == run.run_id]
    if clash:
        raise RecordError(f"{source}: field 'spec.method' {run.method!r} names the preset's method {clash[0]!r} "
                          "(its runs come from tpo-gym bench); give your method a name of its own")
    for other, entry in index.items():
        if other != run.method and run.run_id in entry["runs"]:
            raise RecordError(f"{source}: field 'spec.method' {run.method!r} gives its runs the ids of imported "
                              f"method {other!r} ({run.run_id}); give it a name of its own")
    known = index.get(run.method, {}).get("algo", run.algo)
    if known != run.algo:
        raise RecordError(f"{source}: field 'spec.algo' is {run.algo!r}, but method {run.method!r} was imported "
                          f"with algo {known!r}; one method has one algo")
    stored = rec.get("config_hash", run.config_hash)
    if stored != run.config_hash:
        raise RecordError(f"{source}: field 'config_hash' {stored!r:.40} is not its spec's ({run.config_hash}); "
                          "leave it out, or fix the spec")
    return run


def _read_external(path: Path, whole: Preset, index: dict[str, dict[str, Any]]
                   ) -> tuple[RunSpec, dict[str, Any]]:
    """``(run, record to store)`` of the record file ``path``, or :class:`RecordError` in one line."""
    rec = validate_record(read_stored(path), str(path), whole.metric_keys, strict=True)
    run = _check_against(str(path), rec, whole, index)
    stored = {**rec, "schema_version": RECORD_SCHEMA_VERSION, "spec": run.to_dict(), "run_id": run.run_id,
              "config_hash": run.config_hash, "imported_from": str(path.resolve())}
    return run, stored


def _previous(out: Path, run: RunSpec) -> tuple[dict[str, Any] | None, str | None]:
    """``(record stored for run's id, why it may not be replaced)``: a run of tpo-gym bench may not."""
    path = record_path(out, run)
    if not path.exists():
        return None, None
    try:
        rec = read_stored(path)
    except RecordError:
        return None, None  # unreadable: an import may replace it
    if not isinstance(rec, dict) or "imported_from" not in rec:
        return None, f"would replace {path}, a run of tpo-gym bench; give your method a name of its own"
    return rec, None


def import_records(out: str | Path, paths: list[str | Path]) -> ImportSummary:
    """Check the run records ``paths`` (files; a directory: its ``.json`` and ``.json.gz`` files) and add them
    to the bench folder ``out`` (its ``runs/`` and the manifest's :data:`IMPORTED_FIELD`), holding the folder's
    bench lock. All or nothing: one refused record imports none.

    :raises FileNotFoundError: ``out`` has no ``manifest.json``.
    :raises ImportRefused: records that cannot be imported, one line each (the file and the field).
    :raises BenchLocked: a bench is writing ``out``.
    :raises BadManifest: ``out``'s manifest cannot be read.
    """
    from tpo_gym.evaluation.report.runs import _read_manifest

    out = Path(out)
    manifest_path, _ = _read_manifest(out)  # before the lock: a folder without a manifest gets no lock file
    with bench_lock(out):
        manifest_path, manifest = _read_manifest(out)  # its imported runs checked (imported_methods)
        index = copy.deepcopy(imported_methods(manifest))
        whole = Preset(data=manifest.get("whole_preset") or manifest["preset"], source=str(manifest_path))
        files, refused = _record_files(paths)
        chosen: dict[str, tuple[Path, RunSpec, dict[str, Any]]] = {}
        for path in files:
            try:
                run, stored = _read_external(path, whole, index)
                if run.run_id in chosen:
                    raise RecordError(f"{path}: the same run ({run.method}, {run.setting}, seed {run.seed}) as "
                                      f"{chosen[run.run_id][0]}; import one record per run")
                _, why = _previous(out, run)
                if why is not None:
                    raise RecordError(f"{path}: {why}")
            except RecordError as exc:
                refused.append(str(exc))
                continue
            chosen[run.run_id] = (path, run, stored)
            index.setdefault(run.method, {"algo": run.algo, "runs": {}})
            index[run.method]["runs"][run.run_id] = {"setting": run.setting, "seed": run.seed,
                                                     "config_hash": run.config_hash, "source": stored["imported_from"]}
        if refused or not chosen:
            raise ImportRefused(refused or ["no run record given"])
        summary = ImportSummary(out, list(dict.fromkeys(run.method for _, run, _ in chosen.values())))
        compress = manifest.get("compress_records") is True
        for _, run, stored in chosen.values():
            previous, _ = _previous(out, run)
            if previous == stored:
                summary.unchanged.append(run.run_id)
                continue
            write_record(out, run, stored, compress)
            summary.new.append(run.run_id)
        if index != manifest.get(IMPORTED_FIELD, {}):
            atomic_write_json(manifest_path, {**manifest, IMPORTED_FIELD: index})
    summary.notes = _notes(out, manifest, [run for _, run, _ in chosen.values()])
    return summary


def _notes(out: Path, manifest: dict[str, Any], runs: list[RunSpec]) -> list[str]:
    """One line per imported run the report does not show yet: a seed beyond its seeds, a setting outside its
    selection."""
    seeds = int(manifest["seeds"])
    selected = {s["name"] for s in manifest["preset"]["settings"]}
    notes = []
    for run in runs:
        if run.setting not in selected:
            notes.append(f"{run.run_id}: setting {run.setting!r} is not in the report's selection; "
                         f"tpo-gym report {out} --settings ... with it shows it")
        elif run.seed >= seeds:
            notes.append(f"{run.run_id}: seed {run.seed} is beyond the report's seeds 0..{seeds - 1}; "
                         f"tpo-gym report {out} --seeds {run.seed + 1} shows it")
    return notes


def add_import_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``tpo-gym import RECORDS... --out DIR`` to ``subparsers`` (what ``add_subparsers`` returned); its
    namespace's ``handler`` is :func:`run_import_command`.

    :return: the ``import`` sub-command's parser.
    """
    parser = subparsers.add_parser(
        "import", help="add run records written by your own scripts to a bench folder and its report",
        description="Check run records written by your own scripts (tpo_gym.evaluation.run_logger.RunLogger, or "
                    "the schema of tpo_gym.evaluation.records) and add them to a folder written by tpo-gym bench: "
                    "each method becomes a row of every table, figure, claim check and summary.csv of the "
                    "report, which is rebuilt. One refused record imports nothing; importing again changes "
                    "nothing.")
    parser.add_argument("records", nargs="+", metavar="RECORD",
                        help="a run record (.json or .json.gz), or a directory of them")
    parser.add_argument("--out", required=True, metavar="DIR", help="a directory written by tpo-gym bench")
    parser.add_argument("--no-report", action="store_true", help="store the runs; do not rebuild the report")
    parser.set_defaults(handler=run_import_command)
    return parser


def _fail(lines: list[str], code: int = 2) -> NoReturn:
    """Each line on stderr as an error of ``tpo-gym import``, then exit with ``code`` (no traceback)."""
    for line in lines:
        print(f"tpo-gym import: error: {line}", file=sys.stderr)
    raise SystemExit(code)


def run_import_command(args: argparse.Namespace) -> int:
    """``tpo-gym import``: :func:`import_records`, then the report rebuilt (unless ``--no-report``).

    :return: the exit status (0); a refused record or a folder that cannot take it exits 2 with one line each.
    """
    from tpo_gym.evaluation.report import BadManifest, NoStoredRuns, build_report
    from tpo_gym.evaluation.runner import BenchLocked

    out = Path(args.out)
    if not out.is_dir():
        _fail([f"--out {args.out!r} is not a directory written by tpo-gym bench"])
    try:
        summary = import_records(out, args.records)
    except ImportRefused as exc:
        _fail(exc.lines + ["nothing was imported"])
    except (FileNotFoundError, BadManifest, BenchLocked) as exc:
        _fail([str(exc)])
    except OSError as exc:
        _fail([f"cannot write under {out}: {exc.strerror or exc}"], code=1)
    print(f"imported {len(summary.new) + len(summary.unchanged)} runs of {', '.join(summary.methods)} into {out} "
          f"({len(summary.new)} new, {len(summary.unchanged)} unchanged)")
    for note in summary.notes:
        print(f"note: {note}")
    if args.no_report:
        return 0
    refused: list[str] = []
    try:
        written = build_report(out, refused=refused)
    except (NoStoredRuns, BadManifest) as exc:
        _fail([str(exc)], code=1)
    for line in refused:
        print(f"tpo-gym import: warning: refused stored record {line}", file=sys.stderr)
    print(f"wrote {', '.join(sorted(written))} in {out}")
    return 0
