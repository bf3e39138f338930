"""The command line: help, bad --out, preset listing with cost estimates, case-insensitive selections."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli
from tpo_gym.evaluation import cost as K
from tpo_gym.evaluation.presets import available_presets, load_preset


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert "Traceback" not in err and "usage:" not in err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# help
# ---------------------------------------------------------------------------------------------


def test_bare_command_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, [])
    assert code == 0 and "usage: tpo-gym" in out
    for command in ("presets", "bench", "report"):
        assert command in out


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["report", "--help"], ["presets", "--help"]])
def test_help_has_no_docstring_markup(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = _run(capsys, argv)
    assert code == 0 and out
    for markup in ("``", ":param", ":raises", ":return", "::"):
        assert markup not in out, f"{markup!r} in the help of {argv}"


# ---------------------------------------------------------------------------------------------
# --out errors: one line, no traceback
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def small_preset(tmp_path: Path, tiny_preset_data: dict) -> Path:
    tiny_preset_data["settings"], tiny_preset_data["paper"] = tiny_preset_data["settings"][:1], {}
    tiny_preset_data["methods"] = tiny_preset_data["methods"][:1]
    return write_preset(tmp_path, tiny_preset_data)


def test_out_that_is_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, small_preset: Path) -> None:
    target = tmp_path / "a_file"
    target.write_text("x")
    code, _, err = _run(capsys, ["bench", "--preset", str(small_preset), "--out", str(target), "--no-progress"])
    assert code == 2 and "not a directory" in _one_line_error(err)
    code, _, err = _run(capsys, ["bench", "--preset", str(small_preset), "--out", str(target / "sub"),
                                 "--no-progress"])
    assert code == 2 and "is a file, not a directory" in _one_line_error(err)


def test_out_that_is_not_writable(capsys: pytest.CaptureFixture[str], tmp_path: Path, small_preset: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() != 0:  # a real read-only directory where permissions apply
        locked.chmod(0o500)
    else:  # root writes anywhere: make the probe write fail as it would for anyone else
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(tempfile, "mkstemp", refuse)  # the probe file the --out check writes
    try:
        code, _, err = _run(capsys, ["bench", "--preset", str(small_preset), "--out", str(locked / "out"),
                                     "--no-progress"])
    finally:
        locked.chmod(0o700)
    line = _one_line_error(err)
    assert code == 2 and "not writable" in line and "Permission denied" in line


def test_report_of_a_file_or_an_empty_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "a_file"
    target.write_text("x")
    code, _, err = _run(capsys, ["report", str(target)])
    assert code == 2 and "is not a directory" in _one_line_error(err)
    code, _, err = _run(capsys, ["report", str(tmp_path)])
    assert code == 2 and "no manifest.json" in _one_line_error(err)


# ---------------------------------------------------------------------------------------------
# preset selections: bench usage on errors, any case
# ---------------------------------------------------------------------------------------------


def test_unknown_method_prints_the_bench_usage_and_suggests(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, ["bench", "--preset", "table3", "--methods", "TPO,PPOO", "--list"])
    assert code == 2 and "usage: tpo-gym bench" in err
    assert "no method 'PPOO'" in err and "Did you mean: PPO" in err


def test_method_and_setting_names_are_case_insensitive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, ["bench", "--preset", "table3", "--settings", "p h=7", "--methods",
                                 "tpo,grpo (no kl),ppo", "--seeds", "3", "--list", "--out", str(tmp_path / "o")])
    assert code == 0
    assert "P H=7 (reference)" in out and "P H=7 (tuned)" in out and "TPO, GRPO (no KL), PPO" in out
    assert "runs:    18 " in out and "setups:  reference, tuned" in out
    assert not (tmp_path / "o").exists(), "--list runs nothing and writes nothing"


# ---------------------------------------------------------------------------------------------
# what a preset holds, and its estimated cost
# ---------------------------------------------------------------------------------------------


def test_presets_lists_every_preset_with_runs_and_cost(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, ["presets"])
    assert code == 0
    for name in available_presets():
        preset = load_preset(name)
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        cells = row.split()
        assert cells[1:5] == [str(len(preset.settings)), str(len(preset.methods)), str(preset.seeds),
                              str(len(preset.runs()))], row
    assert "est. compute" in out and "measured" in out


def test_presets_name_shows_settings_methods_seeds_runs_and_cost(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, ["presets", "quick", "--seeds", "2", "--workers", "2"])
    assert code == 0
    assert "seeds:   2 (0..1); the preset default is 3" in out and "runs:    40 " in out
    for setting in ("single-context bandit", "multi-context bandit", "rev. copy V=2 H=5"):
        assert setting in out
    assert "TPO, GRPO, PPO, DG" in out and "estimated cost:" in out and "--workers 2" in out
    code, _, err = _run(capsys, ["presets", "tabel1"])
    assert code == 2 and "Did you mean: table1" in err


def test_cost_estimate_matches_the_measured_reports() -> None:
    """The constants reproduce the committed reports' compute times within a factor of 2."""
    # the reports were measured under this project's setup ("tuned")
    measured = {"quick": (None, 70.7), "tabular-single": (None, 33.4), "tabular-multi": (None, 70.4)}
    for name, (seeds, seconds) in measured.items():
        preset = load_preset(name)
        estimate = K.estimate_preset(preset.subset(setups=["tuned"]) if preset.setups else preset, seeds).compute_s
        assert seconds / 2 < estimate < seconds * 2, (name, estimate, seconds)
    table1 = load_preset("table1").subset(["V=2", "V=4"], setups=["tuned"])
    assert 5083.2 / 2 < K.estimate_preset(table1, 5).compute_s < 5083.2 * 2
    table3 = load_preset("table3").subset(["P H=7"], ["TPO", "GRPO", "PPO"], ["tuned"])
    assert 6856.8 / 2 < K.estimate_preset(table3, 3).compute_s < 6856.8 * 2


def test_cost_work_model_counts_rollouts_and_epochs() -> None:
    table3 = load_preset("table3")
    runs = {(r.setting, r.method): r for r in table3.runs(1)}
    # sequence-level TPO: B*K rollouts of H tokens, 1 + 4 epochs; PPO prompt-matched: B rollouts
    assert K.run_units(runs[("P H=7 (reference)", "TPO")]) == 2000 * 800 * 7 * 5
    assert K.run_units(runs[("P H=7 (reference)", "PPO")]) == 2000 * 100 * 7 * 5
    assert K.run_units(runs[("I H=7 (reference)", "PPO")]) == 2000 * 800 * 7 * 5  # interaction-matched
    assert K.run_units(runs[("P H=7 (reference)", "DG")]) == 2000 * 100 * 7 * 2  # one epoch
    est = K.estimate_preset(table3, 1)
    assert est.wall_s(1) == pytest.approx(est.compute_s) and est.wall_s(1000) == pytest.approx(est.longest_s)
    assert K.format_seconds(42) == "42 s" and K.format_seconds(3600 * 3) == "3.0 h"


def test_presets_listing_reads_only(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _run(capsys, ["presets"])[0] == 0 and _run(capsys, ["bench", "--list"])[0] == 0
    assert os.listdir(tmp_path) == []
    preset = json.loads(available_presets()["quick"].read_text())
    assert preset["name"] == "quick"


# ---------------------------------------------------------------------------------------------
# --device
# ---------------------------------------------------------------------------------------------
def test_device_is_checked_early_and_recorded(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                              small_preset: Path) -> None:
    import torch

    code, _, err = _run(capsys, ["bench", "--preset", str(small_preset), "--device", "tpu", "--out",
                                 str(tmp_path / "a")])
    assert code == 2 and "usage: tpo-gym bench" in err and "'tpu'" in err and "cuda:N" in err
    if not torch.cuda.is_available():
        code, _, err = _run(capsys, ["bench", "--preset", str(small_preset), "--device", "cuda", "--out",
                                     str(tmp_path / "b")])
        assert code == 2 and "CUDA is not available" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    code, _, _ = _run(capsys, ["bench", "--preset", str(small_preset), "--device", "cpu", "--no-progress",
                               "--out", str(tmp_path / "c")])
    assert code == 0
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["device"] == "cpu"


def test_report_over_a_selection_gathers_pieces_and_runs_nothing(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "o"
    for method in ("TPO", "DG"):  # one method at a time, as a long preset is filled piece by piece
        code, _, _ = _run(capsys, ["bench", "--preset", "tabular-single", "--methods", method, "--setups", "tuned",
                                   "--seeds", "2", "--out", str(out), "--no-progress"])
        assert code == 0
    assert "| DG |" in (out / "report.md").read_text() and "| TPO |" not in (out / "report.md").read_text()
    records = sorted(p.name for p in (out / "runs").iterdir())
    code, stdout, _ = _run(capsys, ["report", str(out), "--methods", "TPO,DG", "--setups", "tuned", "--seeds", "3"])
    assert code == 0 and "report.md" in stdout
    text = (out / "report.md").read_text()
    assert "| TPO |" in text and "| DG |" in text and "| seeds | 3 (0..2) |" in text
    assert "2 not run yet" in text, "seed 2 of each method is missing, and said so"
    assert sorted(p.name for p in (out / "runs").iterdir()) == records, "report runs nothing"
    code, _, err = _run(capsys, ["report", str(out), "--methods", "TPOO"])
    assert code == 2 and "no method 'TPOO'" in err


#: Two cheap settings x two methods, as a preset file (not packaged).
PIECES = {
    "name": "pieces", "description": "test-only preset filled piece by piece", "paper_ref": "none", "seeds": 2,
    "settings": [
        {"name": "a", "kind": "tabular_single", "params": {"n_arms": 10, "batch_size": 20, "steps": 8}},
        {"name": "b", "kind": "tabular_single", "params": {"n_arms": 10, "batch_size": 20, "steps": 8}},
    ],
    "methods": [{"name": "TPO", "algo": "TPO"}, {"name": "DG", "algo": "DG"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"}],
    "curves": ["error"],
}


def _bench(capsys: pytest.CaptureFixture[str], preset: Path, out: Path, *extra: str) -> None:
    code, _, err = _run(capsys, ["bench", "--preset", str(preset), "--out", str(out), "--no-progress", *extra])
    assert code == 0, err


def _rows(out: Path) -> set[tuple[str, int]]:
    return {(r["run_id"], r["step"]) for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_a_narrower_report_never_drops_stored_rows(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """results.jsonl keeps the rows of runs outside the selection: without runs/ it is the only copy."""
    out = tmp_path / "o"
    _bench(capsys, write_preset(tmp_path, PIECES), out)
    for record in (out / "runs").iterdir():  # a committed report: results.jsonl only
        record.unlink()
    before = _rows(out)
    assert _run(capsys, ["report", str(out), "--seeds", "1", "--methods", "DG"])[0] == 0
    assert _rows(out) == before
    assert _run(capsys, ["report", str(out), "--seeds", "2", "--methods", "TPO,DG"])[0] == 0
    text = (out / "report.md").read_text()
    assert "not run yet" not in text and "| TPO |" in text and _rows(out) == before


def test_a_preset_file_selection_widens_again_and_unset_flags_keep_the_manifests(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "o"
    preset = write_preset(tmp_path, PIECES)
    _bench(capsys, preset, out, "--methods", "TPO", "--settings", "a")
    _bench(capsys, preset, out, "--methods", "DG", "--settings", "a")
    assert _run(capsys, ["report", str(out), "--methods", "TPO,DG"])[0] == 0  # wider than the last bench
    text = (out / "report.md").read_text()
    assert "| TPO |" in text and "| DG |" in text and "not run yet" not in text
    assert "| b |" not in text and "b |" not in text.split("## Results")[1].split("\n")[2], "--settings kept: a"
    assert _run(capsys, ["report", str(out), "--seeds", "1"])[0] == 0  # the rest as the manifest has it
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["name"] for s in manifest["preset"]["settings"]] == ["a"]
    assert [m["name"] for m in manifest["preset"]["methods"]] == ["TPO", "DG"] and manifest["seeds"] == 1
    assert _run(capsys, ["report", str(out), "--settings", "a,b", "--seeds", "2"])[0] == 0
    assert "4 not run yet" in (out / "report.md").read_text()  # setting b: 2 methods x 2 seeds


def test_a_failed_report_leaves_every_file_as_it_was(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "o"
    _bench(capsys, write_preset(tmp_path, PIECES), out, "--settings", "a")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    code, _, err = _run(capsys, ["report", str(out), "--settings", "b"])  # never run: nothing to report
    assert code == 1 and "left as it is" in _one_line_error(err)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert _run(capsys, ["report", str(out)])[0] == 0


def test_a_preset_file_with_a_packaged_presets_name_is_reported_as_run(capsys: pytest.CaptureFixture[str],
                                                                       tmp_path: Path) -> None:
    out = tmp_path / "o"
    _bench(capsys, write_preset(tmp_path, dict(PIECES, name="quick")), out, "--settings", "a")
    assert _run(capsys, ["report", str(out), "--seeds", "1"])[0] == 0
    assert _run(capsys, ["report", str(out), "--settings", "a,b"])[0] == 0, "a and b: the file's, not quick's"


@pytest.mark.parametrize("content", ['{"preset": ', "{}", "[1, 2]", '{"preset": {}, "seeds": 0}'])
def test_a_damaged_manifest_is_one_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               content: str) -> None:
    out = tmp_path / "o"
    preset = write_preset(tmp_path, PIECES)
    _bench(capsys, preset, out, "--settings", "a", "--methods", "DG")
    (out / "manifest.json").write_text(content)
    for argv in (["report", str(out)], ["report", str(out), "--seeds", "1"]):
        code, _, err = _run(capsys, argv)
        assert code == 2 and "manifest.json" in _one_line_error(err)
    code, _, err = _run(capsys, ["bench", "--preset", str(preset), "--out", str(out), "--no-progress"])
    if content.endswith("}"):  # a JSON object: bench writes its manifest over it (the runs are kept)
        assert code == 0 and _run(capsys, ["report", str(out)])[0] == 0
    else:
        assert code == 2 and "manifest.json is damaged" in _one_line_error(err)


def test_a_damaged_run_record_is_named_in_the_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "o"
    preset = write_preset(tmp_path, PIECES)
    _bench(capsys, preset, out, "--settings", "a", "--methods", "DG")
    record = sorted((out / "runs").iterdir())[0]
    record.write_text("[1, 2]")
    (out / "results.jsonl").write_text((out / "results.jsonl").read_text() + "not json\n")
    assert _run(capsys, ["report", str(out)])[0] == 0
    assert f"`{record}: a run record must be a JSON object, got list`" in \
        (out / "report.md").read_text().split("cannot be read")[1]
    _bench(capsys, preset, out, "--settings", "a", "--methods", "DG")  # the bench redoes it
    assert json.loads(record.read_text())["status"] == "ok"


def test_report_flags_name_the_bad_value(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "o"
    _bench(capsys, write_preset(tmp_path, PIECES), out, "--settings", "a", "--methods", "DG")
    code, _, err = _run(capsys, ["report", str(out), "--settings", "nope"])
    assert code == 2 and "--settings nope: preset 'pieces' has no setting 'nope'" in err and "manifest" not in err
    code, _, err = _run(capsys, ["report", str(out), "--methods", " , "])
    assert code == 2 and "--methods" in err and "names nothing" in err


# ---------------------------------------------------------------------------------------------
# another preset's report in --out; empty selections; run counts that would not fit in memory
# ---------------------------------------------------------------------------------------------
OTHER = dict(PIECES, name="other", settings=[dict(PIECES["settings"][0], name="c")])


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def test_bench_of_another_preset_in_out_is_refused_unless_replace_preset(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Path) -> None:
    out = tmp_path / "o"
    pieces, other = write_preset(tmp_path, PIECES, "pieces.json"), write_preset(tmp_path, OTHER, "other.json")
    _bench(capsys, pieces, out, "--settings", "a", "--seeds", "1")
    before = _files(out)
    code, _, err = _run(capsys, ["bench", "--preset", str(other), "--out", str(out), "--no-progress"])
    line = _one_line_error(err)
    assert code == 2 and "'pieces'" in line and "'other'" in line and "--replace-preset" in line
    assert _files(out) == before and len(list((out / "runs").iterdir())) == 2, "nothing written, nothing run"

    _bench(capsys, other, out, "--replace-preset", "--seeds", "1")
    assert (out / "report.md").read_text().startswith("# other: benchmark report")
    assert json.loads((out / "manifest.json").read_text())["preset"]["name"] == "other"
    assert len(list((out / "runs").iterdir())) == 4, "the runs of 'pieces' are kept"

    code, stdout, err = _run(capsys, ["report", str(out), "--preset", "pieces"])  # back: as it was
    assert code == 0, err
    text = (out / "report.md").read_text()
    assert text.startswith("# pieces: benchmark report") and "not run yet" not in text and "| DG |" in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["preset"]["name"] == "pieces" and manifest["seeds"] == 1
    assert [s["name"] for s in manifest["preset"]["settings"]] == ["a"] and len(manifest["invocations"]) == 1
    assert _run(capsys, ["report", str(out), "--preset", "other"])[0] == 0
    assert (out / "report.md").read_text().startswith("# other: benchmark report")
    code, _, err = _run(capsys, ["report", str(out), "--preset", "nope"])
    assert code == 2 and "--preset nope" in err and "unknown preset 'nope'" in err


def test_replace_preset_never_overwrites_another_presets_stored_run(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "o"
    _bench(capsys, write_preset(tmp_path, PIECES, "pieces.json"), out, "--settings", "a", "--seeds", "1")
    clash = dict(PIECES, name="clash", settings=[dict(PIECES["settings"][0], params={"n_arms": 5, "steps": 4})])
    before = {p.name: p.read_bytes() for p in (out / "runs").iterdir()}
    code, _, err = _run(capsys, ["bench", "--preset", str(write_preset(tmp_path, clash, "clash.json")), "--out",
                                 str(out), "--no-progress", "--replace-preset", "--seeds", "1"])
    line = _one_line_error(err)
    assert code == 2 and "would overwrite the stored run of preset 'pieces'" in line
    assert {p.name: p.read_bytes() for p in (out / "runs").iterdir()} == before


def test_bench_help_documents_replace_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, ["bench", "--help"])
    assert code == 0 and "--replace-preset" in out
    code, out, _ = _run(capsys, ["report", "--help"])
    assert code == 0 and "--preset" in out


@pytest.mark.parametrize("flag,value", [("--settings", ""), ("--methods", ""), ("--setups", ""),
                                        ("--settings", " , "), ("--out", "")])
def test_an_empty_selection_is_an_error_not_everything(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       flag: str, value: str) -> None:
    preset = str(write_preset(tmp_path, PIECES))
    for argv in (["bench", "--preset", preset, "--list"], ["bench", "--preset", preset, "--out", str(tmp_path / "o")]):
        code, stdout, err = _run(capsys, [*argv, flag, value])
        assert code == 2 and not stdout and f"{flag} {value!r} names no" in _one_line_error(err)
    assert not (tmp_path / "o").exists(), "nothing ran"
    for value in ("", "0"):
        code, _, err = _run(capsys, ["bench", "--preset", preset, "--list", "--seeds", value])
        assert code == 2 and "--seeds must be" in err and "Traceback" not in err


def _run_limited(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """``tpo-gym argv`` in a process allowed 1.5 GiB of data (a run count that grows memory fails fast)."""
    import resource
    import subprocess
    import sys

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (1536 << 20, 1536 << 20))

    done = subprocess.run([sys.executable, "-m", "tpo_gym.evaluation.cli", *argv], capture_output=True, text=True,
                          timeout=120, preexec_fn=limit_memory, cwd=cwd)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("argv", [["bench", "--preset", "quick", "--seeds", "1000000000000", "--list"],
                                  ["bench", "--preset", "quick", "--seeds", "1000000000000", "--out", "OUT"]])
def test_a_seed_count_too_large_for_memory_is_refused_at_once(tmp_path: Path, argv: list[str]) -> None:
    """Refused before any run spec is made: in a process allowed 1.5 GiB of data, within seconds."""
    code, stdout, err = _run_limited([str(tmp_path / "o") if a == "OUT" else a for a in argv], tmp_path)
    line = _one_line_error(err)
    assert code == 2 and not stdout
    assert "--seeds 1000000000000:" in line and "at most 100000 runs are allowed" in line
    assert not (tmp_path / "o").exists()


def test_report_seeds_beyond_the_run_limit_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "o"
    _bench(capsys, write_preset(tmp_path, PIECES), out, "--settings", "a", "--methods", "DG", "--seeds", "1")
    before = _files(out)
    code, _, err = _run_limited(["report", str(out), "--seeds", "1000000000000"], tmp_path)
    assert code == 2 and "--seeds 1000000000000:" in _one_line_error(err) and _files(out) == before


def test_llm_estimate_counts_the_fixed_per_run_cost_and_agrees_with_the_docs() -> None:
    """llm-smoke's two runs measured 58 s and 71 s; the estimate must not fall back to the step work alone."""
    est = K.estimate_preset(load_preset("llm-smoke"))
    per_run = est.compute_s / est.runs
    assert per_run >= K.LLM_RUN_OVERHEAD_S
    assert 30 <= per_run <= 150, per_run
    root = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/language-models.md"):
        text = " ".join((root / doc).read_text().split())
        assert "llm-smoke` (about 2 minutes of CPU time, a minute on 2 workers)" in text, doc
    assert K.format_seconds(est.compute_s) == "2 min"
