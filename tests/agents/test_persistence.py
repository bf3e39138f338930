"""save / load, exact resumption and bit-identical reruns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.agents.conftest import bandit_env, params_of, token_env
from tpo_gym import GRPO, TPO


def _make_tpo(**kw: Any) -> TPO:
    return TPO("TransformerPolicy", token_env(length=3), batch_size=16, seed=5, **kw)


def test_save_load_predict_identical(tmp_path: Path) -> None:
    model = _make_tpo()
    model.learn(3 * model.steps_per_iteration)
    obs = np.stack([token_env(length=3).reset(seed=s)[0] for s in range(20)])
    actions, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "tpo.zip")
    loaded = TPO.load(tmp_path / "tpo.zip")
    again, _ = loaded.predict(obs, deterministic=True)
    np.testing.assert_array_equal(actions, again)
    for k, v in params_of(model).items():
        torch.testing.assert_close(params_of(loaded)[k], v, rtol=0, atol=0)
    assert loaded.history == model.history
    assert loaded.eta == model.eta and loaded.level == "token"


@pytest.mark.parametrize("make", [_make_tpo, lambda: GRPO("MlpPolicy", bandit_env(), batch_size=16, seed=2)])
def test_resume_equals_uninterrupted(tmp_path: Path, make: Any) -> None:
    straight = make()
    n = 3 * straight.steps_per_iteration
    straight.learn(2 * n)

    first = make()
    first.learn(n)
    first.save(tmp_path / "half.zip")
    env = first.get_env()
    resumed = type(first).load(tmp_path / "half.zip", env=env)
    resumed.learn(n, reset_num_timesteps=False)

    assert [h["iteration"] for h in resumed.history] == list(range(6))
    assert resumed.history == straight.history
    assert resumed.num_timesteps == straight.num_timesteps
    for k, v in params_of(straight).items():
        torch.testing.assert_close(params_of(resumed)[k], v, rtol=0, atol=0)


def test_same_seed_bit_identical_curves() -> None:
    runs = []
    for _ in range(2):
        model = _make_tpo()
        model.learn(4 * model.steps_per_iteration)
        runs.append((model.history, params_of(model)))
    assert runs[0][0] == runs[1][0]
    for k in runs[0][1]:
        assert torch.equal(runs[0][1][k], runs[1][1][k])
    other = _make_tpo()
    other.set_random_seed(6)
    other.learn(4 * other.steps_per_iteration)
    assert other.history != runs[0][0]


def test_optimizer_state_is_saved(tmp_path: Path) -> None:
    model = _make_tpo()
    model.learn(model.steps_per_iteration)
    model.save(tmp_path / "m.zip")
    loaded = TPO.load(tmp_path / "m.zip")
    saved = model.policy.optimizer.state_dict()["optimizers"]
    restored = loaded.policy.optimizer.state_dict()["optimizers"]
    assert len(saved) == 2  # Muon + AdamW
    for a, b in zip(saved, restored, strict=True):
        for key in a["state"]:
            for name, value in a["state"][key].items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, b["state"][key][name])
