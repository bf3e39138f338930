"""Shared helpers of the tpo_gym environments: strict action checks and per-env seeding.

Nothing here is public API. The helpers exist so that every environment rejects bad input the same
way (a ``ValueError`` naming the bad value and what is allowed, never a silent clip) and so that the
native vector environments draw their contexts from exactly the random streams that
:class:`gymnasium.vector.SyncVectorEnv` would give each copy of the single environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.utils import seeding


def check_int_kwarg(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum``, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_choice_kwarg(name: str, value: Any, allowed: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise ``ValueError`` listing the choices."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


def check_discrete_action(action: Any, n: int) -> int:
    """Validate one action of a ``Discrete(n)`` space and return it as a Python ``int``.

    Accepted: a Python ``int`` (not ``bool``), a numpy integer scalar or a 0-d integer array, with
    ``0 <= action < n``. Anything else (floats, bools, strings, arrays of another shape, out of
    range values) raises ``ValueError``; nothing is rounded or clipped.
    """
    if isinstance(action, (bool, np.bool_)):
        raise ValueError(f"action must be an integer in [0, {n}), got the bool {action!r}")
    if isinstance(action, np.ndarray):
        if action.shape != ():
            raise ValueError(f"action must be a scalar integer in [0, {n}), got an array of shape {action.shape}")
        if not np.issubdtype(action.dtype, np.integer):
            raise ValueError(f"action must have an integer dtype, got dtype {action.dtype} ({action!r})")
        action = action.item()
    if not isinstance(action, (int, np.integer)):
        raise ValueError(f"action must be an integer in [0, {n}), got {action!r} of type {type(action).__name__}")
    value = int(action)
    if not 0 <= value < n:
        raise ValueError(f"action {value} is outside the action space Discrete({n}): allowed 0..{n - 1}")
    return value


def check_discrete_batch(actions: Any, n: int, num_envs: int, what: str = "actions") -> np.ndarray:
    """Validate a batch of ``Discrete(n)`` actions of shape ``(num_envs,)``; return it as int64.

    Accepted: any array-like of integers (numpy integer dtype, or Python ints) with exactly that shape
    and every value in ``[0, n)``. Floats, bools, other shapes and out-of-range values raise
    ``ValueError``.
    """
    arr = np.asarray(actions)
    if arr.shape != (num_envs,):
        raise ValueError(f"{what} must have shape ({num_envs},) (one per env), got shape {arr.shape}")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must have an integer dtype, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= n):
        bad = arr[(arr < 0) | (arr >= n)]
        raise ValueError(f"{what} outside Discrete({n}) (allowed 0..{n - 1}): {bad[:8].tolist()}")
    return arr.astype(np.int64, copy=False)


def check_candidates(candidates: Any, n: int) -> np.ndarray:
    """Validate a 1-D array of K >= 1 candidate actions of ``Discrete(n)``; return it as int64."""
    arr = np.asarray(candidates)
    if arr.ndim != 1 or arr.shape[0] < 1:
        raise ValueError(f"candidates must be a 1-D array of K >= 1 actions, got shape {arr.shape}")
    return check_discrete_batch(arr, n, arr.shape[0], what="candidates")


def check_candidate_matrix(candidates: Any, n: int, num_envs: int) -> np.ndarray:
    """Validate an int array ``[num_envs, K]`` of ``Discrete(n)`` candidates; return it as int64."""
    arr = np.asarray(candidates)
    if arr.ndim != 2 or arr.shape[0] != num_envs or arr.shape[1] < 1:
        raise ValueError(f"candidates must have shape ({num_envs}, K) with K >= 1, got shape {arr.shape}")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"candidates must have an integer dtype, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= n):
        raise ValueError(f"candidates outside Discrete({n}) (allowed 0..{n - 1})")
    return arr.astype(np.int64, copy=False)


def check_group_size(options: dict[str, Any] | None, num_envs: int) -> int:
    """Read ``options["group_size"]`` (default 1) and check it divides ``num_envs``."""
    if options is None or "group_size" not in options:
        return 1
    g = options["group_size"]
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or int(g) < 1:
        raise ValueError(f"options['group_size'] must be a positive integer, got {g!r}")
    if num_envs % int(g) != 0:
        raise ValueError(
            f"options['group_size']={int(g)} must divide num_envs={num_envs} (envs i*G..(i+1)*G-1 share one context)"
        )
    return int(g)


def seed_generators(seed: int | Sequence[int | None] | None, num_envs: int) -> list[np.random.Generator]:
    """One generator per sub-env, seeded exactly as ``SyncVectorEnv.reset(seed=...)`` seeds its copies.

    ``seed`` an int: env ``i`` gets ``seed + i``; a sequence: one seed per env; ``None``: fresh entropy.
    Each generator comes from :func:`gymnasium.utils.seeding.np_random`, like ``Env.reset(seed=...)``,
    so a native vector env draws the same contexts as ``num_envs`` single envs in a ``SyncVectorEnv``.
    """
    if seed is None:
        seeds: list[int | None] = [None] * num_envs
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        seeds = [int(seed) + i for i in range(num_envs)]
    else:
        seeds = list(seed)
        if len(seeds) != num_envs:
            raise ValueError(f"seed must be an int, None or a list of {num_envs} seeds, got {len(seeds)}")
    return [seeding.np_random(s)[0] for s in seeds]


_TWO_64 = 1 << 64
_MAX_CODE = 1 << 62


def draw_uniform(gens: Sequence[np.random.Generator], n: int) -> np.ndarray:
    """One exactly uniform integer in ``[0, n)`` from each generator: ``int64 [len(gens)]``.

    Each generator contributes one raw 64-bit word of its bit generator (rejection sampling redraws
    the rare word above the largest multiple of ``n``, so the result is exactly uniform). Single envs
    call it with ``[self.np_random]`` and native vector envs with one generator per sub-env, so both
    draw the same contexts from the same seeds; per generator it costs one cheap call, which is what
    makes native resets fast. ``1 <= n <= 2**62``.
    """
    if not 1 <= n <= _MAX_CODE:
        raise ValueError(f"n must be in [1, 2**62], got {n}")
    raw = np.fromiter((g.bit_generator.random_raw() for g in gens), dtype=np.uint64, count=len(gens))
    limit = (_TWO_64 // n) * n
    if limit < _TWO_64:
        for i in np.flatnonzero(raw >= np.uint64(limit)).tolist():
            word = gens[i].bit_generator.random_raw()
            while word >= limit:
                word = gens[i].bit_generator.random_raw()
            raw[i] = word
    return (raw % np.uint64(n)).astype(np.int64)


def draw_tokens(gens: Sequence[np.random.Generator], vocab_size: int, length: int) -> np.ndarray:
    """``length`` i.i.d. uniform tokens in ``[0, vocab_size)`` per generator: ``int64 [len(gens), length]``.

    Tokens are the base-``vocab_size`` digits of :func:`draw_uniform` codes, as many tokens per code
    as fit in 62 bits (one code for the paper's V=2..16, H<=10), drawn chunk by chunk.
    """
    per_code = 1
    while vocab_size ** (per_code + 1) <= _MAX_CODE:
        per_code += 1
    out = np.empty((len(gens), length), dtype=np.int64)
    for start in range(0, length, per_code):
        k = min(per_code, length - start)
        codes = draw_uniform(gens, vocab_size**k)
        powers = vocab_size ** np.arange(k, dtype=np.int64)
        out[:, start : start + k] = (codes[:, None] // powers) % vocab_size
    return out
