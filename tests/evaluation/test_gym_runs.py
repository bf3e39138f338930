"""The ``gym`` run kind (plain Gymnasium envs, e.g. Box actions) and the ``continuous`` preset that uses it."""

from __future__ import annotations

import math

import pytest

from tpo_gym.evaluation.cost import estimate_preset, run_seconds
from tpo_gym.evaluation.derived import override_budget
from tpo_gym.evaluation.experiments import RUN_KINDS, execute_run, methods_for_kind, seed_batch_key
from tpo_gym.evaluation.presets import load_preset


def _spec(algo: str, method_kwargs: dict, steps: int = 1600, window: int = 800, **agent_kwargs: object) -> dict:
    return {"preset": "t", "kind": "gym", "method": algo, "algo": algo, "setting": "Pendulum", "seed": 0,
            "params": {"env_id": "Pendulum-v1", "steps": steps, "window": window,
                       "agent_kwargs": {"batch_size": 2, "group_size": 2, **agent_kwargs}},
            "method_kwargs": method_kwargs}


def test_gym_is_a_run_kind_of_the_six_box_agents_and_of_sb3() -> None:
    assert "gym" in RUN_KINDS
    assert set(methods_for_kind("gym")) == {"TPO", "GRPO", "GroupPG", "PPO", "REINFORCE", "DG"}
    assert seed_batch_key(_spec("TPO", {})) is None  # run one by one


@pytest.mark.parametrize("algo", ["TPO", "PPO"])
def test_a_gym_run_logs_the_mean_training_return_per_window(algo: str) -> None:
    record = execute_run(_spec(algo, {"level": "sequence"} if algo == "TPO" else {}))
    assert record["status"] == "ok", record["traceback"]
    rows = record["rows"]
    assert [r["step"] for r in rows] == [0, 1] and [r["env_steps"] for r in rows] == [800, 1600]
    assert all(-2000 < r["return"] < 0 for r in rows)  # Pendulum's returns: 4 episodes of 200 steps a window


def test_a_gym_run_of_an_sb3_algorithm_is_measured_the_same_way() -> None:
    spec = _spec("stable_baselines3:PPO", {"n_steps": 128, "batch_size": 64, "n_epochs": 1}, steps=512, window=256)
    record = execute_run(spec)
    assert record["status"] == "ok", record["traceback"]
    rows = record["rows"]
    assert [r["step"] for r in rows] == [0, 1] and [r["env_steps"] for r in rows] == [256, 512]
    assert all(math.isfinite(r["return"]) and r["return"] < 0 for r in rows)


def test_a_window_past_the_budget_is_cut_to_it_and_a_bad_budget_fails_the_run() -> None:
    record = execute_run(_spec("TPO", {"level": "sequence"}, steps=800, window=10_000))
    assert record["status"] == "ok" and [r["env_steps"] for r in record["rows"]] == [800]
    failed = execute_run(_spec("TPO", {}, steps=0))
    assert failed["status"] == "failed" and "steps >= 1 and window >= 1" in failed["traceback"]


def test_the_continuous_preset_runs_tpo_ppo_sb3_ppo_and_grpo_on_two_box_tasks() -> None:
    preset = load_preset("continuous")
    assert [s["params"]["env_id"] for s in preset.settings] == ["Pendulum-v1", "MountainCarContinuous-v0"]
    assert {m["algo"] for m in preset.methods} == {"TPO", "PPO", "GRPO", "stable_baselines3:PPO"}
    assert preset.seeds == 5 and preset.run_count() == 40
    assert preset.metrics[0]["key"] == "return" and preset.metrics[0]["better"] == "higher"
    estimate = estimate_preset(preset)
    assert estimate.runs == 40 and 0 < estimate.compute_s < 86_400
    sb3 = next(r for r in preset.runs(1) if r.algo.startswith("stable_baselines3"))
    ours = next(r for r in preset.runs(1) if r.algo == "TPO" and r.setting == sb3.setting)
    assert run_seconds(sb3) > run_seconds(ours)  # SB3's PPO steps its critic and minibatches too
    tiny = override_budget(preset, steps=3200)  # tpo-gym bench --steps: env steps of every gym setting
    assert all(s["params"]["steps"] == 3200 for s in tiny.settings)
