"""tpo_gym.agents.policies: predict checks observations against the space; policy files save and load
safely."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.agents.conftest import Boom, bandit_env, small_tpo, token_env
from tpo_gym import TPO
from tpo_gym.agents.persistence import AgentFileError


@pytest.mark.parametrize("policy,env", [
    ("MlpPolicy", "bandit"), ("MlpPolicy", "token"), ("TransformerPolicy", "token"), ("MlpPolicy", "mnist")])
def test_predict_on_an_empty_batch_returns_no_actions(policy: str, env: str) -> None:
    made = {"bandit": bandit_env, "token": token_env, "mnist": lambda: gym.make("tpo_gym/MNISTBandit-v0")}[env]()
    model = TPO(policy, made, batch_size=4, seed=0)
    shape = made.observation_space.shape
    one, _ = model.predict(np.stack([made.observation_space.sample()]))
    for empty in (np.zeros((0, *shape), dtype=made.observation_space.dtype), np.zeros((0, *shape)), []):
        actions, state = model.predict(empty, deterministic=True)
        assert state is None and actions.shape == (0,) and actions.dtype == one.dtype


def test_predict_rejects_observations_outside_the_space() -> None:
    model = TPO("TransformerPolicy", token_env(length=3), batch_size=4, seed=0)
    obs, _ = token_env(length=3).reset(seed=0)
    model.predict(obs)
    bad = obs.copy()
    bad[0] = 3  # V = 2: tokens 0, 1 and padding 2
    with pytest.raises(ValueError, match=r"observation value 3 at index \(0, 0\) is outside"):
        model.predict(bad)
    with pytest.raises(ValueError, match="integer dtype"):
        model.predict(obs.astype(np.float64))
    with pytest.raises(ValueError, match="shape"):
        model.predict(obs[:-1])
    mlp = TPO("MlpPolicy", gym.make("tpo_gym/MNISTBandit-v0"), candidates="single", seed=0)
    image = np.zeros((2, 784), dtype=np.float32)
    mlp.predict(image)
    image[1, 5] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mlp.predict(image)
    image[1, 5] = 2.0
    with pytest.raises(ValueError, match="outside the bounds"):
        mlp.predict(image)


@pytest.mark.parametrize("make", [lambda: small_tpo(), lambda: TPO("TransformerPolicy", token_env(), seed=0)])
def test_policy_save_load_is_safe(make: Any, tmp_path: Path) -> None:
    model = make()
    model.policy.save(str(tmp_path / "policy.pt"))
    loaded = type(model.policy).load(str(tmp_path / "policy.pt"))
    for k, v in model.policy.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0)
    marker = tmp_path / "pwned"
    torch.save({"state_dict": {}, "data": Boom(marker)}, tmp_path / "evil.pt")
    with pytest.raises(AgentFileError, match="not a tpo-gym policy file"):
        type(model.policy).load(str(tmp_path / "evil.pt"))
    assert not marker.exists()


def test_policy_save_replaces_a_link_at_its_path_instead_of_writing_through_it(tmp_path: Path) -> None:
    from tpo_gym.agents.policies import MlpPolicy

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "policy.pt").symlink_to(victim)
    model = small_tpo()
    model.policy.save(str(tmp_path / "policy.pt"))
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "policy.pt").is_symlink()
    loaded = MlpPolicy.load(str(tmp_path / "policy.pt"))
    for k, v in model.policy.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
