"""tpo_gym.agents.common.base (GroupAlgorithm): the SB3 surface (callbacks, logger, learn, predict, history,
steps_per_iteration), env resolution, and the constructor arguments of every method."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CheckpointCallback,
    EvalCallback,
    ProgressBarCallback,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor, VecNormalize

from tests.agents.conftest import bandit_env, small_tpo, token_env
from tests.agents.method_checks import EventsCallback
from tpo_gym import CE, DG, GRPO, PPO, REINFORCE, TPO
from tpo_gym.agents import MuonAdamW, TransformerPolicy

_Count = EventsCallback


def test_tpo_and_grpo_log_their_winner_loser_diagnostics() -> None:
    """(Every method's history and logged keys: tests/agents/method_checks.py.)"""
    for cls, keys in ((TPO, {"mean_q_winners", "mean_q_losers"}), (GRPO, {"mean_abs_adv_winners",
                                                                          "mean_abs_adv_losers"})):
        model = cls("TransformerPolicy", token_env(length=3), batch_size=10, seed=0)
        model.learn(model.steps_per_iteration)
        assert keys <= set(model.history[0])


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
    # frequencies in env steps, as with SB3's agents: on_step once per env step (one env), 10 per iteration
    eval_cb = EvalCallback(Monitor(bandit_env()), eval_freq=20, n_eval_episodes=3, log_path=str(tmp_path), verbose=0)
    ckpt = CheckpointCallback(save_freq=20, save_path=str(tmp_path / "ckpt"), name_prefix="tpo")
    model.learn(4 * model.steps_per_iteration, callback=[count, eval_cb, ckpt])
    assert count.events[0] == "start" and count.events[-1] == "end"
    assert count.events.count("step") == 40 and count.events.count("rollout_end") == 4
    data = np.load(tmp_path / "evaluations.npz")
    assert data["results"].shape == (2, 3)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["tpo_20_steps.zip", "tpo_40_steps.zip"]
    TPO.load(tmp_path / "ckpt" / "tpo_40_steps.zip")


def test_stop_on_reward_threshold() -> None:
    model = TPO("MlpPolicy", bandit_env(n_arms=4), batch_size=10, learning_rate=1e-2, seed=0)
    stop = StopTrainingOnRewardThreshold(reward_threshold=0.9, verbose=0)
    eval_cb = EvalCallback(Monitor(bandit_env(n_arms=4)), callback_on_new_best=stop, eval_freq=10, n_eval_episodes=5)
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
        (lambda: TPO("TransformerPolicy", "MountainCarContinuous-v0"), r"a Box action space needs policy='MlpPolicy'"),
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


# ---------------------------------------------------------------------------------------------
# learn
# ---------------------------------------------------------------------------------------------
class _Prompts(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[np.ndarray] = []

    def _on_rollout_end(self) -> None:  # once per iteration (on_step: once per env step)
        self.prompts.append(self.model.rollout_batch.obs[:, 0].cpu().numpy().copy())

    def _on_step(self) -> bool:
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
    model = small_tpo()
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
    model = small_tpo()
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

    model = small_tpo()
    assert not isinstance(model.get_env().envs[0], Monitor)


# ---------------------------------------------------------------------------------------------
# constructor arguments: keyword-only, each documented, refused where a method fixes them
# ---------------------------------------------------------------------------------------------
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


def test_a_rollout_stopped_by_an_exception_is_drawn_again_with_its_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt inside the rollout does not use up its seed: the run then matches an uninterrupted one."""
    from tpo_gym.agents import base

    plain, interrupted = (PPO("MlpPolicy", bandit_env(), batch_size=4, seed=0, n_epochs=1) for _ in range(2))
    plain.learn(4 * plain.steps_per_iteration)
    real, calls = base.collect_rollouts, {"n": 0}

    def interrupt_the_third(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(base, "collect_rollouts", interrupt_the_third)
    with pytest.raises(KeyboardInterrupt):
        interrupted.learn(4 * interrupted.steps_per_iteration)
    interrupted.learn(4 * interrupted.steps_per_iteration - interrupted.num_timesteps, reset_num_timesteps=False)
    assert [r["error"] for r in interrupted.history] == [r["error"] for r in plain.history]
    assert interrupted.rollout_seed() == plain.rollout_seed()


def test_a_subclass_overriding_a_hook_of_the_old_agent_class_is_refused() -> None:
    from tpo_gym.agents.common.grouping import Grouping

    with pytest.raises(TypeError, match="overrides _grouping, which GroupAlgorithm no longer calls: override "
                                        "choose_grouping instead"):
        class OldStyle(TPO):
            def _grouping(self, native: bool) -> Grouping:
                return Grouping("actions")


def test_an_agent_without_an_env_is_refused_unless_it_is_being_loaded() -> None:
    with pytest.raises(ValueError, match="TPO needs an env to build its policy"):
        TPO("MlpPolicy", None)
    assert TPO("MlpPolicy", None, _init_setup_model=False).grouping is None
