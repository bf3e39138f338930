"""Safe save / load of the agents: plain JSON plus tensors read with ``weights_only=True``.

Stable-Baselines3 stores an agent's attributes as JSON whose non-JSON values are cloudpickled
(``":serialized:"`` fields), and unpickles them on load: a crafted file runs arbitrary code. A
tpo-gym agent file is a zip archive with exactly these entries, and loading executes nothing from it:

``tpo_gym.json``
    ``{"format": "tpo-gym-agent", "version": 1, "class": "TPO", "kwargs": {...}, "state": {...},
    "observation_space": {...}, "action_space": {...}, "tpo_gym_version": "..."}``: the constructor
    arguments as plain data (numbers, strings, lists, dicts; classes as ``{"__class__": "module:Name"}``
    restricted to torch and tpo_gym classes), the counters (``num_timesteps``, iteration, ...), the
    per-iteration ``history``, and the spaces described by their parameters.
``weights.pt``
    ``{"policy": state_dict, "optimizer": state_dict}``, read with ``torch.load(weights_only=True)``
    (tensors and plain containers only).

Every failure is an :class:`AgentFileError` naming the part that is wrong: not a zip / truncated, a
missing or repeated entry, an entry larger than its cap (:data:`MAX_JSON_BYTES`,
:data:`MAX_WEIGHTS_BYTES`, checked before it is read) or corrupt, a JSON entry that does not parse,
a field that is not plain data (an SB3 ``:serialized:`` value), a file written by another class, a
field missing, unknown or outside the schema ``save`` writes (:func:`check_agent_meta`, then the
agent's own constructor checks), weights that do not match the policy. A path is written atomically
through :func:`tpo_gym._io.atomic_writer`.
"""

from __future__ import annotations

import collections
import importlib
import io
import json
import math
import os
import pathlib
import re
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from tpo_gym._io import DIR_MODE, atomic_writer, make_dirs
from tpo_gym._validation import INT64_MAX, check_float, check_int

__all__ = [
    "FORMAT",
    "VERSION",
    "AgentFileError",
    "space_to_data",
    "space_from_data",
    "encode_value",
    "decode_value",
    "schedule_to_data",
    "schedule_from_data",
    "write_agent_file",
    "read_agent_file",
    "check_agent_meta",
    "setting_error",
    "check_space_sizes",
    "MAX_JSON_BYTES",
    "MAX_WEIGHTS_BYTES",
]

FORMAT = "tpo-gym-agent"
VERSION = 1
JSON_ENTRY = "tpo_gym.json"
WEIGHTS_ENTRY = "weights.pt"
#: Largest uncompressed size of the ``tpo_gym.json`` entry that :func:`read_agent_file` reads (64 MiB).
MAX_JSON_BYTES = 64 * 2**20
#: Largest uncompressed size of the ``weights.pt`` entry that :func:`read_agent_file` reads (16 GiB).
MAX_WEIGHTS_BYTES = 16 * 2**30
#: Module prefixes whose classes an agent file may name (``{"__class__": "module:Name"}``).
ALLOWED_MODULES = ("torch.nn", "torch.optim", "tpo_gym.")


class AgentFileError(ValueError):
    """An agent file that cannot be loaded safely: the message names the bad part."""


# --------------------------------------------------------------------------------------------
# spaces
# --------------------------------------------------------------------------------------------
def _floats(a: np.ndarray) -> list[Any]:
    return [float(x) if math.isfinite(float(x)) else str(float(x)) for x in np.asarray(a, dtype=np.float64).ravel()]


def space_to_data(space: spaces.Space) -> dict[str, Any]:
    """Describe a Gymnasium space by its parameters (JSON-able); raises ``ValueError`` for others."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": np.asarray(space.nvec).tolist(),
            "start": np.asarray(space.start).tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "low": _floats(space.low),
            "high": _floats(space.high),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "max_length": int(space.max_length),
            "min_length": int(space.min_length),
            "charset": "".join(sorted(space.character_set)),
        }
    raise ValueError(f"cannot save an agent with a {type(space).__name__} space (supported: Discrete, "
                     "MultiDiscrete, MultiBinary, Box, Text)")


def _space_dtype(data: dict[str, Any], field: str, kinds: str) -> np.dtype:
    value = data.get("dtype")
    try:
        dtype = np.dtype(value) if isinstance(value, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in kinds:
        raise AgentFileError(f"{field}.dtype must name a numpy {'integer' if kinds == 'iu' else 'number'} type, "
                             f"got {value!r}")
    return dtype


#: The fields :func:`space_to_data` writes for each space type.
SPACE_FIELDS = {
    "Discrete": {"type", "n", "start"},
    "MultiDiscrete": {"type", "nvec", "start", "dtype"},
    "MultiBinary": {"type", "n"},
    "Box": {"type", "shape", "low", "high", "dtype"},
    "Text": {"type", "max_length", "min_length", "charset"},
}


def space_from_data(data: Any, field: str) -> spaces.Space:
    """Rebuild a space described by :func:`space_to_data`; raises :class:`AgentFileError` naming ``field``.

    Every size is checked to be an integer in range (int64) before a space is built from it.
    """
    kind = data.get("type") if isinstance(data, dict) else None
    if not isinstance(kind, str) or kind not in SPACE_FIELDS:
        raise AgentFileError(f"{field} must be a space description with a type in {sorted(SPACE_FIELDS)}, got "
                             f"{data!r:.200}")
    odd = sorted(set(data) ^ SPACE_FIELDS[kind])
    if odd:
        what = "is not a field" if odd[0] in data else "is missing"
        raise AgentFileError(f"{field}.{odd[0]} {what}: a {kind} space is described by exactly the fields "
                             f"{sorted(SPACE_FIELDS[kind])}")
    try:
        if kind == "Discrete":
            return spaces.Discrete(check_int(f"{field}.n", data["n"], 1),
                                   start=check_int(f"{field}.start", data["start"], -INT64_MAX))
        if kind == "MultiDiscrete":
            dtype = _space_dtype(data, field, "iu")
            nvec = np.asarray(data["nvec"])
            start = np.asarray(data["start"])
            if nvec.dtype.kind not in "iu" or start.dtype.kind not in "iu" or nvec.shape != start.shape:
                raise ValueError("nvec and start must be integer arrays of the same shape")
            if not (np.array_equal(nvec.astype(dtype), nvec) and np.array_equal(start.astype(dtype), start)):
                raise ValueError(f"nvec and start do not fit the dtype {dtype}")
            return spaces.MultiDiscrete(nvec.astype(dtype), dtype=dtype, start=start.astype(dtype))
        if kind == "MultiBinary":
            n = data["n"]
            return spaces.MultiBinary([check_int(f"{field}.n", x, 1) for x in n] if isinstance(n, list)
                                      else check_int(f"{field}.n", n, 1))
        if kind == "Box":
            if not isinstance(data["shape"], list):
                raise ValueError("shape must be a list")
            shape = tuple(check_int(f"{field}.shape", s, 0) for s in data["shape"])
            dtype = _space_dtype(data, field, "iuf")
            size = math.prod(shape)
            if not (isinstance(data["low"], list) and isinstance(data["high"], list)
                    and len(data["low"]) == len(data["high"]) == size):
                raise ValueError(f"{field}.low and {field}.high must be lists of prod({field}.shape) = {size} values")
            low = np.asarray([float(x) for x in data["low"]], dtype=np.float64).reshape(shape)
            high = np.asarray([float(x) for x in data["high"]], dtype=np.float64).reshape(shape)
            return spaces.Box(low.astype(dtype), high.astype(dtype), shape=shape, dtype=dtype)
        min_length = check_int(f"{field}.min_length", data["min_length"], 0)
        max_length = check_int(f"{field}.max_length", data["max_length"], min_length)
        if not isinstance(data["charset"], str) or not data["charset"]:
            raise ValueError("charset must be a non-empty string")
        return spaces.Text(max_length, min_length=min_length, charset=data["charset"])
    except AgentFileError:
        raise
    except (TypeError, ValueError, OverflowError, AssertionError) as exc:  # gymnasium checks with assert
        raise AgentFileError(f"{field} is not a valid {kind} space description ({exc})") from None


# --------------------------------------------------------------------------------------------
# plain values (classes by name, restricted)
# --------------------------------------------------------------------------------------------
def class_to_name(cls: type) -> str:
    """``"module:QualName"`` of a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def class_from_name(name: Any, field: str, base: tuple[type, ...]) -> type:
    """Import the class ``"module:Name"`` if it lives in torch.nn / torch.optim / tpo_gym and subclasses ``base``.

    Nothing outside those modules is ever imported from a file: pass such classes through
    ``custom_objects`` instead.
    """
    if not isinstance(name, str) or ":" not in name:
        raise AgentFileError(f"{field} must name a class as 'module:Name', got {name!r}")
    module, _, qualname = name.partition(":")
    if not any(module == m or module.startswith(m if m.endswith(".") else m + ".") for m in ALLOWED_MODULES):
        raise AgentFileError(
            f"{field} names the class {name!r} outside torch.nn, torch.optim and tpo_gym; it is not imported "
            f"from a file: pass it with custom_objects={{...}} to load()"
        )
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise AgentFileError(f"{field} names the class {name!r}, which does not exist here") from None
    if not isinstance(obj, type) or not issubclass(obj, base):
        raise AgentFileError(f"{field} names {name!r}, which is not a subclass of {[b.__name__ for b in base]}")
    return obj


_CLASS_BASES: tuple[type, ...] = (nn.Module, torch.optim.Optimizer)


def encode_value(value: Any, field: str) -> Any:
    """A constructor argument as plain JSON data; classes as ``{"__class__": "module:Name"}``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [encode_value(v, f"{field}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"cannot save {field}: dict keys must be str")
        return {k: encode_value(v, f"{field}.{k}") for k, v in value.items()}
    if isinstance(value, type):
        return {"__class__": class_to_name(value)}
    if isinstance(value, torch.device):
        return str(value)
    raise ValueError(
        f"cannot save {field} = {value!r} ({type(value).__name__}): agent files hold plain data only "
        "(numbers, strings, lists, dicts, classes of torch / tpo_gym)"
    )


def check_plain(value: Any, field: str) -> None:
    """Raise :class:`AgentFileError` if ``value`` holds an SB3 ``:serialized:`` (pickled) field."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and k.startswith(":") and k.endswith(":"):
                raise AgentFileError(
                    f"{field} holds a serialized (pickled) field {k!r}; tpo-gym never unpickles data from a file"
                )
            check_plain(v, f"{field}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_plain(v, f"{field}[{i}]")


def decode_value(value: Any, field: str) -> Any:
    """Inverse of :func:`encode_value` (classes restricted as in :func:`class_from_name`)."""
    if isinstance(value, dict):
        if set(value) == {"__class__"}:
            return class_from_name(value["__class__"], field, _CLASS_BASES)
        return {k: decode_value(v, f"{field}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [decode_value(v, f"{field}[{i}]") for i, v in enumerate(value)]
    return value


# --------------------------------------------------------------------------------------------
# learning-rate schedules
# --------------------------------------------------------------------------------------------
def schedule_to_data(learning_rate: Any) -> Any:
    """A float, or SB3's ``ConstantSchedule`` / ``LinearSchedule`` / ``FloatSchedule`` of them, as data.

    Any other callable raises ``ValueError`` (it cannot be rebuilt without running code).
    """
    from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule

    if isinstance(learning_rate, (int, float, np.integer, np.floating)) and not isinstance(learning_rate, bool):
        return float(learning_rate)
    if isinstance(learning_rate, FloatSchedule):
        return schedule_to_data(learning_rate.value_schedule)
    if isinstance(learning_rate, ConstantSchedule):
        return float(learning_rate.val)
    if isinstance(learning_rate, LinearSchedule):
        return {"schedule": "linear", "start": float(learning_rate.start), "end": float(learning_rate.end),
                "end_fraction": float(learning_rate.end_fraction)}
    raise ValueError(
        f"cannot save learning_rate={learning_rate!r}: agent files hold a float or SB3's LinearSchedule / "
        "ConstantSchedule; pass the schedule again with load(..., custom_objects={'learning_rate': fn})"
    )


def schedule_from_data(data: Any, field: str = "kwargs.learning_rate") -> Any:
    """Rebuild what :func:`schedule_to_data` wrote: a finite rate > 0, or a linear schedule from
    ``start > 0`` to ``end >= 0`` reached at ``0 < end_fraction <= 1``."""
    from stable_baselines3.common.utils import LinearSchedule

    try:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return check_float(field, data, 0.0, strict_min=True)
        if isinstance(data, dict) and data.get("schedule") == "linear":
            if set(data) != {"schedule", "start", "end", "end_fraction"}:
                raise ValueError(f"a linear schedule has exactly the fields end, end_fraction, schedule, start; got "
                                 f"{sorted(data)}")
            return LinearSchedule(check_float(f"{field}.start", data["start"], 0.0, strict_min=True),
                                  check_float(f"{field}.end", data["end"], 0.0),
                                  check_float(f"{field}.end_fraction", data["end_fraction"], 0.0, 1.0, strict_min=True))
    except (ValueError, OverflowError) as exc:
        raise AgentFileError(f"field {field!r} is not valid: {exc}") from None
    raise AgentFileError(f"field {field!r} is not a learning rate or a known schedule: {data!r:.200}")


# --------------------------------------------------------------------------------------------
# the file
# --------------------------------------------------------------------------------------------
def write_agent_file(path: Any, meta: dict[str, Any], weights: dict[str, Any]) -> None:
    """Write the zip to a file object, or atomically to a path (``.zip`` added when it has no suffix).

    A path is written through :func:`tpo_gym._io.atomic_writer`: an exclusively created temporary
    file next to it, fsynced, then renamed over it; nothing planted at a temporary name is followed.
    """
    payload = json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=1, sort_keys=True)
    buffer = io.BytesIO()
    torch.save(weights, buffer)

    def write(fileobj: Any) -> None:
        with zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(JSON_ENTRY, payload)
            zf.writestr(WEIGHTS_ENTRY, buffer.getvalue())

    if isinstance(path, (str, pathlib.Path)):
        target = pathlib.Path(path)
        if target.suffix != ".zip":
            target = target.with_name(target.name + ".zip") if not target.suffix else target
        with atomic_writer(target) as f:
            write(f)
    else:
        write(path)


def _resolve_path(path: Any) -> Any:
    if isinstance(path, (str, pathlib.Path)):
        p = pathlib.Path(path)
        if not p.exists() and p.suffix != ".zip" and p.with_name(p.name + ".zip").exists():
            return p.with_name(p.name + ".zip")
        if not p.exists():
            raise FileNotFoundError(f"no agent file at {str(p)!r}")
        return p
    return path


def _read_entry(zf: zipfile.ZipFile, name: str, limit: int, where: str) -> bytes:
    """The bytes of the entry ``name``, refused if its header size or its data exceed ``limit`` bytes.

    The size recorded in the archive is checked before anything is decompressed, and the data are
    read through a stream capped at ``limit + 1`` bytes, so a header that lies cannot make the read
    grow past the cap. Corrupt data (a bad deflate stream, a CRC mismatch) names the entry.
    """
    info = zf.getinfo(name)
    too_big = f"{where}: entry {name!r} is larger than its limit of {limit:,} bytes"
    if info.file_size > limit:
        raise AgentFileError(f"{too_big} ({info.file_size:,} bytes uncompressed): not read")
    try:
        with zf.open(info) as stream:
            data = stream.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, RuntimeError, NotImplementedError) as exc:
        raise AgentFileError(f"{where}: entry {name!r} is corrupt ({exc})") from None
    if len(data) > limit:
        raise AgentFileError(too_big)
    return data


def read_agent_file(path: Any, device: torch.device | str = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """Read ``(meta, weights)`` of an agent file, executing nothing from it.

    :raises AgentFileError: naming the part that is wrong (archive, entry, field).
    """
    path = _resolve_path(path)
    where = str(path) if isinstance(path, (str, pathlib.Path)) else "the given file object"
    try:
        zf = zipfile.ZipFile(path, "r")
    except (zipfile.BadZipFile, EOFError, ValueError):
        raise AgentFileError(f"{where} is not a zip archive (truncated or corrupt agent file)") from None
    with zf:
        names = zf.namelist()
        if JSON_ENTRY not in names:
            if "data" in names and "policy.pth" in names:
                raise AgentFileError(
                    f"{where} was written by Stable-Baselines3 (entries {sorted(names)}), not by a tpo-gym agent; "
                    "load it with its own SB3 class"
                )
            raise AgentFileError(
                f"{where} has no {JSON_ENTRY!r} entry (entries: {sorted(names)}): not a tpo-gym agent file"
            )
        if WEIGHTS_ENTRY not in names:
            raise AgentFileError(f"{where} has no {WEIGHTS_ENTRY!r} entry (truncated agent file?)")
        repeated = sorted(name for name, count in collections.Counter(names).items() if count > 1)
        if repeated:
            raise AgentFileError(f"{where} holds the entries {repeated} more than once: an agent file has each entry "
                                 "exactly once")
        raw = _read_entry(zf, JSON_ENTRY, MAX_JSON_BYTES, where)
        weights_bytes = _read_entry(zf, WEIGHTS_ENTRY, MAX_WEIGHTS_BYTES, where)
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer of > 4300 digits, deep nesting
        raise AgentFileError(f"{where}: entry {JSON_ENTRY!r} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise AgentFileError(f"{where}: entry {JSON_ENTRY!r} is not a tpo-gym agent description")
    if type(meta.get("version")) is not int or meta["version"] != VERSION:
        raise AgentFileError(f"{where}: agent file version {meta.get('version')!r} is not supported (this tpo-gym "
                             f"reads version {VERSION})")
    check_plain(meta, JSON_ENTRY)
    try:
        weights = torch.load(io.BytesIO(weights_bytes), map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling refusal or corruption is reported the same way
        raise AgentFileError(f"{where}: entry {WEIGHTS_ENTRY!r} cannot be read as plain tensors ({exc})") from None
    if not isinstance(weights, dict) or "policy" not in weights:
        raise AgentFileError(f"{where}: entry {WEIGHTS_ENTRY!r} does not hold the policy weights")
    return meta, weights


# --------------------------------------------------------------------------------------------
# the schema of tpo_gym.json
# --------------------------------------------------------------------------------------------
#: The top-level fields :meth:`GroupAlgorithm.save` writes.
META_FIELDS = ("format", "version", "class", "policy", "kwargs", "observation_space", "action_space", "state",
               "tpo_gym_version")
#: The counters of ``state``: integers >= 0.
STATE_COUNTERS = ("num_timesteps", "n_updates", "iteration", "rollout_index")
#: The fields of ``state``.
STATE_FIELDS = (*STATE_COUNTERS, "base_seed", "history")


def _field_check(field: str, check: Callable[..., Any], value: Any, *args: Any) -> Any:
    try:
        return check(field, value, *args)
    except (ValueError, OverflowError) as exc:
        raise AgentFileError(f"field {field!r} is not valid: {exc}") from None


def check_agent_meta(meta: dict[str, Any], settings: Iterable[str], given: Iterable[str] = ()) -> None:
    """Check an agent description against the schema :meth:`~tpo_gym.agents.GroupAlgorithm.save` writes.

    Exactly the fields of :data:`META_FIELDS`; ``kwargs`` a dict holding every name of ``settings``
    (the constructor arguments saved; those in ``given``, passed by the caller, may be absent) and
    no other; the settings no constructor checks (``verbose`` an integer >= 0, ``policy_kwargs`` a
    dict, ``tensorboard_log`` a string or null); ``state`` exactly :data:`STATE_FIELDS`: the counters
    integers >= 0, ``base_seed`` an integer in ``[0, 2**63 - 1]``, ``history`` a list of dicts of
    plain values. The remaining settings are checked by the agent's constructor.

    :raises AgentFileError: naming the first bad field and what it must be.
    """
    missing = [f for f in META_FIELDS if f not in meta]
    unknown = sorted(set(meta) - set(META_FIELDS))
    if missing or unknown:
        raise AgentFileError(f"the file lacks the fields {missing}" if missing else
                             f"the file has unexpected fields {unknown}")
    if not isinstance(meta["tpo_gym_version"], str):
        raise AgentFileError(f"field 'tpo_gym_version' must be a string, got {meta['tpo_gym_version']!r:.80}")
    kwargs = meta["kwargs"]
    if not isinstance(kwargs, dict):
        raise AgentFileError(f"field 'kwargs' must be a dict of settings, got {kwargs!r:.80}")
    settings = list(settings)
    extra = sorted(set(kwargs) - set(settings))
    if extra:
        raise AgentFileError(f"field 'kwargs' has settings {extra} that {meta['class']} does not take")
    given = set(given)
    absent = [name for name in settings if name not in kwargs and name not in given]
    if absent:
        raise AgentFileError(f"field 'kwargs' lacks the settings {absent} (a saved agent holds all of {settings})")
    if "verbose" in kwargs:
        _field_check("kwargs.verbose", check_int, kwargs["verbose"], 0)
    if kwargs.get("policy_kwargs") is not None and not isinstance(kwargs["policy_kwargs"], dict):
        raise AgentFileError(f"field 'kwargs.policy_kwargs' must be a dict, got {kwargs['policy_kwargs']!r:.80}")
    if kwargs.get("tensorboard_log") is not None and not isinstance(kwargs["tensorboard_log"], str):
        raise AgentFileError(f"field 'kwargs.tensorboard_log' must be a string or null, got "
                             f"{kwargs['tensorboard_log']!r:.80}")
    state = meta["state"]
    if not isinstance(state, dict) or set(state) != set(STATE_FIELDS):
        shown = sorted(state) if isinstance(state, dict) else repr(state)[:80]
        raise AgentFileError(f"field 'state' must hold exactly the fields {sorted(STATE_FIELDS)}, got {shown}")
    for name in STATE_COUNTERS:
        _field_check(f"state.{name}", check_int, state[name], 0)
    _field_check("state.base_seed", check_int, state["base_seed"], 0)
    history = state["history"]
    if not isinstance(history, list):
        raise AgentFileError(f"field 'state.history' must be a list of dicts, got {history!r:.80}")
    for i, record in enumerate(history):
        if not isinstance(record, dict) or not all(
            isinstance(v, (int, float, str, bool)) or v is None for v in record.values()
        ):
            raise AgentFileError(f"field 'state.history[{i}]' must be a dict of numbers and strings, "
                                 f"got {record!r:.80}")


def setting_error(exc: Exception, settings: Iterable[str], given: Iterable[str] = (),
                  prefix: str = "kwargs") -> AgentFileError | None:
    """The :class:`AgentFileError` for a ``ValueError`` / ``TypeError`` raised while an agent is built from a file.

    It names ``<prefix>.<name>`` for the one of ``settings`` (from the file) or ``given`` (passed by the
    caller) that the message mentions first, or ``<prefix>`` when it mentions none. ``None`` when that
    name is one of ``given`` (the caller's own error, raised as it is) or ``exc`` already is an
    :class:`AgentFileError`.
    """
    if isinstance(exc, AgentFileError):
        return None
    text, given = str(exc), set(given)
    found = ((re.search(rf"\b{re.escape(name)}\b", text), name) for name in {*settings, *given})
    named = sorted((m.start(), name) for m, name in found if m)
    if named and named[0][1] in given:
        return None
    field = f"{prefix}.{named[0][1]}" if named else prefix
    return AgentFileError(f"field {field!r} is not valid: {text}")


def check_space_sizes(observation_space: spaces.Space, action_space: spaces.Space, weights: dict[str, Any]) -> None:
    """Refuse a Discrete / MultiDiscrete / MultiBinary space larger than the saved policy weights allow.

    A policy holds at least one parameter per action logit and per input category (a one-hot input
    width, an embedding row), so a space size above the number of saved policy parameters cannot
    come from ``save``; checking it before the policy is built keeps a small file from allocating a
    huge layer.
    """
    policy = weights.get("policy")
    if not isinstance(policy, dict) or not all(isinstance(v, torch.Tensor) for v in policy.values()):
        raise AgentFileError(f"entry {WEIGHTS_ENTRY!r}: 'policy' must be a dict of tensors (a state_dict)")
    numel = sum(v.numel() for v in policy.values())
    for field, space in (("observation_space", observation_space), ("action_space", action_space)):
        if isinstance(space, spaces.MultiDiscrete):
            field, size = f"{field}.nvec", int(space.nvec.max()) if space.nvec.size else 0
        elif isinstance(space, (spaces.Discrete, spaces.MultiBinary)):
            field, size = f"{field}.n", math.prod(np.atleast_1d(space.n).tolist())
        else:
            continue
        if size > numel:
            raise AgentFileError(f"field {field!r} describes a space of size {size:,}, more than the {numel:,} saved "
                                 "policy parameters can serve")


# --------------------------------------------------------------------------------------------
# language-model agents: a directory (Hugging Face save_pretrained + the same JSON)
# --------------------------------------------------------------------------------------------
OPTIMIZER_ENTRY = "optimizer.pt"


def write_agent_dir(path: Any, meta: dict[str, Any], optimizer_state: dict[str, Any], save_model: Any) -> None:
    """Write a language-model agent directory atomically: built in a fresh private temp dir, then renamed into place.

    ``save_model(dir)`` writes the model (``save_pretrained``: safetensors) and the tokenizer. The work
    directory is made by ``tempfile.mkdtemp`` beside the target (a random name, created exclusively), so
    nothing planted at a temporary name is followed or removed; the previous agent at ``path`` is moved
    into it and removed with it only once the new one is in place. Only that work directory is ever
    removed recursively.
    """
    target = pathlib.Path(path)
    if target.suffix == ".zip":
        target = target.with_suffix("")
    make_dirs(target.parent)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        new, old = work / "agent", work / "previous"
        new.mkdir(mode=DIR_MODE)  # readable like a directory made by mkdir (mkdtemp's own is private)
        save_model(new)
        (new / JSON_ENTRY).write_text(json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=1,
                                                 sort_keys=True))
        torch.save(optimizer_state, new / OPTIMIZER_ENTRY)
        if os.path.lexists(target):
            os.replace(target, old)
        try:
            os.replace(new, target)
        except BaseException:
            if os.path.lexists(old):
                os.replace(old, target)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_dir_entries(root: pathlib.Path) -> None:
    """Refuse a symbolic link or anything but regular files and directories anywhere under ``root``."""
    for dirpath, dirnames, filenames in os.walk(root):  # links to directories are listed, never entered
        for name in [*dirnames, *filenames]:
            entry = pathlib.Path(dirpath) / name
            if entry.is_symlink():
                raise AgentFileError(f"{str(entry)!r} is a symbolic link: an agent directory holds only its own "
                                     "files (links are never followed)")
            if name in filenames and not entry.is_file():
                raise AgentFileError(f"{str(entry)!r} is not a regular file")


def read_agent_dir(path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, optimizer_state)`` of a language-model agent directory, executing nothing from it.

    Every entry must be a regular file or directory (a symbolic link anywhere in it is refused);
    ``tpo_gym.json`` (at most :data:`MAX_JSON_BYTES`) and ``optimizer.pt`` (``{"optimizer":
    state_dict}``, read with ``weights_only=True``) must be there. The model, tokenizer and adapter
    are read by :mod:`tpo_gym.agents.lm` (``load_agent_model`` / ``load_agent_tokenizer`` /
    ``load_agent_adapter``).

    :raises AgentFileError: naming the entry and what is wrong.
    """
    root = pathlib.Path(path)
    entry = root / JSON_ENTRY
    if not entry.is_file():
        raise AgentFileError(f"{str(root)!r} has no {JSON_ENTRY!r}: not a tpo-gym agent directory")
    _check_dir_entries(root)
    size = entry.stat().st_size
    if size > MAX_JSON_BYTES:
        raise AgentFileError(f"{str(entry)!r} is larger than its limit of {MAX_JSON_BYTES:,} bytes ({size:,} bytes): "
                             "not read")
    try:
        meta = json.loads(entry.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer of > 4300 digits, deep nesting
        raise AgentFileError(f"{str(root)!r}: {JSON_ENTRY!r} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise AgentFileError(f"{str(root)!r}: {JSON_ENTRY!r} is not a tpo-gym agent description (version {VERSION})")
    check_plain(meta, JSON_ENTRY)
    file = root / OPTIMIZER_ENTRY
    if not file.exists():
        raise AgentFileError(f"{str(root)!r} has no {OPTIMIZER_ENTRY!r} (an agent directory holds the optimiser state)")
    if not file.is_file():
        raise AgentFileError(f"{str(file)!r} is not a regular file")
    try:
        optimizer = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise AgentFileError(f"{str(file)!r} cannot be read as plain tensors ({exc})") from None
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("optimizer"), dict):
        raise AgentFileError(f"{str(file)!r} does not hold {{'optimizer': state_dict}}")
    return meta, optimizer
