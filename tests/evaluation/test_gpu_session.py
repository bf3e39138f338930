"""The prepared GPU command (benchmarks/gpu_session.sh) run dry on the CPU: queue, packing, unpacking, report."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from tpo_gym.evaluation import cli

ROOT = Path(__file__).resolve().parents[2]
TINY = {"d_model": 8, "d_ff": 16, "n_layers": 1}
#: A tiny preset: a bandit (one run per seed) and a token task (seed-batched).
PRESET = {
    "name": "dry-run",
    "description": "test-only preset: a tiny bandit and a tiny token task",
    "paper_ref": "none (tests)",
    "seeds": 2,
    "settings": [
        {"name": "bandit", "kind": "tabular_single",
         "params": {"n_arms": 10, "batch_size": 20, "steps": 20, "step_size": 0.5}},
        {"name": "H=3", "kind": "token", "methods": ["TPO"],
         "params": {"env_id": "tpo_gym/TokenTask-v0", "env_kwargs": {"target": "reverse_copy", "vocab_size": 2,
                                                                      "length": 3},
                    "episodes": 2, "agent_kwargs": {"batch_size": 4, "group_size": 2, "policy_kwargs": TINY}}},
    ],
    "methods": [{"name": "TPO", "algo": "TPO"}, {"name": "DG", "algo": "DG"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"}],
    "curves": ["error"],
}


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def gq() -> ModuleType:
    return _module("gpu_queue")


def _session(tmp: Path, queue: str, seconds: int = 300) -> subprocess.CompletedProcess:
    (tmp / "queue.txt").write_text(queue)
    env = {**os.environ, "OUT": str(tmp / "out"), "GPU_DEVICE": "cpu", "GPU_STEPS": "queue",
           "GPU_QUEUE": str(tmp / "queue.txt"), "GPU_RESULTS": str(tmp / "results"), "GPU_WORK": str(tmp / "work"),
           "GPU_MARGIN": "5", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), str(seconds)], env=env,
                          capture_output=True, text=True, timeout=600)


def _members(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return sorted(tar.getnames())


def test_dry_run_packs_only_new_records_and_the_archive_unpacks_into_a_report(tmp_path: Path, gq: ModuleType) -> None:
    preset = tmp_path / "dry-run.json"
    preset.write_text(json.dumps(PRESET))
    committed = tmp_path / "results" / "dry-run"
    assert cli.main(["bench", "--preset", str(preset), "--seeds", "1", "--out", str(committed), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in (committed / "runs").glob("*.json")}
    assert sorted(before) == ["H=3__TPO__seed0.json", "bandit__DG__seed0.json", "bandit__TPO__seed0.json"]

    done = _session(tmp_path, f"# the dry run's queue\n{preset} --seeds 2 --seed-batch 2 --workers 1\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 runs (3 executed, 3 resumed, 0 failed)" in done.stdout, "the committed runs are skipped"
    summary = (tmp_path / "out" / "queue.txt").read_text()
    assert "finished in" in summary and "3 new record(s) (0 failed)" in summary, summary
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu.txt", "queue.txt", "runs-1.tar.gz",
                                                                    "session.log"]
    archive = tmp_path / "out" / "runs-1.tar.gz"
    assert _members(archive) == ["dry-run/manifest.json", "dry-run/runs/H=3__TPO__seed1.json",
                                 "dry-run/runs/bandit__DG__seed1.json", "dry-run/runs/bandit__TPO__seed1.json"]
    work = tmp_path / "work" / "dry-run" / "runs"
    assert {p.name: p.read_bytes() for p in work.glob("*seed0.json")} == before, "committed runs: skipped, not rerun"

    lines = gq.unpack([archive], tmp_path / "results")
    assert lines[0].startswith("3 record(s) ->"), lines
    runs = {p.name: p.read_bytes() for p in (committed / "runs").glob("*.json")}
    assert len(runs) == 6 and all(runs[name] == data for name, data in before.items())
    manifest = json.loads((committed / "manifest.json").read_text())
    assert [i.get("device") for i in manifest["invocations"]] == [None, "cpu"], "the GPU invocation is added"
    assert cli.main(["report", str(committed), "--seeds", "2"]) == 0
    report = (committed / "report.md").read_text()
    assert "seeds | 2 (0..1)" in report and "not run yet" not in report


def test_a_chunk_stopped_at_its_deadline_leaves_no_record_and_the_next_is_not_started(tmp_path: Path,
                                                                                      gq: ModuleType) -> None:
    slow = json.loads(json.dumps(PRESET))
    slow["settings"] = slow["settings"][1:]
    slow["settings"][0]["params"]["episodes"] = 100_000
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(slow))
    chunks = gq.parse_queue(f"{path} --seeds 1\n{path} --seeds 2\n")
    lines = gq.run_queue(chunks, seconds=12, device="cpu", work=tmp_path / "work", out=tmp_path / "out",
                         results=tmp_path / "results", margin=2, min_chunk=5)
    assert any(line.startswith("stopped at the deadline") for line in lines), lines
    assert any(line.startswith("not started") for line in lines), lines
    assert list((tmp_path / "work" / "dry-run" / "runs").iterdir()) == [], "no record, no temporary file"
    assert not list((tmp_path / "out").glob("*.tar.gz"))


def test_queue_lines_are_checked_and_the_packaged_queue_loads(gq: ModuleType, tmp_path: Path) -> None:
    chunks = gq.parse_queue(gq.QUEUE)
    assert [c.name for c in chunks] == ["table1", "table1", "table3", "table2", "eta", "ablations",
                                        "sparse-diagnostics"]
    assert all("--seed-batch" in c.args for c in chunks)
    with pytest.raises(ValueError, match="queue line 2: --device is set by the queue"):
        gq.parse_queue("table1 --seeds 2\ntable1 --device cpu\n")
    with pytest.raises(ValueError, match="queue line 1: unknown preset 'tabel1'"):
        gq.parse_queue("tabel1 --seeds 2\n")
    with pytest.raises(ValueError, match="the queue has no chunk"):
        gq.parse_queue("# nothing\n")
    spaced = tmp_path / "spaced.json"
    spaced.write_text(json.dumps(dict(PRESET, name="dry run")))
    with pytest.raises(ValueError, match="queue line 1: preset name 'dry run' names a folder"):
        gq.parse_queue(f"{spaced} --seeds 1\n")


def test_pack_splits_archives_under_the_limit_and_unpack_restores_every_ok_record(tmp_path: Path,
                                                                                 gq: ModuleType) -> None:
    records = {}
    for i in range(12):
        rec = {"run_id": f"r{i}", "status": "ok", "rows": [{"step": s, "error": (i * s % 97) / 97} for s in range(300)]}
        records[f"r{i}.json"] = json.dumps(rec).encode()
    failed = {"run_id": "bad", "status": "failed", "rows": [], "traceback": "Traceback\nRuntimeError: CUDA oops"}
    records["bad.json"] = json.dumps(failed).encode()
    manifest = json.dumps({"preset": {}, "seeds": 1, "invocations": [{"started": "t0"}], "device": "cuda"}).encode()
    limit = 3 * max(len(gq.zlib.compress(data, 6)) for data in records.values())
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "runs-9.tar.gz").write_bytes(b"an earlier run's")
    paths = gq.pack({"p": records}, {"p": manifest}, tmp_path / "out", limit=limit)
    assert len(paths) > 2 and all(p.stat().st_size <= limit for p in paths)
    assert sorted((tmp_path / "out").glob("*.tar.gz")) == sorted(paths), "an earlier run's archive is removed"
    assert sorted(m for p in paths for m in _members(p) if "/runs/" in m) == sorted(f"p/runs/{f}" for f in records)
    lines = gq.unpack(paths, tmp_path / "results")
    assert sorted(p.name for p in (tmp_path / "results" / "p" / "runs").iterdir()) == \
        sorted(f for f in records if f != "bad.json"), "a failed record stays in the archive"
    assert any("not unpacked, failed: p/runs/bad.json: RuntimeError: CUDA oops" in line for line in lines)
    assert json.loads((tmp_path / "results" / "p" / "manifest.json").read_text())["device"] == "cuda"
    with pytest.raises(ValueError, match="alone compresses to"):
        gq.pack({"p": records}, {}, tmp_path / "small", limit=100)


@pytest.mark.parametrize("name", ["../escape.json", "p/runs/../../x.json", "p/other.json", "/abs/runs/x.json"])
def test_unpack_refuses_a_member_outside_preset_runs(tmp_path: Path, gq: ModuleType, name: str) -> None:
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(ValueError, match="unexpected member"):
        gq.unpack([archive], tmp_path / "results")
    assert not (tmp_path / "results").exists() and not (tmp_path / "escape.json").exists()


def test_unpack_refuses_a_record_of_another_run(tmp_path: Path, gq: ModuleType) -> None:
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = json.dumps({"run_id": "other", "status": "ok"}).encode()
        info = tarfile.TarInfo("p/runs/mine.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="p/runs/mine.json is not a run record of that run"):
        gq.unpack([archive], tmp_path / "results")


def test_device_checks_pass_on_the_cpu_and_catch_a_different_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    checks = _module("gpu_checks")
    token = checks.FAMILIES["token: TPO_token"]
    monkeypatch.setattr(checks, "FAMILIES", {"token: TPO_token": token})
    rows = checks.run_checks("cpu")
    assert [r["path"] for r in rows] == ["alone, host rollouts", "SeedBatch loop, host rollouts",
                                         "SeedBatch stacked, host rollouts",
                                         "SeedBatch stacked, on-device rollouts vs alone on-device"]
    assert all(r["ok"] for r in rows), rows

    built = []

    def third_one_differs(seed: int, device: str, on_device: bool):  # the CPU agent, its start, then the candidate
        agent = token(seed, device, on_device)
        built.append(agent)
        if len(built) == 3:
            with torch.no_grad():
                for p in agent.policy.parameters():
                    p.mul_(1.01)
        return agent

    monkeypatch.setattr(checks, "FAMILIES", {"token: TPO_token": third_one_differs})
    monkeypatch.setattr(checks, "BATCHED", ())
    rows = checks.run_checks("cpu")
    assert len(rows) == 1 and not rows[0]["ok"] and rows[0]["loss"] > checks.TOLERANCE["loss"], rows


def test_compressed_committed_records_are_seeded_and_unpacked_compressed(tmp_path: Path, gq: ModuleType) -> None:
    """Committed records are ``.json.gz`` (``tpo-gym bench --compress``): a window copies them into its work
    folder (so its bench skips them) and ``unpack`` stores the new ones compressed too, as the results
    folder's manifest says, with no plain copy beside them."""
    import gzip

    results = tmp_path / "results" / "p"
    (results / "runs").mkdir(parents=True)
    (results / "manifest.json").write_text(json.dumps({"compress_records": True, "invocations": []}))
    old = {"run_id": "r0", "status": "ok", "rows": [{"step": 0, "error": 1.0}]}
    (results / "runs" / "r0.json.gz").write_bytes(gzip.compress(json.dumps(old).encode(), mtime=0))
    committed = gq.seed_committed(tmp_path / "results", tmp_path / "work", "p")
    assert sorted(committed) == ["r0.json.gz"] and (tmp_path / "work" / "p" / "runs" / "r0.json.gz").is_file()
    new = {"run_id": "r1", "status": "ok", "rows": [{"step": 0, "error": 0.5}]}
    (tmp_path / "work" / "p" / "runs" / "r1.json").write_text(json.dumps(new))
    records = gq.new_records(tmp_path / "work", "p", committed)
    assert sorted(records) == ["r1.json"]
    (tmp_path / "out").mkdir()
    paths = gq.pack({"p": records}, {}, tmp_path / "out")
    gq.unpack(paths, tmp_path / "results")
    assert sorted(p.name for p in (results / "runs").iterdir()) == ["r0.json.gz", "r1.json.gz"]
    assert json.loads(gzip.decompress((results / "runs" / "r1.json.gz").read_bytes())) == new


def test_device_distribution_check_runs_whole_runs_on_both_sides_and_tests_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU against CPU (alone vs a SeedBatch): the same distribution, a test row per outcome with its power."""
    checks = _module("gpu_checks")
    monkeypatch.setattr(checks, "DISTRIBUTION", {**checks.DISTRIBUTION, "methods": ("TPO",)})
    rows = checks.distribution_checks("cpu", 3)
    assert [r["path"] for r in rows] == ["steps to 1%", "final error"]
    assert all(r["ok"] for r in rows), rows
    assert all("power" in r["test"] and "p = " in r["test"] for r in rows)


def test_per_seed_outcomes_read_steps_to_one_percent_and_final_error() -> None:
    checks = _module("gpu_checks")
    records = [{"status": "ok", "spec": {"seed": 0}, "rows": [{"error": e} for e in (0.5, 0.005, 0.002)]},
               {"status": "ok", "spec": {"seed": 1}, "rows": [{"error": e} for e in (0.5, 0.2, 0.1)]}]
    assert checks.per_seed_outcomes(records) == {"steps to 1%": [1.0, float("inf")], "final error": [0.002, 0.1]}
    with pytest.raises(RuntimeError, match=r"seeds \[1\] failed"):
        checks.per_seed_outcomes([records[0], {**records[1], "status": "failed", "traceback": "boom"}])
