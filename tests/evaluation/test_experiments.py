"""tpo_gym.evaluation.experiments: the agent run kinds (token tasks, MNIST) and the ``llm`` run kind (a tiny
random Llama on Reasoning Gym, checkpoints and resume) through the harness, on budgets of a few
iterations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tpo_gym
from tests.agents.lm_toys import tiny_llama, tiny_tokenizer
from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli
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


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _params(model_dir: Path, steps: int) -> dict[str, Any]:
    return {"env_kwargs": {"dataset": "basic_arithmetic", "size": 50, "seed": 0,
                           "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
            "steps": steps, "eval_every": 2, "eval_size": 2, "checkpoint_every": 1,
            "agent_kwargs": {"batch_size": 2, "group_size": 2, "n_epochs": 1, "learning_rate": 1e-3},
            "policy_kwargs": {"model": str(model_dir), "max_new_tokens": 3, "prompt_format": "answer_prefill"}}


def _spec(model_dir: Path, steps: int, checkpoint_dir: Path | None) -> dict[str, Any]:
    spec = {"preset": "t", "kind": "llm", "method": "TPO", "algo": "TPO", "setting": "s", "seed": 0,
            "params": _params(model_dir, steps), "method_kwargs": {}}
    if checkpoint_dir is not None:
        spec["checkpoint_dir"] = str(checkpoint_dir)
    return spec


def test_llm_run_rows_and_resume_from_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    straight = execute_run(_spec(model_dir, 4, None))
    assert straight["status"] == "ok", straight["traceback"]
    rows = straight["rows"]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert all("test_score" in rows[i] for i in (0, 2, 4)) and "test_score" not in rows[1]
    assert all("mean_score" in r and "entropy_q" in r for r in rows[:4])
    first = execute_run(_spec(model_dir, 2, tmp_path / "ckpt"))  # "crashes" after 2 steps
    assert first["status"] == "ok" and (tmp_path / "ckpt" / "agent" / "tpo_gym.json").is_file()
    resumed = execute_run(_spec(model_dir, 4, tmp_path / "ckpt"))
    assert resumed["status"] == "ok", resumed["traceback"]
    assert json.dumps(resumed["rows"], sort_keys=True) == json.dumps(rows, sort_keys=True)


def test_lora_llm_run_resumes_from_its_adapter_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    def spec(steps: int) -> dict[str, Any]:
        out = _spec(model_dir, steps, tmp_path / "ckpt")
        out["params"]["policy_kwargs"]["lora"] = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}
        return out

    first = execute_run(spec(1))
    assert first["status"] == "ok", first["traceback"]
    assert (tmp_path / "ckpt" / "agent" / "adapter").is_dir()
    resumed = execute_run(spec(2))  # the base model comes from the run's settings, never from the file
    assert resumed["status"] == "ok", resumed["traceback"]
    assert [r["step"] for r in resumed["rows"]] == [0, 1, 2]


def test_llm_preset_through_the_cli(model_dir: Path, tmp_path: Path) -> None:
    preset = {
        "name": "tiny-llm", "description": "test-only LLM preset", "paper_ref": "none (tests)", "seeds": 1,
        "settings": [{"name": "arith", "kind": "llm", "params": _params(model_dir, 2)}],
        "methods": [{"name": "TPO", "algo": "TPO"}, {"name": "GRPO", "algo": "GRPO"}],
        "metrics": [{"id": "final_test_score", "type": "final", "key": "test_score"},
                    {"id": "initial_test_score", "type": "initial", "key": "test_score"}],
        "paper": {}, "curves": ["mean_score", "test_score"], "log_y": False,
    }
    path = write_preset(tmp_path, preset, "tiny-llm.json")
    out = tmp_path / "out"
    assert cli.main(["bench", "--preset", str(path), "--workers", "1", "--out", str(out), "--no-progress"]) == 0
    report = (out / "report.md").read_text()
    assert "TPO" in report and "GRPO" in report and "failed" not in report.lower().split("## ")[0]
    assert len(list((out / "runs").glob("*.json"))) == 2
    assert (out / "checkpoints").is_dir()
