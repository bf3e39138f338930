"""tpo_gym.evaluation.runner: seed-batched runs (``tpo-gym bench --seed-batch S``: one record per seed,
as if run alone), worker crashes and interrupts, and the Ray backend."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli
from tpo_gym.evaluation.presets import load_preset
from tpo_gym.evaluation.runner import bench, seed_batches

SMALL = {"policy_kwargs": {"d_model": 16, "d_ff": 32, "n_layers": 1}}
TOKEN_PRESET = {
    "name": "tiny-token",
    "description": "test-only preset: a tiny token task, and a setting whose agents cannot be built",
    "paper_ref": "none (tests)",
    "seeds": 3,
    "settings": [
        {"name": "H=3", "kind": "token",
         "params": {"env_id": "tpo_gym/TokenTask-v0", "env_kwargs": {"target": "reverse_copy", "vocab_size": 2,
                                                                      "length": 3},
                    "episodes": 3, "agent_kwargs": {"batch_size": 8, "group_size": 4, **SMALL}}},
        {"name": "broken", "kind": "token", "methods": ["PPO"],
         "params": {"env_id": "tpo_gym/TokenTask-v0", "env_kwargs": {"length": 3}, "episodes": 2,
                    "agent_kwargs": {"batch_size": 0, **SMALL}}},
    ],
    "methods": [{"name": "TPO_token", "algo": "TPO", "kwargs": {"level": "token"}}, {"name": "PPO", "algo": "PPO"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"}],
    "curves": ["error"],
}


def _records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}


def test_seed_batched_bench_gives_the_records_of_seeds_run_alone(tmp_path: Path) -> None:
    preset = load_preset(str(write_preset(tmp_path, TOKEN_PRESET, "tiny-token.json")))
    alone = bench(preset, tmp_path / "alone", progress=False)
    batched = bench(preset, tmp_path / "batched", seed_batch=3, progress=False)
    assert (alone.total, alone.failed) == (batched.total, batched.failed) == (9, 3)
    a, b = _records(tmp_path / "alone"), _records(tmp_path / "batched")
    assert sorted(a) == sorted(b)
    for run_id, rec in b.items():
        assert rec["status"] == a[run_id]["status"]
        assert rec["rows"] == a[run_id]["rows"], run_id  # CPU: the batch's loop path is bit-identical
        if rec["status"] == "ok":
            assert rec["seed_batch"] == 3 and rec["rows"]
    # the batch that raised records each of its seeds as failed, with the error
    broken = [rec for run_id, rec in b.items() if run_id.startswith("broken")]
    assert len(broken) == 3 and all(r["status"] == "failed" and "batch_size" in r["traceback"] for r in broken)
    # resume: only the failed seeds run again, still batched
    again = bench(preset, tmp_path / "batched", seed_batch=2, progress=False)
    assert (again.skipped, again.executed, again.failed) == (6, 3, 3)
    manifest = json.loads((tmp_path / "batched" / "manifest.json").read_text())
    assert manifest["seed_batch"] == 2


def test_seed_batches_group_only_seeds_of_one_run() -> None:
    preset = load_preset(str(Path(__file__).parents[2] / "tpo_gym/evaluation/preset_files/quick.json"))
    specs = [r.to_dict() for r in preset.runs(5)]
    tasks = seed_batches(specs, 2)
    assert sorted(s["seed"] for t in tasks for s in t) == sorted(s["seed"] for s in specs)
    for task in tasks:
        assert len(task) <= 2
        assert len({(s["setting"], s["method"]) for s in task}) == 1
        if len(task) > 1:
            assert task[0]["kind"] in ("token", "mnist")
    assert any(len(t) == 2 for t in tasks)
    kinds = {s["kind"] for s in specs}
    if kinds - {"token", "mnist"}:  # other kinds run seed by seed
        assert any(len(t) == 1 and t[0]["kind"] not in ("token", "mnist") for t in tasks)
    assert seed_batches(specs, 1) == [[s] for s in specs]


def test_bad_seed_batch_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preset = load_preset(str(write_preset(tmp_path, TOKEN_PRESET, "tiny-token.json")))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="seed_batch must be an int >= 1"):
            bench(preset, tmp_path / "out", seed_batch=bad, progress=False)
    with pytest.raises(SystemExit):
        cli.main(["bench", "--preset", "quick", "--seed-batch", "0", "--out", str(tmp_path / "o")])
    assert "--seed-batch" in capsys.readouterr().err


def test_a_failing_seed_of_a_batch_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch raises (one seed diverged): each seed runs again alone; only the bad one fails, with its own
    traceback, and the others' records are those of seeds run alone."""
    from tpo_gym.evaluation import experiments as X

    def batch(specs: list[dict]) -> list[list[dict]]:
        raise FloatingPointError("loss is NaN in seed 1 of the batch")

    def alone(spec: dict) -> list[dict]:
        if spec["seed"] == 1:
            raise FloatingPointError("loss is NaN (seed 1)")
        return [{"step": 0, "error": 0.5 + spec["seed"]}]

    monkeypatch.setitem(X._SEED_BATCH_FUNCS, "token", batch)
    monkeypatch.setitem(X._KIND_FUNCS, "token", alone)
    specs = [{"kind": "token", "preset": "p", "setting": "s", "method": "m", "seed": s} for s in range(3)]
    records = X.execute_runs(specs)
    assert [r["status"] for r in records] == ["ok", "failed", "ok"]
    assert [r["rows"] for r in records] == [[{"step": 0, "error": 0.5}], [], [{"step": 0, "error": 2.5}]]
    assert "seed 1)" in records[1]["traceback"] and "seed_batch" not in records[0]
    assert all(r["seed_batch_error"] == "FloatingPointError: loss is NaN in seed 1 of the batch" for r in records)


def test_a_dying_worker_costs_only_its_own_run() -> None:
    """A worker process killed mid-run (the out-of-memory killer, say) breaks the pool; only its run fails."""
    from tests.evaluation import _dying_worker
    from tpo_gym.evaluation.runner import _run_local

    tasks = [[{"seed": s}] for s in range(6)]
    records = {r["spec"]["seed"]: r for r in _run_local(tasks, 2, run=_dying_worker.run)}
    assert sorted(records) == list(range(6))
    assert records[0]["status"] == "failed" and "worker process died" in records[0]["traceback"]
    assert "exited with code 137" in records[0]["traceback"], "how it died, not a guess"
    assert all(records[s]["status"] == "ok" for s in range(1, 6))


def test_an_interrupted_bench_stops_its_workers(tmp_path: Path) -> None:
    """When the bench stops reading (Ctrl-C, or SIGTERM in the CLI) the workers stop too, at once."""
    import os
    import time

    from tests.evaluation import _dying_worker
    from tpo_gym.evaluation.runner import _run_local

    pid_file = tmp_path / "pid"
    stream = _run_local([[{"seed": 0}], [{"seed": 1, "pid_file": str(pid_file)}]], 2, run=_dying_worker.slow)
    assert next(stream)["spec"]["seed"] == 0
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the slow run never started"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    start = time.monotonic()
    stream.close()
    assert time.monotonic() - start < 15
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_ray_backend_runs_on_a_local_cluster(tmp_path: Path, tiny_preset_data: dict,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """4 runs on a local 2-CPU Ray (ray is in the ``dev`` extra, so the test suite always has it)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    tiny_preset_data["settings"], tiny_preset_data["paper"] = tiny_preset_data["settings"][:1], {}
    path = write_preset(tmp_path, tiny_preset_data)
    out = tmp_path / "out"
    assert importlib.util.find_spec("ray") is not None, "ray is a dev dependency: pip install -e '.[dev]'"
    rc = cli.main(["bench", "--preset", str(path), "--backend", "ray", "--workers", "2", "--out", str(out),
                   "--no-progress"])
    records = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    assert rc == 0, [r["traceback"] for r in records if r["status"] != "ok"]
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    assert all(r["pid"] != os.getpid() for r in records), "runs must execute in Ray worker processes"
    assert (out / "report.md").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "ray"


def test_missing_ray_gives_the_install_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--preset", "tabular-single", "--backend", "ray", "--out", str(tmp_path / "o")])
    assert info.value.code == 2
    assert "pip install 'tpo-gym[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
