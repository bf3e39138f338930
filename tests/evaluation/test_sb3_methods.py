"""Stable-Baselines3 algorithms as benchmark methods (issue 47 item 2): ``"algo": "stable_baselines3:PPO"``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli

TOKEN = {"env_id": "tpo_gym/TokenTask-v0",
         "env_kwargs": {"target": "reverse_copy", "reward": "bag", "vocab_size": 2, "length": 3},
         "episodes": 6, "agent_kwargs": {"batch_size": 8, "group_size": 2, "n_epochs": 1,
                                         "policy_kwargs": {"d_model": 8, "d_ff": 16, "n_layers": 1}}}
PRESET = {
    "name": "sb3-mix", "description": "test-only: TPO beside SB3's PPO and DQN on a tiny token task",
    "paper_ref": "none (tests)", "seeds": 2,
    "settings": [{"name": "tiny rev", "kind": "token", "params": TOKEN}],
    "methods": [{"name": "TPO", "algo": "TPO", "kwargs": {"level": "token"}},
                {"name": "SB3 PPO", "algo": "stable_baselines3:PPO", "kwargs": {"n_steps": 24, "batch_size": 24}},
                {"name": "SB3 DQN", "algo": "stable_baselines3:DQN", "kwargs": {"learning_starts": 8}}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"}],
    "curves": ["error"], "log_y": False,
}


@pytest.fixture(scope="module")
def sb3_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sb3")
    out = root / "out"
    assert cli.main(["bench", "--preset", str(write_preset(root, PRESET)), "--out", str(out), "--no-progress"]) == 0
    return out


def test_sb3_algorithms_run_beside_tpo_and_reach_every_part_of_the_report(sb3_bench: Path) -> None:
    report = (sb3_bench / "report.md").read_text()
    for name in ("SB3 PPO", "SB3 DQN"):
        assert f"| {name} |" in report
    rows = list(csv.DictReader((sb3_bench / "summary.csv").open()))
    assert {r["method"] for r in rows} >= {"TPO", "SB3 PPO", "SB3 DQN"}
    assert "stable_baselines3" in json.dumps(json.loads((sb3_bench / "manifest.json").read_text()))


def test_sb3_runs_get_the_budget_of_a_single_sample_method_and_say_what_they_used(sb3_bench: Path) -> None:
    """6 steps of B = 8 episodes of H = 3 tokens: 144 env steps, one reward per step; one row per step."""
    import gzip

    for path in (sb3_bench / "runs").glob("*SB3_PPO*"):
        text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        record = json.loads(text)
        assert record["status"] == "ok", record.get("traceback")
        rows = record["rows"]
        assert [r["step"] for r in rows] == list(range(6))
        assert rows[-1]["env_steps"] == rows[-1]["reward_queries"] == 6 * 8 * 3
        assert all(0.0 <= r["error"] <= 1.0 for r in rows)


def test_an_sb3_method_in_a_setting_it_cannot_run_is_refused_in_one_line(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(json.dumps(PRESET))
    data["settings"] = [{"name": "bandit", "kind": "tabular_single",
                         "params": {"n_arms": 10, "batch_size": 20, "steps": 30, "step_size": 0.5}}]
    data["methods"] = [{"name": "SB3 PPO", "algo": "stable_baselines3:PPO"}]
    with pytest.raises(SystemExit):
        cli.main(["bench", "--preset", str(write_preset(tmp_path, data)), "--list"])
    assert "cannot run in setting 'bandit' of kind 'tabular_single'" in capsys.readouterr().err


def test_an_sb3_method_runs_on_mnist_with_the_same_held_out_evaluation(tmp_path: Path) -> None:
    """MNIST: a point every eval_every steps of B one-step episodes, with the greedy test error."""
    import gzip

    data = {**PRESET, "name": "sb3-mnist",
            "settings": [{"name": "MNIST", "kind": "mnist",
                          "params": {"steps": 4, "eval_every": 2, "agent_kwargs": {"batch_size": 16}}}],
            "methods": [{"name": "TPO", "algo": "TPO", "kwargs": {"candidates": "single"}},
                        {"name": "SB3 A2C", "algo": "stable_baselines3:A2C", "kwargs": {"n_steps": 8}}],
            "metrics": [{"id": "final_error", "type": "final", "key": "test_error", "scale": 100, "unit": "%"}],
            "seeds": 1, "curves": ["test_error"]}
    out = tmp_path / "out"
    assert cli.main(["bench", "--preset", str(write_preset(tmp_path, data)), "--out", str(out), "--no-progress"]) == 0
    (path,) = (out / "runs").glob("*SB3_A2C*")
    text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    rows = json.loads(text)["rows"]
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert all(0.0 <= r["test_error"] <= 1.0 for r in rows) and rows[-1]["env_steps"] == 4 * 16
    assert "| SB3 A2C |" in (out / "report.md").read_text()


def test_an_sb3_class_named_like_a_tpo_gym_agent_stays_the_sb3_class() -> None:
    import stable_baselines3

    from tpo_gym import PPO
    from tpo_gym.agents.common.registry import resolve_algorithm

    for _ in range(2):  # the second lookup too (a cached alias must not turn it into tpo-gym's PPO)
        assert resolve_algorithm("stable_baselines3:PPO") is stable_baselines3.PPO
    assert resolve_algorithm("PPO") is PPO
