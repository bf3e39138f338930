"""Stable-Baselines3 conventions the agents keep: full signatures with their ``:param:`` lines, the env steps of an
iteration as SB3's callbacks count them, and a progress bar over env steps.

SB3's algorithm classes spell out every constructor argument; tpo-gym's subclasses take their own arguments and
forward the rest, so :func:`complete_signature` gives each class the full signature and appends the ``:param:``
lines of the arguments it inherits.

SB3 calls ``callback.on_step()`` once per ``env.step()`` of its ``n_envs`` envs (``num_timesteps`` grows by
``n_envs`` per call), and fills ``ep_info_buffer`` from the ``"episode"`` infos of ``Monitor``. tpo-gym's agents
roll out a whole iteration first (B or B*K episodes side by side), then replay its env steps to the callbacks in
the order they were taken (:func:`step_order`; :meth:`~tpo_gym.agents.common.base.GroupAlgorithm.after_rollout`), and
read the ``Monitor`` / ``RecordEpisodeStatistics`` entries of the rollout's infos with :func:`episode_entries`.
The progress bar (:func:`count_progress_by_steps`) reads ``num_timesteps`` rather than adding ``n_envs`` per call,
so it stays exact when an iteration's last call covers fewer than ``n_envs`` steps.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ProgressBarCallback

from tpo_gym.agents.common.env_copies import wrapper_levels

__all__ = ["IterationProgressBar", "count_progress_by_steps", "step_order", "episode_entries", "user_monitors",
           "record_in_monitors", "param_blocks", "complete_signature", "check_n_threads", "check_tensorboard_log",
           "MAX_THREADS", "MAX_PATH_CHARS"]

#: Most torch CPU threads an agent may ask for (``n_threads``).
MAX_THREADS = 4096
#: Longest ``tensorboard_log`` path accepted.
MAX_PATH_CHARS = 4096


def check_n_threads(value: Any) -> int | None:
    """``n_threads`` as given: ``None`` (leave torch's setting) or an integer in ``[1, MAX_THREADS]``, else
    ``ValueError`` naming the value and the range (the constructor and a saved agent's file both go through it)."""
    from tpo_gym._validation import check_int

    return None if value is None else check_int("n_threads", value, 1, MAX_THREADS)


def check_tensorboard_log(value: Any) -> Any:
    """``tensorboard_log`` as given: ``None`` or a non-empty path (a ``str`` or ``os.PathLike``) of at most
    ``MAX_PATH_CHARS`` characters without NUL, else ``ValueError`` naming the value and what is allowed."""
    import os

    if value is None:
        return None
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text or "\0" in text or len(text) > MAX_PATH_CHARS:
        shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:80]}... ({len(repr(value))} characters)"
        raise ValueError(f"tensorboard_log must be None or a non-empty directory path (str) of at most "
                         f"{MAX_PATH_CHARS} characters without NUL, got {shown}")
    return value


class IterationProgressBar(ProgressBarCallback):
    """SB3's progress bar, set to the model's ``num_timesteps`` at each ``on_step`` (exact at every call)."""

    def _on_training_start(self) -> None:
        self._start = self.model.num_timesteps
        self._total = max(int(self.locals["total_timesteps"]) - self._start, 0)
        super()._on_training_start()

    def _on_step(self) -> bool:
        done = min(self.model.num_timesteps - self._start, self._total)
        self.pbar.update(done - self.pbar.n)
        return True


def count_progress_by_steps(callback: BaseCallback) -> None:
    """Make SB3 ``ProgressBarCallback`` instances (also inside lists) follow ``num_timesteps``.

    The instance keeps its identity (its class becomes :class:`IterationProgressBar`, which only
    changes how ``_on_step`` advances the bar), so a caller holding it can still read ``pbar``.
    """
    if type(callback) is ProgressBarCallback:
        callback.__class__ = IterationProgressBar
    elif isinstance(callback, CallbackList):
        for inner in callback.callbacks:
            count_progress_by_steps(inner)


def step_order(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where N episodes rolled out side by side end, in the order their ``sum(lengths)`` env steps were taken.

    The steps are taken time step by time step, sub-env by sub-env (step ``t`` of every episode still running,
    in sub-env order, then step ``t + 1``), as a vector env steps them. Returns ``(ends, episodes)``: the 0-based
    positions of the episodes' last steps in that order (ascending) and the index of the episode ending there.

    :param lengths: ``int [N]`` env steps of each episode (>= 1).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    t = np.arange(int(lengths.max(initial=0)))[:, None]
    taken = t < lengths[None, :]  # [T, N], time-major like the vector env's steps
    last = (t == lengths[None, :] - 1)[taken]
    return np.flatnonzero(last), np.nonzero(taken)[1][last]


def episode_entries(info: dict[str, Any], done: np.ndarray, entries: list[dict[str, Any]] | None
                    ) -> list[dict[str, Any]]:
    """Add the ``"episode"`` / ``"is_success"`` entries of a vector env's ``info`` for the sub-envs in ``done``.

    Gymnasium's vector envs give them as arrays with ``"_key"`` masks (``info["episode"]["r"][i]``), as SB3's
    ``Monitor`` and Gymnasium's ``RecordEpisodeStatistics`` inside a ``SyncVectorEnv`` both do; ``entries[i]``
    gets sub-env ``i``'s as SB3's ``Monitor`` writes them (``{"episode": {"r": .., "l": .., "t": ..}}``).

    :param info: the vector env's ``info`` of one step.
    :param done: ``bool [num_envs]`` sub-envs whose (first) episode ended at this step.
    :param entries: the entries so far (``None``: none yet).
    """
    n = len(done)
    entries = [{} for _ in range(n)] if entries is None else entries
    for key in ("episode", "is_success"):
        if key not in info:
            continue
        got = done & np.asarray(info.get("_" + key, np.ones(n, np.bool_)), dtype=np.bool_)
        value = info[key]
        for i in np.flatnonzero(got):
            if key == "episode":
                entries[i][key] = {k: np.asarray(v)[i].item() for k, v in value.items() if not k.startswith("_")}
            else:
                entries[i][key] = np.asarray(value)[i].item()
    return entries


def user_monitors(env: Any) -> list[list[Any]]:
    """The SB3 ``Monitor`` s of the env a user passed, per sub-env (at any depth of its wrappers).

    The rollouts run in the agent's own copies, which drop the outermost ``Monitor`` s and re-create the others
    without a file (:func:`~tpo_gym.agents.common.env_copies.rebuild_plan`); so that ``monitor.get_episode_rewards()``,
    its CSV file and SB3's ``load_results`` / ``plot_results`` see the episodes, as with SB3's own agents, the
    episodes are recorded in the user's (:func:`record_in_monitors`), with the statistics SB3 reports (a
    ``Monitor`` inside a reward wrapper records the reward it sees). ``env`` is the env the model keeps
    (``model.env``: a ``DummyVecEnv`` or tpo-gym's ``TextVecEnv`` of the user's env; a ``VecMonitor`` is
    returned as the one entry of every sub-env).
    Envs in subprocesses (``SubprocVecEnv``) give none: their monitors live in the other processes.
    """
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import VecMonitor

    if isinstance(env, VecMonitor):
        return [[env]] * env.num_envs
    return [[level for level in wrapper_levels(sub) if isinstance(level, Monitor)]
            for sub in getattr(env, "envs", None) or []]


def record_in_monitors(monitors: list[list[Any]], episodes: list[tuple[int, dict[str, Any]]]) -> None:
    """Record each ``(sub_env, info)`` of ``episodes`` in that sub-env's user ``monitors`` as SB3's ``Monitor`` does
    at an episode's end: its return, length and time appended (``episode_returns``, ``episode_lengths``,
    ``episode_times``; ``total_steps`` grows by the length) and a row ``r, l, t`` (plus its ``info_keywords``)
    written to its file, ``t`` in seconds since the monitor was made. A ``VecMonitor`` gets the row and its
    ``episode_count``. ``info`` is the episode's info as SB3 reads it (``{"episode": {"r", "l", "t"}, ...}``).
    """
    import time

    from stable_baselines3.common.vec_env import VecMonitor

    if not any(monitors):
        return
    for k, info in episodes:
        ep = info["episode"]
        for monitor in monitors[k % len(monitors)]:
            row = {"r": round(float(ep["r"]), 6), "l": int(ep["l"]), "t": round(time.time() - monitor.t_start, 6)}
            for key in monitor.info_keywords:
                row[key] = ep.get(key, info.get(key, ""))
            if isinstance(monitor, VecMonitor):
                monitor.episode_count += 1
            else:
                monitor.episode_returns.append(float(ep["r"]))
                monitor.episode_lengths.append(int(ep["l"]))
                monitor.episode_times.append(row["t"])
                monitor.total_steps += int(ep["l"])
            if monitor.results_writer is not None:
                monitor.results_writer.write_row(row)


def param_blocks(doc: str) -> dict[str, str]:
    """The ``:param name: text`` blocks of a docstring, by name."""
    text = inspect.cleandoc(doc or "")
    return {name: block.strip() for block, name in re.findall(r"(:param (\w+):.*?)(?=\n:param |\n\n|\Z)", text,
                                                              flags=re.S)}


def complete_signature(cls: type, base_init: Callable[..., Any], base_doc: str, fixed: dict[str, Any]) -> None:
    """Give ``cls.__init__`` its full signature (its own arguments, then the base's it forwards, keyword-only ones
    sorted with ``_init_setup_model`` last) and append to ``cls.__doc__`` the ``:param:`` lines of the inherited
    arguments it does not document. Arguments in ``fixed`` (fixed by the method) are left out."""
    own = inspect.signature(cls.__init__)  # type: ignore[misc]
    base = inspect.signature(base_init)
    params = [p for p in own.parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    names = {p.name for p in params}
    for p in base.parameters.values():
        if p.name not in names and p.name not in fixed:
            params.append(p)
    head = [p for p in params if p.kind is not p.KEYWORD_ONLY]
    tail = sorted((p for p in params if p.kind is p.KEYWORD_ONLY), key=lambda p: p.name == "_init_setup_model")
    cls.__init__.__signature__ = own.replace(parameters=head + tail)  # type: ignore[misc]
    documented = param_blocks(cls.__doc__ or "")
    inherited = param_blocks(base_doc)
    extra = [inherited[p.name] for p in head + tail if p.name in inherited and p.name not in documented]
    if extra:
        cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + "\n".join("    " + b.replace("\n", "\n    ")
                                                                       for b in extra) + "\n"
