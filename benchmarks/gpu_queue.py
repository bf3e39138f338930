"""The queue of preset chunks a GPU window works through, and the archives that bring its run records back.

A GPU window is short (about 15 minutes in all, one command at most 10, at most 8 files of 16 MiB come
back). ``benchmarks/gpu_session.sh`` runs the device checks, then ``gpu_queue.py run``, which works
through :data:`QUEUE` in order of value until a deadline:

* each chunk is one ``tpo-gym bench --preset P ARGS --device D --out WORK/P`` under ``timeout`` (SIGTERM at
  the deadline: the finished runs are stored, the unfinished ones leave no record);
* before each chunk the committed records of its preset (``RESULTS/P/runs/*.json`` or ``*.json.gz``) are copied into
  ``WORK/P/runs/``, so ``bench`` skips them: each window continues where the last one stopped;
* at the end every *new* record (not a copied one) goes into ``OUT/runs-N.tar.gz`` (each under 16 MiB,
  split when needed), with the preset's manifest, and ``OUT/queue.txt`` says which chunks finished.

``gpu_queue.py unpack ARCHIVE ...`` puts the records of such archives into ``RESULTS/P/runs/`` (and the
manifest where the preset has none yet), compressed where that folder's manifest says its records are
(``tpo-gym bench --compress``, the committed form); then ``tpo-gym report RESULTS/P``.

    python benchmarks/gpu_queue.py list [--queue FILE]
    python benchmarks/gpu_queue.py run --seconds 400 [--device cuda] [--queue FILE] [--out DIR] [--work DIR]
    python benchmarks/gpu_queue.py unpack OUT/runs-1.tar.gz [...] [--results DIR]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing tpo-gym (the bare GPU machine)

from tpo_gym.evaluation._io import atomic_write_bytes, atomic_write_json, make_dirs  # noqa: E402
from tpo_gym.evaluation.presets import load_preset  # noqa: E402

#: The chunks in order of value (issue 28): ``PRESET  tpo-gym bench arguments`` per line; ``--device`` and
#: ``--out`` are added. Runs already committed under benchmarks/results/PRESET/runs/ are skipped.
QUEUE = """\
table1              --settings V=8,V=16 --seeds 20 --seed-batch 20 --workers 4
table1              --settings V=2,V=4 --seeds 20 --seed-batch 20 --workers 4
table3              --setups reference --seeds 20 --seed-batch 20 --workers 4
table2              --seeds 10 --seed-batch 10 --workers 4
eta                 --seeds 10 --seed-batch 10 --workers 4
ablations           --seeds 20 --seed-batch 20 --workers 4
sparse-diagnostics  --seed-batch 30 --workers 4
"""

#: Largest file that comes back from the GPU machine's output folder (16 MiB).
ARCHIVE_LIMIT = 16 * 2**20
#: Archives that come back at most (8 files, less session.log, gpu.txt, checks.txt, bench.txt and queue.txt).
MAX_ARCHIVES = 3
#: Seconds a chunk has after SIGTERM to stop its workers before it is killed.
KILL_AFTER = 20
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.=+\-]+$")


@dataclass(frozen=True)
class Chunk:
    """One queue entry: a preset (name or .json file) and the ``tpo-gym bench`` arguments it runs with."""

    preset: str
    args: tuple[str, ...]

    @property
    def name(self) -> str:
        """The preset's name (a preset file's ``name`` field): its folder under the results and the work dir."""
        return load_preset(self.preset).name

    def __str__(self) -> str:
        return shlex.join([self.preset, *self.args])


def parse_queue(text: str) -> list[Chunk]:
    """The chunks of a queue text: one ``PRESET ARGS...`` per line; blank lines and ``#`` comments skipped.

    :raises ValueError: a line whose preset does not load or has a name unfit for a folder, or that sets
        ``--device`` / ``--out`` / ``--preset`` (the queue's).
    """
    chunks = []
    for number, line in enumerate(text.splitlines(), 1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        taken = [w for w in words[1:] if w.split("=")[0] in ("--device", "--out", "--preset")]
        if taken:
            raise ValueError(f"queue line {number}: {taken[0].split('=')[0]} is set by the queue; remove it "
                             f"from {line.strip()!r}")
        chunk = Chunk(words[0], tuple(words[1:]))
        try:
            name = chunk.name
        except ValueError as exc:
            raise ValueError(f"queue line {number}: {exc}") from None
        if not _SAFE_NAME.match(name):
            raise ValueError(f"queue line {number}: preset name {name!r} names a folder and an archive member: use "
                             "letters, digits and _.=+- only")
        chunks.append(chunk)
    if not chunks:
        raise ValueError("the queue has no chunk: give lines 'PRESET tpo-gym-bench-arguments'")
    return chunks


def _records(folder: Path) -> dict[str, bytes]:
    """``{file name: bytes}`` of the run records (``*.json``, ``*.json.gz``) in ``folder``."""
    if not folder.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and p.name.endswith((".json", ".json.gz"))}


def seed_committed(results: Path, work: Path, name: str) -> dict[str, bytes]:
    """Copy the committed records of preset ``name`` (``results/name/runs``) that ``work/name/runs`` lacks.

    :return: every committed record (a work record equal to one of them is not new).
    """
    committed = _records(results / name / "runs")
    runs = make_dirs(work / name / "runs")
    for file, data in committed.items():
        if not (runs / file).exists():
            atomic_write_bytes(runs / file, data)
    return committed


def new_records(work: Path, name: str, committed: dict[str, bytes]) -> dict[str, bytes]:
    """The records under ``work/name/runs`` that are not byte for byte a committed one."""
    return {f: d for f, d in _records(work / name / "runs").items() if committed.get(f) != d}


def run_chunk(chunk: Chunk, device: str, work: Path, seconds: float) -> int:
    """``tpo-gym bench`` of one chunk under ``timeout seconds`` (then SIGTERM; SIGKILL :data:`KILL_AFTER` s
    later): its exit status (124 when the deadline stopped it)."""
    command = ["timeout", f"--kill-after={KILL_AFTER}", f"{max(seconds, 1):.0f}",
               sys.executable, "-m", "tpo_gym.evaluation.cli", "bench", "--preset", chunk.preset, *chunk.args,
               "--device", device, "--out", str(work / chunk.name), "--no-progress"]
    print(f"\n$ {shlex.join(command)}", flush=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(command, check=False, env={**os.environ, "PYTHONPATH": path}).returncode


def _member_sizes(files: dict[str, bytes]) -> dict[str, int]:
    return {f: len(zlib.compress(d, 6)) + 512 for f, d in files.items()}


def pack(records: dict[str, dict[str, bytes]], manifests: dict[str, bytes], out: Path,
         limit: int = ARCHIVE_LIMIT) -> list[Path]:
    """Write ``records`` (``{preset: {file: bytes}}``) to ``out/runs-1.tar.gz``, ``runs-2.tar.gz``, ... as
    ``PRESET/runs/FILE``, each archive at most ``limit`` bytes: split where the members' compressed sizes
    (each compressed alone, a bound on their share of the archive) would pass ``limit`` less 1/16 (for the
    manifests and the tar headers). Each archive also holds ``PRESET/manifest.json`` of its presets;
    archives of an earlier run in ``out`` are removed.

    :raises ValueError: one record alone does not fit, or an archive came out over ``limit``.
    """
    members = [(name, f, d) for name in sorted(records) for f, d in sorted(records[name].items())]
    sizes = _member_sizes({f"{n}/{f}": d for n, f, d in members})
    room = limit - limit // 16
    parts: list[list[tuple[str, str, bytes]]] = [[]]
    used = 0
    for name, file, data in members:
        size = sizes[f"{name}/{file}"]
        if size > room:
            raise ValueError(f"record {name}/runs/{file} alone compresses to {size} bytes, over {room}")
        if used + size > room and parts[-1]:
            parts.append([])
            used = 0
        parts[-1].append((name, file, data))
        used += size
    for stale in out.glob("runs-*.tar.gz"):  # the archives in ``out`` are this run's
        stale.unlink()
    paths = []
    for i, part in enumerate(p for p in parts if p):
        path = out / f"runs-{i + 1}.tar.gz"
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name in sorted({n for n, _, _ in part}):
                if name in manifests:
                    _add(tar, f"{name}/manifest.json", manifests[name])
            for name, file, data in part:
                _add(tar, f"{name}/runs/{file}", data)
        if buffer.tell() > limit:
            raise ValueError(f"{path} came to {buffer.tell()} bytes, over the {limit}-byte limit")
        atomic_write_bytes(path, buffer.getvalue())
        paths.append(path)
    return paths


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _status(code: int) -> str:
    return {0: "finished", 1: "finished, with failed runs", 124: "stopped at the deadline",
            130: "interrupted", 137: "killed at the deadline"}.get(code, f"error (exit status {code})")


def run_queue(chunks: list[Chunk], seconds: float, device: str, work: Path, out: Path, results: Path,
              margin: float = 45.0, min_chunk: float = 30.0) -> list[str]:
    """Work through ``chunks`` until ``seconds`` from now less ``margin`` (kept for packing), then pack the
    new records into ``out``; a chunk starts only with ``min_chunk`` seconds left.

    :return: the lines of the summary (also written to ``out/queue.txt``).
    """
    deadline = time.monotonic() + seconds - margin
    make_dirs(out)
    committed: dict[str, dict[str, bytes]] = {}
    lines = [f"queue on {device}: {len(chunks)} chunk(s), {seconds:.0f} s available ({margin:.0f} s kept for "
             "packing)", ""]
    for chunk in chunks:
        name = chunk.name
        left = deadline - time.monotonic()
        if left < min_chunk:
            lines.append(f"not started ({left:.0f} s left): {chunk}")
            continue
        if name not in committed:
            committed[name] = seed_committed(results, work, name)
        before = len(new_records(work, name, committed[name]))
        start = time.monotonic()
        code = run_chunk(chunk, device, work, left)
        made = len(new_records(work, name, committed[name])) - before
        lines.append(f"{_status(code)} in {time.monotonic() - start:.0f} s, {made} new record(s): {chunk}")
    records = {n: new_records(work, n, c) for n, c in committed.items()}
    records = {n: r for n, r in records.items() if r}
    manifests = {n: m.read_bytes() for n in records if (m := work / n / "manifest.json").is_file()}
    failed = sum(json.loads(d).get("status") != "ok" for r in records.values() for d in r.values())
    paths = pack(records, manifests, out)
    lines += ["", f"{sum(len(r) for r in records.values())} new record(s) ({failed} failed) of "
                  f"{', '.join(f'{n} ({len(r)})' for n, r in records.items()) or 'no preset'}"]
    lines += [f"{p.name}: {p.stat().st_size / 2**20:.2f} MiB" for p in paths]
    if len(paths) > MAX_ARCHIVES:
        lines.append(f"WARNING: {len(paths)} archives; only {MAX_ARCHIVES} fit among the 8 files that come back")
    lines += ["", "after the window: python benchmarks/gpu_queue.py unpack runs-*.tar.gz, then "
                  "tpo-gym report benchmarks/results/PRESET"]
    (out / "queue.txt").write_text("\n".join(lines) + "\n")
    return lines


def _read_archive(path: Path) -> Iterable[tuple[str, str, bytes]]:
    """``(preset, member, bytes)`` of an archive written by :func:`pack`; ``member`` is ``manifest.json`` or
    ``runs/FILE.json``. Reads members only (nothing is extracted, no link followed).

    :raises ValueError: a member that is not a plain file named ``PRESET/manifest.json`` or ``PRESET/runs/X.json``.
    """
    with tarfile.open(path, mode="r:gz") as tar:
        for info in tar:
            parts = info.name.split("/")
            ok = info.isfile() and all(_SAFE_NAME.match(p) for p in parts) and (
                parts[1:] == ["manifest.json"] or (len(parts) == 3 and parts[1] == "runs"
                                                   and parts[2].endswith((".json", ".json.gz"))))
            if not ok:
                raise ValueError(f"{path}: unexpected member {info.name!r} (an archive of gpu_queue.py holds "
                                 "PRESET/manifest.json and PRESET/runs/RUN.json(.gz) files only)")
            data = tar.extractfile(info).read()  # type: ignore[union-attr]
            yield parts[0], "/".join(parts[1:]), data


def unpack(archives: list[Path], results: Path) -> list[str]:
    """Put the records of ``archives`` into ``results/PRESET/runs/``: each ``ok`` record (replacing a stored
    one of the same run), never a failed one (it stays in the archive, named in the returned lines). The
    archive's manifest becomes ``results/PRESET/manifest.json`` where there is none; otherwise its
    invocations (with the device they ran on) are added to the stored manifest's.

    :return: what was done, one line per preset and per failed record.
    :raises ValueError: a damaged archive or record.
    """
    written: dict[str, int] = {}
    compressed: dict[str, bool] = {}
    lines = []
    manifests: dict[str, dict[str, Any]] = {}
    for archive in archives:
        for name, member, data in _read_archive(archive):
            packed = member.endswith(".gz")
            try:
                text = gzip.decompress(data) if packed else data
                obj = json.loads(text)
            except (ValueError, OSError, EOFError, zlib.error) as exc:
                raise ValueError(f"{archive}: {name}/{member} is not JSON ({exc})") from None
            if member == "manifest.json":
                manifests[name] = obj
                continue
            run_id = member[len("runs/"):].removesuffix(".gz").removesuffix(".json")
            if not isinstance(obj, dict) or obj.get("run_id") != run_id:
                raise ValueError(f"{archive}: {name}/{member} is not a run record of that run")
            if obj.get("status") != "ok":
                last = (obj.get("traceback") or "").strip().splitlines()[-1:] or ["no traceback"]
                lines.append(f"not unpacked, failed: {name}/{member}: {last[0]}")
                continue
            runs = make_dirs(results / name / "runs")
            compress = _compressed_results(results / name) if name not in compressed else compressed[name]
            compressed[name] = compress
            plain, gz = runs / f"{run_id}.json", runs / f"{run_id}.json.gz"
            if compress:
                atomic_write_bytes(gz, data if packed else gzip.compress(text, compresslevel=9, mtime=0))
            else:
                atomic_write_bytes(plain, text)
            stale = plain if compress else gz
            if stale.is_file():
                stale.unlink()
            written[name] = written.get(name, 0) + 1
    for name, manifest in manifests.items():
        path = results / name / "manifest.json"
        if not path.is_file():
            atomic_write_json(make_dirs(path.parent) / "manifest.json", manifest)
            continue
        stored = json.loads(path.read_text())
        seen = {i.get("started") for i in stored.get("invocations", [])}
        added = [dict(i, device=manifest.get("device")) for i in manifest.get("invocations", [])
                 if i.get("started") not in seen]
        if added:
            stored["invocations"] = stored.get("invocations", []) + added
            atomic_write_json(path, stored)
    for name, count in written.items():
        lines.insert(0, f"{count} record(s) -> {results / name / 'runs'}; next: tpo-gym report {results / name} "
                        "(--seeds N / --settings A,B to widen the report's selection)")
    return lines


def _compressed_results(folder: Path) -> bool:
    """Whether the committed records in ``folder`` are stored compressed (its manifest's ``compress_records``)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("compress_records") is True


def main(argv: list[str] | None = None) -> int:
    """Command line: ``list``, ``run`` or ``unpack`` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="gpu_queue.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("list", "run"):
        p = sub.add_parser(name)
        p.add_argument("--queue", type=Path, default=None, help="a queue file (default: the QUEUE of this module)")
    run = sub.choices["run"]
    run.add_argument("--seconds", type=float, required=True, help="seconds this command may take in all")
    run.add_argument("--device", default="cuda")
    run.add_argument("--margin", type=float, default=45.0, help="seconds kept for packing (default 45)")
    run.add_argument("--out", type=Path, default=Path("/tmp/gpu_session"), help="where the archives go")
    run.add_argument("--work", type=Path, default=Path("/tmp/gpu_work"), help="the chunks' bench folders")
    for p in (run, sub.add_parser("unpack")):
        p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results",
                       help="the committed results (default: benchmarks/results)")
    sub.choices["unpack"].add_argument("archives", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "unpack":
            print("\n".join(unpack(args.archives, args.results)))
            return 0
        chunks = parse_queue(args.queue.read_text() if args.queue else QUEUE)
        if args.command == "list":
            print("\n".join(f"{i + 1}. {c}" for i, c in enumerate(chunks)))
            return 0
        print("\n".join(run_queue(chunks, args.seconds, args.device, args.work, args.out, args.results,
                                  args.margin)))
    except (OSError, ValueError, tarfile.TarError) as exc:
        print(f"gpu_queue.py {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
