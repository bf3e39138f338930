"""The module paths of tpo_gym.agents before its subpackages still import, as their new modules."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import tpo_gym.agents
from tpo_gym.agents import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_imports_as_its_new_module(old: str) -> None:
    module = importlib.import_module(old)
    new = [importlib.import_module(name) for name in MOVED[old]]
    if len(new) == 1:
        assert module is new[0]  # the same module object: its classes are the same classes
        assert module.__spec__.name == MOVED[old][0]  # and it keeps its own spec
    else:
        for m in new:
            for name in m.__all__:
                assert getattr(module, name) is getattr(m, name), (old, name)
    assert getattr(tpo_gym.agents, old.rpartition(".")[2]) is module


def test_old_paths_cover_every_documented_name() -> None:
    from tpo_gym.agents.base import GroupAlgorithm
    from tpo_gym.agents.persistence import AgentFileError, load_agent, save_agent  # noqa: F401
    from tpo_gym.agents.registry import register_algorithm  # noqa: F401
    from tpo_gym.agents.single import DG, PPO, REINFORCE
    from tpo_gym.agents.tpo import TPO

    assert all(issubclass(c, GroupAlgorithm) for c in (TPO, PPO, REINFORCE, DG))
    assert TPO is tpo_gym.agents.TPO and PPO is tpo_gym.agents.PPO


def test_python_dash_m_runs_an_old_path() -> None:
    out = subprocess.run([sys.executable, "-W", "error", "-m", "tpo_gym.agents.smollm2", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
