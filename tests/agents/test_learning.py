"""Learning within small budgets: TPO solves the bandit and reverse copy; the baselines improve."""

from __future__ import annotations

import numpy as np
import pytest

from tests.agents.conftest import bandit_env, token_env
from tpo_gym import DG, GRPO, PPO, TPO


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
    """Terminal reward: every token is credited with the exact-match outcome (SPEC 3), so PPO learns."""
    model = PPO("TransformerPolicy", token_env(length=4, vocab_size=2, reward="terminal"), seed=0)
    model.learn(60 * model.steps_per_iteration)
    errors = [h["error"] for h in model.history]
    assert errors[0] > 0.8  # 1 - 2**-4 exact-match error at chance
    assert np.mean(errors[-5:]) < 0.5
