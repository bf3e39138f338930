"""Benchmarks run in chunks across sessions: compressed run records (``--compress``, committed to the
repository and read back as plain ones), ``--list`` saying what is stored, and ``--stop-after`` stopping
cleanly at a deadline (what finished is stored, what was in flight leaves no record, the same command
goes on)."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli
from tpo_gym.evaluation.presets import load_preset
from tpo_gym.evaluation.report import build_report
from tpo_gym.evaluation.runner import bench, load_record, record_path, stored_runs

FAST = {
    "name": "chunks", "description": "test-only preset: two fast bandits", "paper_ref": "none (tests)", "seeds": 2,
    "settings": [
        {"name": "single", "kind": "tabular_single",
         "params": {"n_arms": 10, "batch_size": 20, "steps": 25, "step_size": 0.5}},
        {"name": "multi", "kind": "tabular_multi",
         "params": {"n_contexts": 5, "n_arms": 4, "steps": 30, "step_size": 0.5}},
    ],
    "methods": [{"name": "TPO", "algo": "TPO"}, {"name": "DG", "algo": "DG"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"}],
    "curves": ["error"],
}


def _names(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "runs").iterdir())


def test_compressed_records_are_read_as_plain_ones_and_a_rerun_runs_nothing(tmp_path: Path) -> None:
    preset = load_preset(str(write_preset(tmp_path, FAST, "chunks.json")))
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    bench(preset, plain, workers=2, progress=False)
    summary = bench(preset, packed, workers=2, progress=False, compress=True)
    assert summary.executed == 8 and summary.failed == 0
    assert _names(packed) == sorted(n + ".gz" for n in _names(plain)), "one .json.gz per run, no plain copy"
    for spec in preset.runs(2):
        a, b = load_record(plain, spec), load_record(packed, spec)
        assert b is not None and b["rows"] == a["rows"] and b["config_hash"] == spec.config_hash
        raw = record_path(packed, spec).read_bytes()
        assert raw[:2] == b"\x1f\x8b" and json.loads(gzip.decompress(raw))["run_id"] == spec.run_id
        assert len(raw) < record_path(plain, spec).stat().st_size
    build_report(plain), build_report(packed)
    assert (packed / "summary.csv").read_text() == (plain / "summary.csv").read_text()
    before = {n: (packed / "runs" / n).read_bytes() for n in _names(packed)}
    again = bench(preset, packed, workers=2, progress=False)  # no --compress: as the last bench there
    assert again.executed == 0 and again.skipped == 8
    assert {n: (packed / "runs" / n).read_bytes() for n in _names(packed)} == before
    assert json.loads((packed / "manifest.json").read_text())["compress_records"] is True


def test_a_damaged_or_oversized_compressed_record_is_run_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tpo_gym.evaluation._run_records as run_records  # the module whose read_record reads the cap

    preset = load_preset(str(write_preset(tmp_path, FAST, "chunks.json"))).subset(["single"], ["TPO"], None)
    out = tmp_path / "out"
    bench(preset, out, seeds=2, progress=False, compress=True)
    first, second = preset.runs(2)
    path = record_path(out, first)
    path.write_bytes(path.read_bytes()[:40])  # truncated
    assert load_record(out, first) is None and load_record(out, second) is not None
    monkeypatch.setattr(run_records, "MAX_RECORD_BYTES", 100)  # a record that would decompress past the cap
    assert load_record(out, second) is None
    monkeypatch.undo()
    summary = bench(preset, out, seeds=2, progress=False)
    assert summary.executed == 1 and load_record(out, first)["status"] == "ok"


def test_switching_form_leaves_one_record_per_run(tmp_path: Path) -> None:
    preset = load_preset(str(write_preset(tmp_path, FAST, "chunks.json"))).subset(["single"], ["DG"], None)
    out = tmp_path / "out"
    bench(preset, out, seeds=1, progress=False)
    (spec,) = preset.runs(1)
    rec = load_record(out, spec)
    rec["status"] = "failed"  # a failed record is run again, now compressed
    record_path(out, spec).write_text(json.dumps(rec))
    bench(preset, out, seeds=1, progress=False, compress=True)
    assert _names(out) == [f"{spec.run_id}.json.gz"] and load_record(out, spec)["status"] == "ok"


def test_list_says_what_is_stored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, out = write_preset(tmp_path, FAST, "chunks.json"), tmp_path / "out"
    args = ["bench", "--preset", str(path), "--out", str(out), "--settings", "single", "--no-progress"]
    assert cli.main([*args, "--list"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"stored: 0 of 4 runs in {out}; a bench there runs the other 4"
    assert cli.main([*args, "--compress"]) == 0
    capsys.readouterr()
    assert cli.main([*args, "--list"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"stored: all 4 runs in {out} (a bench there runs nothing new)"
    assert cli.main([*args, "--list", "--seeds", "3"]) == 0
    assert "stored: 4 of 6 runs" in capsys.readouterr().out


def test_stop_after_stops_at_the_deadline_and_the_same_command_goes_on(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path, out = write_preset(tmp_path, FAST, "chunks.json"), tmp_path / "out"
    args = ["bench", "--preset", str(path), "--out", str(out), "--workers", "2", "--no-progress"]
    start = time.monotonic()
    assert cli.main([*args, "--stop-after", "0.001"]) == 0  # 60 ms: before any worker process has started
    assert time.monotonic() - start < 30
    printed = capsys.readouterr().out
    assert "stopped at the --stop-after deadline (0.001 min): 8 of 8 runs left" in printed
    assert "continue with: tpo-gym bench --preset" in printed
    assert not list((out / "runs").iterdir()), "runs in flight leave no record"
    invocation = json.loads((out / "manifest.json").read_text())["invocations"][-1]
    assert invocation["stopped_at_deadline"] is True and invocation["left"] == 8
    assert cli.main(args) == 0
    assert len(stored_runs(out, load_preset(str(path)).runs(2))) == 8


def test_a_deadline_stops_the_runs_in_flight_and_keeps_those_finished(tmp_path: Path) -> None:
    import os

    from tests.evaluation import _dying_worker
    from tpo_gym.evaluation.runner import _Deadline, _run_local

    pid_file = tmp_path / "pid"
    tasks = [[{"seed": 0}], [{"seed": 1, "pid_file": str(pid_file)}]]
    stream = _run_local(tasks, 2, run=_dying_worker.slow, deadline=time.monotonic() + 8)
    got = []
    start = time.monotonic()
    with pytest.raises(_Deadline):
        for rec in stream:
            got.append(rec["spec"]["seed"])
    assert got == [0], "the finished run is yielded, the one in flight is not"
    assert time.monotonic() - start < 25, "the slow run (60 s) is stopped at the deadline, not waited for"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_bad_stop_after_is_refused(bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--preset", "quick", "--out", str(tmp_path / "o"), "--stop-after", bad])
    assert exc.value.code == 2
    assert f"--stop-after takes a positive number of minutes, got '{bad}'" in capsys.readouterr().err


def test_bench_refuses_bad_stop_after_and_compress(tmp_path: Path) -> None:
    preset = load_preset(str(write_preset(tmp_path, FAST, "chunks.json")))
    with pytest.raises(ValueError, match=r"stop_after \(minutes\) must be a finite number > 0 and <= 1000000, got 0"):
        bench(preset, tmp_path / "o", stop_after=0)
    with pytest.raises(ValueError, match="compress must be True, False or None"):
        bench(preset, tmp_path / "o", compress="yes")  # type: ignore[arg-type]
