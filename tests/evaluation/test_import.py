"""Runs from a script: RunLogger writes a record, ``tpo-gym import`` adds it to a bench folder, the report shows it
as it shows the preset's own methods; malformed records are refused in one line through the real CLI."""

from __future__ import annotations

import csv
import gzip
import json
import math
import runpy
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli
from tpo_gym.evaluation.presets import load_preset
from tpo_gym.evaluation.records import RecordError, validate_record
from tpo_gym.evaluation.run_logger import RunLogger
from tpo_gym.evaluation.runner import bench

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "external_runs.py"
METHOD = "MLP-TPO"

#: A token setting small enough for a test (3 iterations) and a bandit setting the script does not run.
TOKEN_PRESET = {
    "name": "tokimport", "description": "test-only preset: a tiny token reversal and a bandit",
    "paper_ref": "none (tests)", "seeds": 2,
    "settings": [
        {"name": "tok", "kind": "token",
         "params": {"env_id": "tpo_gym/TokenTask-v0",
                    "env_kwargs": {"target": "reverse_copy", "reward": "bag", "vocab_size": 2, "length": 3},
                    "episodes": 3, "agent_kwargs": {"batch_size": 8, "group_size": 4}}},
        {"name": "bandit", "kind": "tabular_single",
         "params": {"n_arms": 10, "batch_size": 20, "steps": 20, "step_size": 0.5}},
    ],
    "methods": [{"name": "TPO", "algo": "TPO"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"},
                {"id": "steps_to_45pct", "type": "steps_to_threshold", "key": "error", "threshold": 0.45}],
    "paper_claims": [{"text": "TPO has the lowest final error.",
                      "checks": [{"test": "best", "metric": "final_error", "method": "TPO", "settings": ["tok"]}]}],
    "tables": [{"title": "Tiny", "settings": ["tok", "bandit"], "methods": ["TPO"]}],
    "curves": ["error"],
}


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``tpo-gym ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A bench of TPO on the token and bandit settings (2 seeds), then examples/external_runs.py with
    ``--no-bench``: MLP-TPO trained for 2 seeds, logged, imported through ``tpo-gym import`` and reported."""
    root = tmp_path_factory.mktemp("import")
    preset = write_preset(root, TOKEN_PRESET, "tokimport.json")
    out = root / "out"
    bench(load_preset(str(preset)), out, progress=False)
    example = runpy.run_path(str(EXAMPLE), run_name="external_runs")
    example["main"](["--preset", str(preset), "--setting", "tok", "--out", str(out), "--no-bench", "--iterations",
                     "3"])
    return {"root": root, "preset": preset, "out": out, "example": example,
            "records": sorted((out / "external").glob("*.json"))}


@pytest.fixture
def copy(folder: dict[str, Any], tmp_path: Path) -> Path:
    """A copy of the imported bench folder, safe to change."""
    return Path(shutil.copytree(folder["out"], tmp_path / "out"))


def _summary(out: Path) -> list[dict[str, str]]:
    with open(out / "summary.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _record(folder: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The example's record of seed 0, changed (a key set to ``...`` is removed)."""
    rec = json.loads(folder["records"][0].read_text())
    for key, value in changes.items():
        target, _, field = key.rpartition("__")
        holder = rec[target] if target else rec
        if value is ...:
            holder.pop(field)
        else:
            holder[field] = value
    return rec


def test_the_example_writes_one_valid_record_per_seed(folder: dict[str, Any]) -> None:
    assert [p.name for p in folder["records"]] == ["mlp_tpo_seed0.json", "mlp_tpo_seed1.json"]
    for seed, path in enumerate(folder["records"]):
        rec = validate_record(json.loads(path.read_text()), str(path), {"error"}, strict=True)
        assert rec["schema_version"] == 1 and rec["status"] == "ok" and rec["traceback"] is None
        assert rec["spec"]["method"] == METHOD and rec["spec"]["seed"] == seed and rec["spec"]["kind"] == "token"
        assert [r["step"] for r in rec["rows"]] == [0, 1, 2]
        assert rec["env_interactions"] == 3 * 8 * 3 and rec["reward_queries"] == 4 * rec["env_interactions"]


def test_imported_runs_show_in_every_part_of_the_report(folder: dict[str, Any]) -> None:
    out = folder["out"]
    report = (out / "report.md").read_text()
    results = report.split("## Results")[1].split("## Claims")[0]
    assert results.count(f"| {METHOD} | ") == 3  # final error, steps to 45%, per-seed steps
    assert f"| {METHOD} | " in report.split("## Aggregate (IQM)")[1].split("## Diagnostics")[0]
    claims = report.split("## Claims")[1].split("## Aggregate")[0]
    assert METHOD in claims and "TPO has the lowest final error" in claims
    assert f"Imported methods: `{METHOD}`" in report
    assert f"| {METHOD} | tok |" in report.split("## Diagnostics")[1]
    rows = {(r["method"], r["setting"]): r for r in _summary(out)}
    assert rows[(METHOD, "tok")]["n_ok"] == "2" and math.isfinite(float(rows[(METHOD, "tok")]["final_error_pct"]))
    assert (METHOD, "bandit") not in rows  # a method is reported in the settings it has runs in
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    stored = {r["run_id"]: r["config_hash"] for r in lines if r["method"] == METHOD}
    assert sorted(stored) == ["tok__MLP-TPO__seed0", "tok__MLP-TPO__seed1"]
    assert stored["tok__MLP-TPO__seed0"] == json.loads((out / "runs" / "tok__MLP-TPO__seed0.json").read_text())[
        "config_hash"]


def test_imported_methods_are_drawn_in_the_figures(copy: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import tpo_gym.evaluation.report.figures as F

    drawn: set[tuple[str, str]] = set()
    original = F._save

    def spy(fig: Any, path: Path, handles: list[Any], labels: list[str], title: str) -> None:
        drawn.update((path.name, line.get_gid()) for ax in fig.axes for line in ax.get_lines() if line.get_gid())
        original(fig, path, handles, labels, title)

    monkeypatch.setattr(F, "_save", spy)
    assert _cli(["report", str(copy)], capsys)[0] == 0
    assert {("curves_error.png", "TPO"), ("curves_error.png", METHOD)} <= drawn
    assert (copy / "curves_error.png").stat().st_size > 0
    assert "![error](curves_error.png)" in (copy / "report.md").read_text()


def test_importing_the_same_records_again_changes_nothing(copy: Path, folder: dict[str, Any],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.name: p.read_bytes() for p in [copy / "manifest.json", *(copy / "runs").iterdir()]}
    summary = (copy / "summary.csv").read_text()
    code, out, _ = _cli(["import", *map(str, folder["records"]), "--out", str(copy)], capsys)
    assert code == 0 and "(0 new, 2 unchanged)" in out
    assert {p.name: p.read_bytes() for p in [copy / "manifest.json", *(copy / "runs").iterdir()]} == before
    assert (copy / "summary.csv").read_text() == summary


def test_a_seed_beyond_the_reports_seeds_is_stored_and_said_so(copy: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str],
                                                                folder: dict[str, Any]) -> None:
    path = tmp_path / "seed5.json.gz"
    rec = _record(folder, spec__seed=5)
    path.write_bytes(gzip.compress(json.dumps(rec).encode()))
    code, out, err = _cli(["import", str(path), "--out", str(copy), "--no-report"], capsys)
    assert code == 0, err
    assert f"note: tok__MLP-TPO__seed5: seed 5 is beyond the report's seeds 0..1; tpo-gym report {copy} --seeds 6" \
           in out
    assert (copy / "runs" / "tok__MLP-TPO__seed5.json").is_file()
    assert "tok__MLP-TPO__seed5" in json.loads((copy / "manifest.json").read_text())["imported"][METHOD]["runs"]


def test_a_record_replaced_by_hand_is_not_used(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "runs" / "tok__MLP-TPO__seed1.json"
    rec = json.loads(path.read_text())
    rec["spec"]["params"]["lr"] = 1.0
    rec["config_hash"] = "0123456789abcdef"  # another configuration: not the run that was imported
    path.write_text(json.dumps(rec))
    (copy / "results.jsonl").unlink()  # its copy of the imported run's rows would stand in for the record
    assert _cli(["report", str(copy)], capsys)[0] == 0
    assert {(r["method"], r["n_ok"]) for r in _summary(copy)} >= {(METHOD, "1")}
    assert "1 seeds of imported methods not imported (`tpo-gym import` adds them)" in (copy / "report.md").read_text()


BAD = {
    "missing status": (lambda f: _record(f, status=...), "field 'status'"),
    "missing spec": (lambda f: _record(f, spec=...), "missing field 'spec'"),
    "missing seed": (lambda f: _record(f, spec__seed=...), "missing field 'spec.seed'"),
    "seed as text": (lambda f: _record(f, spec__seed="0"), "field 'spec.seed' must be an integer"),
    "params a list": (lambda f: _record(f, spec__params=[1]), "field 'spec.params' must be an object"),
    "step as text": (lambda f: dict(_record(f), rows=[{"step": "0", "error": 0.5}]), "rows[0] field 'step'"),
    "error as text": (lambda f: dict(_record(f), rows=[{"step": 0, "error": "low"}]), "rows[0] field 'error'"),
    "NaN error": (lambda f: dict(_record(f), rows=[{"step": 0, "error": math.nan}]), "field 'error' must be a rate"),
    "error above 1": (lambda f: dict(_record(f), rows=[{"step": 0, "error": 1.5}]), "field 'error' must be a rate"),
    "steps not increasing": (lambda f: dict(_record(f), rows=[{"step": 1, "error": 0.5}, {"step": 1, "error": 0.4}]),
                             "rows[1] field 'step' must be greater"),
    "reserved row key": (lambda f: dict(_record(f), rows=[{"step": 0, "error": 0.5, "method": 1}]),
                         "rows[0] field 'method' is reserved"),
    "future schema": (lambda f: _record(f, schema_version=2), "field 'schema_version' is 2, newer than"),
    "schema as text": (lambda f: _record(f, schema_version="1"), "field 'schema_version' must be an integer"),
    "deep params": (lambda f: _record(f, spec__params={"a": json.loads("[" * 40 + "]" * 40)}), "nests deeper than 32"),
    "deeply nested JSON": (lambda f: "[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    "not JSON": (lambda f: "{status: ok", "not valid JSON"),
    "the preset's method": (lambda f: _record(f, spec__method="tpo"), "names the preset's method 'TPO'"),
    "another preset": (lambda f: _record(f, spec__preset="quick"), "field 'spec.preset' is 'quick'"),
    "unknown setting": (lambda f: _record(f, spec__setting="V=9"), "not a setting of preset 'tokimport'; its "
                                                                   "settings: tok, bandit"),
    "wrong kind": (lambda f: _record(f, spec__kind="mnist"), "field 'spec.kind' is 'mnist'"),
    "method name": (lambda f: _record(f, spec__method="a|b"), "field 'spec.method' may hold"),
    "hash of another spec": (lambda f: _record(f, config_hash="feedfeedfeedfeed"), "field 'config_hash'"),
    "another algo": (lambda f: _record(f, spec__algo="Other", spec__seed=3), "was imported with algo 'MLP-TPO'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_record_is_refused_in_one_line(case: str, folder: dict[str, Any], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    make, field = BAD[case]
    data = make(folder)
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    manifest = (folder["out"] / "manifest.json").read_bytes()
    code, _, err = _cli(["import", str(path), "--out", str(folder["out"]), "--no-report"], capsys)
    lines = err.splitlines()
    assert code == 2 and "Traceback" not in err
    assert lines == [lines[0], "tpo-gym import: error: nothing was imported"], err
    assert lines[0].startswith(f"tpo-gym import: error: {path}: ") and field in lines[0], lines[0]
    assert (folder["out"] / "manifest.json").read_bytes() == manifest


def test_one_refused_record_imports_none_of_the_others(copy: Path, folder: dict[str, Any], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_record(folder, spec__seed=2)))
    bad.write_text(json.dumps(_record(folder, spec__seed=-1)))
    missing = tmp_path / "nothing.json"
    code, _, err = _cli(["import", str(good), str(bad), str(missing), "--out", str(copy)], capsys)
    assert code == 2
    assert [line.split(": ")[2] for line in err.splitlines()] == [str(missing), str(bad), "nothing was imported"]
    assert not (copy / "runs" / "tok__MLP-TPO__seed2.json").exists()


def test_import_needs_a_bench_folder(tmp_path: Path, folder: dict[str, Any],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(["import", str(folder["records"][0]), "--out", str(tmp_path)], capsys)
    assert code == 2 and err == f"tpo-gym import: error: {tmp_path} has no manifest.json: run `tpo-gym bench --out " \
                                f"{tmp_path}` first\n"


def test_a_damaged_imported_field_is_a_one_line_report_error(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["imported"][METHOD]["runs"]["tok__MLP-TPO__seed0"]["seed"] = "zero"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = _cli(["report", str(copy)], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "field 'imported', run 'tok__MLP-TPO__seed0'" in err


def test_run_logger_checks_each_row_as_it_is_logged(tmp_path: Path, folder: dict[str, Any]) -> None:
    preset = str(folder["preset"])
    with pytest.raises(ValueError, match="has no setting 'V=3'.* Its settings: tok, bandit"):
        RunLogger(tmp_path / "r.json", preset=preset, setting="V=3", method="Mine", seed=0)
    with pytest.raises(ValueError, match="argument 'method' may hold"):
        RunLogger(tmp_path / "r.json", preset=preset, setting="tok", method="a|b", seed=0)
    with pytest.raises(ValueError, match="params must be plain JSON data"):
        RunLogger(tmp_path / "r.json", preset=preset, setting="tok", method="Mine", seed=0, params={"f": print})
    log = RunLogger(tmp_path / "r.json", preset=preset, setting="TOK", method="Mine", seed=0)
    assert log.spec["setting"] == "tok" and log.spec["kind"] == "token"
    assert log.log(error=np.float32(0.5), loss=torch.tensor(2.0), gap=None) == {"step": 0, "error": 0.5, "loss": 2.0,
                                                                             "gap": None}
    with pytest.raises(RecordError, match=r"r.json: log\(step=1\) field 'error' must be a rate.*got nan"):
        log.log(error=float("nan"))
    with pytest.raises(ValueError, match="step must be"):
        log.log(step=0, error=0.4)
    with pytest.raises(ValueError, match="takes one number"):
        log.log(error=np.array([0.1, 0.2]))
    assert log.log(error=0.25)["step"] == 1


def test_run_logger_writes_failed_with_the_traceback_and_refuses_an_empty_run(tmp_path: Path,
                                                                              folder: dict[str, Any]) -> None:
    path = tmp_path / "failed.json.gz"
    with pytest.raises(ZeroDivisionError):
        with RunLogger(path, preset=str(folder["preset"]), setting="tok", method="Mine", seed=1) as log:
            log.log(error=0.5)
            _ = 1 / 0
    rec = json.loads(gzip.decompress(path.read_bytes()))
    assert rec["status"] == "failed" and "ZeroDivisionError" in rec["traceback"] and len(rec["rows"]) == 1
    with pytest.raises(RecordError, match="field 'rows' is empty"):
        with RunLogger(tmp_path / "empty.json", preset="quick", setting="rev. copy V=2 H=5 (tuned)", method="Mine",
                       seed=0):
            pass
    assert not (tmp_path / "empty.json").exists()


def test_a_failed_record_is_imported_and_reported_as_failed(copy: Path, tmp_path: Path, folder: dict[str, Any],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    rec = _record(folder, spec__method="Crashing", status="failed", traceback="RuntimeError: diverged", rows=[])
    path = tmp_path / "failed.json"
    path.write_text(json.dumps(rec))
    assert _cli(["import", str(path), "--out", str(copy)], capsys)[0] == 0
    report = (copy / "report.md").read_text()
    assert "`tok__Crashing__seed0`: `RuntimeError: diverged`" in report
    assert {(r["method"], r["n_failed"]) for r in _summary(copy)} >= {("Crashing", "1")}


def test_committed_records_without_a_schema_version_read_as_version_1() -> None:
    path = next((ROOT / "benchmarks" / "results" / "table2" / "runs").glob("*.json.gz"))
    rec = json.loads(gzip.decompress(path.read_bytes()))
    assert "schema_version" not in rec
    validate_record(rec, str(path), {"error"}, strict=True)
    with pytest.raises(RecordError, match="newer than this tpo-gym reads"):
        validate_record({**rec, "schema_version": 2}, str(path))
