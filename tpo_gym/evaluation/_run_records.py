"""Where the record of a run lives under a bench's output directory (plain or gzip-compressed JSON), and reading
and writing it. Re-exported by :mod:`tpo_gym.evaluation.runner`."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from tpo_gym.evaluation._io import atomic_write_bytes, atomic_write_json, gzip_json_bytes, read_json, read_json_gz
from tpo_gym.evaluation.presets import RunSpec
from tpo_gym.evaluation.records import RecordError

#: A compressed run record holding more than this once decompressed is refused (a Table 1 run is ~0.4 MB).
MAX_RECORD_BYTES = 256 * 2**20


def _record_paths(out: Path, spec: RunSpec) -> tuple[Path, Path]:
    """``(plain, compressed)``: the two places the record of ``spec`` may be stored under ``out``."""
    base = Path(out) / "runs" / spec.run_id
    return base.with_name(base.name + ".json"), base.with_name(base.name + ".json.gz")


def record_path(out: Path, spec: RunSpec, compress: bool | None = None) -> Path:
    """Where the record of ``spec`` lives under ``out``.

    :param compress: ``None``: the stored record's path (``runs/<run_id>.json.gz`` if that exists, else
        ``runs/<run_id>.json``); ``True`` / ``False``: the path a new record of that form gets.
    """
    plain, packed = _record_paths(out, spec)
    if compress is None:
        regular = [p for p in (packed, plain) if p.is_file()]
        return regular[0] if regular else packed if os.path.lexists(packed) else plain
    return packed if compress else plain


def read_record(path: Path) -> Any:
    """The JSON content of the run record at ``path`` (``.json``, or ``.json.gz`` read with a size cap)."""
    return read_json_gz(path, MAX_RECORD_BYTES) if path.name.endswith(".gz") else read_json(path)


def read_stored(path: Path) -> Any:
    """The JSON content of the stored record at ``path``, which exists.

    :raises RecordError: it is not a regular file (a directory or fifo is never opened), or cannot be read
        or parsed.
    """
    try:
        regular = stat.S_ISREG(path.stat().st_mode)
    except OSError:  # a dangling link, say
        regular = False
    if not regular:
        raise RecordError(f"{path}: not a regular file (a directory, link to nothing, fifo or device); "
                          "move it away")
    try:
        return read_record(path)
    except OSError as exc:
        raise RecordError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise RecordError(str(exc)) from None


def write_record(out: Path, spec: RunSpec, rec: dict[str, Any], compress: bool) -> None:
    """Store ``rec`` as the one record of ``spec``: in the form asked for, the other form removed."""
    target = record_path(out, spec, compress)
    if compress:
        atomic_write_bytes(target, gzip_json_bytes(rec))
    else:
        atomic_write_json(target, rec)
    other = record_path(out, spec, not compress)
    if other.is_file() or other.is_symlink():
        other.unlink()
