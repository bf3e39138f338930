"""The manifest's index of imported methods and runs (``tpo-gym import``), read by the importer and by the report;
re-exported by :mod:`tpo_gym.evaluation.importer`."""

from __future__ import annotations

from typing import Any

__all__ = ["IMPORTED_FIELD", "imported_methods"]

#: The manifest field that lists the imported methods and runs.
IMPORTED_FIELD = "imported"


def imported_methods(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's :data:`IMPORTED_FIELD` (``{}`` when absent), its structure checked.

    :raises ValueError: one line naming the entry that is not ``{method: {"algo": text, "runs": {run_id:
        {"setting": text, "seed": int >= 0, "config_hash": text, "source": text}}}}``.
    """
    index = manifest.get(IMPORTED_FIELD, {})
    shape = ('{method: {"algo": text, "runs": {run_id: {"setting": text, "seed": integer >= 0, "config_hash": '
             'text, "source": text}}}}')
    if not isinstance(index, dict):
        raise ValueError(f"field {IMPORTED_FIELD!r} must be {shape}")
    for method, entry in index.items():
        runs = entry.get("runs") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("algo"), str) or not isinstance(runs, dict):
            raise ValueError(f"field {IMPORTED_FIELD!r}, method {method!r:.60}, must be {shape}")
        for run_id, run in runs.items():
            if not (isinstance(run, dict) and all(isinstance(run.get(k), str) for k in ("setting", "config_hash",
                                                                                        "source"))
                    and isinstance(run.get("seed"), int) and not isinstance(run["seed"], bool) and run["seed"] >= 0):
                raise ValueError(f"field {IMPORTED_FIELD!r}, run {run_id!r:.80}, must be {shape}")
    return index
