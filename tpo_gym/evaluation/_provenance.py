"""Provenance of a benchmark: package versions and the git commit of the code that ran."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["package_versions", "git_commit"]


def package_versions() -> dict[str, str]:
    """Installed versions of tpo-gym and the libraries that determine its results."""
    out = {}
    for name in ("tpo-gym", "torch", "gymnasium", "stable-baselines3", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_commit() -> str:
    """``HEAD`` of the repository holding this package, or ``unknown``.

    ``+dirty`` is appended when any file of the package (``tpo_gym/``) is modified or untracked, i.e.
    when the code that ran is not exactly the commit.
    """
    here = Path(__file__).resolve().parent
    package = here.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(package)], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
