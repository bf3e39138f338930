"""Shared helpers of the tpo_gym environments: limits, strict action checks and per-env seeding.

Nothing here is public API. The helpers exist so that every environment rejects bad input the same
way (a ``ValueError`` worded ``"<name> must be <what is allowed>, got <value>"``, as everywhere in
tpo-gym, see :mod:`tpo_gym._validation`; never a silent clip) and so that the native vector
environments draw their contexts from exactly the random streams that
:class:`gymnasium.vector.SyncVectorEnv` would give each copy of the single environment.

Scalar arguments (sizes, seeds, choices, ``reset``'s ``options``) are checked with
:mod:`tpo_gym._validation`; the limits below are the largest sizes the environments can hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.utils import seeding

from tpo_gym._validation import INT64_MAX, check_int, check_options, check_seed

#: Largest ``n`` of :func:`draw_uniform` (one 64-bit word per draw, exactly uniform up to 2**62).
MAX_DRAW = 1 << 62
#: Largest ``num_envs`` of a native vector env: each sub-env keeps its own numpy ``Generator``
#: (about 1 KB, and about 0.1 ms to seed), as ``SyncVectorEnv`` does.
MAX_NUM_ENVS = 1 << 20
#: Largest ``n_arms``: the ``Discrete(n_arms)`` action space holds ``n_arms`` as an int64.
MAX_ARMS = INT64_MAX
#: Largest ``n_contexts``: the observation is a dense one-hot float32 vector of that length and the
#: table of correct arms an int64 array of that length (64 MiB and 128 MiB at the limit).
MAX_CONTEXTS = 1 << 24
#: Largest ``vocab_size`` V: prompt tokens are drawn with :func:`draw_uniform` (V <= 2**62), and the
#: observation space ``MultiDiscrete([V + 1] * 2H)`` needs ``V + 1`` to fit an int64.
MAX_VOCAB = MAX_DRAW
#: Largest ``length`` H: the observation holds 2H int64 tokens and every step returns a copy of it,
#: so an episode costs O(H**2); the paper's tasks use H <= 20.
MAX_LENGTH = 1 << 16


def _power_text(n: int) -> str:
    """``n`` as ``2**k`` / ``2**k - 1`` where it is one of those (limits read better that way)."""
    for k in range(8, 65):
        if n == 1 << k:
            return f"2**{k}"
        if n == (1 << k) - 1:
            return f"2**{k} - 1"
    return str(n)


def check_size(name: str, value: Any, minimum: int, maximum: int, why: str) -> int:
    """:func:`tpo_gym._validation.check_int`, whose error also says the maximum and why it is what it is."""
    try:
        return check_int(name, value, minimum=minimum, maximum=maximum)
    except ValueError as exc:
        raise ValueError(f"{exc} (max {_power_text(maximum)}: {why})") from None


def check_num_envs(num_envs: Any) -> int:
    """``num_envs`` of a native vector env: an integer in ``[1, MAX_NUM_ENVS]``."""
    return check_size(
        "num_envs", num_envs, 1, MAX_NUM_ENVS, "each sub-env keeps its own numpy Generator, as in SyncVectorEnv"
    )


def check_reset_args(seed: Any, options: Any) -> tuple[int | None, dict[str, Any] | None]:
    """``reset``'s ``seed`` (None or an integer >= 0, numpy integers too) and ``options`` (None or a dict).

    Returns the seed as a Python ``int`` (Gymnasium's seeding accepts only Python ints).
    """
    return check_seed(seed), check_options(options)


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def check_discrete_action(action: Any, n: int) -> int:
    """Validate one action of a ``Discrete(n)`` space and return it as a Python ``int``.

    Accepted: a Python ``int`` (not ``bool``), a numpy integer scalar or a 0-d integer array, with
    ``0 <= action < n``. Anything else (floats, bools, strings, arrays of another shape, out of
    range values) raises ``ValueError``; nothing is rounded or clipped.
    """
    allowed = f"an integer in [0, {n}) (the action space Discrete({n}))"
    if isinstance(action, (bool, np.bool_)):
        raise ValueError(f"action must be {allowed}, got the bool {action!r}")
    if isinstance(action, np.ndarray):
        if action.shape != ():
            raise ValueError(f"action must be {allowed}, a scalar, got an array of shape {action.shape}")
        if not np.issubdtype(action.dtype, np.integer):
            raise ValueError(f"action must be {allowed}, with an integer dtype, got dtype {action.dtype} ({action!r})")
        action = action.item()
    if not isinstance(action, (int, np.integer)):
        raise ValueError(f"action must be {allowed}, got {_show(action)}")
    value = int(action)
    if not 0 <= value < n:
        raise ValueError(f"action must be {allowed}, got {value}")
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
    return _check_discrete_values(arr, n, what)


def _check_discrete_values(arr: np.ndarray, n: int, what: str) -> np.ndarray:
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must have an integer dtype, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= n):
        bad = arr[(arr < 0) | (arr >= n)]
        raise ValueError(f"{what} must be integers in [0, {n}) (Discrete({n})), got {bad[:8].tolist()} outside it")
    return arr.astype(np.int64, copy=False)


def check_candidates(candidates: Any, n: int) -> np.ndarray:
    """Validate a 1-D array of K >= 1 candidate actions of ``Discrete(n)``; return it as int64."""
    arr = np.asarray(candidates)
    if arr.ndim != 1 or arr.shape[0] < 1:
        raise ValueError(f"candidates must be a 1-D array of K >= 1 actions, got shape {arr.shape}")
    return _check_discrete_values(arr, n, "candidates")


def check_candidate_matrix(candidates: Any, n: int, num_envs: int) -> np.ndarray:
    """Validate an int array ``[num_envs, K]`` of ``Discrete(n)`` candidates; return it as int64."""
    arr = np.asarray(candidates)
    if arr.ndim != 2 or arr.shape[0] != num_envs or arr.shape[1] < 1:
        raise ValueError(f"candidates must have shape ({num_envs}, K) with K >= 1, got shape {arr.shape}")
    return _check_discrete_values(arr, n, "candidates")


def check_group_size(options: dict[str, Any] | None, num_envs: int) -> int:
    """Read ``options["group_size"]`` (default 1) and check it divides ``num_envs``."""
    if options is None or "group_size" not in options:
        return 1
    g = check_int("options['group_size']", options["group_size"], minimum=1, maximum=num_envs)
    if num_envs % g != 0:
        raise ValueError(
            f"options['group_size'] must divide num_envs={num_envs} (envs i*G..(i+1)*G-1 share one context), got {g}"
        )
    return g


def seed_generators(seed: Any, num_envs: int) -> list[np.random.Generator]:
    """One generator per sub-env, seeded exactly as ``SyncVectorEnv.reset(seed=...)`` seeds its copies.

    ``seed`` an integer >= 0: env ``i`` gets ``seed + i``; a list (tuple, 1-D array) of ``num_envs``
    seeds, each None or an integer >= 0: one seed per env; ``None``: fresh entropy. Numpy integers
    are accepted. Each generator comes from :func:`gymnasium.utils.seeding.np_random`, like
    ``Env.reset(seed=...)``, so a native vector env draws the same contexts as ``num_envs`` single
    envs in a ``SyncVectorEnv``. Anything else raises ``ValueError``. Seeded generators are
    :class:`~tpo_gym.envs._seeding.LazyGenerator` s: the same streams, built only when more than their
    first word is drawn (a reset of thousands of sub-envs costs microseconds per sub-env, not tens).
    """
    if seed is None:
        seeds: list[int | None] = [None] * num_envs
    elif isinstance(seed, (list, tuple, np.ndarray)):
        if (isinstance(seed, np.ndarray) and seed.ndim != 1) or len(seed) != num_envs:
            raise ValueError(
                f"seed must be None, an integer >= 0 or a list of {num_envs} seeds (one per env), got {_show(seed)}"
            )
        if all(type(s) is int and s >= 0 for s in seed):  # the common case, checked at once
            seeds = list(seed)
        else:
            seeds = [check_seed(s, name=f"seed[{i}]") for i, s in enumerate(seed)]
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        base = check_seed(seed)
        assert base is not None
        seeds = [base + i for i in range(num_envs)]
    else:
        raise ValueError(f"seed must be None, an integer >= 0 or a list of {num_envs} seeds, got {_show(seed)}")
    if any(s is None for s in seeds):
        return [seeding.np_random(s)[0] for s in seeds]
    from tpo_gym.envs._seeding import lazy_generators

    return lazy_generators(seeds)  # type: ignore[arg-type,return-value]


_TWO_64 = 1 << 64


def draw_uniform(gens: Sequence[np.random.Generator], n: int) -> np.ndarray:
    """One exactly uniform integer in ``[0, n)`` from each generator: ``int64 [len(gens)]``.

    Each generator contributes one raw 64-bit word of its bit generator (rejection sampling redraws
    the rare word above the largest multiple of ``n``, so the result is exactly uniform). Single envs
    call it with ``[self.np_random]`` and native vector envs with one generator per sub-env, so both
    draw the same contexts from the same seeds; per generator it costs one cheap call, which is what
    makes native resets fast. ``1 <= n <= 2**62``.
    """
    if not 1 <= n <= MAX_DRAW:
        raise ValueError(f"n must be an integer in [1, 2**62], got {n!r}")
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
    while vocab_size ** (per_code + 1) <= MAX_DRAW:
        per_code += 1
    out = np.empty((len(gens), length), dtype=np.int64)
    for start in range(0, length, per_code):
        k = min(per_code, length - start)
        codes = draw_uniform(gens, vocab_size**k)
        powers = vocab_size ** np.arange(k, dtype=np.int64)
        out[:, start : start + k] = (codes[:, None] // powers) % vocab_size
    return out
