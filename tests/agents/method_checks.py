"""The checks every agent class passes, as plain functions of the class: the per-method tests
(tests/agents/test_every_method.py) run each on every registered method, and on a throwaway method defined in a
temporary module, so that a new method is checked with no test to edit.

Each check takes the class and a temporary directory and raises ``AssertionError`` naming the method.
"""

from __future__ import annotations

import inspect
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.callbacks import BaseCallback

from tests.agents.conftest import bandit_env, params_of, token_env
from tpo_gym.agents import GroupAlgorithm
from tpo_gym.agents.common import persistence
from tpo_gym.agents.common.spec import GROUP_DIAGNOSTICS

#: Keys every history record has besides the spec's diagnostics.
RECORD_KEYS = {"iteration", "num_timesteps", "error"}


def documented_params(cls: type) -> str:
    """The docstrings a class's constructor arguments are documented in: its own and its agent parents' (a subclass
    without its own ``__init__`` inherits its parent's ``:param:`` lines)."""
    return "\n".join(c.__doc__ or "" for c in cls.__mro__ if isinstance(c, type) and issubclass(c, GroupAlgorithm))


def check_signature_and_docs(cls: type, tmp_path: Path) -> None:
    """Every constructor argument is documented (``:param name:``), and the ones after ``env`` are keyword-only."""
    params = inspect.signature(cls).parameters
    doc = documented_params(cls)
    for name in params:
        if name in ("policy", "env", "_init_setup_model") and cls is not GroupAlgorithm:
            continue
        assert f":param {name}:" in doc, f"{cls.__name__} does not document {name}"
    assert "learning_rate" in params and "seed" in params, cls.__name__
    try:
        cls("MlpPolicy", bandit_env(), 1e-3)
    except TypeError:
        pass
    else:
        raise AssertionError(f"{cls.__name__}: arguments after env must be keyword-only")


def _small(cls: type, **kwargs: Any) -> GroupAlgorithm:
    agent: GroupAlgorithm = cls("TransformerPolicy", token_env(length=3), batch_size=10, seed=0, **kwargs)
    return agent


def check_history_and_logged_keys(cls: type, tmp_path: Path) -> None:
    """One record per iteration with the counters, the error in [0, 1], the update's loss and gradient norm; every
    other logged key is a diagnostic the spec declares (declared ones a run does not log, such as a language
    model's, are dropped, not an error); a group method logs the group diagnostics."""
    model = _small(cls)
    assert model.steps_per_iteration == model.n_rollouts * 3, cls.__name__
    model.learn(3 * model.steps_per_iteration)
    assert [h["iteration"] for h in model.history] == [0, 1, 2], cls.__name__
    assert [h["num_timesteps"] for h in model.history] == [model.steps_per_iteration * (i + 1) for i in range(3)]
    declared = {d.key for d in cls.spec.diagnostics}  # type: ignore[attr-defined]
    for h in model.history:
        assert {"loss", "grad_norm"} <= set(h) and 0.0 <= h["error"] <= 1.0, (cls.__name__, h)
        undeclared = set(h) - RECORD_KEYS - declared
        assert not undeclared, f"{cls.__name__} logs {sorted(undeclared)}, which its spec does not declare"
    if cls.sampling == "group":  # type: ignore[attr-defined]
        assert {d.key for d in GROUP_DIAGNOSTICS} <= set(model.history[0]), cls.__name__


def check_same_seed_same_run(cls: type, tmp_path: Path) -> None:
    """Two agents with the same seed train to the same history and weights, bit for bit (one process)."""
    runs = []
    for _ in range(2):
        model = _small(cls)
        model.learn(2 * model.steps_per_iteration)
        runs.append(model)
    assert json.dumps(runs[0].history, sort_keys=True) == json.dumps(runs[1].history, sort_keys=True), cls.__name__
    for k, v in params_of(runs[0]).items():
        assert torch.equal(params_of(runs[1])[k], v), (cls.__name__, k)


def check_save_load_round_trip(cls: type, tmp_path: Path) -> None:
    """Saved and loaded (by the class and by ``GroupAlgorithm.load``), an agent keeps its settings, history and
    weights exactly, predicts the same actions and trains on."""
    env = "tpo_gym/Bandit-v0"
    model = cls("MlpPolicy", env, batch_size=8, seed=3, n_epochs=2)
    model.learn(2 * model.steps_per_iteration)
    model.save(tmp_path / "m")  # SB3 adds .zip
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    for loaded in (cls.load(tmp_path / "m.zip", env=env), GroupAlgorithm.load(buffer)):
        assert type(loaded) is cls
        assert persistence.agent_settings(loaded) == persistence.agent_settings(model), cls.__name__
        assert json.dumps(loaded.history, sort_keys=True) == json.dumps(model.history, sort_keys=True)
        assert loaded.num_timesteps == model.num_timesteps
        for k, v in params_of(model).items():
            assert torch.equal(params_of(loaded)[k], v), (cls.__name__, k)
    loaded = cls.load(tmp_path / "m.zip", env=env)
    observation, _ = bandit_env().reset(seed=0)
    assert (loaded.predict(observation, deterministic=True)[0] == model.predict(observation, deterministic=True)[0])
    loaded.learn(loaded.steps_per_iteration, reset_num_timesteps=False)


class EventsCallback(BaseCallback):
    """Records SB3's callback events in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def _on_training_start(self) -> None:
        self.events.append("start")

    def _on_rollout_end(self) -> None:
        self.events.append("rollout_end")

    def _on_step(self) -> bool:
        self.events.append("step")
        return True

    def _on_training_end(self) -> None:
        self.events.append("end")


def check_sb3_callbacks(cls: type, tmp_path: Path) -> None:
    """SB3's callback protocol: training start, per iteration the steps and the rollout end, training end."""
    model = _small(cls)
    callback = EventsCallback()
    model.learn(2 * model.steps_per_iteration, callback=callback)
    events = callback.events
    assert events[0] == "start" and events[-1] == "end", (cls.__name__, events)
    assert events.count("rollout_end") == 2 and "step" in events, (cls.__name__, events)


#: Every per-method check, in the order the tests run them.
PER_METHOD_CHECKS: tuple[Callable[[type, Path], None], ...] = (
    check_signature_and_docs,
    check_history_and_logged_keys,
    check_same_seed_same_run,
    check_save_load_round_trip,
    check_sb3_callbacks,
)
