"""Shared fixtures: a tiny preset file and one benchmark run of it (shared by several tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpo_gym.evaluation import cli

#: Tiny preset: two fast tabular settings plus one setting whose runs crash (steps=0 is invalid).
TINY_PRESET = {
    "name": "tiny",
    "description": "test-only preset: two tiny bandits and one setting that crashes",
    "paper_ref": "none (tests)",
    "seeds": 2,
    "settings": [
        {"name": "single", "kind": "tabular_single",
         "params": {"n_arms": 10, "batch_size": 20, "steps": 30, "step_size": 0.5}},
        {"name": "multi", "kind": "tabular_multi",
         "params": {"n_contexts": 5, "n_arms": 4, "steps": 40, "step_size": 0.5}},
        {"name": "crash", "kind": "tabular_single", "methods": ["TPO"],
         "params": {"n_arms": 10, "batch_size": 20, "steps": 0}},
    ],
    "methods": [{"name": "TPO", "algo": "TPO"}, {"name": "DG", "algo": "DG", "kwargs": {}}],
    "metrics": [
        {"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"},
        {"id": "steps_to_1pct", "type": "steps_to_threshold", "key": "error", "threshold": 0.01},
    ],
    "paper": {"final_error": {"TPO": {"single": 0.5, "multi": "<50"}, "DG": {"single": "-"}},
              "steps_to_1pct": {"TPO": {"single": 12}}},
    "curves": ["error", "misalignment"],
    "log_y": True,
}


#: DG runs in both settings, TPO only in the second: a per-panel colour cycle would colour DG differently.
COLOUR_PRESET = {
    "name": "colours", "description": "test-only preset: methods missing from some panels", "paper_ref": "none",
    "seeds": 2,
    "settings": [
        {"name": "a", "kind": "tabular_single", "methods": ["DG"],
         "params": {"n_arms": 10, "batch_size": 20, "steps": 15, "step_size": 0.5}},
        {"name": "b", "kind": "tabular_single",
         "params": {"n_arms": 10, "batch_size": 20, "steps": 15, "step_size": 0.5}},
    ],
    "methods": [{"name": "TPO", "algo": "TPO"}, {"name": "DG", "algo": "DG"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"}],
    "curves": ["error", "misalignment"], "log_y": True,
}


def write_preset(directory: Path, data: dict, name: str = "tiny.json") -> Path:
    path = directory / name
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="session")
def tiny_bench(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run the tiny preset once through the CLI with 2 workers; returns paths and the exit code."""
    root = tmp_path_factory.mktemp("tiny")
    preset = write_preset(root, TINY_PRESET)
    out = root / "out"
    rc = cli.main(["bench", "--preset", str(preset), "--workers", "2", "--out", str(out), "--no-progress"])
    return {"root": root, "preset": preset, "out": out, "rc": rc}


@pytest.fixture
def tiny_preset_data() -> dict:
    """A fresh copy of the tiny test preset (safe to mutate)."""
    return json.loads(json.dumps(TINY_PRESET))
