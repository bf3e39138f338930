"""ReasoningGym env: scoring through the dataset's own score_answer, text spaces, bad names."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import reasoning_gym

from tpo_gym.envs.reasoning_gym_env import SYSTEM_PROMPT, ReasoningGymEnv


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "knights_knaves", "graph_color"])
def test_reward_is_the_datasets_score(dataset: str) -> None:
    env = gym.make("tpo_gym/ReasoningGym-v0", dataset=dataset, size=10, seed=3)
    ref = reasoning_gym.create_dataset(dataset, seed=3, size=10)
    obs, info = env.reset(seed=0)
    entry = ref[info["index"]]
    assert info["question"] == entry["question"] and info["system_prompt"] == SYSTEM_PROMPT
    assert obs in env.observation_space and "<answer>" in obs
    good = entry["answer"] if entry["answer"] is not None else "no reference answer"
    completions = [f"Thinking... <answer>{good}</answer>", "no tags at all", "<answer>wrong</answer>"]
    scores = env.unwrapped.score_candidates(completions)
    expected = [ref.score_answer(reasoning_gym.utils.extract_answer(c), entry) for c in completions]
    np.testing.assert_allclose(scores, expected)
    assert scores.dtype == np.float32
    if entry["answer"] is not None:
        assert scores[0] == 1.0
    _, reward, terminated, truncated, info = env.step(completions[0])
    assert (reward, terminated, truncated) == (expected[0], True, False)
    assert info["answer"] == entry["answer"]


def test_config_kwargs_pass_through() -> None:
    env = ReasoningGymEnv(dataset="basic_arithmetic", size=5, seed=0, min_terms=2, max_terms=2)
    assert env.dataset.config.min_terms == 2 and env.dataset.config.max_terms == 2


def test_unknown_dataset_lists_close_names() -> None:
    with pytest.raises(ValueError, match=r"unknown reasoning_gym dataset 'graph_colour'.*graph_color"):
        gym.make("tpo_gym/ReasoningGym-v0", dataset="graph_colour")


@pytest.mark.parametrize("action", [3, None, b"<answer>1</answer>"])
def test_bad_completion(action: object) -> None:
    env = ReasoningGymEnv(dataset="basic_arithmetic", size=5)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="must be a str"):
        env.step(action)
    with pytest.raises(ValueError, match="list of completion strings"):
        env.score_candidates("<answer>1</answer>")
