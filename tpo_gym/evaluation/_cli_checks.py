"""The ``tpo-gym`` command's argument checks and its one-line exits (used by :mod:`tpo_gym.evaluation.cli`): an
error (no usage, no traceback), a warning per refused stored record, a preset that does not load, an ``--out`` that
cannot hold a report."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tpo_gym.evaluation.presets import Preset, PresetError


def _positive_int(name: str, maximum: int | None = None):
    """An argparse type: an integer >= 1 (and <= ``maximum``), the error naming the flag ``name``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer >= 1, got {text!r:.40}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{name} must be <= {maximum}, got {value}")
        return value

    return parse


def _names(text: str | None) -> list[str] | None:
    """``"a, b"`` -> ``["a", "b"]``; ``None`` stays ``None`` (no filter)."""
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def _check_selection(command: str, args: argparse.Namespace) -> None:
    """A selection flag given but naming nothing (``--settings ""``, ``--methods ,``) is an error, never "all"."""
    for flag in ("settings", "methods", "setups"):
        text = getattr(args, flag)
        if text is not None and not _names(text):
            _fail(command, f"--{flag} {text!r} names nothing: give comma-separated names, or leave --{flag} out "
                           "for all")


def _check_run_count(command: str, preset: Preset, seeds: int | None, flag: int | None) -> None:
    """The selection's run count with ``seeds`` seeds fits (:data:`~tpo_gym.evaluation.presets.MAX_RUNS`),
    checked before any run is made; else one line naming ``--seeds`` (``flag``: its value, if given) and the
    limit."""
    try:
        preset.run_count(seeds)
    except PresetError as exc:
        _fail(command, f"--seeds {flag}: {exc}" if flag is not None else str(exc))


def _warn(command: str, refused: list[str], then: str = "") -> None:
    """One stderr line per stored record that was refused (cannot be read or is invalid)."""
    for line in refused:
        print(f"tpo-gym {command}: warning: refused stored record {line}{then}", file=sys.stderr)


def _fail(command: str, message: str, code: int = 2) -> None:
    """One line on stderr, no usage and no traceback, then exit."""
    print(f"tpo-gym {command}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _check_path_text(command: str, flag: str, text: str) -> None:
    """``text`` (a directory argument) must encode as UTF-8: the report writes it into report.md and
    manifest.json, so a name with undecodable bytes (``runs/\\xff``) is refused before anything runs."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _fail(command, f"{flag} {text!r} is not valid UTF-8 (it holds bytes no text encodes); use a UTF-8 name")


def _default_out(preset: Preset) -> Path:
    """``runs/<preset name>``, the default ``--out``: always one directory right under ``runs/`` (the name
    is validated as a safe name; this checks it once more before anything is written)."""
    out = Path("runs") / preset.name
    if out.parent != Path("runs") or preset.name in ("", ".", ".."):
        _fail("bench", f"preset name {preset.name!r} cannot name a directory under runs/: give --out")
    return out


def _check_out(out: Path) -> str | None:
    """Why ``out`` cannot hold a report (one line), or ``None``: creates it and writes a probe file."""
    from tpo_gym.evaluation._io import make_dirs

    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe == out and not out.is_dir():
        return f"--out {out} exists and is not a directory"
    if not probe.is_dir():
        return f"--out {out}: {probe} is a file, not a directory"
    try:
        make_dirs(out)
        fd, tmp = tempfile.mkstemp(prefix=".tpo-gym-probe.", dir=out)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        return f"--out {out} is not writable: {exc.strerror or exc}"
    return None


def _preset_error(parser: argparse.ArgumentParser, command: str, exc: PresetError) -> None:
    """Exit on a preset that does not load: one line (no usage) when an ``algo`` names no importable agent class,
    else argparse's usage and the message."""
    from tpo_gym.agents.common.registry import AlgorithmReferenceError

    if isinstance(exc.__cause__, AlgorithmReferenceError):
        _fail(command, str(exc))
    parser.error(str(exc))

