"""The agents count env steps, call callbacks and keep episode statistics as Stable-Baselines3's agents do (issue 34).

SB3's ``OnPolicyAlgorithm.collect_rollouts``: ``num_timesteps += n_envs`` and ``callback.on_step()`` per
``env.step()`` (so ``n_calls * n_envs == num_timesteps`` and ``EvalCallback(eval_freq=N)`` /
``CheckpointCallback(save_freq=N)`` with one env fire every N env steps), ``learn`` stops at the first rollout end
with ``num_timesteps >= total_timesteps``, ``ep_info_buffer`` filled from the ``"episode"`` infos and
``rollout/ep_rew_mean`` its mean.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CheckpointCallback,
    EvalCallback,
    StopTrainingOnMaxEpisodes,
)
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from tests.agents.conftest import bandit_env
from tpo_gym import TPO, SeedBatch

TOKEN = "tpo_gym/TokenReversal-v0"
SMALL = {"policy_kwargs": {"d_model": 8, "d_ff": 16, "n_layers": 1}}


class _Steps(BaseCallback):
    """Records ``num_timesteps`` and the ``dones`` / ``infos`` locals at every ``on_step``, and each rollout's size."""

    def __init__(self) -> None:
        super().__init__()
        self.timesteps: list[int] = []
        self.done_lengths: list[list[int]] = [[]]  # per iteration: "l" of the episodes in the order they end
        self.rollout_steps: list[int] = []

    def _on_step(self) -> bool:
        self.timesteps.append(self.model.num_timesteps)
        for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
            if done:
                self.done_lengths[-1].append(info["episode"]["l"])
        return True

    def _on_rollout_end(self) -> None:
        self.rollout_steps.append(int(self.model.rollout_batch.lengths.sum()))
        self.done_lengths.append([])


def _eval_and_checkpoint(model: TPO, eval_env: gym.Env[Any, Any], eval_freq: int, save_freq: int, total: int,
                         tmp_path: Path) -> tuple[list[int], list[str]]:
    """Train with SB3's EvalCallback and CheckpointCallback; the evaluations' timesteps and the checkpoint files."""
    evaluate = EvalCallback(Monitor(eval_env), eval_freq=eval_freq, n_eval_episodes=2, log_path=str(tmp_path),
                            verbose=0)
    save = CheckpointCallback(save_freq=save_freq, save_path=str(tmp_path / "ckpt"), name_prefix="tpo")
    model.learn(total, callback=[evaluate, save])
    assert evaluate.n_calls == save.n_calls == model.num_timesteps  # one env: one call per env step
    ckpt = tmp_path / "ckpt"
    files = sorted((p.name for p in ckpt.iterdir()), key=lambda n: int(n.split("_")[1])) if ckpt.exists() else []
    npz = tmp_path / "evaluations.npz"
    return (np.load(npz)["timesteps"].tolist() if npz.exists() else []), files


def test_eval_and_checkpoint_callbacks_count_env_steps_on_cartpole(tmp_path: Path) -> None:
    model = TPO("MlpPolicy", "CartPole-v1", batch_size=4, seed=0)  # the README's example: 32 episodes an iteration
    evaluated, saved = _eval_and_checkpoint(model, gym.make("CartPole-v1"), 1000, 2500, 5000, tmp_path)
    assert evaluated == [1000, 2000, 3000, 4000, 5000]
    assert saved == ["tpo_2500_steps.zip", "tpo_5000_steps.zip"]
    assert TPO.load(tmp_path / "ckpt" / "tpo_5000_steps.zip").num_timesteps == 5000


def test_eval_and_checkpoint_callbacks_count_env_steps_on_token_reversal(tmp_path: Path) -> None:
    model = TPO("TransformerPolicy", TOKEN, batch_size=4, group_size=2, seed=0, **SMALL)
    spi = model.steps_per_iteration
    assert model.level == "token" and spi == 4 * 10  # K candidates per state are scored, one is stepped
    evaluated, saved = _eval_and_checkpoint(model, gym.make(TOKEN), 2 * spi, 3 * spi, 6 * spi, tmp_path)
    assert evaluated == [2 * spi, 4 * spi, 6 * spi] and len(model.history) == 6
    assert saved == [f"tpo_{3 * spi}_steps.zip", f"tpo_{6 * spi}_steps.zip"]


def test_one_call_per_n_envs_env_steps() -> None:
    for n_envs, calls in ((1, 10), (2, 5), (3, 4)):  # an iteration is 10 one-step episodes
        model = TPO("MlpPolicy", DummyVecEnv([bandit_env] * n_envs), batch_size=10, seed=0)
        steps = _Steps()
        model.learn(40, callback=steps)
        assert model.n_envs == n_envs and steps.n_calls == 4 * calls and model.num_timesteps == 40
        first = [min((i + 1) * n_envs, 10) for i in range(calls)]  # the last call of an iteration may cover fewer
        assert steps.timesteps == [s + 10 * it for it in range(4) for s in first]
        assert all(len(d) == 10 for d in steps.done_lengths[:4])


def test_dones_mark_each_episode_at_its_last_step_and_stop_callbacks_work() -> None:
    model = TPO("MlpPolicy", "CartPole-v1", batch_size=4, seed=0)
    steps = _Steps()
    model.learn(3000, callback=steps)
    assert steps.n_calls == model.num_timesteps == sum(steps.rollout_steps)
    for lengths in steps.done_lengths[:-1]:
        assert len(lengths) == model.n_rollouts and lengths == sorted(lengths)  # shorter episodes end earlier
    bandit = TPO("MlpPolicy", bandit_env(), batch_size=10, seed=0)
    bandit.learn(1000, callback=StopTrainingOnMaxEpisodes(max_episodes=25))  # reads the dones locals
    assert len(bandit.history) == 2 and bandit.num_timesteps == 30  # stopped inside the 3rd rollout


def test_learn_stops_on_the_env_steps_actually_taken_on_cartpole() -> None:
    model = TPO("MlpPolicy", "CartPole-v1", batch_size=4, seed=0)
    with pytest.raises(ValueError, match=r"episodes of CartPole-v1 vary in length \(up to 500 steps\)"):
        model.steps_per_iteration  # noqa: B018 (nothing to report before an iteration ran)
    steps = _Steps()
    model.learn(5000, callback=steps)
    counts = [r["num_timesteps"] for r in model.history]
    assert model.num_timesteps == counts[-1] == sum(steps.rollout_steps)
    assert np.diff([0, *counts]).tolist() == steps.rollout_steps
    assert counts[-2] < 5000 <= counts[-1]  # the first iteration to reach total_timesteps is the last
    assert 400 < steps.rollout_steps[0] < 2000 and len(model.history) == round(5000 / np.mean(steps.rollout_steps))
    assert model.steps_per_iteration == steps.rollout_steps[-1]
    before = len(model.history)
    model.learn(5 * model.steps_per_iteration, reset_num_timesteps=False)
    assert 4 <= len(model.history) - before <= 6


def test_ep_info_buffer_and_ep_rew_mean_follow_sb3(tmp_path: Path) -> None:
    model = TPO("MlpPolicy", "CartPole-v1", batch_size=4, seed=0)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(3000)
    batch = model.rollout_batch
    assert len(model.ep_info_buffer) == model.stats_window_size == 100
    last = list(model.ep_info_buffer)[-model.n_rollouts:]  # the last iteration's episodes, in rollout order
    assert [e["r"] for e in last] == batch.returns.tolist() and [e["l"] for e in last] == batch.lengths.tolist()
    with (tmp_path / "progress.csv").open() as f:
        log = list(csv.DictReader(f))[-1]
    assert float(log["rollout/ep_rew_mean"]) == pytest.approx(np.mean([e["r"] for e in model.ep_info_buffer]))
    assert float(log["rollout/ep_len_mean"]) == pytest.approx(np.mean([e["l"] for e in model.ep_info_buffer]))


def test_ep_info_buffer_reads_the_envs_own_episode_statistics() -> None:
    """A RecordEpisodeStatistics the rollouts keep is what the buffer reads (SB3 reads its Monitor's), not the
    returns the agent trains on (here doubled by an outer wrapper)."""
    env = gym.wrappers.TransformReward(gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1")),
                                       lambda r: 2.0 * r)
    model = TPO("MlpPolicy", env, batch_size=2, group_size=4, seed=0)
    model.learn(500)
    batch = model.rollout_batch
    last = list(model.ep_info_buffer)[-model.n_rollouts:]
    assert [e["l"] for e in last] == batch.lengths.tolist()
    assert [e["r"] for e in last] == batch.lengths.float().tolist() == (batch.returns / 2).tolist()
    assert all(e["t"] >= 0 for e in last)


def test_text_completions_are_one_step_episodes() -> None:
    from tests.agents.lm_toys import lm_kwargs, say_letter_env

    model = TPO("CausalLMPolicy", say_letter_env(), seed=0, batch_size=2, group_size=3, n_epochs=1,
                policy_kwargs=lm_kwargs())
    steps = _Steps()
    model.learn(2 * model.steps_per_iteration, callback=steps)
    assert model.steps_per_iteration == 6 and steps.n_calls == model.num_timesteps == 12
    assert steps.done_lengths[:2] == [[1] * 6, [1] * 6]
    scores = model.rollout_batch.scores.reshape(-1).tolist()
    assert [e["r"] for e in list(model.ep_info_buffer)[-6:]] == scores


def test_each_seed_of_a_seed_batch_sees_its_own_env_steps() -> None:
    agents = [TPO("TransformerPolicy", TOKEN, batch_size=4, group_size=2, seed=s, **SMALL) for s in (0, 1)]
    callbacks = [_Steps(), _Steps()]
    SeedBatch(agents).learn(3 * agents[0].steps_per_iteration, callback=callbacks)
    for agent, steps in zip(agents, callbacks, strict=True):
        assert steps.n_calls == agent.num_timesteps == 3 * 40 and steps.timesteps == list(range(1, 121))
        assert len(agent.ep_info_buffer) == 3 * 4
