"""Agent run kinds (token tasks, MNIST) through the harness, on budgets of a few iterations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tpo_gym
from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation.experiments import execute_run, make_agent
from tpo_gym.evaluation.presets import load_preset
from tpo_gym.evaluation.report import build_report
from tpo_gym.evaluation.runner import bench

AGENT_PRESET = {
    "name": "tiny-agents",
    "description": "test-only preset: a 3-iteration token task and a 4-step MNIST run",
    "paper_ref": "none (tests)",
    "seeds": 1,
    "settings": [
        {"name": "token", "kind": "token",
         "params": {"env_id": "tpo_gym/TokenTask-v0",
                    "env_kwargs": {"target": "reverse_copy", "reward": "bag", "vocab_size": 2, "length": 2},
                    "episodes": 3, "agent_kwargs": {"batch_size": 8, "group_size": 4},
                    "policy_kwargs_note": "default TransformerPolicy"}},
        {"name": "mnist", "kind": "mnist", "methods": ["TPO", "PG"],
         "params": {"steps": 4, "eval_every": 2, "agent_kwargs": {"batch_size": 10}}},
    ],
    "methods": [
        {"name": "TPO", "algo": "TPO", "kwargs": {}},
        {"name": "GRPO (no KL)", "algo": "GRPO", "kwargs": {"beta": 0.0}},
        {"name": "PG", "algo": "REINFORCE", "kwargs": {"baseline": "expected"}},
    ],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100}],
    "curves": ["error", "test_error"],
}


@pytest.fixture(scope="module")
def agent_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("agents")
    out = root / "out"
    summary = bench(load_preset(str(write_preset(root, AGENT_PRESET))), out, workers=2, progress=False)
    assert summary.total == 5
    build_report(out)
    return out


def _records(out: Path) -> dict[str, dict]:
    """``{"<setting>/<method>": record}`` of the stored runs."""
    recs = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    return {f"{r['spec']['setting']}/{r['spec']['method']}": r for r in recs}


def test_token_runs_log_one_row_per_iteration(agent_bench: Path) -> None:
    recs = _records(agent_bench)
    for name in ("token/TPO", "token/GRPO (no KL)", "token/PG"):
        rec = recs[name]
        assert rec["status"] == "ok", rec["traceback"]
        assert [r["step"] for r in rec["rows"]] == [0, 1, 2]
        assert all(0.0 <= r["error"] <= 1.0 for r in rec["rows"])
    assert "zero_variance_fraction" in recs["token/TPO"]["rows"][0]
    assert "mean_q_winners" in recs["token/TPO"]["rows"][0]
    assert "mean_abs_adv_winners" in recs["token/GRPO (no KL)"]["rows"][0]


def test_mnist_runs_log_greedy_test_error(agent_bench: Path) -> None:
    recs = _records(agent_bench)
    for name in ("mnist/TPO", "mnist/PG"):
        rec = recs[name]
        assert rec["status"] == "ok", rec["traceback"]
        assert [r["step"] for r in rec["rows"]] == [0, 2, 4]
        assert all(0.0 <= r["test_error"] <= 1.0 for r in rec["rows"])
        assert "error" in rec["rows"][-1]
    report = (agent_bench / "report.md").read_text()
    assert "curves_test_error.png" in report and "zero_variance_fraction" in report


def test_method_kwargs_override_setting_kwargs() -> None:
    import gymnasium as gym

    env = gym.make("tpo_gym/TokenTask-v0", length=2)
    model = make_agent("GRPO", env, 3, {"agent_kwargs": {"batch_size": 8, "group_size": 4, "n_epochs": 2}},
                       {"n_epochs": 1, "beta": 0.0})
    assert isinstance(model, tpo_gym.GRPO)
    assert (model.batch_size, model.group_size, model.n_epochs, model.beta) == (8, 4, 1, 0.0)
    with pytest.raises(ValueError, match="unknown agent"):
        make_agent("SAC", env, 0, {}, {})


def test_bad_agent_kwarg_becomes_a_failed_record() -> None:
    spec = {"preset": "t", "kind": "token", "method": "TPO", "algo": "TPO", "setting": "s", "seed": 0,
            "params": {"env_id": "tpo_gym/TokenTask-v0", "env_kwargs": {"length": 2}, "episodes": 1,
                       "agent_kwargs": {"batch_size": 0}}, "method_kwargs": {}}
    rec = execute_run(spec)
    assert rec["status"] == "failed" and "batch_size" in rec["traceback"] and rec["rows"] == []


def test_agent_diagnostics_figures(agent_bench: Path) -> None:
    """Winners and losers share one figure, losses get one panel per method, no figure repeats another."""
    names = {p.name for p in agent_bench.glob("curves_*.png")}
    assert {"curves_weights.png", "curves_loss.png", "curves_grad_norm.png", "curves_all_fail_fraction.png"} <= names
    assert not names & {"curves_mean_q_winners.png", "curves_mean_q_losers.png", "curves_mean_abs_adv_winners.png",
                        "curves_mean_abs_adv_losers.png"}
    report = (agent_bench / "report.md").read_text()
    # token-level groups score 0 or 1: the any-success fraction is 1 - the all-fail fraction
    assert "curves_any_success_fraction.png" not in names and "not drawn separately" in report
    assert "One panel per method" in report and "Solid: candidates that beat their group's mean" in report


def test_method_policy_kwargs_merge_with_the_settings() -> None:
    import gymnasium as gym

    env = gym.make("tpo_gym/TokenReversal-v0")
    params = {"agent_kwargs": {"batch_size": 8, "group_size": 2, "policy_kwargs": {"d_ff": 128}}}
    model = make_agent("TPO", env, 0, params, {"policy_kwargs": {"setup": "reference"}, "learning_rate": 1e-3})
    assert model.policy.setup == "reference" and model.policy.d_ff == 128 and model.policy.n_heads == 2
    assert params["agent_kwargs"]["policy_kwargs"] == {"d_ff": 128}  # the preset data is not changed
