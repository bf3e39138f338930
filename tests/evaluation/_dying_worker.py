"""A task function for the crash-isolation test of the local pool: the worker running seed 0 dies at once,
as one killed by the kernel would (importable by the spawned worker processes)."""

from __future__ import annotations

import os
import time
from typing import Any


def run(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if specs[0]["seed"] == 0:
        os._exit(137)
    time.sleep(0.05)
    return [{"spec": s, "status": "ok", "rows": [], "traceback": None, "wall_s": 0.0} for s in specs]


def slow(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Seed 0 returns at once; the others write their process id to ``spec["pid_file"]`` and take a minute."""
    if specs[0]["seed"] != 0:
        with open(specs[0]["pid_file"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
    return [{"spec": s, "status": "ok", "rows": [], "traceback": None, "wall_s": 0.0} for s in specs]
