"""Atomic file writes: an exclusive temporary file in the target's directory, fsync, then ``os.replace``.

The one place tpo-gym writes its user-visible files (agent zips, run records, manifests, reports).
The temporary file is made by ``tempfile.mkstemp`` (``O_CREAT | O_EXCL``, a random name), so a file
or symlink planted next to the target is never opened, followed or overwritten; readers see the old
file or the new one, never half of it.

Files are left readable by others (mode ``0o644`` less the process umask) and directories are
created ``0o755`` less the umask, like files written with ``open``; ``tempfile.mkstemp`` alone
would leave every file private (``0o600``).

This module sits at the bottom of the package: it imports nothing from ``tpo_gym``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["FILE_MODE", "DIR_MODE", "current_umask", "make_dirs", "atomic_writer", "atomic_write_bytes",
           "atomic_write_text", "atomic_write_json", "parse_json", "read_json", "gzip_json_bytes", "read_json_gz"]

#: Mode of every written file before the umask is applied.
FILE_MODE = 0o644
#: Mode of every created directory before the umask is applied.
DIR_MODE = 0o755


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux ``/proc``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: read by setting and restoring it
    os.umask(mask)
    return mask


def make_dirs(path: str | os.PathLike[str]) -> Path:
    """``mkdir -p`` with mode :data:`DIR_MODE` (less the umask) for every directory it creates."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):  # parents first, each with DIR_MODE (mkdir -p would use 0o777)
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a directory")
    return path


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """Open a binary file whose content replaces ``path`` atomically when the ``with`` block ends.

    The data goes to an exclusively created temporary file in ``path``'s directory; on success it
    is flushed, fsynced, given mode :data:`FILE_MODE` less the umask and renamed over ``path``; on
    an error it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    make_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, FILE_MODE & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (readers see the old file or the new one, never half).

    The file gets mode :data:`FILE_MODE` less the umask.
    """
    with atomic_writer(path) as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")


def parse_json(data: bytes | str, source: str) -> Any:
    """``data`` (UTF-8 bytes or text) parsed as JSON, never running code from it.

    :raises ValueError: one line naming ``source`` and what is wrong: not UTF-8 text, not JSON, nested
        too deeply (Python's recursion limit), or an integer too long to convert (Python's digit limit).
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ValueError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start}); JSON files are "
                         "UTF-8") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply to read") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise ValueError(f"{source}: holds an integer with more digits than Python converts "
                             f"({sys.get_int_max_str_digits()})") from None
        raise ValueError(f"{source}: not valid JSON ({exc})") from None


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file (UTF-8).

    :raises ValueError: it is not UTF-8 JSON (see :func:`parse_json`), naming the path.
    """
    return parse_json(Path(path).read_bytes(), str(path))


def gzip_json_bytes(obj: Any) -> bytes:
    """``obj`` as indented JSON, gzip-compressed with no time stamp (the same object gives the same bytes)."""
    text = json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n"
    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


def read_json_gz(path: str | os.PathLike[str], max_bytes: int) -> Any:
    """Read a gzip-compressed JSON file, refusing one that holds more than ``max_bytes`` once decompressed.

    :raises ValueError: the file is not gzip data, is truncated, holds more than ``max_bytes`` bytes or is
        not JSON (each named with the path).
    """
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"{path}: not a complete gzip file ({exc})") from exc
    if len(data) > max_bytes:
        raise ValueError(f"{path}: holds more than {max_bytes} bytes once decompressed")
    return parse_json(data, f"{path} (decompressed)")
