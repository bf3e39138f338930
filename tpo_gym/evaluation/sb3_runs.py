"""Stable-Baselines3 algorithms as benchmark methods: ``{"algo": "stable_baselines3:PPO", "kwargs": {...}}``.

Any class derived from SB3's ``BaseAlgorithm`` (SB3's PPO, A2C, DQN, sb3-contrib's classes that take a Discrete
action space) runs in a token or MNIST setting of a preset, on the setting's env, with the method row's ``kwargs``
as its constructor arguments (``policy`` among them, default ``"MlpPolicy"``; ``n_envs``, default 1, for SB3's
``make_vec_env``). It is measured as the built-in agents are:

* **Budget, matched in env interactions.** A step of a token setting is one iteration of a single-sample
  built-in method: ``B`` episodes of ``H`` tokens (``B K`` under ``budget="interaction"``), so an SB3 method
  gets ``episodes x B x H`` env steps (``x K``) and its curve has one point per such window. A step of MNIST is
  ``B`` one-step episodes.
* **Metrics.** ``error`` is 1 - the mean episode score of the training episodes that ended in the window (the
  env's ``info["error"]``: the same sampled training error as the built-in agents'); MNIST's ``test_error`` is the
  greedy error on the 10,000 test images every ``eval_every`` steps, with ``model.predict(deterministic=True)``
  as for the built-ins.
* **What it used.** Every row carries ``env_steps`` (cumulative env interactions) and ``reward_queries`` (rewards
  the method observed: one per env step, since SB3's algorithms score no candidates).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["run_sb3"]


def _window(params: dict[str, Any], kind: str) -> int:
    """Env steps of one step of the setting's curve (see the module docstring)."""
    agent = params.get("agent_kwargs", {})
    batch = int(agent.get("batch_size", 100))
    if kind == "mnist":
        return batch
    horizon = int(params.get("env_kwargs", {}).get("length", 0)) or _horizon(params)
    multiplier = int(agent.get("group_size", 8)) if agent.get("budget") == "interaction" else 1
    return batch * horizon * multiplier


def _horizon(params: dict[str, Any]) -> int:
    import gymnasium as gym

    import tpo_gym  # noqa: F401  (registers the envs)

    env = gym.make(params["env_id"], **params.get("env_kwargs", {}))
    horizon = getattr(env.unwrapped, "horizon", None)
    env.close()
    if not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"{params['env_id']}: an SB3 method needs the env's fixed horizon (env.unwrapped.horizon) "
                         "to match its budget to the built-in methods'")
    return horizon


def _make_callback(window: int, total: int, evaluate: Any = None, eval_every: int = 1) -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class WindowLog(BaseCallback):
        """Rows of the run: per window of ``window`` env steps, the mean ``info["error"]`` of the episodes that
        ended in it (the last window's where none did); with ``evaluate`` (MNIST), one row every ``eval_every``
        windows with ``test_error`` and the mean training error of those windows."""

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict[str, Any]] = []
            self._errors: list[float] = []
            self._pending: list[float] = []
            self._windows = 0
            self._last = math.nan

        def _on_training_start(self) -> None:
            if evaluate is not None:
                self.rows.append({"step": 0, "test_error": evaluate(self.model), "env_steps": 0, "reward_queries": 0})

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                if done and "error" in info:
                    self._errors.append(float(info["error"]))
            while (self._windows + 1) * window <= min(self.num_timesteps, total):
                self._close_window()
            return True

        def _close_window(self) -> None:
            if self._errors:
                self._last = float(np.mean(self._errors))
            self._errors = []
            self._pending.append(self._last)
            self._windows += 1
            used = {"env_steps": self._windows * window, "reward_queries": self._windows * window}
            if evaluate is None:
                self.rows.append({"step": self._windows - 1, "error": self._last, **used})
            elif self._windows % eval_every == 0:
                self.rows.append({"step": self._windows, "test_error": evaluate(self.model),
                                  "error": float(np.nanmean(self._pending)), **used})
                self._pending = []

    return WindowLog()


def run_sb3(spec: dict[str, Any], cls: type) -> list[dict[str, Any]]:
    """Train ``cls`` (an SB3 algorithm) on the run ``spec`` of a token or MNIST setting; its rows."""
    from stable_baselines3.common.env_util import make_vec_env

    from tpo_gym.evaluation._run_envs import greedy_error, make_env

    kind, p = spec["kind"], spec["params"]
    if kind not in ("token", "mnist"):
        raise ValueError(f"SB3 method {spec['method']!r} ({cls.__name__}) runs in token and MNIST settings; setting "
                         f"{spec['setting']!r} is of kind {kind!r}")
    kwargs = dict(spec.get("method_kwargs", {}))
    policy = kwargs.pop("policy", "MlpPolicy")
    n_envs = kwargs.pop("n_envs", 1)
    if not isinstance(n_envs, int) or isinstance(n_envs, bool) or not 1 <= n_envs <= 1024:
        raise ValueError(f"SB3 method {spec['method']!r}: n_envs must be an int in [1, 1024], got {n_envs!r}")
    seed = int(spec["seed"])
    window = _window(p, kind)
    evaluate, eval_every = None, 1
    if kind == "mnist":
        from tpo_gym.envs.mnist_data import load_mnist

        env_id, env_kwargs = "tpo_gym/MNISTBandit-v0", {"split": "train", **p.get("env_kwargs", {})}
        total = int(p["steps"]) * window
        eval_every = int(p.get("eval_every", 200))
        test_x, test_y = load_mnist("test")

        def evaluate(model: Any) -> float:
            return greedy_error(model, test_x, test_y)
    else:
        env_id, env_kwargs = p["env_id"], p.get("env_kwargs", {})
        total = int(p["episodes"]) * window
    venv = make_vec_env(lambda: make_env(env_id, env_kwargs), n_envs=n_envs, seed=seed)
    model = cls(policy, venv, seed=seed, device=spec.get("device", "cpu"), **kwargs)
    callback = _make_callback(window, total, evaluate, eval_every)
    model.learn(total, callback=callback)
    rows = callback.rows
    if not any("error" in r for r in rows):
        raise RuntimeError(f"SB3 method {spec['method']!r} finished no episode in {total} env steps")
    return rows
