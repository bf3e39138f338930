"""ReasoningGym env: scoring through the dataset's own score_answer, text spaces, vectorisation, bad names."""

from __future__ import annotations

import copy
import pickle
import re
import string

import gymnasium as gym
import numpy as np
import pytest
import reasoning_gym
from gymnasium.utils.env_checker import check_env as gym_check_env

from tpo_gym.envs.reasoning_gym_env import (
    SYSTEM_PROMPT,
    ReasoningGymEnv,
    UnicodeText,
    observation_text,
    text_charset,
)


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
    # gym.make's TimeLimit (max_episode_steps=1) also truncates the one step; the env itself does not.
    assert (reward, terminated, truncated) == (expected[0], True, True)
    assert info["answer"] == entry["answer"]
    assert (info["score"], info["error"]) == (expected[0], 1.0 - expected[0])
    assert type(info["score"]) is float and type(info["error"]) is float


def test_config_kwargs_pass_through() -> None:
    env = ReasoningGymEnv(dataset="basic_arithmetic", size=5, seed=0, min_terms=2, max_terms=2)
    assert env.dataset.config.min_terms == 2 and env.dataset.config.max_terms == 2


def test_unknown_dataset_lists_close_names() -> None:
    with pytest.raises(ValueError, match=r"dataset must be one of .*got 'graph_colour'.*graph_color"):
        gym.make("tpo_gym/ReasoningGym-v0", dataset="graph_colour")


@pytest.mark.parametrize("action", [3, None, b"<answer>1</answer>"])
def test_bad_completion(action: object) -> None:
    env = ReasoningGymEnv(dataset="basic_arithmetic", size=5)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="must be a str"):
        env.step(action)
    with pytest.raises(ValueError, match="list of completion strings"):
        env.score_candidates("<answer>1</answer>")


def test_registered_with_one_step_episodes() -> None:
    assert gym.spec("tpo_gym/ReasoningGym-v0").max_episode_steps == 1
    env = gym.make("tpo_gym/ReasoningGym-v0", dataset="basic_arithmetic", size=5)
    assert env.spec is not None and env.spec.max_episode_steps == 1
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("<answer>0</answer>")
    assert terminated and truncated  # TimeLimit adds truncated=True; the env itself says truncated=False
    assert "score" in info
    env.reset(seed=1)  # a new episode, new time budget
    assert env.step("x")[2] is True


def test_async_vector_env_fails_loudly_with_shared_memory_and_works_without() -> None:
    """Gymnasium's shared memory would return padding for every Text observation: refuse it."""
    kw = {"dataset": "basic_arithmetic", "size": 10}
    with pytest.raises(ValueError, match=re.escape('vector_kwargs={"shared_memory": False}')):
        gym.make_vec("tpo_gym/ReasoningGym-v0", 2, vectorization_mode="async", **kw)
    venv = gym.make_vec(
        "tpo_gym/ReasoningGym-v0", 2, vectorization_mode="async", vector_kwargs={"shared_memory": False}, **kw
    )
    try:
        obs, info = venv.reset(seed=0)
        ref = reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=10)
        for i in range(2):
            assert obs[i] == SYSTEM_PROMPT + "\n" + ref[int(info["index"][i])]["question"]
            assert info["question"][i] == ref[int(info["index"][i])]["question"]
        assert obs in venv.observation_space
        _, rewards, terminated, _, info = venv.step(("<answer>1</answer>", "no answer"))
        assert terminated.all() and info["_score"].all() and rewards[1] == 0.0
    finally:
        venv.close()


@pytest.mark.parametrize("dataset", ["emoji_mystery", "circuit_logic"])
def test_non_ascii_questions_are_observed_unchanged(dataset: str) -> None:
    """Emoji, supplementary-plane variation selectors, box drawing: nothing becomes '?'."""
    env = gym.make("tpo_gym/ReasoningGym-v0", dataset=dataset, size=5, seed=0)
    ref = reasoning_gym.create_dataset(dataset, seed=0, size=5)
    non_ascii = 0
    for seed in range(4):
        obs, info = env.reset(seed=seed)
        question = ref[info["index"]]["question"]
        non_ascii += sum(ord(c) > 127 for c in question)
        assert info["question"] == question and info["system_prompt"] == SYSTEM_PROMPT
        assert obs == SYSTEM_PROMPT + "\n" + question
        assert obs in env.observation_space
    assert non_ascii > 0
    gym_check_env(env.unwrapped, skip_render_check=True)


def test_charset_is_broad_and_documented() -> None:
    charset = text_charset()
    assert len(charset) > 100_000
    kept = "\t\n\r\x0b\x0c ~é£αἀ∫─█✅（👽\U000e0110\u00a0\u200d\ufffd中"
    assert all(c in charset for c in kept)
    dropped = ["\x00", "\x07", "\x7f", "\x85", "\ue000", "\U0010fffd", "\ud800", "\U000e01f0"]
    assert not any(c in charset for c in dropped)
    space = ReasoningGymEnv(dataset="basic_arithmetic", size=5).observation_space
    assert space.character_set is charset
    assert space == gym.spaces.Text(65536, min_length=0, charset=charset)
    assert gym.spaces.Text(65536, min_length=0, charset=charset) == space
    assert space != gym.spaces.Text(65536, min_length=0, charset=string.printable)
    assert "Unicode characters" in repr(space) and len(repr(space)) < 100


def test_text_spaces_are_cheap_to_copy_and_pickle() -> None:
    space = UnicodeText(max_length=64)
    blob = pickle.dumps(space)
    assert len(blob) < 10_000  # the shared charset is not copied into every space
    clone = pickle.loads(blob)
    assert clone == space and copy.deepcopy(space) == space
    batched = gym.vector.utils.batch_space(space, 3)
    assert "é👽" in space and ("a", "b\n", "") in batched
    space.seed(0)
    sample = space.sample()
    assert sample in space and len(sample) <= 64
    clone.seed(0)
    assert clone.sample() == sample  # seeded sampling is reproducible
    assert len(space.sample(mask=(3, None))) == 3  # masks go through Text.sample


class _StubDataset:
    """One entry whose question holds characters outside the charset (a control and a private-use char)."""

    question = "What is 1\x00+1\ue000?"

    def __getitem__(self, index: int) -> dict[str, object]:
        return {"question": self.question, "answer": "2", "metadata": {}}

    def score_answer(self, answer: str | None, entry: dict[str, object]) -> float:
        return float(answer == "2")


def test_characters_outside_the_charset_change_only_the_observation() -> None:
    env = ReasoningGymEnv(dataset="basic_arithmetic", size=5)
    env.dataset = _StubDataset()
    obs, info = env.reset(seed=0)
    assert info["question"] == _StubDataset.question  # raw, for the LLM's chat template
    assert obs == SYSTEM_PROMPT + "\nWhat is 1\ufffd+1\ufffd?"
    assert obs in env.observation_space
    assert observation_text("sys", "a\x01b") == "sys\na\ufffdb"
    _, reward, _, _, info = env.step("<answer>2</answer>")
    assert (reward, info["score"], info["error"], info["is_success"]) == (1.0, 1.0, 0.0, True)


def test_sb3_check_env_rejects_text_observations() -> None:
    """Documented in the env: SB3's checker needs numpy observations; Gymnasium's checker passes."""
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make("tpo_gym/ReasoningGym-v0", dataset="basic_arithmetic", size=5)
    with pytest.raises(AssertionError, match="must be a numpy array"):
        sb3_check_env(env)
    gym_check_env(env.unwrapped, skip_render_check=True)
    assert "stable_baselines3.common.env_checker.check_env" in (ReasoningGymEnv.__doc__ or "")


def test_reset_option_index_shows_that_entry() -> None:
    env = gym.make("tpo_gym/ReasoningGym-v0", dataset="basic_arithmetic", size=5, seed=3)
    _, info = env.reset(seed=0, options={"index": 4})
    assert info["index"] == 4 and info["question"] == env.unwrapped.dataset[4]["question"]
    answer = env.unwrapped.dataset[4]["answer"]
    assert env.unwrapped.score_candidates([f"<answer>{answer}</answer>"])[0] == 1.0
    with pytest.raises(ValueError, match=r"options\['index'\] must be an integer >= 0 and <= 4, got 5"):
        env.reset(options={"index": 5})


def test_renders_the_question_and_after_the_step_how_the_completion_scored() -> None:
    env = gym.make("tpo_gym/ReasoningGym-v0", dataset="gcd", size=10, seed=0, render_mode="ansi")
    _, info = env.reset(seed=0)
    answer = env.unwrapped.entry["answer"]
    assert env.render() == f"gcd #{info['index']}\nQuestion: {info['question']}\n"
    env.step(f"so <answer>{answer}</answer>")
    assert env.render().splitlines()[2:] == [f"Completion: so <answer>{answer}</answer>",
                                             f"Extracted answer: {answer}", f"Reference answer: {answer}", "Score: 1"]
    env.reset(seed=1)
    assert "Completion" not in env.render()  # a new question shows no earlier answer
    pic = gym.make("tpo_gym/ReasoningGym-v0", dataset="gcd", size=10, render_mode="rgb_array")
    pic.reset(seed=0)
    frame = pic.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    assert frame.min() < 100 and frame.max() == 255  # dark text on white
    for mode in ("ansi", "rgb_array"):  # Gymnasium's checker with its render checks
        gym_check_env(gym.make("tpo_gym/ReasoningGym-v0", dataset="gcd", size=10, render_mode=mode).unwrapped)
    with pytest.raises(ValueError, match=r"render_mode must be None or one of \['ansi', 'rgb_array'\], got 'text'"):
        ReasoningGymEnv("gcd", size=10, render_mode="text")
