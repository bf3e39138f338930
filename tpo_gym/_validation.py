"""The one validation module of tpo-gym: scalar arguments of agents, envs and objectives, and devices.

Every public entry point checks its arguments early and raises a ``ValueError`` that names the
argument, shows the bad value and says what is allowed (never a silent cast, clip or NaN). The
wording is the same everywhere: ``"<name> must be <what is allowed>, got <value>"``.

This module sits at the bottom of the package: it imports nothing from ``tpo_gym``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "check_int",
    "check_float",
    "check_choice",
    "check_bool",
    "check_seed",
    "check_options",
    "check_device",
    "INT64_MAX",
]

#: Largest value of an int64 (numpy arrays, gymnasium spaces and torch tensors hold env sizes as int64).
INT64_MAX = int(np.iinfo(np.int64).max)


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _range_text(minimum: float | None, maximum: float | None, strict_min: bool = False) -> str:
    def num(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    lo = None if minimum is None else (f"> {num(minimum)}" if strict_min else f">= {num(minimum)}")
    hi = None if maximum is None else f"<= {num(maximum)}"
    return " and ".join(p for p in (lo, hi) if p is not None)


def check_int(
    name: str,
    value: Any,
    minimum: int | None = None,
    maximum: int | None = INT64_MAX,
    allow_integral_float: bool = False,
) -> int:
    """Return ``value`` as a Python ``int`` if it is an integer in ``[minimum, maximum]``.

    Accepted: Python and numpy integers (never ``bool``); with ``allow_integral_float`` also finite
    floats with an integral value, as SB3 accepts ``learn(total_timesteps=1e5)``. ``maximum``
    defaults to the int64 maximum, so sizes that would overflow an array get the same clear error.
    """
    # the int64 bound is named only when it is what the value broke (it is the default of every size)
    shown_max = maximum if maximum is not None and maximum < INT64_MAX else None
    if maximum is not None and isinstance(value, (numbers.Integral, np.integer)) and int(value) > maximum:
        shown_max = maximum
    rng = _range_text(minimum, shown_max)
    what = "an integer" + (f" {rng}" if rng else "")
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be {what}, got {_show(value)}")
    if isinstance(value, (numbers.Integral, np.integer)):
        out = int(value)
    elif allow_integral_float and isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)) or float(value) != math.floor(float(value)):
            raise ValueError(f"{name} must be {what}, got {_show(value)}")
        out = int(value)
    else:
        raise ValueError(f"{name} must be {what}, got {_show(value)}")
    if (minimum is not None and out < minimum) or (maximum is not None and out > maximum):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return out


def check_float(
    name: str,
    value: Any,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_min: bool = False,
) -> float:
    """Return ``value`` as a finite Python ``float`` in the allowed range, else raise ``ValueError``.

    ``strict_min=True`` requires ``value > minimum`` (e.g. ``eta > 0``); otherwise ``value >= minimum``
    (e.g. ``beta >= 0``). Integers are accepted, ``bool`` and strings are not.
    """
    rng = _range_text(minimum, maximum, strict_min)
    what = "a finite number" + (f" {rng}" if rng else "")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise ValueError(f"{name} must be {what}, got {_show(value)}")
    try:
        out = float(value)
    except OverflowError:  # an integer past the float range (10**400): as out of range as inf
        out = math.inf if value > 0 else -math.inf
    if not math.isfinite(out):
        raise ValueError(f"{name} must be {what}, got {_show(value)}")
    if minimum is not None and (out <= minimum if strict_min else out < minimum):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if maximum is not None and out > maximum:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return out


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of the strings ``allowed``, else raise ``ValueError`` listing them."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a ``bool`` (Python or numpy), else raise ``ValueError``."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {_show(value)}")
    return bool(value)


def check_seed(value: Any, name: str = "seed") -> int | None:
    """A reset / constructor seed: ``None`` or a non-negative integer (as ``np.random.default_rng``)."""
    if value is None:
        return None
    return check_int(name, value, minimum=0, maximum=None)


def check_options(value: Any, name: str = "options") -> dict[str, Any] | None:
    """``reset``'s ``options``: ``None`` or a ``dict`` with string keys."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{name} must be None or a dict with str keys, got {_show(value)}")
    return value


def check_device(device: Any, name: str = "device") -> str:
    """``device`` (a string or ``torch.device``) as text if torch can use it on this machine, else ``ValueError``.

    Allowed: ``"cpu"``, ``"auto"`` (CUDA when available, else the CPU: the one way to fall back),
    ``"cuda"`` and ``"cuda:N"`` when this machine has that CUDA device (never a silent CPU run).
    """
    import torch  # here, so the module stays light for the envs that never need it

    text = str(device)
    if text in ("cpu", "auto"):
        return text
    if text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {text!r}: CUDA is not available on this machine (allowed here: 'cpu', 'auto')")
        if text.startswith("cuda:") and int(text[5:]) >= torch.cuda.device_count():
            raise ValueError(f"{name} {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return text
    raise ValueError(f"{name} must be 'cpu', 'auto', 'cuda' or 'cuda:N', got {device!r}")
