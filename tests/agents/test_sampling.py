"""tpo_gym.agents.common.sampling on the policy's device (rollouts_on_device): the same batches and curves as the
numpy envs."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch

import tpo_gym  # noqa: F401  (registers the envs)
from tpo_gym import DG, GRPO, PPO, REINFORCE, TPO, GroupPG
from tpo_gym.agents.common.sampling import RolloutSource, collect_rollouts, make_rollout_env

TINY = {"d_model": 16, "d_ff": 32, "n_layers": 1}


def _same_history(a: list[dict], b: list[dict]) -> bool:
    def eq(x: float, y: float) -> bool:
        return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
    return len(a) == len(b) and all(r.keys() == s.keys() and all(eq(r[k], s[k]) for k in r)
                                    for r, s in zip(a, b, strict=True))


@pytest.mark.parametrize(("cls", "kw"), [
    (TPO, {"level": "token"}), (GRPO, {"level": "token"}), (TPO, {"level": "sequence"}),
    (GRPO, {"level": "sequence"}), (GroupPG, {"level": "token"}), (PPO, {}), (DG, {}),
    (REINFORCE, {"budget": "interaction"}),
])
@pytest.mark.parametrize("reward", ["bag", "terminal"])
def test_on_device_rollouts_train_exactly_as_the_numpy_envs(cls, kw: dict, reward: str) -> None:
    histories, kinds = [], []
    for on_device in (False, True):
        env = gym.make("tpo_gym/TokenTask-v0", reward=reward, vocab_size=2, length=4)
        agent = cls("TransformerPolicy", env, batch_size=8, group_size=4, seed=3, rollouts_on_device=on_device,
                    policy_kwargs=TINY, **kw)
        agent.learn(2 * agent.steps_per_iteration)
        histories.append(agent.history)
        kinds.append(type(agent.get_rollout_env().venv).__name__)
    assert kinds == ["TokenTaskVectorEnv", "TokenTaskTensorEnv"]
    assert _same_history(*histories), "bit-identical curves on CPU"


def test_on_device_batch_equals_the_host_batch_field_by_field() -> None:
    env = gym.make("tpo_gym/TokenTask-v0", reward="sequential", vocab_size=3, length=5)
    policy = TPO("TransformerPolicy", env, batch_size=6, group_size=3, seed=0, policy_kwargs=TINY).policy
    source = RolloutSource.from_env(env)
    for kw in ({"n_candidates": 3}, {"group_size": 3}, {"score_all_actions": True}):
        host = collect_rollouts(policy, make_rollout_env(source, 6), seed=11, **kw)
        dev = collect_rollouts(policy, make_rollout_env(source, 6, device="cpu"), seed=11, **kw)
        for field in ("obs", "actions", "rewards", "logp_old", "candidates", "candidate_scores", "episode_scores",
                      "returns", "lengths"):
            a, b = getattr(host, field), getattr(dev, field)
            assert (a is None) == (b is None), field
            if a is not None:
                assert a.dtype == b.dtype and torch.equal(a, b), field
        assert (host.step_mask, host.error, host.n_steps, host.group_size, host.reward_credit) == \
            (dev.step_mask, dev.error, dev.n_steps, dev.group_size, dev.reward_credit)


def test_default_stays_on_the_host_on_cpu_and_bad_requests_are_named() -> None:
    agent = TPO("TransformerPolicy", "tpo_gym/TokenReversal-v0", batch_size=4, group_size=2, policy_kwargs=TINY)
    assert agent.get_rollout_env().on_device is False, "CPU default: the numpy envs"
    with pytest.raises(ValueError, match="rollouts_on_device must be None, True or False, got 'yes'"):
        TPO("TransformerPolicy", "tpo_gym/TokenReversal-v0", rollouts_on_device="yes")
    bandit = TPO("MlpPolicy", "tpo_gym/Bandit-v0", batch_size=4, group_size=2, rollouts_on_device=True)
    with pytest.raises(ValueError, match="has no on-device tensor form"):
        bandit.learn(8)


def test_the_setting_survives_save_and_load(tmp_path) -> None:
    agent = TPO("TransformerPolicy", "tpo_gym/TokenReversal-v0", batch_size=4, group_size=2, seed=0,
                rollouts_on_device=True, policy_kwargs=TINY)
    agent.learn(agent.steps_per_iteration)
    agent.save(tmp_path / "a.zip")
    loaded = TPO.load(tmp_path / "a.zip", env="tpo_gym/TokenReversal-v0")
    assert loaded.rollouts_on_device is True and loaded.get_rollout_env().on_device


@pytest.mark.parametrize(("cls", "kw"), [
    (TPO, {"candidates": "single"}), (GRPO, {}), (GroupPG, {}), (REINFORCE, {"baseline": "expected"}), (DG, {}),
    (tpo_gym.CE, {}),
])
def test_mnist_on_device_rollouts_train_exactly_as_the_numpy_env(cls, kw: dict) -> None:
    histories = []
    for on_device in (False, True):
        agent = cls("MlpPolicy", gym.make("tpo_gym/MNISTBandit-v0"), batch_size=16, seed=2,
                    rollouts_on_device=on_device, **kw)
        agent.learn(3 * agent.steps_per_iteration)
        histories.append(agent.history)
    assert _same_history(*histories)
