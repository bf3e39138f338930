"""Write a run record from your own training script, for ``tpo-gym import`` to add to a bench folder's report.

A script calls :meth:`RunLogger.log` once per logged step; the ``with`` block writes one record in the schema of
:mod:`~tpo_gym.evaluation.records` (version :data:`~tpo_gym.evaluation.records.RECORD_SCHEMA_VERSION`) atomically
when it ends: ``status`` ``"ok"``, or ``"failed"`` with the traceback when the block raises (the exception goes on).
Every logged row is checked as it is logged by the same validator a report uses, so a NaN error or a step that
does not increase is an error at the line that logs it, not a refused import later::

    with RunLogger("mypg_seed0.json", preset="quick", setting="rev. copy V=2 H=5 (tuned)", method="MyPG",
                   seed=0) as log:
        for step in range(70):
            ...  # one iteration of your algorithm
            log.log(step=step, error=error, loss=loss)

Then ``tpo-gym import mypg_seed0.json --out runs/quick`` (docs: "Runs from a script").
"""

from __future__ import annotations

import json
import numbers
import os
import platform
import time
import traceback as tb
from pathlib import Path
from types import TracebackType
from typing import Any

from tpo_gym._validation import check_int
from tpo_gym.evaluation._io import atomic_write_bytes, atomic_write_json, gzip_json_bytes
from tpo_gym.evaluation.presets import PresetError, load_preset, resolve_names
from tpo_gym.evaluation.records import RECORD_SCHEMA_VERSION, RecordError, validate_record

__all__ = ["RunLogger"]


def _number(name: str, value: Any) -> int | float | None:
    """``value`` as a JSON number: Python and numpy numbers, one-element arrays and tensors (``.item()``), or
    ``None``; ``ValueError`` naming ``name`` for anything else (text, a bool, a vector)."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, numbers.Number):  # numpy and torch scalars
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            raise ValueError(f"log({name}=...) takes one number, got {type(value).__name__} of shape "
                             f"{tuple(getattr(value, 'shape', ()))}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"log({name}=...) takes a number (int, float, a numpy or one-element torch scalar) or "
                         f"None, got {value!r:.60} ({type(value).__name__})")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _json_data(name: str, value: Any) -> dict[str, Any]:
    """A copy of ``value`` if it is a JSON object of plain data (what a record stores), else ``ValueError``."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict of plain JSON data, got {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{name} must be plain JSON data (text, numbers, bools, lists, dicts; finite numbers): "
                         f"{exc}") from None


class RunLogger:
    """One run of your own algorithm, logged row by row and written as a run record when the ``with`` block ends.

    :param path: where the record goes: a ``.json`` file, or ``.json.gz`` (gzip-compressed).
    :param preset: the preset whose report the run joins: a packaged preset's name or a preset ``.json`` file.
    :param setting: the preset's setting (column) the run belongs to, e.g. ``"V=2 (reference)"``; exact, or any case.
    :param method: the name of your method: the report's row, which must not be one of the preset's methods
        (letters, digits, spaces and ``_.=+-()``).
    :param seed: the run's seed, an integer >= 0 (the report shows seeds ``0 .. seeds-1``).
    :param algo: the algorithm's name (default: ``method``).
    :param kind: the setting's run kind; default: read from the preset. Give it to log for a preset this
        tpo-gym cannot load (the import checks it against the bench folder's preset).
    :param params: your run's configuration (plain JSON data); with ``algo``, ``kind``, ``seed`` and
        ``method_kwargs`` it makes the run's configuration hash.
    :param method_kwargs: your method's arguments (plain JSON data).
    :param metric_keys: the logged keys checked finite and in range as they are logged (default: the preset's
        :attr:`~tpo_gym.evaluation.presets.Preset.metric_keys`, else ``error``).
    :raises ValueError: an argument that is not allowed (an unknown setting, say), naming it and what is allowed.

    Each :meth:`log` row is checked at once; on exit, a block that ended normally writes ``status`` ``"ok"`` (at
    least one row logged, else :class:`~tpo_gym.evaluation.records.RecordError`), one that raised an
    ``Exception`` writes ``"failed"`` with its traceback and the rows logged until then; ``KeyboardInterrupt``
    and ``SystemExit`` write nothing, as an interrupted bench run leaves no record.
    """

    def __init__(self, path: str | os.PathLike[str], *, preset: str, setting: str, method: str, seed: int,
                 algo: str | None = None, kind: str | None = None, params: dict[str, Any] | None = None,
                 method_kwargs: dict[str, Any] | None = None, metric_keys: list[str] | None = None) -> None:
        self.path = Path(path)
        if not self.path.name.endswith((".json", ".json.gz")):
            raise ValueError(f"path must name a .json or .json.gz file, got {str(path)!r}")
        if not isinstance(preset, str) or not preset:
            raise ValueError(f"preset must be a preset name or .json file, got {preset!r}")
        keys = set(metric_keys or ())
        if kind is None:
            try:
                loaded = load_preset(preset)
                (setting,) = resolve_names([setting], [s["name"] for s in loaded.settings],
                                           f"preset {loaded.name!r}", "settings")
            except PresetError as exc:
                raise ValueError(f"{exc} (give kind=... to log for a preset this tpo-gym cannot load)") from None
            preset, kind = loaded.name, next(s["kind"] for s in loaded.settings if s["name"] == setting)
            keys |= set(metric_keys or loaded.metric_keys)
        self.metric_keys = frozenset(keys or {"error"})
        self.spec = {"preset": preset, "kind": kind, "method": method, "algo": method if algo is None else algo,
                     "setting": setting, "seed": check_int("seed", seed, minimum=0),
                     "params": _json_data("params", {} if params is None else params),
                     "method_kwargs": _json_data("method_kwargs", {} if method_kwargs is None else method_kwargs)}
        try:
            validate_record({"status": "failed", "rows": [], "spec": self.spec}, "RunLogger", strict=True)
        except RecordError as exc:
            raise ValueError(str(exc).replace("field 'spec.", "argument '")) from None
        self.rows: list[dict[str, Any]] = []
        self.counts = {"env_interactions": 0, "reward_queries": 0}
        self._counted = False
        self._started = time.perf_counter()

    def __enter__(self) -> RunLogger:
        self._started = time.perf_counter()
        return self

    def log(self, step: int | None = None, **values: Any) -> dict[str, Any]:
        """Log one row: ``step`` (default: the last step + 1, or 0) and numbers (or ``None``) by name.

        :return: the row as stored.
        :raises ValueError: a step that is not an integer above the last one, or a value that is not a number.
        :raises RecordError: a value the report could not use: a metric key (``error``) that is NaN, infinite or a
            rate outside [0, 1], or a key reserved for naming runs (``run_id``, ``method``, ...).
        """
        last = self.rows[-1]["step"] if self.rows else -1
        step = last + 1 if step is None else check_int("step", step, minimum=last + 1)
        row = {"step": step, **{name: _number(name, value) for name, value in values.items()}}
        record = {"status": "ok", "rows": [row], "spec": self.spec}
        validate_record(record, str(self.path), self.metric_keys, [f"log(step={step})"], strict=True)
        self.rows.append(row)
        return row

    def count(self, env_interactions: int = 0, reward_queries: int = 0) -> None:
        """Add to the run's totals of environment steps taken and rewards asked for (the record's
        ``env_interactions`` and ``reward_queries``; written only once this is called)."""
        self.counts["env_interactions"] += check_int("env_interactions", env_interactions, minimum=0)
        self.counts["reward_queries"] += check_int("reward_queries", reward_queries, minimum=0)
        self._counted = True

    def record(self, status: str = "ok", traceback: str | None = None) -> dict[str, Any]:
        """The record as it would be written now with ``status`` (``"ok"`` or ``"failed"``), validated.

        :raises RecordError: it is not a valid record (an ``"ok"`` one without rows, say).
        """
        rec: dict[str, Any] = {"schema_version": RECORD_SCHEMA_VERSION, "spec": self.spec, "status": status,
                               "rows": self.rows, "traceback": traceback,
                               "wall_s": round(time.perf_counter() - self._started, 3), "host": platform.node()}
        if self._counted:
            rec.update(self.counts)
        return validate_record(rec, str(self.path), self.metric_keys, strict=True)

    def write(self, status: str = "ok", traceback: str | None = None) -> Path:
        """Write :meth:`record` to :attr:`path` atomically (readers see the old file or the new one).

        :return: the path written.
        """
        rec = self.record(status, traceback)
        if self.path.name.endswith(".gz"):
            return atomic_write_bytes(self.path, gzip_json_bytes(rec))
        return atomic_write_json(self.path, rec)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 trace: TracebackType | None) -> bool:
        if exc is None:
            self.write("ok")
        elif isinstance(exc, Exception):
            self.write("failed", "".join(tb.format_exception(exc_type, exc, trace)))
        return False
