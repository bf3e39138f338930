"""Atomic file writes of the harness: the names of :mod:`tpo_gym._io`, the package's one write helper."""

from __future__ import annotations

from tpo_gym._io import (
    DIR_MODE,
    FILE_MODE,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    atomic_writer,
    current_umask,
    gzip_json_bytes,
    make_dirs,
    parse_json,
    read_json,
    read_json_gz,
)

__all__ = ["FILE_MODE", "DIR_MODE", "current_umask", "make_dirs", "atomic_writer", "atomic_write_bytes",
           "atomic_write_text", "atomic_write_json", "parse_json", "read_json", "gzip_json_bytes", "read_json_gz"]
