"""Base class of the native batched (``vector_entry_point``) environments of tpo_gym.

It implements what every native vector env shares, with array operations only:

* ``NEXT_STEP`` autoreset, exactly like :class:`gymnasium.vector.SyncVectorEnv`'s default: after a
  sub-env terminates, the *next* ``step`` call resets it (its action is ignored, reward 0,
  ``terminated = truncated = False``) and returns the first observation of the new episode;
* seeding identical to ``SyncVectorEnv``: ``reset(seed=s)`` gives sub-env ``i`` the generator of
  ``seed = s + i`` (see :func:`tpo_gym.envs._common.seed_generators`), so native, sync and async
  vectorisation draw the same contexts and give the same rewards for the same actions;
* the group option ``reset(options={"group_size": G})``: sub-envs ``i*G .. (i+1)*G-1`` share one
  context, drawn from the generator of the group's first sub-env.

Drawing a new context uses each resetting sub-env's own generator (one small numpy call per group,
the only per-env Python work); ``step`` and ``score_candidates`` are pure array code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from tpo_gym.envs._common import check_group_size, seed_generators


class NativeVectorEnv(VectorEnv):
    """Shared reset / autoreset / group logic; subclasses draw and assign contexts and step."""

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        self.num_envs = int(num_envs)
        self.group_size = 1
        self._gens: list[np.random.Generator] | None = None
        self._needs_reset = np.zeros(self.num_envs, dtype=np.bool_)
        self._has_reset = False

    # -- hooks for subclasses ------------------------------------------------------------------
    def _draw_contexts(self, gens: list[np.random.Generator], seeded: bool) -> np.ndarray:
        """Draw one context per generator (the group leaders), stacked along axis 0."""
        raise NotImplementedError

    def _assign_contexts(self, env_ids: np.ndarray, contexts: np.ndarray) -> None:
        """Start new episodes in sub-envs ``env_ids`` with the given contexts (one row each)."""
        raise NotImplementedError

    def _observations(self) -> np.ndarray:
        """The current observation of every sub-env, batched."""
        raise NotImplementedError

    # -- shared machinery -----------------------------------------------------------------------
    def _reset_subenvs(self, mask: np.ndarray, seeded: bool = False) -> None:
        """Start new episodes in the sub-envs of ``mask`` (whole groups), one draw per group."""
        ids = np.flatnonzero(mask)
        if ids.size == 0:
            return
        g = self.group_size
        leaders = ids[ids % g == 0]
        if leaders.size * g != ids.size:  # pragma: no cover - groups always move in lockstep
            raise RuntimeError("internal error: a group was only partly reset")
        assert self._gens is not None
        contexts = self._draw_contexts([self._gens[i] for i in leaders.tolist()], seeded)
        pos = np.searchsorted(leaders, (ids // g) * g)
        self._assign_contexts(ids, contexts[pos])
        self._needs_reset[ids] = False

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every sub-env. ``options={"group_size": G}`` makes groups of G share a context.

        ``seed`` is an int (sub-env ``i`` gets ``seed + i``, as in ``SyncVectorEnv``), a list of one
        seed per sub-env, or ``None`` (keep the current generators; fresh entropy on first reset).
        """
        self.group_size = check_group_size(options, self.num_envs)
        seeded = seed is not None or self._gens is None
        if seeded:
            self._gens = seed_generators(seed, self.num_envs)
            self._np_random = self._gens[0]
        self._reset_subenvs(np.ones(self.num_envs, dtype=np.bool_), seeded=seeded)
        self._has_reset = True
        return self._observations(), {}

    def _check_has_reset(self) -> None:
        if not self._has_reset:
            raise RuntimeError(f"{type(self).__name__}: call reset() before step() or score_candidates()")

    @staticmethod
    def _masked_info(info: dict[str, Any], key: str, values: np.ndarray, mask: np.ndarray) -> None:
        """Add ``values`` under ``key`` with the ``_key`` mask, like ``VectorEnv._add_info``."""
        info[key] = values
        info["_" + key] = mask
