"""Execute a preset's runs: in parallel worker processes or on a Ray cluster; resumable.

Layout of an output directory ``OUT``:

* ``OUT/runs/<run_id>.json`` -- one record per finished run (``status`` ``"ok"`` with the logged
  rows, or ``"failed"`` with the traceback; ``algorithm``: where its agent class came from, ``{"name",
  "path": "module:qualname", "distribution", "version"}``, absent in records of older versions), written
  atomically by the parent process as soon as the run returns; ``OUT/runs/<run_id>.json.gz`` instead
  with ``compress=True`` (gzip, no time stamp: about 8x smaller, for records committed to a repository).
  Either form is read; a run has one. A rerun skips every run whose record is ``"ok"`` and whose
  configuration hash matches; failed and missing runs are (re)executed.
* ``OUT/manifest.json`` -- the preset as run (and the whole preset it was selected from), the seed
  count, the command, the wall time of each invocation and ``algorithms`` (each ``algo``'s provenance, as
  in the records: a report in a new shell imports a class named in ``$TPO_GYM_ALGORITHMS`` from there);
  :func:`tpo_gym.evaluation.report.build_report` rebuilds the report from it alone. One preset's
  report per directory: a bench of another preset there is refused unless ``replace_preset``, which
  keeps the replaced preset's entry under ``other_presets`` (its runs stay; no run of one preset ever
  overwrites another's).
* ``OUT/.tpo-gym-bench.lock`` -- held (``fcntl.flock``) by the one bench writing ``OUT``; a second bench
  there is refused (:class:`BenchLocked`) while the first runs.

Stored records are read through :func:`stored_record`, which refuses (:class:`~tpo_gym.evaluation.records.RecordError`,
one line naming the file and the field) a path that is not a regular file, a file that is not JSON and a record
that :func:`~tpo_gym.evaluation.records.validate_record` does not pass; a bench runs such a run again.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tpo_gym._validation import check_device, check_float, check_int
from tpo_gym.evaluation._io import atomic_write_json, make_dirs, read_json
from tpo_gym.evaluation._provenance import algorithm_provenance, git_commit, package_versions
from tpo_gym.evaluation._run_pool import (
    RAY_HINT,
    WATCHDOG_INTERVAL_S,
    BackendError,
    _Deadline,
    _run_local,
    _run_ray,
    require_ray,
)
from tpo_gym.evaluation._run_records import MAX_RECORD_BYTES, read_record, read_stored, record_path, write_record
from tpo_gym.evaluation.experiments import seed_batch_key
from tpo_gym.evaluation.presets import Preset, RunSpec
from tpo_gym.evaluation.records import RECORD_SCHEMA_VERSION, RecordError, validate_record

try:  # POSIX; elsewhere two benches on one directory are not kept apart
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

# in the order of the API reference page (docs/reference/evaluation/runner.md)
__all__ = ["BACKENDS", "RAY_HINT", "MAX_RECORD_BYTES", "MAX_STOP_AFTER_MINUTES", "MAX_WORKERS", "LOCK_NAME",
           "WATCHDOG_INTERVAL_S", "BenchLocked", "BackendError", "PresetMismatch", "BenchSummary", "record_path",
           "read_record", "read_stored", "stored_record", "load_record", "stored_runs", "write_record", "switch_preset",
           "require_ray", "seed_batches", "bench", "check_stop_after", "bench_lock"]

BACKENDS = ("local", "ray")
#: The longest ``stop_after`` deadline, in minutes (about 1.9 years; longer is as good as none).
MAX_STOP_AFTER_MINUTES = 1_000_000
#: The most parallel runs of one bench (worker processes, or the CPUs of a Ray started here).
MAX_WORKERS = 1024
#: The lock file a bench holds in its output directory.
LOCK_NAME = ".tpo-gym-bench.lock"


class BenchLocked(RuntimeError):
    """Another bench (process :attr:`pid`, ``None`` if unknown) is writing the output directory."""

    def __init__(self, out: Path, pid: int | None) -> None:
        super().__init__(f"another tpo-gym bench (pid {pid if pid is not None else 'unknown'}) is writing {out}; "
                         "wait for it to finish (the same command then resumes), or use another --out")
        self.pid = pid


class PresetMismatch(ValueError):
    """The output directory holds the report of another preset (:attr:`stored`), which a bench of
    :attr:`wanted` would replace."""

    def __init__(self, message: str, stored: str, wanted: str) -> None:
        super().__init__(message)
        self.stored, self.wanted = stored, wanted


@dataclass
class BenchSummary:
    """What one ``bench`` invocation did.

    ``executed`` counts the runs started (``failed`` of them failed); with a deadline (``stop_after``),
    ``stopped`` says it was reached and ``left`` how many selected runs have no ``"ok"`` record yet
    (not started, or stopped in flight: those leave no record). ``refused``: one line per stored record that
    could not be used (unreadable or invalid: those runs were run again).
    """

    out: Path
    total: int
    executed: int
    skipped: int
    failed: int
    wall_s: float
    stopped: bool = False
    left: int = 0
    refused: list[str] = field(default_factory=list)


def stored_record(out: Path, spec: RunSpec, metric_keys: Collection[str] = ()) -> dict[str, Any] | None:
    """The stored record of ``spec`` (plain or compressed), validated; ``None`` when none is stored or it was
    made with another configuration (a changed preset).

    :param metric_keys: the logged keys the report reads (see :attr:`Preset.metric_keys`).
    :raises RecordError: a record is stored but cannot be read or is invalid (one line: the file and field).
    """
    path = record_path(out, spec)
    if not os.path.lexists(path):
        return None
    rec = read_stored(path)
    if isinstance(rec, dict):
        if not isinstance(rec.get("config_hash"), str):
            raise RecordError(f"{path}: field 'config_hash' must be the hash of the run's configuration (text), "
                              f"got {rec.get('config_hash')!r:.60}")
        if rec["config_hash"] != spec.config_hash:
            return None
    return validate_record(rec, str(path), metric_keys)


def load_record(out: Path, spec: RunSpec, metric_keys: Collection[str] = ()) -> dict[str, Any] | None:
    """:func:`stored_record`, ``None`` also for a record that cannot be used."""
    try:
        return stored_record(out, spec, metric_keys)
    except RecordError:
        return None


def stored_runs(out: Path, runs: list[RunSpec], metric_keys: Collection[str] = (),
                refused: list[str] | None = None) -> list[RunSpec]:
    """The runs among ``runs`` whose valid ``"ok"`` record with the same configuration is stored under ``out``
    (what a bench there would skip). A stored record that cannot be used counts as not stored; its one-line
    reason is appended to ``refused``."""
    done = []
    for spec in runs:
        try:
            rec = stored_record(out, spec, metric_keys)
        except RecordError as exc:
            if refused is not None:
                refused.append(str(exc))
            continue
        if rec is not None and rec["status"] == "ok":
            done.append(spec)
    return done


def _previous_manifest(path: Path) -> dict[str, Any]:
    """The manifest an earlier bench wrote at ``path`` (a new one if there is none).

    :raises ValueError: it exists but is not a JSON object with a list of invocations.
    """
    if not path.is_file():
        return {"invocations": []}
    try:
        manifest = read_json(path)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("invocations", []), list):
        raise ValueError(f"{path} is damaged (not a manifest written by tpo-gym bench); move it away to start a "
                         "new one: the stored runs under runs/ are kept and reused")
    manifest.setdefault("invocations", [])
    return manifest


def switch_preset(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    """``manifest`` made the manifest of preset ``name``: the current preset's fields (its selection, seeds,
    invocations, ...) are kept under ``other_presets[<its name>]``, and those ``name`` left there earlier
    come back (none: a manifest with no invocations yet). Unchanged when ``name`` is the current preset or
    the manifest names none."""
    preset, others = manifest.get("preset"), manifest.get("other_presets")
    current = preset.get("name") if isinstance(preset, dict) else None
    if current is None or current == name:  # no preset named yet (a new or damaged manifest): nothing to keep
        return manifest
    others = dict(others) if isinstance(others, dict) else {}
    others[current] = {k: v for k, v in manifest.items() if k != "other_presets"}
    kept = others.pop(name, None)
    switched = dict(kept) if isinstance(kept, dict) else {}
    if not isinstance(switched.get("invocations"), list):
        switched["invocations"] = []
    return {**switched, "other_presets": others} if others else switched


def _check_replace(out: Path, manifest: dict[str, Any], preset: Preset, runs: list[RunSpec],
                   replace_preset: bool) -> None:
    """Refuse a bench of ``preset`` in ``out`` when it holds another preset's report (unless
    ``replace_preset``), and always when one of ``runs`` would overwrite another preset's stored run."""
    stored = manifest.get("preset", {}).get("name") if isinstance(manifest.get("preset"), dict) else None
    if stored is None or stored == preset.name:
        return
    if not replace_preset:
        raise PresetMismatch(f"{out} holds the report and runs of preset {stored!r}, not {preset.name!r}",
                             stored, preset.name)
    for spec in runs:
        path = record_path(out, spec)
        try:
            rec = read_stored(path) if os.path.lexists(path) else None
        except RecordError:
            continue
        ran = rec.get("spec") if isinstance(rec, dict) else None
        owner = ran.get("preset") if isinstance(ran, dict) else None
        if owner not in (None, preset.name) and isinstance(rec, dict) and rec.get("config_hash") != spec.config_hash:
            raise PresetMismatch(f"run {spec.run_id} of preset {preset.name!r} would overwrite the stored run of "
                                 f"preset {owner!r} with that id in {out}", owner, preset.name)


def seed_batches(specs: list[dict[str, Any]], seed_batch: int) -> list[list[dict[str, Any]]]:
    """Group specs into tasks: up to ``seed_batch`` seeds of one method x setting of a batchable kind
    (token, MNIST) per task, in order; every other spec alone."""
    tasks: list[list[dict[str, Any]]] = []
    open_batches: dict[str, list[dict[str, Any]]] = {}
    for spec in specs:
        key = seed_batch_key(spec) if seed_batch > 1 else None
        if key is None:
            tasks.append([spec])
            continue
        batch = open_batches.get(key)
        if batch is None or len(batch) >= seed_batch:
            batch = open_batches[key] = []
            tasks.append(batch)
        batch.append(spec)
    return tasks


def bench(
    preset: Preset,
    out: str | os.PathLike[str],
    seeds: int | None = None,
    workers: int = 1,
    backend: str = "local",
    command: str | None = None,
    progress: bool = True,
    device: str = "cpu",
    seed_batch: int = 1,
    replace_preset: bool = False,
    compress: bool | None = None,
    stop_after: float | None = None,
) -> BenchSummary:
    """Run every missing run of ``preset`` and store it under ``out`` (the report is built separately).

    :param seeds: seeds ``0 .. seeds-1`` (default: the preset's count).
    :param workers: parallel runs (local worker processes, or Ray CPUs when Ray is started here).
    :param backend: ``"local"`` (``ProcessPoolExecutor``, spawn context) or ``"ray"``.
    :param command: the command line recorded in the manifest.
    :param device: torch device of every run's agent (``"cpu"``, the default and what CI tests;
        ``"cuda"``, ``"cuda:N"`` or ``"auto"``). Not part of a run's identity: a run finished on one
        device is not rerun on another.
    :param seed_batch: train up to this many seeds of one method x setting together in one process
        (:class:`~tpo_gym.agents.SeedBatch`; token and MNIST runs). Still one record per seed; a batch
        that fails runs each of its seeds again alone (one bad seed fails only itself). Not part of a
        run's identity either.
    :param replace_preset: when ``out`` holds the report of another preset: make this preset's the report
        there (the other's manifest entry is kept under ``other_presets`` and its stored runs stay, so
        :func:`~tpo_gym.evaluation.report.select_report` can rebuild its report). Without it that is a
        :class:`PresetMismatch`, as is (always) a run that would overwrite another preset's stored run.
    :param compress: store new records gzip-compressed (``runs/<run_id>.json.gz``, about 8x smaller: the
        form committed to a repository). ``None`` (the default): as the last bench in ``out`` did (its
        manifest's ``compress_records``), else plain JSON. Records of the other form are still read.
    :param stop_after: minutes after which no run is started and the runs in flight are stopped, leaving no
        record (a clean stop at a deadline: everything finished before it is stored, and the same call
        goes on). The summary's ``stopped`` and ``left`` say whether it was reached and what is left. At most
        :data:`MAX_STOP_AFTER_MINUTES`.
    :raises PresetError: more runs than :data:`~tpo_gym.evaluation.presets.MAX_RUNS`.
    :raises ValueError: an argument out of its range (``workers`` at most :data:`MAX_WORKERS`), naming it.
    :raises BenchLocked: another bench is writing ``out`` (:data:`LOCK_NAME`).

    A stored record that cannot be used (unreadable, or refused by
    :func:`~tpo_gym.evaluation.records.validate_record`) is not a finished run: it is run again, and the
    summary's ``refused`` says why each was. A run that returns an invalid ``"ok"`` record (a NaN error, say)
    is stored as failed, with the reason. The records of the selection end up in the form of
    ``compress``, which the manifest's ``compress_records`` then states.
    """
    device = check_device(device)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    workers = check_int("workers", workers, minimum=1, maximum=MAX_WORKERS)
    if isinstance(seed_batch, bool) or not isinstance(seed_batch, int) or seed_batch < 1:
        raise ValueError(f"seed_batch must be an int >= 1 (seeds trained together per process), got {seed_batch!r}")
    if stop_after is not None:
        stop_after = check_stop_after(stop_after)
    if compress is not None and not isinstance(compress, bool):
        raise ValueError(f"compress must be True, False or None (as the last bench there), got {compress!r}")
    deadline = None if stop_after is None else time.monotonic() + 60.0 * stop_after
    n_seeds = preset.seeds if seeds is None else int(seeds)
    if n_seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {n_seeds}")
    preset.run_count(n_seeds)  # a count that would not fit in memory: refused before any run is made
    if backend == "ray":
        require_ray()
    out = make_dirs(out)
    with bench_lock(out):
        return _bench_locked(preset, out, n_seeds, workers, backend, command, progress, device, seed_batch,
                             replace_preset, compress, deadline)


def check_stop_after(value: Any, name: str = "stop_after") -> float:
    """``value`` as a number of minutes if it is in ``(0,`` :data:`MAX_STOP_AFTER_MINUTES` ``]``, else
    ``ValueError`` naming ``name``, the value and the range."""
    return check_float(f"{name} (minutes)", value, minimum=0, maximum=MAX_STOP_AFTER_MINUTES, strict_min=True)


@contextlib.contextmanager
def bench_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s :data:`LOCK_NAME` (``fcntl.flock``, released when the process ends, however it ends) for
    the ``with`` block, the holder's pid written in it.

    :raises BenchLocked: another process holds it.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise BenchLocked(out, int(holder) if holder.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _store(out: Path, spec: RunSpec, rec: dict[str, Any], compress: bool, metric_keys: Collection[str],
           algorithm: dict[str, Any] | None = None) -> bool:
    """Store the record a run returned (with ``algorithm``, the provenance of its agent class), an ``"ok"`` one
    that :func:`validate_record` refuses as ``"failed"`` with the reason (never a silent NaN kept as finished).
    Whether it is stored as ``"ok"``."""
    rec["run_id"], rec["config_hash"] = spec.run_id, spec.config_hash
    rec.setdefault("schema_version", RECORD_SCHEMA_VERSION)
    if algorithm is not None:
        rec["algorithm"] = algorithm
    rec["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if rec["status"] == "ok":
        try:
            validate_record(rec, f"run {spec.run_id}", metric_keys)
        except RecordError as exc:
            rec.update(status="failed", traceback=f"the run returned an invalid record: {exc}")
    write_record(out, spec, rec, compress)
    return rec["status"] == "ok"


def _recompress(out: Path, runs: list[RunSpec], compress: bool) -> None:
    """Store the records of ``runs`` (all stored and valid) in the form ``compress`` asks for, so the manifest's
    ``compress_records`` holds for every record of its selection."""
    for spec in runs:
        path = record_path(out, spec)
        if path.name.endswith(".gz") != compress:
            write_record(out, spec, read_stored(path), compress)


def _bench_locked(preset: Preset, out: Path, n_seeds: int, workers: int, backend: str, command: str | None,
                  progress: bool, device: str, seed_batch: int, replace_preset: bool, compress: bool | None,
                  deadline: float | None) -> BenchSummary:
    """:func:`bench` once its arguments are checked and ``out``'s lock is held."""
    manifest_path = out / "manifest.json"
    manifest = _previous_manifest(manifest_path)
    runs = preset.runs(n_seeds)
    _check_replace(out, manifest, preset, runs, replace_preset)
    manifest = switch_preset(manifest, preset.name)
    if compress is None:
        compress = manifest.get("compress_records") is True
    make_dirs(out / "runs")
    algorithms = {algo: algorithm_provenance(algo) for algo in dict.fromkeys(r.algo for r in runs)}
    manifest.update(preset=preset.data, whole_preset=preset.whole_data, preset_source=preset.source, seeds=n_seeds,
                    command=command or " ".join(sys.argv), backend=backend, workers=workers, device=device,
                    seed_batch=seed_batch, compress_records=compress, algorithms=algorithms)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    atomic_write_json(manifest_path, manifest)

    refused: list[str] = []
    finished = stored_runs(out, runs, preset.metric_keys, refused)
    _recompress(out, finished, compress)
    done = {r.run_id for r in finished}
    todo = [r for r in runs if r.run_id not in done]
    by_id = {r.run_id: r for r in todo}
    t0 = time.perf_counter()
    failed = 0
    stopped = False
    recorded: set[str] = set()
    if todo:
        from tqdm.auto import tqdm

        # long runs (kind "llm") checkpoint under OUT/checkpoints/<run_id>/ and resume from there
        specs = [{**r.to_dict(), "checkpoint_dir": str((out / "checkpoints" / r.run_id).resolve()),
                  "device": device} for r in todo]
        tasks = seed_batches(specs, seed_batch)
        stream = (_run_local(tasks, workers, deadline=deadline) if backend == "local"
                  else _run_ray(tasks, workers, deadline=deadline))
        bar = tqdm(total=len(todo), desc=f"{preset.name} runs", unit="run", disable=not progress,
                   initial=0, dynamic_ncols=True)
        try:
            for rec in stream:
                spec = RunSpec.from_dict(rec["spec"])
                spec = by_id.get(spec.run_id, spec)
                failed += not _store(out, spec, rec, compress, preset.metric_keys, algorithms.get(spec.algo))
                recorded.add(spec.run_id)
                bar.update(1)
                bar.set_postfix(failed=failed)
        except _Deadline:
            stopped = True
        finally:
            bar.close()
    wall = time.perf_counter() - t0
    left = len(todo) - len(recorded) + failed
    executed = len(recorded) if stopped else len(todo)
    manifest["invocations"].append({"started": started, "wall_s": round(wall, 3), "runs": len(runs),
                                    "executed": executed, "skipped": len(runs) - len(todo), "failed": failed,
                                    **({"stopped_at_deadline": True, "left": left} if stopped else {}),
                                    "git_commit": git_commit(), "versions": package_versions()})
    atomic_write_json(manifest_path, manifest)
    return BenchSummary(out=out, total=len(runs), executed=executed, skipped=len(runs) - len(todo),
                        failed=failed, wall_s=wall, stopped=stopped, left=left, refused=refused)
