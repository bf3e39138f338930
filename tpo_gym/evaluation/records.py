"""The one validator of run records: a stored ``runs/<run_id>.json`` (or ``.json.gz``) and the rows of a run
rebuilt from ``results.jsonl`` pass the same checks before a report or a resumed bench uses them.

A record is a JSON object with ``status`` ``"ok"`` or ``"failed"``, ``rows`` (a list of row objects; at least
one in an ``"ok"`` record), and optionally ``traceback`` (text or null) and ``wall_s`` (a number or null).
A row holds ``step`` (an integer >= 0) and numbers (or null) under other keys. The values of the keys a
preset's metrics read (:attr:`~tpo_gym.evaluation.presets.Preset.metric_keys`) must be finite, within
+-:data:`MAX_ABS_VALUE`, and a rate (``error``, ``*_error``, ``*_accuracy``, ``*_fraction``) in [0, 1]; the
other keys are diagnostics, where NaN means "not defined at this step" and is kept.

A record that fails is refused with one line naming the file, the field and what is allowed
(:class:`RecordError`): a report shows it as refused, and a bench runs it again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from typing import Any

from tpo_gym._validation import INT64_MAX

__all__ = ["MAX_ABS_VALUE", "RECORD_STATUSES", "RecordError", "validate_record"]

#: The statuses a run record may have.
RECORD_STATUSES = ("ok", "failed")
#: The largest magnitude of a metric value: far past any error, score or norm a run logs, and small enough
#: that a scaled seed mean of many of them stays finite.
MAX_ABS_VALUE = 1e100
#: Metric keys that are rates, in [0, 1] (a float rounding error past either end is allowed).
_RATE_KEY = re.compile(r"^(.*_)?(error|accuracy|fraction)$")
_RATE_SLACK = 1e-9


class RecordError(ValueError):
    """A run record that cannot be used: one line naming the file (or line), the field and what is allowed."""


def _show(value: Any) -> str:
    """``value`` for an error message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_metric(source: str, field: str, key: str, value: float) -> None:
    """A metric value: finite, within +-:data:`MAX_ABS_VALUE`, a rate in [0, 1]."""
    if _RATE_KEY.match(key):
        if not (math.isfinite(value) and -_RATE_SLACK <= value <= 1 + _RATE_SLACK):
            raise RecordError(f"{source}: {field} must be a rate, a finite number in [0, 1], got {_show(value)}")
    elif not (math.isfinite(value) and abs(value) <= MAX_ABS_VALUE):
        raise RecordError(f"{source}: {field} must be a finite number within +-{MAX_ABS_VALUE:g}, got "
                          f"{_show(value)}")


def _check_row(source: str, where: str, row: Any, metric_keys: Collection[str]) -> None:
    """One logged row: ``step`` an integer >= 0, every other value a number or null, metrics in range."""
    if not isinstance(row, dict):
        raise RecordError(f"{source}: {where} must be an object of logged values, got {_show(row)}")
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= INT64_MAX:
        raise RecordError(f"{source}: {where} field 'step' must be an integer >= 0, got {_show(step)}")
    for key, value in row.items():
        if value is None or key == "step":
            continue
        if not _is_number(value):
            raise RecordError(f"{source}: {where} field {key!r} must be a number or null, got {_show(value)}")
        if key in metric_keys:
            _check_metric(source, f"{where} field {key!r}", key, float(value))


def validate_record(rec: Any, source: str, metric_keys: Collection[str] = (),
                    row_names: Sequence[str] | None = None) -> dict[str, Any]:
    """``rec`` if it is a valid run record, else :class:`RecordError`.

    :param source: what the record was read from (a file), first in every message.
    :param metric_keys: the logged keys a report computes its metrics from (checked finite and in range).
    :param row_names: how to name each row in a message (default ``rows[i]``; ``results.jsonl`` names lines).
    """
    if not isinstance(rec, dict):
        raise RecordError(f"{source}: a run record must be a JSON object, got {type(rec).__name__}")
    status = rec.get("status")
    if status not in RECORD_STATUSES:
        raise RecordError(f"{source}: field 'status' must be one of {list(RECORD_STATUSES)}, got {_show(status)}")
    if "rows" not in rec:
        raise RecordError(f"{source}: missing field 'rows' (a list of logged rows)")
    rows = rec["rows"]
    if not isinstance(rows, list):
        raise RecordError(f"{source}: field 'rows' must be a list of logged rows, got {type(rows).__name__}")
    if status == "ok" and not rows:
        raise RecordError(f"{source}: field 'rows' is empty; an 'ok' run logs at least one row")
    if not isinstance(rec.get("traceback"), str | None):
        raise RecordError(f"{source}: field 'traceback' must be text or null, got {_show(rec['traceback'])}")
    wall = rec.get("wall_s")
    if wall is not None and not _is_number(wall):
        raise RecordError(f"{source}: field 'wall_s' must be a number of seconds or null, got {_show(wall)}")
    if status == "ok":
        names = row_names if row_names is not None else [f"rows[{i}]" for i in range(len(rows))]
        for where, row in zip(names, rows, strict=True):
            _check_row(source, where, row, metric_keys)
    return rec
