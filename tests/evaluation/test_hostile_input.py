"""Hostile input to the harness: damaged or invalid run records and results.jsonl rows, preset files and names
that would write outside runs/, out-of-range flags, two benches on one directory, orphaned workers. Each is
one clear line naming the file or flag, the field and what is allowed, raised before anything is lost.

Most tests build an output directory by hand (a manifest and records with the right configuration hashes), so
nothing runs; the worker tests start one spawned worker each."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli
from tpo_gym.evaluation import runner as R
from tpo_gym.evaluation.presets import PresetError, load_preset
from tpo_gym.evaluation.records import RecordError, validate_record
from tpo_gym.evaluation.report import build_report

REPO = Path(__file__).parents[2]
HOSTILE = {
    "name": "hostile", "description": "test-only preset: records built by hand", "paper_ref": "none (tests)",
    "seeds": 2,
    "settings": [{"name": "single", "kind": "tabular_single",
                  "params": {"n_arms": 10, "batch_size": 20, "steps": 5, "step_size": 0.5}}],
    "methods": [{"name": "TPO", "algo": "TPO"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"}],
    "curves": ["error"],
}


def _rows() -> list[dict[str, Any]]:
    return [{"step": 0, "error": 0.5, "loss": float("nan")}, {"step": 1, "error": 0.25, "loss": 1.0}]


def _stored_out(tmp_path: Path, compress: bool = False) -> tuple[Path, Any]:
    """An output directory as a finished bench of :data:`HOSTILE` leaves it, written without running."""
    preset = load_preset(str(write_preset(tmp_path, HOSTILE, "hostile.json")))
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    manifest = {"preset": preset.data, "whole_preset": preset.data, "preset_source": preset.source, "seeds": 2,
                "invocations": [], "compress_records": compress}
    (out / "manifest.json").write_text(json.dumps(manifest))
    for spec in preset.runs(2):
        rec = {"spec": spec.to_dict(), "status": "ok", "rows": _rows(), "traceback": None, "wall_s": 0.1,
               "run_id": spec.run_id, "config_hash": spec.config_hash}
        R.write_record(out, spec, rec, compress)
    return out, preset


def _edit(path: Path, change: Any) -> None:
    rec = json.loads(path.read_text())
    change(rec)
    path.write_text(json.dumps(rec))


def _set_error(value: Any) -> Any:
    return lambda rec: rec["rows"][1].update(error=value)


DAMAGE = {
    "no rows": (lambda rec: rec.pop("rows"), "missing field 'rows'"),
    "rows of the wrong type": (lambda rec: rec.update(rows=5), "field 'rows' must be a list"),
    "no rows logged": (lambda rec: rec.update(rows=[]), "field 'rows' is empty"),
    "string step": (lambda rec: rec["rows"][1].update(step="1"), "rows[1] field 'step' must be an integer >= 0"),
    "string error": (_set_error("x"), "rows[1] field 'error' must be a number or null, got 'x'"),
    "NaN error": (_set_error(float("nan")), "rows[1] field 'error' must be a rate, a finite number in [0, 1]"),
    "huge error": (_set_error(-1e308), "rows[1] field 'error' must be a rate, a finite number in [0, 1]"),
    "bad status": (lambda rec: rec.update(status="fine"), "field 'status' must be one of ['ok', 'failed']"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_an_invalid_record_is_refused_by_name_and_the_report_is_written(tmp_path: Path, damage: str) -> None:
    change, expected = DAMAGE[damage]
    out, preset = _stored_out(tmp_path)
    bad, good = preset.runs(2)
    path = R.record_path(out, bad)
    _edit(path, change)
    with pytest.raises(RecordError) as info:
        R.stored_record(out, bad, preset.metric_keys)
    assert str(info.value).startswith(f"{path}: ") and expected in str(info.value)
    assert "\n" not in str(info.value)
    refused: list[str] = []
    assert R.stored_runs(out, preset.runs(2), preset.metric_keys, refused) == [good], "not finished: rerun"
    assert refused == [str(info.value)]
    refused = []
    build_report(out, refused=refused)
    assert refused == [str(info.value)]
    report = (out / "report.md").read_text()
    assert expected in report.split("cannot be read or are invalid")[1]
    assert "1 not run yet" in report, "the refused run is not used"


def test_a_deeply_nested_compressed_record_is_refused(tmp_path: Path) -> None:
    out, preset = _stored_out(tmp_path, compress=True)
    bad = preset.runs(2)[0]
    R.record_path(out, bad).write_bytes(gzip.compress(b"[" * 100_000))  # 250 bytes, a RecursionError in json
    assert len(R.record_path(out, bad).read_bytes()) < 300
    refused: list[str] = []
    build_report(out, refused=refused)
    assert refused == [f"{R.record_path(out, bad)} (decompressed): JSON nested too deeply to read"]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_record_path_that_is_no_regular_file_is_refused_not_missing(tmp_path: Path, kind: str) -> None:
    out, preset = _stored_out(tmp_path)
    bad = preset.runs(2)[0]
    path = R.record_path(out, bad)
    path.unlink()
    path.mkdir() if kind == "directory" else os.mkfifo(path)  # a fifo opened for reading would block
    refused: list[str] = []
    assert len(R.stored_runs(out, preset.runs(2), preset.metric_keys, refused)) == 1
    assert refused == [f"{path}: not a regular file (a directory, link to nothing, fifo or device); move it away"]


def test_results_jsonl_rows_pass_the_same_validator(tmp_path: Path) -> None:
    out, preset = _stored_out(tmp_path)
    build_report(out)
    bad = preset.runs(2)[0]
    R.record_path(out, bad).unlink()  # that run is now read from results.jsonl alone
    lines = (out / "results.jsonl").read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if json.loads(line)["run_id"] == bad.run_id) + 1
    lines[number - 1] = lines[number - 1].replace('"error": 0.25', '"error": "x"')
    (out / "results.jsonl").write_text("\n".join([*lines, "[" * 100_000, "\udcff"]) + "\n", errors="surrogateescape")
    refused: list[str] = []
    build_report(out, refused=refused)
    assert refused == [f"{out / 'results.jsonl'} (run {bad.run_id}): line {number} field 'error' must be a number "
                       "or null, got 'x'"]
    assert "1 not run yet" in (out / "report.md").read_text()


def test_a_run_returning_an_invalid_record_is_stored_as_failed(tmp_path: Path) -> None:
    out, preset = _stored_out(tmp_path)
    spec = preset.runs(2)[0]
    rec = {"spec": spec.to_dict(), "status": "ok", "rows": [{"step": 0, "error": math.nan}], "traceback": None}
    assert R._store(out, spec, rec, False, preset.metric_keys) is False
    stored = json.loads(R.record_path(out, spec).read_text())
    assert stored["status"] == "failed" and "rows[0] field 'error' must be a rate" in stored["traceback"]


def test_diagnostics_may_be_nan_and_failed_records_need_no_rows() -> None:
    assert validate_record({"status": "ok", "rows": _rows()}, "r", {"error"})
    assert validate_record({"status": "failed", "rows": [], "traceback": "boom", "wall_s": math.nan}, "r")
    with pytest.raises(RecordError, match=r"r: rows\[0\] field 'grad_norm' must be a finite number within"):
        validate_record({"status": "ok", "rows": [{"step": 0, "grad_norm": math.inf}]}, "r", {"grad_norm"})


# ---------------------------------------------------------------------------------------------
# preset files and names
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../x", "/", "/tmp/x", "..", ".hidden", "a\x1b[31mred", "x" * 101, " x"])
def test_a_preset_name_that_is_no_safe_name_is_refused(tmp_path: Path, name: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = write_preset(tmp_path, dict(HOSTILE, name=name), "named.json")
    with pytest.raises(PresetError, match="preset name .* is not allowed"):
        load_preset(str(path))
    with pytest.raises(SystemExit):
        cli.main(["bench", "--preset", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert "is not allowed" in err and "\x1b" not in err


def test_the_default_out_is_under_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_preset(tmp_path, HOSTILE, "hostile.json")
    assert cli.main(["bench", "--preset", str(path), "--list"]) == 0
    assert capsys.readouterr().out.strip().endswith("in runs/hostile; a bench there runs the other 2")


@pytest.mark.parametrize(("content", "expected"), [
    (b"[" * 100_000, "JSON nested too deeply to read"),
    (json.dumps(HOSTILE).encode("utf-16"), "not UTF-8 text"),
    (json.dumps(HOSTILE).replace('"seeds": 2', '"seeds": ' + "9" * 5000).encode(), "more digits than Python"),
    (json.dumps(dict(HOSTILE, description="a\x07b")).encode(), "description must be printable text"),
])
def test_a_bad_preset_file_is_one_line(tmp_path: Path, content: bytes, expected: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    for argv in (["bench", "--preset", str(path), "--list"], ["presets", str(path)]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and expected in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# flags
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "expected"), [
    (["--stop-after", "1e9"], "--stop-after takes a positive number of minutes, got '1e9'; at most 1000000"),
    (["--workers", "1000000000"], "--workers must be <= 1024, got 1000000000"),
    (["--out", " "], "--out ' ' names no directory"),
    (["--out", "runs/\udcff"], "--out 'runs/\\udcff' is not valid UTF-8"),
])
def test_out_of_range_flags_are_one_line(tmp_path: Path, argv: list[str], expected: str,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_preset(tmp_path, HOSTILE, "hostile.json")
    monkeypatch.chdir(tmp_path)  # nothing may be written, even under runs/
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--preset", str(path), "--no-progress", *argv])
    assert info.value.code == 2 and expected in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile.json"]


def test_bench_refuses_out_of_range_stop_after_and_workers(tmp_path: Path) -> None:
    preset = load_preset(str(write_preset(tmp_path, HOSTILE, "hostile.json")))
    with pytest.raises(ValueError, match=r"stop_after \(minutes\) must be a finite number > 0 and <= 1000000"):
        R.bench(preset, tmp_path / "o", stop_after=10**400)
    with pytest.raises(ValueError, match="workers must be an integer >= 1 and <= 1024"):
        R.bench(preset, tmp_path / "o", workers=10**9)


# ---------------------------------------------------------------------------------------------
# one bench per directory; the manifest agrees with the records
# ---------------------------------------------------------------------------------------------
def test_a_second_bench_on_one_out_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, preset = _stored_out(tmp_path)
    with R.bench_lock(out):  # as a bench in another process holds it
        with pytest.raises(R.BenchLocked, match=f"another tpo-gym bench \\(pid {os.getpid()}\\) is writing {out}"):
            R.bench(preset, out, progress=False)
        with pytest.raises(SystemExit) as info:
            cli.main(["bench", "--preset", preset.source, "--out", str(out), "--no-progress"])
        assert info.value.code == 2 and "another tpo-gym bench" in capsys.readouterr().err
    assert R.bench(preset, out, progress=False).skipped == 2, "released: the next bench goes on"


@pytest.mark.parametrize("compress", [True, False])
def test_the_manifest_agrees_with_the_records_form(tmp_path: Path, compress: bool) -> None:
    out, preset = _stored_out(tmp_path, compress=not compress)
    summary = R.bench(preset, out, progress=False, compress=compress)
    assert summary.executed == 0 and summary.skipped == 2
    suffix = ".json.gz" if compress else ".json"
    assert all(p.name.endswith(suffix) and (not compress or not p.name.endswith(".json"))
               for p in (out / "runs").iterdir())
    assert len(list((out / "runs").iterdir())) == 2
    assert json.loads((out / "manifest.json").read_text())["compress_records"] is compress


# ---------------------------------------------------------------------------------------------
# worker processes
# ---------------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie nobody reaped has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def test_workers_end_when_the_bench_is_killed(tmp_path: Path) -> None:
    """``kill -9`` of a bench leaves no worker behind: each watches its parent and ends when it is gone."""
    pid_file = tmp_path / "pid"
    script = ("from tests.evaluation import _dying_worker\nfrom tpo_gym.evaluation.runner import _run_local\n"
              f"list(_run_local([[{{'seed': 1, 'pid_file': {str(pid_file)!r}}}]], 1, run=_dying_worker.slow))\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the worker never started"
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the worker outlived its bench"
    finally:
        parent.kill()
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), 9)


def test_a_worker_import_error_is_recorded_with_its_exception() -> None:
    """A run function whose module cannot be imported in the worker: the record holds that exception, not
    "killed, perhaps for lack of memory"."""
    from tests.evaluation import _child_import_error

    records = list(R._run_local([[{"seed": 0}]], 1, run=_child_import_error.run))
    assert records[0]["status"] == "failed"
    assert "ImportError: this module cannot be imported in a worker process" in records[0]["traceback"]
