"""The ``llm`` run kind: a tiny random Llama on Reasoning Gym through the harness, checkpoints and resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents.lm_toys import tiny_llama, tiny_tokenizer
from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli
from tpo_gym.evaluation.experiments import execute_run


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
