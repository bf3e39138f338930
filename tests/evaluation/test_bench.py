"""End to end: a tiny preset through the CLI, resume, crash isolation, report rebuild, bad input."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import pytest

from tpo_gym.evaluation import cli
from tpo_gym.evaluation.presets import available_presets, load_preset
from tpo_gym.evaluation.report import build_report
from tpo_gym.evaluation.runner import bench

OUTPUTS = ("report.md", "summary.csv", "results.jsonl", "manifest.json", "curves_error.png",
           "curves_misalignment.png")


def test_tiny_preset_produces_every_output(tiny_bench: dict) -> None:
    out: Path = tiny_bench["out"]
    assert tiny_bench["rc"] == 1, "a failed run must make the exit status non-zero"
    for name in OUTPUTS:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert len(list((out / "runs").glob("*.json"))) == 10
    assert not list(out.rglob("*.tmp")), "no temporary file may be left behind"
    report = (out / "report.md").read_text()
    for text in ("tpo-gym", "torch", "gymnasium", "stable-baselines3", "numpy", "git commit (runs)", "command",
                 "wall time", "| TPO |", "| DG |", "IQM", "--workers 2"):
        assert text in report, text
    # the paper's value sits beside ours, and a disagreement is flagged
    assert "(0.5)" in report and "⚠" in report
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # one row per run per logged step: single 30 steps + final row, multi 40 + final row
    assert len(rows) == 2 * 2 * 31 + 2 * 2 * 41
    assert {r["method"] for r in rows} == {"TPO", "DG"} and {r["seed"] for r in rows} == {0, 1}
    with open(out / "summary.csv") as fh:
        summary = list(csv.DictReader(fh))
    assert len(summary) == 5
    crash = next(r for r in summary if r["setting"] == "crash")
    assert crash["n_ok"] == "0" and crash["n_failed"] == "2"


def test_crashing_run_is_recorded_and_the_rest_finish(tiny_bench: dict) -> None:
    runs = tiny_bench["out"] / "runs"
    records = {p.stem: json.loads(p.read_text()) for p in runs.glob("*.json")}
    failed = {k: r for k, r in records.items() if r["status"] == "failed"}
    assert sorted(failed) == ["crash__TPO__seed0", "crash__TPO__seed1"]
    for rec in failed.values():
        assert "Traceback" in rec["traceback"] and "ValueError" in rec["traceback"]
    assert all(r["status"] == "ok" and r["rows"] for k, r in records.items() if k not in failed)
    assert "crash__TPO__seed0" in (tiny_bench["out"] / "report.md").read_text()


def test_resume_skips_finished_runs(tiny_bench: dict) -> None:
    out: Path = tiny_bench["out"]
    ok = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")
          if json.loads(p.read_text())["status"] == "ok"}
    time.sleep(0.01)
    summary = bench(load_preset(str(tiny_bench["preset"])), out, workers=1, progress=False)
    assert summary.total == 10 and summary.skipped == 8 and summary.executed == 2 and summary.failed == 2
    assert all(p.stat().st_mtime_ns == t for p, t in ok.items()), "a finished run was rerun"
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["executed"] for i in manifest["invocations"]] == [10, 2]


def test_report_rebuild_from_stored_results(tiny_bench: dict, tmp_path: Path) -> None:
    out: Path = tiny_bench["out"]
    before = (out / "summary.csv").read_text()
    for name in ("report.md", "summary.csv", "results.jsonl", "curves_error.png"):
        (out / name).unlink()
    assert cli.main(["report", str(out)]) == 0
    for name in ("report.md", "summary.csv", "results.jsonl", "curves_error.png"):
        assert (out / name).is_file()
    assert (out / "summary.csv").read_text() == before
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        build_report(tmp_path)


def test_changed_preset_reruns_only_changed_runs(tmp_path: Path, tiny_preset_data: dict) -> None:
    from tests.evaluation.conftest import write_preset

    tiny_preset_data["settings"], tiny_preset_data["paper"] = tiny_preset_data["settings"][:1], {}
    out = tmp_path / "out"
    first = bench(load_preset(str(write_preset(tmp_path, tiny_preset_data))), out, seeds=1, progress=False)
    assert first.executed == 2
    tiny_preset_data["methods"][1]["kwargs"] = {"eta": 2.0}  # DG changes, TPO does not
    second = bench(load_preset(str(write_preset(tmp_path, tiny_preset_data))), out, seeds=1, progress=False)
    assert second.executed == 1 and second.skipped == 1


def _cli_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_bad_input_fails_early_with_a_clear_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _cli_error(capsys, ["bench", "--preset", "tabel1", "--out", str(tmp_path / "x")])
    assert "unknown preset 'tabel1'" in err and "Did you mean: table1" in err and "quick" in err
    assert not (tmp_path / "x").exists(), "nothing may be written before the input is checked"
    assert "--seeds must be >= 1" in _cli_error(capsys, ["bench", "--seeds", "0"])
    assert "--workers must be >= 1" in _cli_error(capsys, ["bench", "--workers", "-2"])
    assert "integer" in _cli_error(capsys, ["bench", "--seeds", "many"])
    assert "no manifest.json" in _cli_error(capsys, ["report", str(tmp_path)])


def test_help_documents_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = capsys.readouterr().out
    for name, path in available_presets().items():
        data = json.loads(path.read_text())
        assert name in text and data["description"][:40] in text and data["paper_ref"][:30] in text


def test_default_out_is_runs_slash_preset(tmp_path: Path, tiny_preset_data: dict,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.evaluation.conftest import write_preset

    tiny_preset_data["settings"], tiny_preset_data["paper"] = tiny_preset_data["settings"][1:2], {}
    tiny_preset_data["methods"] = tiny_preset_data["methods"][:1]
    path = write_preset(tmp_path, tiny_preset_data)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "--preset", str(path), "--seeds", "1", "--no-progress"]) == 0
    assert (tmp_path / "runs" / "tiny" / "report.md").is_file()
    assert os.listdir(tmp_path / "runs" / "tiny" / "runs") == ["multi__TPO__seed0.json"]
