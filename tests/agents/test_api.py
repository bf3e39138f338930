"""The SB3 surface: callbacks, logger, predict, errors, history, steps_per_iteration, other envs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CheckpointCallback,
    EvalCallback,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor

from tests.agents.conftest import bandit_env, token_env
from tpo_gym import CE, DG, GRPO, PPO, REINFORCE, TPO, GroupPG
from tpo_gym.agents import MuonAdamW, TransformerPolicy

ALL = [TPO, GRPO, GroupPG, PPO, REINFORCE, DG, CE]


class _Count(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def _on_training_start(self) -> None:
        self.events.append("start")

    def _on_rollout_end(self) -> None:
        self.events.append("rollout_end")

    def _on_step(self) -> bool:
        self.events.append("step")
        return True

    def _on_training_end(self) -> None:
        self.events.append("end")


@pytest.mark.parametrize("cls", ALL)
def test_history_and_steps_per_iteration(cls: type) -> None:
    model = cls("TransformerPolicy", token_env(length=3), batch_size=10, seed=0)
    assert model.steps_per_iteration == model.n_rollouts * 3
    model.learn(4 * model.steps_per_iteration)
    assert [h["iteration"] for h in model.history] == [0, 1, 2, 3]
    assert [h["num_timesteps"] for h in model.history] == [model.steps_per_iteration * (i + 1) for i in range(4)]
    for h in model.history:
        assert {"iteration", "num_timesteps", "error", "loss", "grad_norm"} <= set(h)
        assert 0.0 <= h["error"] <= 1.0
    if cls in (TPO, GRPO, GroupPG):
        assert {"zero_variance_fraction", "all_fail_fraction", "any_success_fraction"} <= set(model.history[0])
    if cls is TPO:
        assert {"mean_q_winners", "mean_q_losers"} <= set(model.history[0])
    if cls is GRPO:
        assert {"mean_abs_adv_winners", "mean_abs_adv_losers"} <= set(model.history[0])


def test_sequence_level_and_interaction_budget_sizes() -> None:
    seq = TPO("TransformerPolicy", token_env(length=3), batch_size=10, group_size=4, level="sequence")
    assert seq.n_rollouts == 40 and seq.steps_per_iteration == 120
    ppo = PPO("TransformerPolicy", token_env(length=3), batch_size=10, group_size=4, budget="interaction",
              learning_rate=1e-3)
    assert ppo.n_rollouts == 40 and ppo.lr_schedule(1.0) == pytest.approx(2e-3)
    grpo = GRPO("TransformerPolicy", token_env(length=3), batch_size=10, group_size=4, budget="interaction")
    assert grpo.n_rollouts == 10 and grpo.lr_schedule(1.0) == pytest.approx(1e-3)


def test_terminal_reward_error_is_exact_match_error() -> None:
    model = TPO("TransformerPolicy", token_env(length=2, reward="terminal"), batch_size=50, level="sequence",
                group_size=4, seed=0)
    batch = model.collect_rollouts()
    assert batch.error == pytest.approx(1.0 - float(batch.returns.mean()))
    assert set(batch.episode_scores.tolist()) <= {0.0, 1.0}


def test_callbacks_fire_and_eval_writes_npz(tmp_path: Path) -> None:
    model = TPO("MlpPolicy", bandit_env(), batch_size=10, seed=0)
    count = _Count()
    eval_cb = EvalCallback(Monitor(bandit_env()), eval_freq=2, n_eval_episodes=3, log_path=str(tmp_path), verbose=0)
    ckpt = CheckpointCallback(save_freq=2, save_path=str(tmp_path / "ckpt"), name_prefix="tpo")
    model.learn(4 * model.steps_per_iteration, callback=[count, eval_cb, ckpt])
    assert count.events[0] == "start" and count.events[-1] == "end"
    assert count.events.count("step") == 4 and count.events.count("rollout_end") == 4
    data = np.load(tmp_path / "evaluations.npz")
    assert data["results"].shape == (2, 3)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["tpo_20_steps.zip", "tpo_40_steps.zip"]
    TPO.load(tmp_path / "ckpt" / "tpo_40_steps.zip")


def test_stop_on_reward_threshold() -> None:
    model = TPO("MlpPolicy", bandit_env(n_arms=4), batch_size=10, learning_rate=1e-2, seed=0)
    stop = StopTrainingOnRewardThreshold(reward_threshold=0.9, verbose=0)
    eval_cb = EvalCallback(Monitor(bandit_env(n_arms=4)), callback_on_new_best=stop, eval_freq=1, n_eval_episodes=5)
    model.learn(500 * model.steps_per_iteration, callback=eval_cb)
    assert 1 <= len(model.history) < 500


def test_logger_csv_metrics(tmp_path: Path) -> None:
    model = GRPO("MlpPolicy", bandit_env(), batch_size=10, seed=0)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(3 * model.steps_per_iteration)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    for key in ("train/loss", "train/grad_norm", "train/zero_variance_fraction", "train/all_fail_fraction",
                "train/any_success_fraction", "rollout/error", "time/fps", "train/learning_rate"):
        assert key in header


def test_tensorboard_log(tmp_path: Path) -> None:
    model = TPO("MlpPolicy", bandit_env(), batch_size=10, seed=0, tensorboard_log=str(tmp_path))
    model.learn(2 * model.steps_per_iteration, tb_log_name="tpo")
    assert any(p.name.startswith("events.out.tfevents") for p in tmp_path.rglob("*"))


def test_predict_single_and_batched() -> None:
    model = TPO("TransformerPolicy", "tpo_gym/TokenReversal-v0", seed=0)
    env = gym.make("tpo_gym/TokenReversal-v0")
    obs, _ = env.reset(seed=0)
    action, state = model.predict(obs, deterministic=True)
    assert state is None and np.shape(action) == () and env.action_space.contains(int(action))
    batch = np.stack([obs, obs, obs])
    actions, _ = model.predict(batch)
    assert actions.shape == (3,)
    assert isinstance(model.policy, TransformerPolicy) and isinstance(model.policy.optimizer, MuonAdamW)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: TPO("MlpPolicy", bandit_env(), group_size=0), r"group_size must be an integer >= 1, got 0"),
        (lambda: TPO("MlpPolicy", bandit_env(), eta=0.0), r"eta must be a finite number > 0, got 0.0"),
        (lambda: TPO("MlpPolicy", bandit_env(), eta=-1), r"eta must be a finite number > 0, got -1"),
        (lambda: DG("MlpPolicy", bandit_env(), eta=float("nan")), r"eta must be a finite number > 0"),
        (lambda: TPO("CnnPolicy", bandit_env()),
         r"unknown policy alias 'CnnPolicy'; allowed: \['CausalLMPolicy', 'MlpPolicy'"),
        (lambda: TPO("MlpPolicy", "MountainCarContinuous-v0"), r"supports only Discrete action spaces, got Box"),
        (lambda: TPO("MlpPolicy", bandit_env(), level="word"), r"level must be one of \['auto', 'token'"),
        (lambda: TPO("MlpPolicy", bandit_env(), budget="x"), r"budget must be one of \['prompt', 'interaction'\]"),
        (lambda: TPO("MlpPolicy", bandit_env(), candidates="all"), r"candidates must be one of"),
        (lambda: TPO("MlpPolicy", bandit_env(), batch_size=0), r"batch_size must be an integer >= 1, got 0"),
        (lambda: GRPO("MlpPolicy", bandit_env(), beta=-0.1), r"beta must be a finite number >= 0, got -0.1"),
        (lambda: TPO("MlpPolicy", "CartPole-v1", level="token"), r"level='token' needs an env with the tpo_gym"),
        (lambda: CE("MlpPolicy", "CartPole-v1"), r"CE \(the supervised oracle\) needs"),
        (lambda: TPO("TransformerPolicy", bandit_env()), r"TransformerPolicy needs a token-task observation space"),
        (lambda: REINFORCE("MlpPolicy", bandit_env(), baseline="mean"), r"baseline must be one of"),
    ],
)
def test_bad_arguments_raise_clear_value_errors(make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_cartpole_sequence_level_groups_improve_return() -> None:
    """TPO on a non-tpo_gym env: K same-seed episodes per context, score = return."""
    model = TPO("MlpPolicy", "CartPole-v1", batch_size=4, group_size=8, learning_rate=3e-3, seed=0)
    assert model.level == "sequence"
    model.learn(25_000)
    returns = [500 * (1 - h["error"]) for h in model.history]
    assert np.mean(returns[-5:]) > 1.5 * np.mean(returns[:5])
    grpo = GRPO("MlpPolicy", "CartPole-v1", batch_size=2, group_size=4, seed=0)
    before = grpo.policy.state_dict()["net.0.weight"].clone()
    grpo.learn(1)
    assert len(grpo.history) == 1 and not np.allclose(before, grpo.policy.state_dict()["net.0.weight"])


def test_mnist_single_candidate_tpo_and_ce_run() -> None:
    env = gym.make("tpo_gym/MNISTBandit-v0")
    tpo = TPO("MlpPolicy", env, candidates="single", seed=0)
    assert tpo.steps_per_iteration == 100
    tpo.learn(30 * tpo.steps_per_iteration)
    errors = [h["error"] for h in tpo.history]
    assert np.mean(errors[-5:]) < np.mean(errors[:5]) - 0.1
    ce = CE("MlpPolicy", env, seed=0)
    ce.learn(30 * ce.steps_per_iteration)
    assert np.mean([h["error"] for h in ce.history][-5:]) < 0.8


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


def test_predict_on_an_empty_list_of_questions_returns_no_completions() -> None:
    from tests.agents.lm_toys import lm_kwargs, say_letter_env

    model = TPO("CausalLMPolicy", say_letter_env(), policy_kwargs=lm_kwargs(), batch_size=2, group_size=2, seed=0)
    texts, state = model.predict([])
    assert state is None and texts.shape == (0,) and texts.dtype == object


@pytest.mark.parametrize("bad", [[1], "net_arch", 3, {1: 2}])
def test_policy_kwargs_that_is_not_a_dict_is_named(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"policy_kwargs must be None or a dict with str keys, got"):
        TPO("MlpPolicy", bandit_env(), policy_kwargs=bad)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_device_without_cuda_is_refused_and_auto_falls_back(monkeypatch: pytest.MonkeyPatch,
                                                                 device: str) -> None:
    import torch

    from tpo_gym.evaluation.runner import check_device  # what tpo-gym bench --device runs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"CUDA is not available on this machine \(allowed here: 'cpu', 'auto'\)"):
        TPO("MlpPolicy", bandit_env(), device=device)
    with pytest.raises(ValueError, match="CUDA is not available") as agent_error:
        TPO("MlpPolicy", bandit_env(), device=torch.device(device))
    with pytest.raises(ValueError) as cli_error:
        check_device(device)
    assert str(agent_error.value) == str(cli_error.value), "the agent says what tpo-gym bench --device says"
    assert TPO("MlpPolicy", bandit_env(), device="auto").device.type == "cpu"
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'auto', 'cuda' or 'cuda:N', got 'tpu'"):
        TPO("MlpPolicy", bandit_env(), device="tpu")
