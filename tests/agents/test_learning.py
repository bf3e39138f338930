"""Learning within small budgets: TPO solves the bandit and reverse copy; the baselines improve."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from tests.agents.conftest import bandit_env, token_env
from tpo_gym import CE, DG, GRPO, PPO, TPO


def test_tpo_solves_the_single_context_bandit() -> None:
    model = TPO("MlpPolicy", bandit_env(n_arms=100, correct_arm=42), learning_rate=1e-2, seed=0)
    model.learn(40 * model.steps_per_iteration)
    errors = [h["error"] for h in model.history]
    assert errors[0] > 0.9  # starts near chance (99% error)
    assert np.mean(errors[-5:]) < 0.01


def test_tpo_token_solves_reverse_copy_length_4() -> None:
    model = TPO("TransformerPolicy", token_env(length=4, vocab_size=2), seed=0)
    model.learn(80 * model.steps_per_iteration)
    errors = [h["error"] for h in model.history]
    assert len(errors) == 80
    assert errors[0] > 0.3
    assert np.mean(errors[-5:]) < 0.05
    # self-extinguishing: the first-epoch gradient has shrunk by orders of magnitude
    assert model.history[-1]["grad_norm"] < 0.1 * max(h["grad_norm"] for h in model.history)


@pytest.mark.parametrize("cls,iterations", [(GRPO, 40), (PPO, 40), (DG, 60)])
def test_baselines_improve_on_reverse_copy(cls: type, iterations: int) -> None:
    model = cls("TransformerPolicy", token_env(length=4, vocab_size=2), seed=0)
    model.learn(iterations * model.steps_per_iteration)
    errors = [h["error"] for h in model.history]
    assert np.mean(errors[-5:]) < np.mean(errors[:3]) - 0.05


def test_ppo_learns_the_terminal_reward_task() -> None:
    """Terminal reward: every token is credited with the exact-match outcome (docs/method.md section 3), so PPO
    learns."""
    model = PPO("TransformerPolicy", token_env(length=4, vocab_size=2, reward="terminal"), seed=0)
    model.learn(60 * model.steps_per_iteration)
    errors = [h["error"] for h in model.history]
    assert errors[0] > 0.8  # 1 - 2**-4 exact-match error at chance
    assert np.mean(errors[-5:]) < 0.5


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
