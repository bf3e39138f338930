"""The ``gym`` run kind: an agent on a plain Gymnasium env (e.g. ``Pendulum-v1``, Box actions), its return curve.

``params = {"env_id", "env_kwargs"?, "steps", "window", "agent_kwargs"?, "policy"?}``. The agent (a tpo-gym
agent built by :func:`~tpo_gym.evaluation.experiments.make_agent`, default policy ``"MlpPolicy"``, or a
Stable-Baselines3 algorithm, ``"stable_baselines3:PPO"``, with the method row's ``kwargs`` as its constructor
arguments, ``policy`` and ``n_envs`` among them as in :mod:`~tpo_gym.evaluation.sb3_runs`) trains for
``steps`` env steps (``learn(steps)``; ``tpo-gym bench --steps`` sets it), and both are measured the same way, by
one SB3 callback:

* one row per window of ``window`` env steps (at most ``steps``): ``step`` (the window's index, from 0),
  ``return`` (the mean undiscounted return of the training episodes that ended in the window; the window
  before's where none did; the last window also takes the episodes of the last iteration, or SB3 rollout, that
  end past ``steps``) and ``env_steps`` (env steps at the window's end);
* the tpo-gym agents report every episode to callbacks as SB3's ``Monitor`` does (``infos[i]["episode"]``), SB3's
  algorithms through the ``Monitor`` of ``make_vec_env``: the same training returns, exploration noise included.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["run_gym"]


def _return_windows(window: int, total: int) -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    n_windows = max(total // window, 1)

    class ReturnWindows(BaseCallback):
        """Rows of a ``gym`` run: per window of ``window`` env steps, the mean return of the episodes that ended in
        it; the last window also takes the episodes that end past ``total`` (an iteration, or an SB3 rollout, runs
        to its end)."""

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict[str, Any]] = []
            self._returns: list[float] = []
            self._last = math.nan

        def _close(self) -> None:
            if self._returns:
                self._last = float(np.mean(self._returns))
            self._returns = []
            self.rows.append({"step": len(self.rows), "return": self._last, "env_steps": (len(self.rows) + 1) * window})

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                if done and isinstance(info.get("episode"), dict):
                    self._returns.append(float(info["episode"]["r"]))
            while len(self.rows) + 1 < n_windows and (len(self.rows) + 1) * window <= self.num_timesteps:
                self._close()
            return True

        def _on_training_end(self) -> None:
            while len(self.rows) < n_windows:
                self._close()

    return ReturnWindows()


def run_gym(spec: dict[str, Any], sb3_class: type | None = None, make_agent: Any = None) -> list[dict[str, Any]]:
    """The rows of a ``gym`` run (module docstring): a tpo-gym agent built by ``make_agent``
    (:func:`~tpo_gym.evaluation.experiments.make_agent`, passed in by the caller, which imports this module), or the
    SB3 algorithm ``sb3_class``."""
    from tpo_gym.evaluation._run_envs import make_env as _make_env

    p = spec["params"]
    total, window = int(p["steps"]), int(p["window"])
    if total < 1 or window < 1:
        raise ValueError(f"a gym setting needs steps >= 1 and window >= 1, got steps={total}, window={window}")
    window = min(window, total)
    env_id, env_kwargs = p["env_id"], p.get("env_kwargs", {})
    seed = int(spec["seed"])
    if sb3_class is None:
        model = make_agent(spec["algo"], _make_env(env_id, env_kwargs), seed, p, spec["method_kwargs"], kind="gym",
                           device=spec.get("device", "cpu"))
    else:
        from stable_baselines3.common.env_util import make_vec_env

        kwargs = dict(spec.get("method_kwargs", {}))
        policy = kwargs.pop("policy", "MlpPolicy")
        n_envs = kwargs.pop("n_envs", 1)
        if not isinstance(n_envs, int) or isinstance(n_envs, bool) or not 1 <= n_envs <= 1024:
            raise ValueError(f"SB3 method {spec['method']!r}: n_envs must be an int in [1, 1024], got {n_envs!r}")
        venv = make_vec_env(lambda: _make_env(env_id, env_kwargs), n_envs=n_envs, seed=seed)
        model = sb3_class(policy, venv, seed=seed, device=spec.get("device", "cpu"), **kwargs)
    callback = _return_windows(window, total)
    model.learn(total, callback=callback)
    if not any(math.isfinite(r["return"]) for r in callback.rows):
        raise RuntimeError(f"method {spec['method']!r} finished no episode in {total} env steps")
    return [r for r in callback.rows if math.isfinite(r["return"])]
