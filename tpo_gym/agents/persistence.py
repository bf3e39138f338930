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

Every failure names the part that is wrong: not a zip / truncated, a missing entry, a JSON entry that
does not parse, a field that is not plain data (an SB3 ``:serialized:`` value), a file written by
another class, unknown fields, weights that do not match the policy.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import pathlib
import zipfile
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

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
]

FORMAT = "tpo-gym-agent"
VERSION = 1
JSON_ENTRY = "tpo_gym.json"
WEIGHTS_ENTRY = "weights.pt"
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


def space_from_data(data: Any, field: str) -> spaces.Space:
    """Rebuild a space described by :func:`space_to_data`; raises :class:`AgentFileError` naming ``field``."""
    try:
        kind = data["type"]
        if kind == "Discrete":
            return spaces.Discrete(int(data["n"]), start=int(data["start"]))
        if kind == "MultiDiscrete":
            dtype = np.dtype(data["dtype"])
            return spaces.MultiDiscrete(np.asarray(data["nvec"], dtype=dtype), dtype=dtype,
                                        start=np.asarray(data["start"], dtype=dtype))
        if kind == "MultiBinary":
            return spaces.MultiBinary(data["n"])
        if kind == "Box":
            shape = tuple(int(s) for s in data["shape"])
            dtype = np.dtype(data["dtype"])
            low = np.asarray([float(x) for x in data["low"]], dtype=np.float64).reshape(shape)
            high = np.asarray([float(x) for x in data["high"]], dtype=np.float64).reshape(shape)
            return spaces.Box(low.astype(dtype), high.astype(dtype), shape=shape, dtype=dtype)
        if kind == "Text":
            return spaces.Text(int(data["max_length"]), min_length=int(data["min_length"]), charset=data["charset"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AgentFileError(f"{field} is not a valid space description ({exc!r})") from None
    raise AgentFileError(f"{field} has an unknown space type {data.get('type')!r}")


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
    """Rebuild what :func:`schedule_to_data` wrote."""
    from stable_baselines3.common.utils import LinearSchedule

    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    if isinstance(data, dict) and data.get("schedule") == "linear":
        try:
            return LinearSchedule(float(data["start"]), float(data["end"]), float(data["end_fraction"]))
        except (KeyError, TypeError, ValueError):
            pass
    raise AgentFileError(f"{field} is not a learning rate or a known schedule: {data!r}")


# --------------------------------------------------------------------------------------------
# the file
# --------------------------------------------------------------------------------------------
def write_agent_file(path: Any, meta: dict[str, Any], weights: dict[str, Any]) -> None:
    """Write the zip (atomically when ``path`` is a filesystem path: temp file + rename)."""
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
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        with open(tmp, "wb") as f:
            write(f)
        tmp.replace(target)
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


def read_agent_file(path: Any, device: torch.device | str = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """Read ``(meta, weights)`` of an agent file, executing nothing from it.

    :raises AgentFileError: naming the part that is wrong (archive, entry, field).
    """
    path = _resolve_path(path)
    where = str(path) if isinstance(path, (str, pathlib.Path)) else "the given file object"
    try:
        zf = zipfile.ZipFile(path, "r")
    except zipfile.BadZipFile:
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
        try:
            raw = zf.read(JSON_ENTRY)
            weights_bytes = zf.read(WEIGHTS_ENTRY)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
            raise AgentFileError(f"{where}: an entry is corrupt ({exc})") from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AgentFileError(f"{where}: entry {JSON_ENTRY!r} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise AgentFileError(f"{where}: entry {JSON_ENTRY!r} is not a tpo-gym agent description")
    if meta.get("version") != VERSION:
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
# language-model agents: a directory (Hugging Face save_pretrained + the same JSON)
# --------------------------------------------------------------------------------------------
OPTIMIZER_ENTRY = "optimizer.pt"


def write_agent_dir(path: Any, meta: dict[str, Any], optimizer_state: dict[str, Any], save_model: Any) -> None:
    """Write a language-model agent directory atomically (a temp dir, then renamed into place).

    ``save_model(dir)`` writes the model (``save_pretrained``: safetensors) and the tokenizer.
    """
    import shutil

    target = pathlib.Path(path)
    if target.suffix == ".zip":
        target = target.with_suffix("")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(tmp)
    (tmp / JSON_ENTRY).write_text(json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=1,
                                             sort_keys=True))
    torch.save(optimizer_state, tmp / OPTIMIZER_ENTRY)
    old = target.with_name(f".{target.name}.old")
    if target.exists():
        if old.exists():
            shutil.rmtree(old)
        target.rename(old)
    tmp.rename(target)
    if old.exists():
        shutil.rmtree(old)


def read_agent_dir(path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, optimizer_state)`` of a language-model agent directory, executing nothing from it."""
    root = pathlib.Path(path)
    entry = root / JSON_ENTRY
    if not entry.is_file():
        raise AgentFileError(f"{str(root)!r} has no {JSON_ENTRY!r}: not a tpo-gym agent directory")
    try:
        meta = json.loads(entry.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AgentFileError(f"{str(root)!r}: {JSON_ENTRY!r} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise AgentFileError(f"{str(root)!r}: {JSON_ENTRY!r} is not a tpo-gym agent description (version {VERSION})")
    check_plain(meta, JSON_ENTRY)
    optimizer: dict[str, Any] = {}
    if (root / OPTIMIZER_ENTRY).is_file():
        try:
            optimizer = torch.load(root / OPTIMIZER_ENTRY, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise AgentFileError(
                f"{str(root)!r}: {OPTIMIZER_ENTRY!r} cannot be read as plain tensors ({exc})"
            ) from None
    return meta, optimizer
