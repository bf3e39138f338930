"""The Ray backend: a real local Ray cluster (ray is a dev dependency of this test), and the error without Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests.evaluation.conftest import write_preset
from tpo_gym.evaluation import cli


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
