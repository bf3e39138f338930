"""The one validator of run records: a stored ``runs/<run_id>.json`` (or ``.json.gz``), the rows of a run
rebuilt from ``results.jsonl`` and a record written by a script (:class:`~tpo_gym.evaluation.run_logger.RunLogger`,
added to a bench folder by ``tpo-gym import``) pass the same checks before a report or a resumed bench uses them.

**The run-record schema, version 1** (:data:`RECORD_SCHEMA_VERSION`). A record is a JSON object:

======================  =========  =====================================================================================
field                   required   what it holds
======================  =========  =====================================================================================
``schema_version``      no         ``1``; a record without it is version 1 (every record of tpo-gym before the field)
``spec``                to import  the run: ``preset``, ``kind``, ``method``, ``algo``, ``setting`` (text), ``seed`` (an
                                   integer >= 0), ``params`` (an object: the run's configuration), ``method_kwargs`` (an
                                   object, optional)
``status``              yes        ``"ok"`` or ``"failed"``
``rows``                yes        a list of row objects, one per logged step (at least one in an ``"ok"`` record)
``traceback``           no         text or null: why a ``"failed"`` run failed
``wall_s``              no         a number of seconds or null
``host``                no         text or null: the machine the run ran on
``env_interactions``    no         an integer >= 0 or null: environment steps the run took
``reward_queries``      no         an integer >= 0 or null: rewards the run asked the environment for
``config_hash``         no         text: the hash of the run's configuration (a bench sets it; an imported record's
                                   is its own spec's, :attr:`~tpo_gym.evaluation.presets.RunSpec.config_hash`)
======================  =========  =====================================================================================

A row holds ``step`` (an integer >= 0) and numbers (or null) under other keys. The values of the keys a
preset's metrics read (:attr:`~tpo_gym.evaluation.presets.Preset.metric_keys`, ``error`` for most) must be finite,
within +-:data:`MAX_ABS_VALUE`, and a rate (``error``, ``*_error``, ``*_accuracy``, ``*_fraction``) in [0, 1]; the
other keys are diagnostics, where NaN means "not defined at this step" and is kept. A record from outside
(``strict=True``: what ``tpo-gym import`` reads) must also have its ``spec``, steps that increase from row to row,
``spec.params`` nested at most :data:`MAX_SPEC_DEPTH` levels, and no row key that names a run
(:data:`RESERVED_ROW_KEYS`).

A record that fails is refused with one line naming the file, the field and what is allowed
(:class:`RecordError`): a report shows it as refused, a bench runs it again, and ``tpo-gym import`` imports
nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from typing import Any

from tpo_gym._validation import INT64_MAX

__all__ = ["MAX_ABS_VALUE", "MAX_SPEC_DEPTH", "RECORD_SCHEMA_VERSION", "RECORD_STATUSES", "RESERVED_ROW_KEYS",
           "SPEC_FIELDS", "RecordError", "validate_record"]

#: The version of the run-record schema this tpo-gym writes and reads; a record without ``schema_version`` is 1.
RECORD_SCHEMA_VERSION = 1
#: The statuses a run record may have.
RECORD_STATUSES = ("ok", "failed")
#: The fields of a record's ``spec`` that a record from outside must have, and their JSON types.
SPEC_FIELDS = {"preset": str, "kind": str, "method": str, "algo": str, "setting": str, "seed": int, "params": dict}
#: How deeply ``spec.params`` of a record from outside may nest (objects and lists within each other).
MAX_SPEC_DEPTH = 32
#: Row keys a record from outside may not log: ``results.jsonl`` names a row's run with them.
RESERVED_ROW_KEYS = ("run_id", "method", "setting", "seed", "config_hash")
#: The longest text of a spec field (a method name, say).
_MAX_TEXT = 200
#: What a preset, setting or method name of a spec may hold (as in a preset: they name report rows and columns).
_NAME = re.compile(r"^[A-Za-z0-9_.=+\-() ]+$")
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


def _check_row(source: str, where: str, row: Any, metric_keys: Collection[str], strict: bool = False) -> None:
    """One logged row: ``step`` an integer >= 0, every other value a number or null, metrics in range; ``strict``:
    no key of :data:`RESERVED_ROW_KEYS`."""
    if not isinstance(row, dict):
        raise RecordError(f"{source}: {where} must be an object of logged values, got {_show(row)}")
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= INT64_MAX:
        raise RecordError(f"{source}: {where} field 'step' must be an integer >= 0, got {_show(step)}")
    for key, value in row.items():
        if strict and key in RESERVED_ROW_KEYS:
            raise RecordError(f"{source}: {where} field {key!r} is reserved (results.jsonl names a run with "
                              f"{', '.join(RESERVED_ROW_KEYS)}); log it under another name")
        if value is None or key == "step":
            continue
        if not _is_number(value):
            raise RecordError(f"{source}: {where} field {key!r} must be a number or null, got {_show(value)}")
        if key in metric_keys:
            _check_metric(source, f"{where} field {key!r}", key, float(value))


def _depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests lists and objects, counted up to ``limit + 1`` (no deeper, and no recursion)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > limit:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest


def _check_spec(source: str, spec: Any) -> None:
    """``spec`` of a record from outside: every field of :data:`SPEC_FIELDS`, of its type; text printable and at
    most 200 characters, ``seed`` >= 0, ``params`` nested at most :data:`MAX_SPEC_DEPTH` levels."""
    if spec is None:
        raise RecordError(f"{source}: missing field 'spec' (the run: {', '.join(SPEC_FIELDS)})")
    if not isinstance(spec, dict):
        raise RecordError(f"{source}: field 'spec' must be an object ({', '.join(SPEC_FIELDS)}), got {_show(spec)}")
    for key, kind in SPEC_FIELDS.items():
        if key not in spec:
            raise RecordError(f"{source}: missing field 'spec.{key}' (the spec holds {', '.join(SPEC_FIELDS)})")
        value = spec[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            what = {str: "text", int: "an integer >= 0", dict: "an object"}[kind]
            raise RecordError(f"{source}: field 'spec.{key}' must be {what}, got {_show(value)}")
        if kind is str and not (0 < len(value) <= _MAX_TEXT and value.isprintable() and value.strip() == value):
            raise RecordError(f"{source}: field 'spec.{key}' must be printable text of 1 to {_MAX_TEXT} characters "
                              f"without surrounding spaces, got {_show(value)}")
    for key in ("preset", "setting", "method"):
        if not _NAME.match(spec[key]):
            raise RecordError(f"{source}: field 'spec.{key}' may hold letters, digits, spaces and _.=+-() only, got "
                              f"{_show(spec[key])}")
    if not 0 <= spec["seed"] <= INT64_MAX:
        raise RecordError(f"{source}: field 'spec.seed' must be an integer >= 0, got {_show(spec['seed'])}")
    if not isinstance(spec.get("method_kwargs", {}), dict):
        raise RecordError(f"{source}: field 'spec.method_kwargs' must be an object, got "
                          f"{_show(spec['method_kwargs'])}")
    for key in ("params", "method_kwargs"):
        if _depth(spec.get(key, {}), MAX_SPEC_DEPTH) > MAX_SPEC_DEPTH:
            raise RecordError(f"{source}: field 'spec.{key}' nests deeper than {MAX_SPEC_DEPTH} levels")


def _check_metadata(source: str, rec: dict[str, Any]) -> None:
    """The optional fields: ``schema_version`` (1 when absent), ``traceback``, ``wall_s``, ``host`` and the counts."""
    version = rec.get("schema_version", RECORD_SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordError(f"{source}: field 'schema_version' must be an integer (this tpo-gym reads version "
                          f"{RECORD_SCHEMA_VERSION}), got {_show(version)}")
    if version > RECORD_SCHEMA_VERSION:
        raise RecordError(f"{source}: field 'schema_version' is {version}, newer than this tpo-gym reads "
                          f"({RECORD_SCHEMA_VERSION}); upgrade tpo-gym to read it")
    if not isinstance(rec.get("traceback"), str | None):
        raise RecordError(f"{source}: field 'traceback' must be text or null, got {_show(rec['traceback'])}")
    wall = rec.get("wall_s")
    if wall is not None and not _is_number(wall):
        raise RecordError(f"{source}: field 'wall_s' must be a number of seconds or null, got {_show(wall)}")
    if not isinstance(rec.get("host"), str | None):
        raise RecordError(f"{source}: field 'host' must be text or null, got {_show(rec['host'])}")
    for key in ("env_interactions", "reward_queries"):
        count = rec.get(key)
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise RecordError(f"{source}: field {key!r} must be an integer >= 0 or null, got {_show(count)}")


def validate_record(rec: Any, source: str, metric_keys: Collection[str] = (),
                    row_names: Sequence[str] | None = None, strict: bool = False) -> dict[str, Any]:
    """``rec`` if it is a valid run record (the schema of this module's docstring), else :class:`RecordError`.

    :param rec: the parsed record (any JSON value).
    :param source: what the record was read from (a file), first in every message.
    :param metric_keys: the logged keys a report computes its metrics from (checked finite and in range).
    :param row_names: how to name each row in a message (default ``rows[i]``; ``results.jsonl`` names lines).
    :param strict: a record from outside (``tpo-gym import``): its ``spec`` is required and checked, its steps
        must increase, and no row key may be one of :data:`RESERVED_ROW_KEYS`.
    :return: ``rec``, unchanged.
    :raises RecordError: the first problem, in one line naming ``source`` and the field.
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
    _check_metadata(source, rec)
    if strict:
        _check_spec(source, rec.get("spec"))
    if status == "ok":
        names = row_names if row_names is not None else [f"rows[{i}]" for i in range(len(rows))]
        previous = -1
        for where, row in zip(names, rows, strict=True):
            _check_row(source, where, row, metric_keys, strict)
            if strict and row["step"] <= previous:
                raise RecordError(f"{source}: {where} field 'step' must be greater than the step before it "
                                  f"({previous}), got {row['step']}")
            previous = row["step"]
    return rec
