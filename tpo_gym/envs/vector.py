"""Base classes of the native batched (``vector_entry_point``) environments, public for your own tasks.

:class:`NativeVectorEnv` implements what every native vector env shares, with array operations only:

* ``NEXT_STEP`` autoreset, exactly like :class:`gymnasium.vector.SyncVectorEnv`'s default: after a
  sub-env terminates, the *next* ``step`` call resets it (its action is ignored, reward 0,
  ``terminated = truncated = False``) and returns the first observation of the new episode;
* on request (``autoreset_mode=AutoresetMode.SAME_STEP`` or ``"SameStep"``, passed as a kwarg:
  ``gym.make_vec(id, n, vectorization_mode="vector_entry_point", autoreset_mode="SameStep")``) the
  ``SAME_STEP`` autoreset of ``SyncVectorEnv(..., autoreset_mode=SAME_STEP)``: the step that ends an
  episode resets the sub-env at once and returns the new episode's first observation, with the last
  observation in ``info["final_obs"]`` (an object array, ``None`` elsewhere) and the ending step's
  info in ``info["final_info"]`` (each with its ``_final_obs`` / ``_final_info`` mask), so one-step
  tasks take a real step on every call. Subclasses list the modes they support in
  ``autoreset_modes`` (default ``NEXT_STEP`` only; ``DISABLED`` is not offered, it needs partial
  resets); ``metadata["autoreset_mode"]`` is the instance's mode;
* seeding identical to ``SyncVectorEnv``: ``reset(seed=s)`` gives sub-env ``i`` the generator of
  ``seed = s + i`` (see :func:`tpo_gym.envs._common.seed_generators`), so native, sync and async
  vectorisation draw the same contexts and give the same rewards for the same actions;
* the group option ``reset(options={"group_size": G})``: sub-envs ``i*G .. (i+1)*G-1`` share one
  context, drawn from the generator of the group's first sub-env;
* spaces exactly as ``SyncVectorEnv`` reports them:
  ``observation_space = batch_space(single_observation_space, num_envs)`` (same for actions);
* the episode summary in the ``info`` of the step that ends an episode (``score``, ``error`` with
  their ``_score`` / ``_error`` masks) and the ``reward_credit`` attribute, as the single envs
  (see :mod:`tpo_gym.envs`).

Drawing a new context uses each resetting sub-env's own generator (one small numpy call per group,
the only per-env Python work); ``step`` and ``score_candidates`` are pure array code.

A subclass is a :class:`~tpo_gym.envs.group.GroupVectorEnv` (the group API the agents rely on): register
it as the ``vector_entry_point`` of its single env and check it with :func:`tpo_gym.envs.check_group_env`.
:class:`NativeTensorEnv` is the base of the on-device (torch) forms, reached through a vector env
class's ``tensor_env`` attribute. ``tpo_gym.envs._vector``, the old path, still imports both.

The render helpers of the single envs live here too (:class:`RenderMixin`, :func:`check_render_mode`,
:func:`cells_image`): every tpo_gym single env with a native twin renders ``"ansi"`` (a text view) and
``"rgb_array"`` (a small picture of its state), so Stable-Baselines3's ``make_vec_env``, which asks for
``"rgb_array"``, builds them without a warning. The vector envs themselves do not render: they take the
``render_mode`` their single env was made with (so ``gym.make_vec(id, render_mode=...)``, SB3's ``make_vec_env``
and an agent rebuilding its rollouts from a rendering env's spec all work), keep it as ``render_mode``, and their
``render()`` says to render a single env instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import logger, spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from tpo_gym._validation import check_options
from tpo_gym.envs._common import check_group_size, check_num_envs, seed_generators


def check_render_mode(render_mode: Any, modes: list[str]) -> str | None:
    """``render_mode`` if it is None or one of ``modes``, else ``ValueError`` naming it and the allowed ones."""
    if render_mode is not None and (not isinstance(render_mode, str) or render_mode not in modes):
        raise ValueError(f"render_mode must be None or one of {modes}, got {render_mode!r}")
    return render_mode


class RenderMixin:
    """The rendering of the single envs (put it before ``gymnasium.Env`` in the bases): ``metadata`` with both
    render modes and the ``render_fps`` Gymnasium's checker asks for, the ``render_mode`` check
    (:meth:`_set_render_mode`, in ``__init__``) and ``render()``, which returns :meth:`_render_text` for
    ``"ansi"``, :meth:`_render_rgb` for ``"rgb_array"``, and ``None`` with Gymnasium's warning without a
    render mode (as Gymnasium's own envs do)."""

    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    render_mode: str | None = None
    spec: Any = None

    def _set_render_mode(self, render_mode: Any) -> None:
        self.render_mode = check_render_mode(render_mode, self.metadata["render_modes"])

    def render(self) -> str | np.ndarray | None:
        """A text view (``"ansi"``) or an RGB ``uint8 [h, w, 3]`` picture (``"rgb_array"``) of the state."""
        if self.render_mode == "ansi":
            return self._render_text()
        if self.render_mode == "rgb_array":
            return self._render_rgb()
        env_id = self.spec.id if self.spec is not None else "<id>"
        logger.warn("You are calling render method without specifying any render mode. You can specify the "
                    f'render_mode at initialization, e.g. gym.make("{env_id}", render_mode="rgb_array")')
        return None

    def _render_text(self) -> str:
        raise NotImplementedError

    def _render_rgb(self) -> np.ndarray:
        raise NotImplementedError


def cells_image(colors: np.ndarray, cell: int) -> np.ndarray:
    """An RGB ``uint8 [h * cell, w * cell, 3]`` picture of ``colors`` (``float [h, w, 3]`` in ``[0, 1]``),
    each entry a ``cell`` x ``cell`` square."""
    pixels = np.round(np.clip(colors, 0.0, 1.0) * 255).astype(np.uint8)
    return np.ascontiguousarray(pixels.repeat(cell, axis=0).repeat(cell, axis=1))


def check_autoreset_mode(
    value: Any, supported: tuple[AutoresetMode, ...] = (AutoresetMode.NEXT_STEP,), who: str = "this env",
    note: str = "",
) -> AutoresetMode:
    """``value`` (an :class:`~gymnasium.vector.AutoresetMode` or its string value, e.g. ``"SameStep"``) as an
    ``AutoresetMode`` if it is one of ``supported``, else ``ValueError`` naming it and what ``who`` supports
    (followed by ``note``, why, for a supported-elsewhere mode)."""
    allowed = ", ".join(f"AutoresetMode.{m.name} ({m.value!r})" for m in supported)
    try:
        mode = value if isinstance(value, AutoresetMode) else AutoresetMode(value)
    except (ValueError, TypeError):
        raise ValueError(f"autoreset_mode must be {allowed}, got {value!r}") from None
    if mode not in supported:
        why = (" (DISABLED leaves finished sub-envs to reset(options={'reset_mask': ...}), which native vector "
               "envs do not offer; use vectorization_mode='sync' for it)") if mode is AutoresetMode.DISABLED else note
        raise ValueError(f"{who} supports autoreset_mode {allowed}, got AutoresetMode.{mode.name}{why}")
    return mode


class NativeVectorEnv(VectorEnv):
    """Shared reset / autoreset / group logic of a native vector env; subclasses hold the task.

    A subclass calls ``super().__init__(num_envs)`` and :meth:`_set_spaces`, and implements the
    hooks :meth:`_draw_contexts`, :meth:`_assign_contexts` and :meth:`_observations`, plus ``step``
    (which starts with :meth:`_check_has_reset`, resets the sub-envs flagged in ``_needs_reset`` with
    :meth:`_reset_subenvs`, flags those whose episode ends, and reports them with
    :meth:`_episode_info`) and :meth:`score_candidates`. ``reset`` is inherited.

    ``autoreset_mode`` (``NEXT_STEP``, the default, or any mode of the subclass's ``autoreset_modes``) is
    checked here; a subclass that lists ``SAME_STEP`` ends ``step`` with ``return self._autoreset(...)``.
    ``render_mode`` (``None`` or a single env's mode, ``"ansi"`` / ``"rgb_array"``) is checked and recorded, not
    rendered (see :meth:`render`).
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}
    #: The autoreset modes this class supports (a subclass whose ``step`` ends with :meth:`_autoreset`
    #: adds ``SAME_STEP``).
    autoreset_modes: ClassVar[tuple[AutoresetMode, ...]] = (AutoresetMode.NEXT_STEP,)
    #: Why the other modes are not supported (appended to the error).
    autoreset_note: ClassVar[str] = " (its step does not apply the SAME_STEP autoreset)"
    #: How single-sample methods credit the rewards (see :mod:`tpo_gym.envs`); "step" unless a
    #: subclass says otherwise.
    reward_credit: str = "step"
    #: The on-device form of this env (a :class:`NativeTensorEnv` subclass taking ``num_envs``,
    #: ``device``, ``check_actions`` and this env's kwargs), or ``None`` when it has none.
    tensor_env: ClassVar[type[NativeTensorEnv] | None] = None

    def __init__(self, num_envs: int, autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 render_mode: str | None = None) -> None:
        self.num_envs = check_num_envs(num_envs)
        self.render_mode = check_render_mode(render_mode, RenderMixin.metadata["render_modes"])
        self.autoreset_mode = check_autoreset_mode(autoreset_mode, self.autoreset_modes, type(self).__name__,
                                                   self.autoreset_note)
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self.group_size = 1
        self._gens: list[np.random.Generator] | None = None
        self._needs_reset = np.zeros(self.num_envs, dtype=np.bool_)
        self._has_reset = False

    def render(self) -> None:
        """Native vector envs do not render: ``NotImplementedError`` (as Gymnasium's ``VectorEnv``) naming what does."""
        raise NotImplementedError(
            f"{type(self).__name__} does not render (its render_mode {self.render_mode!r} is only recorded); render a "
            "single env (gym.make(id, render_mode=...)) or a vector env made with vectorization_mode='sync'")

    def _set_spaces(self, single_observation_space: spaces.Space[Any], single_action_space: spaces.Space[Any]) -> None:
        """Set the single spaces and their batched forms, exactly as ``SyncVectorEnv`` builds them."""
        self.single_observation_space = single_observation_space
        self.single_action_space = single_action_space
        self.observation_space = batch_space(single_observation_space, self.num_envs)
        self.action_space = batch_space(single_action_space, self.num_envs)

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

    def score_candidates(self, candidates: Any) -> Any:
        """Reward ``float32 [num_envs, K]`` of K candidate actions ``[num_envs, K]`` per sub-env, now,
        without side effects (0 for sub-envs awaiting their autoreset, as the next ``step`` gives)."""
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

        ``seed`` is an integer >= 0 (sub-env ``i`` gets ``seed + i``, as in ``SyncVectorEnv``), a list
        of one seed per sub-env (each None or an integer >= 0), or ``None`` (keep the current
        generators; fresh entropy on first reset). ``options`` is None or a dict with str keys.
        Anything else raises ``ValueError``.
        """
        options = check_options(options)
        group_size = check_group_size(options, self.num_envs)
        gens = seed_generators(seed, self.num_envs) if (seed is not None or self._gens is None) else None
        self.group_size = group_size
        seeded = gens is not None
        if gens is not None:
            self._gens = gens
            self._np_random = getattr(gens[0], "real", lambda: gens[0])()  # a numpy Generator, as gymnasium's
        self._reset_subenvs(np.ones(self.num_envs, dtype=np.bool_), seeded=seeded)
        self._has_reset = True
        return self._observations(), {}

    def _check_has_reset(self) -> None:
        if not self._has_reset:
            raise RuntimeError(f"{type(self).__name__}: call reset() before step() or score_candidates()")

    @staticmethod
    def _masked_info(info: dict[str, Any], key: str, values: np.ndarray, mask: np.ndarray) -> None:
        """Add ``values`` under ``key`` with the ``_key`` mask, like ``VectorEnv._add_info``.

        Entries outside ``mask`` are zero (``False`` for bools), as ``SyncVectorEnv`` leaves them.
        """
        info[key] = np.where(mask, values, np.zeros((), dtype=values.dtype))
        info["_" + key] = mask.copy()

    def _autoreset(
        self, obs: np.ndarray, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
        info: dict[str, Any],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """A step's results as the env's autoreset mode returns them (``step`` ends with this).

        ``NEXT_STEP``: unchanged. ``SAME_STEP``, as ``SyncVectorEnv``: the sub-envs whose episode ended
        start a new one now; their observation becomes the new episode's first, the last one goes to
        ``info["final_obs"]`` and their part of ``info`` (each masked key) to ``info["final_info"]``.
        """
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            return obs, rewards, terminated, truncated, info
        ended = terminated | truncated
        if not ended.any():
            return obs, rewards, terminated, truncated, info
        top: dict[str, Any] = {}
        final: dict[str, Any] = {}
        for key, value in info.items():
            mask = info.get("_" + key)
            if key.startswith("_") and key[1:] in info:
                continue
            if mask is None or not isinstance(value, np.ndarray):  # unmasked: not any one sub-env's
                top[key] = value
                continue
            for part, sel in ((final, mask & ended), (top, mask & ~ended)):
                if sel.any():
                    self._masked_info(part, key, value, sel)
        final_obs = np.full(self.num_envs, None, dtype=object)
        for i in np.flatnonzero(ended).tolist():
            final_obs[i] = obs[i]
        self._reset_subenvs(ended)
        top["final_obs"], top["_final_obs"] = final_obs, ended.copy()
        top["final_info"], top["_final_info"] = final, ended.copy()
        return self._observations(), rewards, terminated, truncated, top

    @classmethod
    def _episode_info(cls, info: dict[str, Any], ended: np.ndarray, score: np.ndarray, error: np.ndarray) -> None:
        """Add the episode summary ``score`` / ``error`` (float64) of the sub-envs in ``ended``."""
        cls._masked_info(info, "score", np.asarray(score, dtype=np.float64), ended)
        cls._masked_info(info, "error", np.asarray(error, dtype=np.float64), ended)


class NativeTensorEnv(NativeVectorEnv):
    """Base of the on-device (torch) forms of the native vector envs: what they share.

    Every sub-env starts at ``reset`` and every episode lasts the same fixed number of steps
    (``fixed_horizon``), so the sub-envs move in lockstep: nothing inside an episode reads a device
    value back. ``step`` / ``score_candidates`` check their input (``check_actions``: also that every
    value is in range, which reads it back; the agents' rollouts pass ``False``), run the ``NEXT_STEP``
    autoreset (the call after the episodes ended resets them: reward 0, not terminated; the only mode
    offered here, ``autoreset_mode=SAME_STEP`` raises ``ValueError``) and leave the task to
    :meth:`_step` / :meth:`_score`. Contexts are drawn on the host by the same per-sub-env
    generators as the numpy env and uploaded once per reset.
    """

    #: Steps of every episode (set by subclasses).
    fixed_horizon: int = 1
    autoreset_note: ClassVar[str] = (" (the on-device forms step every sub-env in lockstep and keep NEXT_STEP; "
                                     "the numpy native vector env offers SAME_STEP)")

    def __init__(self, num_envs: int, device: Any = "cpu", check_actions: bool = True,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, render_mode: str | None = None) -> None:
        import torch

        super().__init__(num_envs, autoreset_mode, render_mode)
        self.device = torch.device(device)
        self.check_actions = bool(check_actions)

    def _reset_subenvs(self, mask: np.ndarray, seeded: bool = False) -> None:
        """As the numpy env's, but always every sub-env at once (lockstep), so ``_assign_contexts`` sets all."""
        if not mask.all():  # pragma: no cover - resets and autoresets here always cover every sub-env
            raise RuntimeError(f"internal error: {type(self).__name__} resets all sub-envs together")
        super()._reset_subenvs(mask, seeded)

    def _as_discrete(self, x: Any, n: int, what: str) -> Any:
        """``x`` as an int64 tensor on the device: actions ``(num_envs,)`` or candidates ``(num_envs, K)``."""
        import torch

        if not isinstance(x, torch.Tensor):
            x = torch.as_tensor(np.asarray(x), device=self.device)
        if x.dtype == torch.bool or x.dtype.is_floating_point or x.dtype.is_complex:
            raise ValueError(f"{what} must have an integer dtype, got dtype {x.dtype}")
        matrix = what == "candidates"
        if x.ndim != 1 + matrix or x.shape[0] != self.num_envs or (matrix and x.shape[1] < 1):
            want = f"({self.num_envs}, K) with K >= 1" if matrix else f"({self.num_envs},)"
            raise ValueError(f"{what} must have shape {want}, got shape {tuple(x.shape)}")
        x = x.to(self.device, torch.int64)
        if self.check_actions and x.numel():
            bad = x[(x < 0) | (x >= n)]
            if bad.numel():
                raise ValueError(f"{what} must be integers in [0, {n}) (Discrete({n})), got {bad[:8].tolist()} "
                                 "outside it")
        return x

    def _n_actions(self) -> int:
        return int(self.single_action_space.n)  # type: ignore[attr-defined]

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """One step of every sub-env; after the episodes ended, the next call resets them instead."""
        import torch

        self._check_has_reset()
        acts = self._as_discrete(actions, self._n_actions(), "actions")
        if self._needs_reset.any():  # host flags: every sub-env ended at the previous step
            self._reset_subenvs(self._needs_reset.copy())
            no = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
            return self._observations(), torch.zeros(self.num_envs, device=self.device), no, no.clone(), {}
        return self._step(acts)

    def score_candidates(self, candidates: Any) -> Any:
        """Reward ``float32 [num_envs, K]`` of K candidate actions per sub-env, no side effects (0 after
        the episodes ended, as the next ``step`` gives)."""
        import torch

        self._check_has_reset()
        cand = self._as_discrete(candidates, self._n_actions(), "candidates")
        if self._needs_reset.any():
            return torch.zeros(cand.shape, dtype=torch.float32, device=self.device)
        return self._score(cand)

    def _step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The task's step of every sub-env with validated int64 ``actions`` (episodes in progress)."""
        raise NotImplementedError

    def _score(self, candidates: Any) -> Any:
        """The task's rewards ``float32 [num_envs, K]`` of validated int64 ``candidates``."""
        raise NotImplementedError

    def _end_info(self, values: dict[str, Any]) -> dict[str, Any]:
        """An ``info`` with every key of ``values`` masked by an all-True ``_key`` (every episode ended)."""
        import torch

        mask = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self._needs_reset[:] = True
        info: dict[str, Any] = {}
        for key, value in values.items():
            info[key], info["_" + key] = value, mask
        return info
