"""Presets you derive: export, pruning on load, budget override, and the report's budget and method notes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tpo_gym.evaluation import cli
from tpo_gym.evaluation.derived import override_budget, paper_budget
from tpo_gym.evaluation.presets import (
    PRESET_FOLDER,
    PresetError,
    available_presets,
    is_packaged_source,
    load_preset,
)
from tpo_gym.evaluation.report.budget import _queries_per_step, budget_used
from tpo_gym.evaluation.report.values import Cell

from .conftest import write_preset

#: Two fast bandit settings, two methods, paper numbers, a table and claims naming each.
DERIVE = {
    "name": "derive", "description": "test-only preset to derive from", "paper_ref": "none (tests), 30 steps",
    "seeds": 2,
    "settings": [
        {"name": "a", "kind": "tabular_single", "params": {"n_arms": 10, "batch_size": 20, "steps": 30,
                                                           "step_size": 0.5}},
        {"name": "b", "kind": "tabular_single", "params": {"n_arms": 10, "batch_size": 20, "steps": 30,
                                                           "step_size": 0.5}},
    ],
    "methods": [{"name": "TPO", "algo": "TPO"}, {"name": "DG", "algo": "DG"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"},
                {"id": "never", "type": "steps_to_threshold", "key": "error", "threshold": 0.0}],
    "paper": {"final_error": {"TPO": {"a": 50.0, "b": 50.0}, "DG": {"a": 0.0, "b": 0.0}}},
    "paper_claims": [
        {"text": "DG beats TPO.", "checks": [{"test": "best", "metric": "final_error", "method": "DG"}]},
        {"text": "TPO is below 99 in a and b.",
         "checks": [{"test": "below", "metric": "final_error", "method": "TPO", "value": 99,
                     "settings": ["a", "b"]}]},
    ],
    "tables": [{"title": "T", "settings": ["a", "b"], "methods": ["TPO", "DG"]}],
    "notes": ["The preset's own note."],
}


def _derive(tmp_path: Path, **changes) -> Path:
    data = json.loads(json.dumps(DERIVE))
    data.update(changes)
    return write_preset(tmp_path, data, "derived.json")


# ---------------------------------------------------------------- the preset folder (item 5)
def test_packaged_presets_live_in_their_own_folder_and_old_sources_still_count_as_packaged() -> None:
    paths = available_presets()
    assert "table2" in paths and all(p.parent.name == PRESET_FOLDER for p in paths.values())
    assert PRESET_FOLDER != "presets"  # the module presets.py keeps its name for importlib.resources
    assert is_packaged_source("table2", "/x/tpo_gym/evaluation/presets/table2.json")  # committed manifests
    assert is_packaged_source("table2", str(paths["table2"]))
    assert not is_packaged_source("table2", "/x/mine/table2.json")


# ---------------------------------------------------------------- --export (item 1)
def test_export_writes_the_packaged_file_pretty_printed_and_refuses_to_overwrite(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "mine.json"
    assert cli.main(["presets", "table2", "--export", str(target)]) == 0
    text = target.read_text()
    assert text.startswith("{\n  ") and json.loads(text) == json.loads(available_presets()["table2"].read_text())
    assert load_preset(str(target)).data == load_preset("table2").data
    with pytest.raises(SystemExit):
        cli.main(["presets", "quick", "--export", str(target)])
    assert "exists; give --force" in capsys.readouterr().err and json.loads(target.read_text())["name"] == "table2"
    assert cli.main(["presets", "quick", "--export", str(target), "--force"]) == 0
    assert json.loads(target.read_text())["name"] == "quick"
    for argv, message in ((["presets", "quick", "--export", str(tmp_path / "no" / "x.json")], "does not exist"),
                          (["presets", "quick", "--export", str(tmp_path)], "is a directory"),
                          (["presets", "--export", str(tmp_path / "y.json")], "needs NAME"),
                          (["presets", "nope", "--export", str(tmp_path / "y.json")], "unknown preset")):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert message in capsys.readouterr().err


# ---------------------------------------------------------------- pruning on load (item 2)
def test_dropping_a_method_prunes_its_paper_numbers_claims_and_table_entries_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _derive(tmp_path, methods=[{"name": "TPO", "algo": "TPO"}])
    preset = load_preset(str(path))
    assert set(preset.data["paper"]["final_error"]) == {"TPO"}
    assert [c["text"] for c in preset.data["paper_claims"]] == ["TPO is below 99 in a and b."]
    assert preset.data["tables"][0]["methods"] == ["TPO"]
    assert any("'DG'" in line and line.startswith("paper:") for line in preset.pruned)
    assert any("dropped 'DG beats TPO.'" in line for line in preset.pruned)
    assert cli.main(["presets", str(path)]) == 0
    err = capsys.readouterr().err
    assert "note:" in err and "paper_claims: dropped 'DG beats TPO.'" in err and "left out" in err


def test_dropping_a_setting_narrows_claims_and_a_packaged_preset_prunes_nothing(tmp_path: Path) -> None:
    path = _derive(tmp_path, settings=DERIVE["settings"][:1])
    preset = load_preset(str(path))
    assert preset.data["paper"]["final_error"] == {"TPO": {"a": 50.0}, "DG": {"a": 0.0}}
    assert preset.data["paper_claims"][1]["checks"][0]["settings"] == ["a"]
    assert any("changed 'TPO is below 99 in a and b.'" in line for line in preset.pruned)
    assert load_preset("table2").pruned == [] and load_preset("quick").pruned == []


def test_dropping_a_metric_prunes_its_paper_numbers_and_a_broken_file_still_fails_validation(
        tmp_path: Path) -> None:
    preset = load_preset(str(_derive(tmp_path, metrics=DERIVE["metrics"][1:])))
    assert preset.data["paper"] == {} and preset.data["paper_claims"] == []
    with pytest.raises(PresetError, match="each method needs string 'name'"):
        load_preset(str(_derive(tmp_path, methods=[{"algo": "TPO"}])))


# ---------------------------------------------------------------- --episodes / --steps (items 3, 6, 7, 8)
@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The derived preset benched at 10 steps instead of 30."""
    root = tmp_path_factory.mktemp("scaled")
    path = write_preset(root, DERIVE, "derived.json")
    out = root / "out"
    rc = cli.main(["bench", "--preset", str(path), "--steps", "10", "--out", str(out), "--no-progress"])
    return {"rc": rc, "out": out, "path": path}


def test_a_budget_override_is_recorded_outside_the_params_and_changes_the_config_hash(scaled: dict) -> None:
    assert scaled["rc"] == 0
    manifest = json.loads((scaled["out"] / "manifest.json").read_text())
    record = manifest["preset"]["budget_override"]
    assert record == {"paper": {"a": 30, "b": 30}, "steps": 10}
    base = load_preset(str(scaled["path"]))
    over = override_budget(base, steps=10)
    assert [s["params"]["steps"] for s in over.settings] == [10, 10]
    assert base.runs(1)[0].config_hash != over.runs(1)[0].config_hash
    assert paper_budget(over, "a") == (10, 30, "steps") and paper_budget(base, "a") is None
    with pytest.raises(PresetError, match="--episodes 5: no selected setting"):
        override_budget(base, episodes=5)


def test_the_report_marks_cells_at_another_budget_not_comparable(scaled: dict) -> None:
    report = (scaled["out"] / "report.md").read_text()
    results = report.split("## Results")[1].split("## Claims")[0]
    assert "(50.0; budget 10 of 30 steps, not comparable)" in results and "⚠" not in results
    assert "Nothing was compared" not in results or "not compared with them: a (" in results
    rows = list(csv.DictReader((scaled["out"] / "summary.csv").open()))
    assert all(r["final_error_pct_within_2se"] == "" for r in rows)


def test_summary_has_no_se_for_a_threshold_never_reached(scaled: dict) -> None:
    rows = list(csv.DictReader((scaled["out"] / "summary.csv").open()))
    assert rows and all(r["never_reached"] == "False" and r["never"] == "" and r["never_se"] == "" for r in rows)


def test_the_notes_describe_the_methods_run_after_the_presets_own(scaled: dict) -> None:
    notes = (scaled["out"] / "report.md").read_text().split("## Notes")[1].split("## Budget used")[0]
    assert notes.index("The preset's own note.") < notes.index("Method `TPO`: algo `TPO`; tpo-gym's built-in agent.")
    assert "Method `DG`: algo `DG`" in notes


def test_the_report_and_summary_state_the_budget_used(scaled: dict) -> None:
    report = (scaled["out"] / "report.md").read_text()
    assert "## Budget used" in report and "env steps / reward queries" in report
    header = next(csv.reader((scaled["out"] / "summary.csv").open()))
    assert header[-2:] == ["env_steps", "reward_queries"]


def test_reward_queries_per_env_step_of_built_in_methods() -> None:
    token = {"name": "t", "kind": "token", "params": {"agent_kwargs": {"group_size": 4}}}
    assert _queries_per_step({"name": "T", "algo": "TPO", "kwargs": {"level": "token"}}, token) == 4
    assert _queries_per_step({"name": "G", "algo": "GRPO", "kwargs": {"level": "sequence"}}, token) == 1
    assert _queries_per_step({"name": "P", "algo": "PPO"}, token) == 1
    assert _queries_per_step({"name": "P", "algo": "PPO"}, dict(token, kind="mnist")) is None
    preset = load_preset("table2").subset(["bag copy"], ["TPO_token", "PPO"], ["reference"])
    setting = preset.settings[0]["name"]
    cells = {}
    for method, ends in (("TPO_token", (900, 1000, 1100)), ("PPO", (1000, 1000, 1000))):
        cell = Cell(method, setting)
        cell.rows = [[{"step": 0, "num_timesteps": 10}, {"step": 1, "num_timesteps": n}] for n in ends]
        cell.counts = [{}] * 3
        cells[(method, setting)] = cell
    used = budget_used(preset, cells)
    assert used[("TPO_token", setting)] == (1000.0, 8000.0) and used[("PPO", setting)] == (1000.0, 1000.0)


def test_methods_adds_an_algorithm_the_preset_does_not_have(capsys: pytest.CaptureFixture[str]) -> None:
    """``--methods TPO_token,REINFORCE``: REINFORCE is no method of table1 but a known algorithm, so it is added
    (said on stderr); a name that is neither is still refused with the preset's methods."""
    args = ["bench", "--preset", "table1", "--settings", "V=2", "--setups", "reference", "--seeds", "1", "--list"]
    assert cli.main([*args, "--methods", "TPO_token,REINFORCE"]) == 0
    captured = capsys.readouterr()
    assert "TPO_token, REINFORCE" in captured.out
    assert "--methods adds REINFORCE (not in preset 'table1')" in captured.err
    assert cli.main([*args, "--methods", "TPO_token,stable_baselines3:PPO"]) == 0  # module:Class -> module.Class
    assert "TPO_token, stable_baselines3.PPO" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main([*args, "--methods", "TPO_token,NoSuchMethod"])
    assert "has no method 'NoSuchMethod'" in capsys.readouterr().err
