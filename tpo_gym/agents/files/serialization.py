"""Plain-data encodings of what an agent file holds: spaces, classes, settings and learning-rate schedules.

Everything here turns a Python value into JSON-able data and back, executing nothing: classes are named
``{"__class__": "module:QualName"}`` and resolved only within :data:`ALLOWED_MODULES`; values that are not plain
data are refused with an :class:`AgentFileError` naming the field.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from tpo_gym._validation import INT64_MAX, check_float, check_int

__all__ = [
    "AgentFileError",
    "ALLOWED_MODULES",
    "space_to_data",
    "space_from_data",
    "class_to_name",
    "class_from_name",
    "encode_value",
    "decode_value",
    "check_plain",
    "schedule_to_data",
    "schedule_from_data",
]

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
