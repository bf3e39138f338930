"""Issue 9: safe loading, continued learning, progress bars, vector envs, predict checks, the simpler core."""

from __future__ import annotations

import inspect
import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback, ProgressBarCallback
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor, VecNormalize

from tests.agents.conftest import bandit_env, params_of, token_env
from tpo_gym import CE, DG, GRPO, PPO, REINFORCE, TPO, GroupPG
from tpo_gym.agents import GroupAlgorithm
from tpo_gym.agents.persistence import AgentFileError

ALL = [TPO, GRPO, GroupPG, PPO, REINFORCE, DG, CE]


class _Boom:
    """Pickling this object makes unpickling create a marker file: proof that code ran on load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (self.marker,))


def _small_tpo(**kw: Any) -> TPO:
    return TPO("MlpPolicy", bandit_env(), batch_size=8, seed=0, **kw)


def _rewrite_zip(src: Path, dst: Path, replace: dict[str, bytes], drop: tuple[str, ...] = ()) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            if name in drop:
                continue
            zout.writestr(name, replace.get(name, zin.read(name)))
        for name, data in replace.items():
            if name not in zin.namelist():
                zout.writestr(name, data)


# ---------------------------------------------------------------------------------------------
# security: loading executes nothing
# ---------------------------------------------------------------------------------------------
def test_sb3_style_serialized_field_never_runs(tmp_path: Path) -> None:
    """A crafted SB3 zip whose ``data`` holds a cloudpickled payload: load refuses, nothing runs."""
    import base64

    marker = tmp_path / "pwned"
    payload = base64.b64encode(pickle.dumps(_Boom(marker))).decode()
    data = {"policy_class": {":type:": "<class 'x'>", ":serialized:": payload}, "learning_rate": 1e-3}
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("data", json.dumps(data))
        zf.writestr("policy.pth", b"")
        zf.writestr("_stable_baselines3_version", "2.9.2")
    for cls in (TPO, GroupAlgorithm):
        with pytest.raises(ValueError, match="Stable-Baselines3"):
            cls.load(path)
    assert not marker.exists()


def test_serialized_field_inside_tpo_gym_file_is_refused(tmp_path: Path) -> None:
    model = _small_tpo()
    model.save(tmp_path / "m.zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as zf:
        meta = json.loads(zf.read("tpo_gym.json"))
    meta["kwargs"]["policy_kwargs"] = {"net_arch": {":serialized:": "gASV..."}}
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "bad.zip", {"tpo_gym.json": json.dumps(meta).encode()})
    with pytest.raises(AgentFileError, match=r"serialized \(pickled\) field ':serialized:'"):
        TPO.load(tmp_path / "bad.zip")
    meta["kwargs"]["policy_kwargs"] = {"activation_fn": {"__class__": "os:system"}}
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "bad2.zip", {"tpo_gym.json": json.dumps(meta).encode()})
    with pytest.raises(AgentFileError, match="outside torch.nn, torch.optim and tpo_gym"):
        TPO.load(tmp_path / "bad2.zip")
    meta["surprise"] = 1
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "bad3.zip", {"tpo_gym.json": json.dumps(meta).encode()})
    with pytest.raises(AgentFileError, match="unexpected fields"):
        TPO.load(tmp_path / "bad3.zip")


def test_pickled_weights_are_refused_without_running(tmp_path: Path) -> None:
    model = _small_tpo()
    model.save(tmp_path / "m.zip")
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"policy": _Boom(marker)}, buffer)
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "bad.zip", {"weights.pt": buffer.getvalue()})
    with pytest.raises(AgentFileError, match="weights.pt.*plain tensors"):
        TPO.load(tmp_path / "bad.zip")
    assert not marker.exists()


def test_files_of_other_classes_are_refused(tmp_path: Path) -> None:
    import stable_baselines3

    sb3 = stable_baselines3.PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16)
    sb3.save(tmp_path / "sb3.zip")
    with pytest.raises(AgentFileError, match="written by Stable-Baselines3"):
        TPO.load(tmp_path / "sb3.zip")
    _small_tpo().save(tmp_path / "tpo.zip")
    with pytest.raises(AgentFileError, match=r"holds a TPO agent, not GRPO: use TPO.load"):
        GRPO.load(tmp_path / "tpo.zip")
    generic = GroupAlgorithm.load(tmp_path / "tpo.zip")
    assert type(generic) is TPO


def test_truncated_and_corrupt_files_say_what_is_wrong(tmp_path: Path) -> None:
    model = _small_tpo()
    model.save(tmp_path / "m.zip")
    raw = (tmp_path / "m.zip").read_bytes()
    (tmp_path / "trunc.zip").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(AgentFileError, match="not a zip archive"):
        TPO.load(tmp_path / "trunc.zip")
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "json.zip", {"tpo_gym.json": b"{not json"})
    with pytest.raises(AgentFileError, match="'tpo_gym.json' is not valid JSON"):
        TPO.load(tmp_path / "json.zip")
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "noweights.zip", {}, drop=("weights.pt",))
    with pytest.raises(AgentFileError, match="no 'weights.pt' entry"):
        TPO.load(tmp_path / "noweights.zip")
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "badweights.zip", {"weights.pt": b"garbage"})
    with pytest.raises(AgentFileError, match="'weights.pt' cannot be read"):
        TPO.load(tmp_path / "badweights.zip")
    other = TPO("MlpPolicy", bandit_env(), batch_size=8, seed=0, policy_kwargs={"net_arch": [7]})
    other.save(tmp_path / "other.zip")
    with zipfile.ZipFile(tmp_path / "other.zip") as zf:
        weights = zf.read("weights.pt")
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "mismatch.zip", {"weights.pt": weights})
    with pytest.raises(AgentFileError, match="weights in the file do not fit the policy"):
        TPO.load(tmp_path / "mismatch.zip")
    with pytest.raises(FileNotFoundError):
        TPO.load(tmp_path / "missing.zip")


@pytest.mark.parametrize("cls", ALL)
def test_every_agent_round_trips_its_settings(cls: type, tmp_path: Path) -> None:
    env = "tpo_gym/Bandit-v0"
    model = cls("MlpPolicy", env, batch_size=8, seed=3, n_epochs=2)
    model.learn(2 * model.steps_per_iteration)
    model.save(tmp_path / "m")  # SB3 adds .zip
    loaded = cls.load(tmp_path / "m.zip", env=env)  # an id works as env
    assert loaded._settings() == model._settings()
    assert json.dumps(loaded.history, sort_keys=True) == json.dumps(model.history, sort_keys=True)  # NaN-aware
    assert loaded.num_timesteps == model.num_timesteps
    for k, v in params_of(model).items():
        torch.testing.assert_close(params_of(loaded)[k], v, rtol=0, atol=0)
    loaded.learn(loaded.steps_per_iteration, reset_num_timesteps=False)


def test_schedules_and_custom_objects(tmp_path: Path) -> None:
    model = _small_tpo(learning_rate=LinearSchedule(1e-3, 1e-4, 0.5))
    model.save(tmp_path / "m.zip")
    loaded = TPO.load(tmp_path / "m.zip")
    assert loaded.lr_schedule(1.0) == pytest.approx(1e-3) and loaded.lr_schedule(0.0) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="cannot save learning_rate"):
        _small_tpo(learning_rate=lambda p: 1e-3 * p).save(tmp_path / "lambda.zip")
    again = TPO.load(tmp_path / "m.zip", custom_objects={"learning_rate": 5e-3}, eta=0.5)
    assert again.lr_schedule(1.0) == pytest.approx(5e-3) and again.eta == 0.5


# ---------------------------------------------------------------------------------------------
# learn
# ---------------------------------------------------------------------------------------------
class _Prompts(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[np.ndarray] = []

    def _on_step(self) -> bool:
        self.prompts.append(self.model.rollout_batch.obs[:, 0].cpu().numpy().copy())
        return True


def test_learn_again_continues_with_fresh_rollouts() -> None:
    model = TPO("TransformerPolicy", token_env(length=6), batch_size=16, seed=0)
    first, second = _Prompts(), _Prompts()
    model.learn(2 * model.steps_per_iteration, callback=first)
    model.learn(2 * model.steps_per_iteration, callback=second)  # reset_num_timesteps=True (default)
    assert len(model.history) == 2 and model.num_timesteps == 2 * model.steps_per_iteration
    for a in first.prompts:
        for b in second.prompts:
            assert not np.array_equal(a, b)
    fresh = TPO("TransformerPolicy", token_env(length=6), batch_size=16, seed=0)
    replay = _Prompts()
    fresh.learn(2 * fresh.steps_per_iteration, callback=replay)
    np.testing.assert_array_equal(replay.prompts[0], first.prompts[0])  # same seed, same stream


def test_progress_bar_reaches_100_percent(monkeypatch: pytest.MonkeyPatch) -> None:
    bar = ProgressBarCallback()
    model = _small_tpo()
    total = 5 * model.steps_per_iteration
    model.learn(total, callback=bar)
    assert bar.pbar.n == bar.pbar.total == total
    seen: list[tuple[int, int]] = []
    from tpo_gym.agents import base

    original = base._IterationProgressBar._on_training_end

    def record(self: Any) -> None:
        seen.append((self.pbar.n, self.pbar.total))
        original(self)

    monkeypatch.setattr(base._IterationProgressBar, "_on_training_end", record)
    model.learn(3 * model.steps_per_iteration, progress_bar=True, reset_num_timesteps=False)
    assert seen == [(3 * model.steps_per_iteration, 3 * model.steps_per_iteration)]


def test_total_timesteps_may_be_an_integral_float() -> None:
    model = _small_tpo()
    model.learn(float(2 * model.steps_per_iteration))
    assert len(model.history) == 2
    with pytest.raises(ValueError, match=r"total_timesteps must be an integer >= 0, got 1.5"):
        model.learn(1.5)


# ---------------------------------------------------------------------------------------------
# envs: vector envs, wrappers and the one decision about the group API
# ---------------------------------------------------------------------------------------------
def test_gymnasium_vector_env_and_sb3_vec_envs_are_used() -> None:
    venv = gym.make_vec("tpo_gym/Bandit-v0", 4, vectorization_mode="vector_entry_point", n_arms=10, correct_arm=3)
    model = TPO("MlpPolicy", venv, batch_size=8, seed=0)
    assert model.level == "token" and model.action_space == gym.spaces.Discrete(10)
    model.learn(model.steps_per_iteration)
    dummy = DummyVecEnv([bandit_env, bandit_env])
    assert TPO("MlpPolicy", dummy, batch_size=8, seed=0).learn(8).get_env() is dummy
    sub = SubprocVecEnv([bandit_env, bandit_env])
    try:
        model = GRPO("MlpPolicy", VecMonitor(sub), batch_size=8, seed=0)
        assert model.level == "token"
        model.learn(model.steps_per_iteration)
    finally:
        sub.close()
    with pytest.raises(ValueError, match=r"does not support the VecEnv wrapper VecNormalize.*Supported: an env id"):
        TPO("MlpPolicy", VecNormalize(DummyVecEnv([bandit_env])))
    bare = gym.vector.SyncVectorEnv([bandit_env])
    bare.spec = None
    with pytest.raises(ValueError, match="VectorEnv without a spec"):
        TPO("MlpPolicy", bare)


def test_wrapped_token_task_is_one_decision() -> None:
    wrapped = gym.wrappers.TransformReward(token_env(length=3), lambda r: r)
    auto = TPO("TransformerPolicy", wrapped, batch_size=4, group_size=2, seed=0)
    assert auto.level == "sequence" and auto.grouping.kind == "rollouts"
    auto.learn(auto.steps_per_iteration)
    with pytest.raises(ValueError, match=r"level='token' needs .*wrapped \(TransformReward\).*level='sequence'"):
        TPO("TransformerPolicy", wrapped, level="token")
    with pytest.raises(ValueError, match=r"CE \(the supervised oracle\) needs .*wrapped"):
        CE("TransformerPolicy", wrapped)
    plain = TPO("TransformerPolicy", token_env(length=3), batch_size=4, seed=0)
    assert plain.level == "token" and plain.grouping.kind == "candidates"


def test_no_monitor_wrapper() -> None:
    from stable_baselines3.common.monitor import Monitor

    model = _small_tpo()
    assert not isinstance(model.get_env().envs[0], Monitor)


# ---------------------------------------------------------------------------------------------
# predict
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# the simpler core: keyword forwarding, one doc mechanism, fixed arguments
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ALL)
def test_signature_and_docs_cover_every_argument(cls: type) -> None:
    params = inspect.signature(cls).parameters
    doc = cls.__doc__ or ""
    for name in params:
        if name in ("policy", "env", "_init_setup_model") and cls is not GroupAlgorithm:
            continue
        assert f":param {name}:" in doc, f"{cls.__name__} does not document {name}"
    assert "learning_rate" in params and "seed" in params
    with pytest.raises(TypeError):
        cls("MlpPolicy", bandit_env(), 1e-3)  # arguments after env are keyword-only


def test_methods_reject_arguments_they_fix() -> None:
    with pytest.raises(ValueError, match="CE takes no group_size argument"):
        CE("MlpPolicy", bandit_env(), group_size=4)
    with pytest.raises(ValueError, match="PPO takes no level argument"):
        PPO("MlpPolicy", bandit_env(), level="sequence")
    assert "level" not in inspect.signature(DG).parameters
    assert inspect.signature(DG).parameters["n_epochs"].default == 1
    assert inspect.signature(PPO).parameters["n_epochs"].default == 4


def test_scalar_checks_report_the_right_bound() -> None:
    with pytest.raises(ValueError, match=r"clip_range must be a finite number >= 0, got -0.1"):
        PPO("MlpPolicy", bandit_env(), clip_range=-0.1)
    GRPO("MlpPolicy", bandit_env(), beta=0.0, clip_range=0.0)
    with pytest.raises(ValueError, match=r"anchor must be True or False, got 'no'"):
        TPO("MlpPolicy", bandit_env(), anchor="no")
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got 2.0"):
        TPO("MlpPolicy", bandit_env(), batch_size=2.0)


@pytest.mark.parametrize("make", [lambda: _small_tpo(), lambda: TPO("TransformerPolicy", token_env(), seed=0)])
def test_policy_save_load_is_safe(make: Any, tmp_path: Path) -> None:
    model = make()
    model.policy.save(str(tmp_path / "policy.pt"))
    loaded = type(model.policy).load(str(tmp_path / "policy.pt"))
    for k, v in model.policy.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0)
    marker = tmp_path / "pwned"
    torch.save({"state_dict": {}, "data": _Boom(marker)}, tmp_path / "evil.pt")
    with pytest.raises(AgentFileError, match="not a tpo-gym policy file"):
        type(model.policy).load(str(tmp_path / "evil.pt"))
    assert not marker.exists()
