"""Bring your own algorithm: a class outside tpo_gym reaches the plain ``tpo-gym`` command, its worker processes
and its reports, by an installed package's entry point, by ``module:Class`` or by ``$TPO_GYM_ALGORITHMS``.

The plugin is ``examples/rloo_plugin`` (``tpo_rloo.RLOO``: REINFORCE with a leave-one-out baseline). The
tests put its module, and for the entry-point route a generated ``.dist-info`` (what ``pip install`` would
write), in a temporary directory on ``PYTHONPATH``; nothing is installed.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tpo_gym.agents.common.registry import (
    ENV_VAR,
    AlgorithmReferenceError,
    algorithm_class,
    algorithm_registry,
    resolve_algorithm,
    unregister_algorithm,
)
from tpo_gym.evaluation import cli

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "rloo_plugin"
#: What the entry point of the plugin's pyproject.toml becomes once installed.
PROVENANCE = {"name": "RLOO", "path": "tpo_rloo:RLOO", "distribution": "tpo-rloo", "version": "0.1.0"}
SMALL = {"batch_size": 6, "group_size": 3, "n_epochs": 1, "policy_kwargs": {"d_model": 8, "d_ff": 16, "n_layers": 1}}


def tiny_table1(directory: Path, algo: str = "RLOO") -> Path:
    """The packaged table1 preset with a method row ``RLOO`` (``algo``) added and a tiny budget: setting V=2
    only, 3 episodes of length-3 sequences, B=6, K=3, a one-layer model."""
    data = json.loads((ROOT / "tpo_gym/evaluation/preset_files/table1.json").read_text())
    setting = data["settings"][0]
    assert setting["name"] == "V=2"
    setting["params"]["episodes"] = 3
    setting["params"]["env_kwargs"]["length"] = 3
    setting["params"]["agent_kwargs"] = copy.deepcopy(SMALL)
    data.update(name="my-table1", settings=[setting], paper_claims=[], tables=[])
    data["methods"].append({"name": "RLOO", "algo": algo, "kwargs": {"level": "token"}})
    data["paper"] = {mid: {m: {s: v for s, v in cols.items() if s == "V=2"} for m, cols in rows.items()}
                     for mid, rows in data["paper"].items()}
    path = directory / "my-table1.json"
    path.write_text(json.dumps(data))
    return path


def plugin_dir(directory: Path, entry_point: bool) -> Path:
    """A directory holding the plugin's module and, with ``entry_point``, the ``.dist-info`` an install writes."""
    site = directory / "site"
    site.mkdir()
    shutil.copy(PLUGIN / "tpo_rloo.py", site / "tpo_rloo.py")
    if entry_point:
        info = site / "tpo_rloo-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tpo-rloo\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text("[tpo_gym.algorithms]\nRLOO = tpo_rloo:RLOO\n")
        (info / "top_level.txt").write_text("tpo_rloo\n")
    return site


def tpo_gym_command(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The ``tpo-gym`` console script in a fresh process, with ``env`` added to an environment without
    ``$TPO_GYM_ALGORITHMS`` (a new shell's)."""
    script = Path(sys.executable).with_name("tpo-gym")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "tpo_gym.evaluation.cli"]
    base = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "PYTHONPATH")}
    return subprocess.run(command + argv, cwd=cwd, env={**base, "OMP_NUM_THREADS": "1", **env},
                          capture_output=True, text=True, timeout=300)


def _records(out: Path) -> dict[str, dict[str, Any]]:
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*seed0.json"))]
    return {r["spec"]["method"]: r for r in records}


# (route, the RLOO row's algo, environment of the bench, the provenance its records store)
ROUTES = [
    ("entry point", "RLOO", {}, PROVENANCE),
    ("TPO_GYM_ALGORITHMS", "RLOO", {ENV_VAR: "tpo_rloo:RLOO"}, dict(PROVENANCE, distribution=None, version=None)),
]


@pytest.mark.parametrize(("route", "algo", "env", "provenance"), ROUTES, ids=[r[0] for r in ROUTES])
def test_the_plain_cli_runs_a_plugin_and_a_new_shell_rebuilds_its_report(
        tmp_path: Path, route: str, algo: str, env: dict[str, str], provenance: dict[str, Any]) -> None:
    site = plugin_dir(tmp_path, entry_point=route == "entry point")
    preset, out = tiny_table1(tmp_path, algo), tmp_path / "out"
    argv = ["bench", "--preset", preset.name, "--settings", "V=2", "--setups", "reference", "--methods",
            "TPO_token,RLOO", "--seeds", "2", "--out", str(out), "--no-progress"]
    ran = tpo_gym_command(argv, tmp_path, PYTHONPATH=str(site), **env)
    assert ran.returncode == 0, ran.stderr
    records = _records(out)
    assert set(records) == {"TPO_token", "RLOO"} and all(r["status"] == "ok" for r in records.values())
    assert records["RLOO"]["algorithm"] == provenance and records["RLOO"]["spec"]["algo"] == algo
    assert records["TPO_token"]["algorithm"]["path"] == "tpo_gym.agents.algorithms.tpo:TPO"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["algorithms"][algo] == provenance
    prefix = "TPO_GYM_ALGORITHMS=tpo_rloo:RLOO " if env else ""
    assert manifest["command"] == prefix + "tpo-gym " + " ".join(argv)  # the report's command row reruns it
    report = (out / "report.md").read_text()
    assert "| RLOO |" in report and "| algorithm `RLOO` | `tpo_rloo:RLOO`" in report
    summary = (out / "summary.csv").read_text()

    rebuilt = tpo_gym_command(["report", str(out)], tmp_path, PYTHONPATH=str(site))  # a new shell: no variable
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (out / "report.md").read_text() == report and (out / "summary.csv").read_text() == summary
    if route == "TPO_GYM_ALGORITHMS":  # without the plugin's directory: one line saying how to make it importable
        lost = tpo_gym_command(["report", str(out)], tmp_path)
        line = lost.stderr.strip()
        assert lost.returncode == 2 and "\n" not in line and "Traceback" not in line
        assert "'RLOO' came from tpo_rloo:RLOO" in line and "pip install" in line and "PYTHONPATH" in line


# ---------------------------------------------------------------------------------------------
# in this process: every command, and the errors
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def plugin_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin's module importable here; afterwards RLOO leaves the registry and the module cache."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    site = plugin_dir(tmp_path, entry_point=False)
    monkeypatch.syspath_prepend(str(site))
    try:
        yield site
    finally:
        if "RLOO" in algorithm_registry():
            unregister_algorithm("RLOO")
        sys.modules.pop("tpo_rloo", None)
        for name in [n for n in sys.modules if n.startswith("not_an_agent_")]:
            sys.modules.pop(name)


def test_a_method_row_may_name_its_class_as_module_colon_class(
        plugin_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert cli.main(["bench", "--preset", str(tiny_table1(tmp_path, "tpo_rloo:RLOO")), "--setups", "reference",
                     "--methods", "RLOO", "--seeds", "1", "--out", str(out), "--no-progress"]) == 0
    record = _records(out)["RLOO"]
    assert record["status"] == "ok" and record["spec"]["algo"] == "tpo_rloo:RLOO"
    assert record["algorithm"] == dict(PROVENANCE, distribution=None, version=None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["command"].startswith(ENV_VAR)  # the reference imports itself
    assert "| algorithm `tpo_rloo:RLOO` | `tpo_rloo:RLOO` (not from an installed distribution) |" in \
        (out / "report.md").read_text()
    capsys.readouterr()


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "usage:" not in err, err
    return err


def test_every_command_finds_a_class_named_in_the_environment(
        plugin_on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV_VAR, "tpo_rloo:RLOO")
    preset = str(tiny_table1(tmp_path))
    assert cli.main(["presets", preset]) == 0
    assert "RLOO (RLOO, level=token)" in capsys.readouterr().out
    assert cli.main(["bench", "--preset", preset, "--methods", "RLOO", "--seeds", "1", "--list",
                     "--out", str(tmp_path / "out")]) == 0
    assert "stored: 0 of 2 runs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("algo", "expected"),
    [
        ("no_such_plugin_module:RLOO", ["algorithm 'no_such_plugin_module:RLOO': cannot import module "
                                        "'no_such_plugin_module'", "pip install", "PYTHONPATH"]),
        ("tpo_rloo:RLOOX", ["module 'tpo_rloo' has no attribute 'RLOOX'"]),
        ("tpo_rloo:leave_one_out_advantages", ["names a function, not a class"]),
        ("tpo_rloo:GroupAdvantageBatch", ["class GroupAdvantageBatch is not an agent class"]),
        ("tpo_rloo:torch.nn", ["names a module, not a class"]),
        ("tpo_rloo.RLOO", ["unknown agent 'tpo_rloo.RLOO'", "module:Class"]),
        ("SAC", ["unknown agent 'SAC'; registered: TPO, GRPO", "TPO_GYM_ALGORITHMS=module:Class"]),
        ("tpo_rloo:RLOO; rm -rf /", ["not a reference of the form package.module:Class"]),
    ],
    ids=["unimportable", "no attribute", "not a class", "not an agent", "a module", "dotted",
         "unknown name", "not a reference"],
)
def test_a_reference_that_names_no_agent_class_is_one_line_naming_it(
        plugin_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], algo: str,
        expected: list[str]) -> None:
    err = _error_line(capsys, ["bench", "--preset", str(tiny_table1(tmp_path, algo)), "--list"])
    assert err.startswith("tpo-gym bench: error: ") and "method 'RLOO'" in err
    for text in expected:
        assert text in err, err


def test_a_module_whose_import_raises_is_named_with_its_error(
        plugin_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (plugin_on_path / "not_an_agent_broken.py").write_text("raise RuntimeError('needs a GPU\\nsecond line')\n")
    err = _error_line(capsys, ["presets", str(tiny_table1(tmp_path, "not_an_agent_broken:RLOO"))])
    assert "importing module 'not_an_agent_broken' raised RuntimeError: needs a GPU" in err


def test_a_bad_entry_of_the_environment_variable_is_named(
        plugin_on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV_VAR, "tpo_rloo_missing:RLOO")
    err = _error_line(capsys, ["bench", "--preset", str(tiny_table1(tmp_path)), "--list"])
    assert "algorithm 'tpo_rloo_missing:RLOO' (in $TPO_GYM_ALGORITHMS): cannot import module" in err


def test_a_reference_is_imported_and_registered_on_demand(plugin_on_path: Path) -> None:
    assert "tpo_rloo" not in sys.modules and "RLOO" not in algorithm_registry()
    cls = resolve_algorithm("tpo_rloo:RLOO")
    assert cls.__module__ == "tpo_rloo" and algorithm_class("RLOO") is cls and resolve_algorithm("RLOO") is cls
    assert "tpo_rloo:RLOO" in os.environ[ENV_VAR].split(",")  # spawned workers find it by name too
    with pytest.raises(AlgorithmReferenceError, match="unknown agent 'tpo_rloo:RLOO'"):  # agent files: names only
        algorithm_class("tpo_rloo:RLOO")


# ---------------------------------------------------------------------------------------------
# RLOO itself
# ---------------------------------------------------------------------------------------------


def test_rloo_advantages_match_a_hand_computed_example(plugin_on_path: Path) -> None:
    from tpo_rloo import leave_one_out_advantages

    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 9.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[True] * 4, [True, True, True, False], [True] * 4])
    # row 0: 1 - (0 + 0 + 1) / 3 = 2/3, 0 - (1 + 0 + 1) / 3 = -2/3; row 1 (3 valid): 3 - (1 + 2) / 2 = 1.5,
    # 1 - (3 + 2) / 2 = -1.5, 2 - (3 + 1) / 2 = 0, the masked 9 ignored; row 2: all equal, all 0
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [1.5, -1.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(leave_one_out_advantages(scores, mask), expected)
    lonely = leave_one_out_advantages(torch.tensor([[4.0, 7.0]]), torch.tensor([[True, False]]))
    assert torch.equal(lonely, torch.zeros(1, 2))  # one valid candidate: no other to compare with


def test_rloo_learns_and_its_gradient_is_the_leave_one_out_reinforce_gradient(plugin_on_path: Path) -> None:
    from tpo_rloo import RLOO

    from tpo_gym.agents.common.update import GroupAdvantageBatch

    agent = RLOO("TransformerPolicy", "tpo_gym/TokenReversal-v0", level="token", seed=0, **SMALL)
    agent.learn(2 * agent.steps_per_iteration)
    assert len(agent.history) == 2 and {"loss", "grad_norm", "zero_variance_fraction"} <= set(agent.history[-1])
    logp = torch.log_softmax(torch.randn(2, 3), -1).requires_grad_(True)
    advantages = torch.tensor([[1.0, -0.5, -0.5], [0.0, 2.0, -2.0]])
    agent.compute_loss(None, GroupAdvantageBatch(u=advantages, mask=None), logp).backward()
    assert torch.allclose(logp.grad, -advantages / 2)
