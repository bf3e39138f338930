"""Stable-Baselines3's PPO (MlpPolicy, unchanged) learns the token task and the MNIST bandit.

Runs the functions of ``benchmarks/bench_sb3_ppo.py`` (about 20 s on 2 idle cores).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sb3_ppo.py"
# SB3's make_vec_env asks for render_mode="rgb_array"; the envs declare it (and "ansi"), so Gymnasium does not
# warn: any warning of make_vec_env, PPO or the envs fails these tests.
NO_WARNING = "error::UserWarning"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sb3_ppo", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.filterwarnings(NO_WARNING)
def test_ppo_learns_token_copy() -> None:
    assert _bench().token_task(timesteps=12_000, seed=0) < 0.05


@pytest.mark.slow
@pytest.mark.filterwarnings(NO_WARNING)
def test_ppo_learns_mnist_bandit() -> None:
    assert _bench().mnist_bandit(timesteps=60_000, seed=0) < 0.15
