"""tpo_gym.envs.token_task: hand-worked rewards for every target x reward kind, the group API, bad input,
and TokenTaskTensorEnv (the token task on a torch device, value for value the numpy vector env)."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.envs.conftest import assert_same
from tpo_gym.envs.token_task import (
    REWARDS,
    TARGETS,
    TokenTaskEnv,
    TokenTaskTensorEnv,
    TokenTaskVectorEnv,
    candidate_rewards,
    step_rewards,
    token_targets,
)

PROMPT = [0, 2, 1]  # V = 3, H = 3
# Targets worked out by hand for PROMPT (copy x; flip 2 - x; reverse copy; reverse flip).
HAND_TARGETS = {
    "copy": [0, 2, 1],
    "flip": [2, 0, 1],
    "reverse_copy": [1, 2, 0],
    "reverse_flip": [1, 0, 2],
}
# For each target: (actions, expected per-step rewards for bag, sequential, terminal), by hand.
HAND_EPISODES = {
    "copy": [
        ([0, 2, 1], {"bag": [1, 1, 1], "sequential": [1, 1, 1], "terminal": [0, 0, 1]}),
        ([0, 0, 1], {"bag": [1, 0, 1], "sequential": [1, 0, 0], "terminal": [0, 0, 0]}),
        ([1, 2, 1], {"bag": [0, 1, 1], "sequential": [0, 0, 0], "terminal": [0, 0, 0]}),
    ],
    "flip": [
        ([2, 0, 1], {"bag": [1, 1, 1], "sequential": [1, 1, 1], "terminal": [0, 0, 1]}),
        ([2, 2, 1], {"bag": [1, 0, 1], "sequential": [1, 0, 0], "terminal": [0, 0, 0]}),
        ([2, 0, 0], {"bag": [1, 1, 0], "sequential": [1, 1, 0], "terminal": [0, 0, 0]}),
    ],
    "reverse_copy": [
        ([1, 2, 0], {"bag": [1, 1, 1], "sequential": [1, 1, 1], "terminal": [0, 0, 1]}),
        ([1, 0, 0], {"bag": [1, 0, 1], "sequential": [1, 0, 0], "terminal": [0, 0, 0]}),
        ([0, 2, 1], {"bag": [0, 1, 0], "sequential": [0, 0, 0], "terminal": [0, 0, 0]}),
    ],
    "reverse_flip": [
        ([1, 0, 2], {"bag": [1, 1, 1], "sequential": [1, 1, 1], "terminal": [0, 0, 1]}),
        ([1, 1, 2], {"bag": [1, 0, 1], "sequential": [1, 0, 0], "terminal": [0, 0, 0]}),
        ([2, 1, 0], {"bag": [0, 0, 0], "sequential": [0, 0, 0], "terminal": [0, 0, 0]}),
    ],
}


@pytest.mark.parametrize("target", TARGETS)
def test_token_targets_by_hand(target: str) -> None:
    np.testing.assert_array_equal(token_targets(np.array(PROMPT), target, 3), HAND_TARGETS[target])
    batch = token_targets(np.array([PROMPT, PROMPT]), target, 3)
    np.testing.assert_array_equal(batch, [HAND_TARGETS[target]] * 2)


@pytest.mark.parametrize("reward", REWARDS)
@pytest.mark.parametrize("target", TARGETS)
def test_rewards_by_hand(target: str, reward: str) -> None:
    env = TokenTaskEnv(target=target, reward=reward, vocab_size=3, length=3)
    for actions, expected in HAND_EPISODES[target]:
        obs, _ = env.reset(seed=0, options={"prompt": PROMPT})
        np.testing.assert_array_equal(obs, PROMPT + [3, 3, 3])
        rewards, info = [], {}
        for t, a in enumerate(actions):
            obs, r, terminated, truncated, info = env.step(a)
            rewards.append(r)
            assert terminated == (t == 2) and truncated is False
            np.testing.assert_array_equal(obs[3 : 4 + t], actions[: t + 1])
        assert rewards == expected[reward]
        n_wrong = sum(a != b for a, b in zip(actions, HAND_TARGETS[target], strict=True))
        assert info["token_error"] == pytest.approx(n_wrong / 3)
        assert info["exact_match"] is (n_wrong == 0) and info["is_success"] is (n_wrong == 0)
        correct = np.array(actions) == np.array(HAND_TARGETS[target])
        np.testing.assert_array_equal(step_rewards(correct, reward), expected[reward])


@pytest.mark.parametrize("reward", REWARDS)
@pytest.mark.parametrize("target", TARGETS)
def test_native_vector_rewards_by_hand(target: str, reward: str) -> None:
    """The batched env gives the same hand-worked rewards (prompt set through the group draw)."""
    venv = TokenTaskVectorEnv(num_envs=3, target=target, reward=reward, vocab_size=3, length=3)
    venv.reset(seed=0)
    venv._assign_contexts(np.arange(3), np.array([PROMPT] * 3))  # white-box: fix the prompt
    episodes = HAND_EPISODES[target]
    actions = np.array([a for a, _ in episodes])  # [3 envs, H]
    got = np.stack([venv.step(actions[:, t])[1] for t in range(3)], axis=1)
    np.testing.assert_array_equal(got, [e[reward] for _, e in episodes])


@pytest.mark.parametrize("reward", REWARDS)
def test_score_candidates_matches_step_and_has_no_side_effects(reward: str) -> None:
    env = TokenTaskEnv(target="reverse_flip", reward=reward, vocab_size=4, length=6)
    obs, _ = env.reset(seed=1)
    rng = np.random.default_rng(0)
    for _ in range(6):
        rng_state = copy.deepcopy(env.np_random.bit_generator.state)
        before = copy.deepcopy(env.__dict__)
        scores = env.score_candidates(np.arange(4))
        assert scores.dtype == np.float32 and scores.shape == (4,)
        assert env.np_random.bit_generator.state == rng_state
        for k in range(4):
            clone = copy.deepcopy(env)
            assert clone.step(k)[1] == scores[k]
        after = env.__dict__
        np.testing.assert_array_equal(after["_state"], before["_state"])
        assert after["_t"] == before["_t"] and after["_prefix_ok"] == before["_prefix_ok"]
        env.step(int(rng.integers(4)))


@pytest.mark.parametrize("reward", REWARDS)
def test_vector_score_candidates_matches_step(reward: str) -> None:
    venv = TokenTaskVectorEnv(num_envs=16, target="reverse_copy", reward=reward, vocab_size=2, length=4)
    venv.reset(seed=3)
    rng = np.random.default_rng(1)
    for _ in range(9):  # two episodes and an autoreset step
        cand = rng.integers(0, 2, size=(16, 5))
        state = (venv._state.copy(), venv._t.copy(), venv._prefix_ok.copy(), venv._needs_reset.copy())
        scores = venv.score_candidates(cand)
        assert scores.dtype == np.float32 and scores.shape == (16, 5)
        for arr, old in zip((venv._state, venv._t, venv._prefix_ok, venv._needs_reset), state, strict=True):
            np.testing.assert_array_equal(arr, old)
        for k in range(5):
            np.testing.assert_array_equal(copy.deepcopy(venv).step(cand[:, k])[1], scores[:, k])
        venv.step(rng.integers(0, 2, size=16))


def test_terminal_scores_only_at_last_step_with_correct_prefix() -> None:
    env = TokenTaskEnv(target="copy", reward="terminal", vocab_size=2, length=3)
    env.reset(options={"prompt": [1, 0, 1]})
    np.testing.assert_array_equal(env.score_candidates([0, 1]), [0, 0])
    env.step(1)
    env.step(0)
    np.testing.assert_array_equal(env.score_candidates([0, 1, 1]), [0, 1, 1])
    env.reset(options={"prompt": [1, 0, 1]})
    env.step(0)  # wrong
    env.step(0)
    np.testing.assert_array_equal(env.score_candidates([0, 1]), [0, 0])


def test_group_size_shares_prompts_across_autoreset() -> None:
    venv = gym.make_vec("tpo_gym/TokenReversal-v0", num_envs=8, vectorization_mode="vector_entry_point")
    obs, _ = venv.reset(seed=4, options={"group_size": 4})
    for _ in range(3):
        prompts = obs[:, :10]
        assert (prompts[:4] == prompts[0]).all() and (prompts[4:] == prompts[4]).all()
        assert not (prompts[0] == prompts[4]).all()
        for _ in range(10):
            obs, *_ = venv.step(venv.action_space.sample())
        obs, *_ = venv.step(venv.action_space.sample())  # autoreset step
    obs, _ = venv.reset(seed=4)  # without the option: back to independent prompts
    assert len({tuple(p) for p in obs[:, :10]}) > 2


@pytest.mark.parametrize("group_size", [3, 0, -2, 16, 2.0, "2", True])
def test_bad_group_size(group_size: object) -> None:
    venv = TokenTaskVectorEnv(num_envs=8)
    with pytest.raises(ValueError, match="group_size"):
        venv.reset(seed=0, options={"group_size": group_size})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocab_size": 1}, "vocab_size must be an integer >= 2.*, got 1"),
        ({"vocab_size": 2.5}, "vocab_size"),
        ({"length": 0}, "length must be an integer >= 1.*, got 0"),
        ({"target": "copyy"}, r"target must be one of \['copy', 'flip', 'reverse_copy', 'reverse_flip'\], got 'copyy'"),
        ({"reward": "dense"}, r"reward must be one of \['bag', 'sequential', 'terminal'\], got 'dense'"),
    ],
)
def test_bad_kwargs(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gym.make("tpo_gym/TokenTask-v0", **kwargs)
    with pytest.raises(ValueError, match=match):
        gym.make_vec("tpo_gym/TokenTask-v0", num_envs=2, vectorization_mode="vector_entry_point", **kwargs)


@pytest.mark.parametrize(
    ("action", "match"),
    [
        (2, r"action must be an integer in \[0, 2\) \(the action space Discrete\(2\)\), got 2"),
        (-1, r"action must be an integer in \[0, 2\).*got -1"),
        (1.0, "must be an integer"),
        (np.float32(1), "must be an integer"),
        (True, "bool"),
        (np.array([0, 1]), "shape"),
        ("1", "must be an integer"),
    ],
)
def test_bad_actions_single(action: object, match: str) -> None:
    env = gym.make("tpo_gym/TokenReversal-v0").unwrapped
    env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        env.step(action)
    if np.ndim(action) == 0:  # the same value as a candidate is rejected too
        with pytest.raises(ValueError):
            env.score_candidates(np.array([action]))


@pytest.mark.parametrize(
    ("actions", "match"),
    [
        (np.array([0, 1, 2, 0]), r"actions must be integers in \[0, 2\) \(Discrete\(2\)\), got \[2\] outside it"),
        (np.array([0.0, 1.0, 1.0, 0.0]), "integer dtype"),
        (np.array([True, False, True, True]), "integer dtype"),
        (np.array([0, 1, 1]), r"shape \(4,\)"),
        (np.zeros((4, 1), dtype=np.int64), r"shape \(4,\)"),
    ],
)
def test_bad_actions_vector(actions: np.ndarray, match: str) -> None:
    venv = gym.make_vec("tpo_gym/TokenReversal-v0", num_envs=4, vectorization_mode="vector_entry_point")
    venv.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        venv.step(actions)
    if actions.shape == (4,):  # the same values as candidates [4, 1] are rejected too
        with pytest.raises(ValueError):
            venv.score_candidates(actions.reshape(4, 1))
    with pytest.raises(ValueError, match="shape"):
        venv.score_candidates(np.zeros((3, 2), dtype=np.int64))


def test_step_after_episode_end_and_before_reset() -> None:
    env = TokenTaskEnv(length=1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    env.step(0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    with pytest.raises(RuntimeError, match="reset"):
        TokenTaskVectorEnv(num_envs=2).step(np.zeros(2, dtype=np.int64))


def test_bad_prompt_option() -> None:
    env = TokenTaskEnv(vocab_size=2, length=3)
    with pytest.raises(ValueError, match="prompt"):
        env.reset(options={"prompt": [0, 1, 2]})
    with pytest.raises(ValueError, match="prompt"):
        env.reset(options={"prompt": [0, 1]})


def test_observation_never_contains_target() -> None:
    """Observation = [prompt; actions so far]; for flip the target is not recoverable by copying."""
    env = TokenTaskEnv(target="flip", vocab_size=5, length=4)
    obs, _ = env.reset(options={"prompt": [0, 1, 2, 3]})
    np.testing.assert_array_equal(obs, [0, 1, 2, 3, 5, 5, 5, 5])
    assert env.observation_space == gym.spaces.MultiDiscrete([6] * 8, dtype=np.int64)


@pytest.mark.parametrize("reward", REWARDS)
@pytest.mark.parametrize("target", TARGETS)
def test_tensor_env_equals_the_numpy_env_step_for_step(reward: str, target: str) -> None:
    kw = dict(target=target, reward=reward, vocab_size=3, length=4)
    ref, env = TokenTaskVectorEnv(8, **kw), TokenTaskTensorEnv(8, **kw)
    assert env.observation_space == ref.observation_space and env.action_space == ref.action_space
    assert env.reward_credit == ref.reward_credit and env.fixed_horizon == 4
    rng = np.random.default_rng(0)
    for episode in range(3):  # through NEXT_STEP autoresets, with and without groups
        opts = {"group_size": 2} if episode == 1 else None
        o1, _ = ref.reset(seed=episode, options=opts)
        o2, _ = env.reset(seed=episode, options=opts)
        assert_same(o1, o2)
        for _ in range(6):  # 4 steps, the autoreset step, one more
            acts, cand = rng.integers(0, 3, 8), rng.integers(0, 3, (8, 5))
            assert_same(ref.score_candidates(cand), env.score_candidates(torch.from_numpy(cand)))
            out1, out2 = ref.step(acts), env.step(torch.from_numpy(acts))
            for x, y in zip(out1[:4], out2[:4], strict=True):
                assert_same(x, y)
            assert out2[1].dtype == torch.float32 and out2[2].dtype == torch.bool
            assert set(out1[4]) == set(out2[4])
            for key in out1[4]:
                assert_same(out1[4][key], out2[4][key])


def test_targets_and_rules_are_one_definition_for_numpy_and_torch() -> None:
    prompts = np.array([[0, 1, 2, 2], [2, 0, 0, 1]])
    for target in TARGETS:
        assert_same(token_targets(prompts, target, 3), token_targets(torch.from_numpy(prompts), target, 3))
    c = np.array([[True, False, True, True], [True, True, True, True]])
    for reward in REWARDS:  # step_rewards is candidate_rewards over a whole episode
        per_step = step_rewards(c, reward)
        ok = np.ones(2, dtype=bool)
        for t in range(4):
            now = candidate_rewards(c[:, t:t + 1], ok[:, None], t == 3, reward)
            assert_same(per_step[:, t:t + 1], now.astype(np.float32))
            assert_same(now, candidate_rewards(torch.from_numpy(c[:, t:t + 1]), torch.from_numpy(ok)[:, None],
                                               t == 3, reward))
            ok &= c[:, t]


def test_tensor_env_rejects_bad_actions_by_name() -> None:
    env = TokenTaskTensorEnv(4, vocab_size=2, length=3)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(torch.zeros(4, dtype=torch.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions must have shape \(4,\)"):
        env.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="integer dtype"):
        env.step(torch.zeros(4))
    with pytest.raises(ValueError, match=r"in \[0, 2\).*\[2\]"):
        env.step(torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match=r"candidates must have shape \(4, K\)"):
        env.score_candidates(torch.zeros(4, dtype=torch.int64))
    fast = TokenTaskTensorEnv(4, vocab_size=2, length=3, check_actions=False)
    fast.reset(seed=0)
    assert fast.step(np.array([0, 1, 1, 0]))[1].shape == (4,), "numpy actions are accepted too"


def test_tensor_env_state_lives_on_its_device() -> None:
    env = TokenTaskTensorEnv(2, device="cpu")
    obs, _ = env.reset(seed=1)
    assert isinstance(obs, torch.Tensor) and obs.device == env.device == torch.device("cpu")
    assert env.prompts.shape == (2, 10) and obs.dtype == torch.int64
    if torch.cuda.is_available():  # pragma: no cover - CI has no GPU
        gpu = TokenTaskTensorEnv(2, device="cuda")
        obs, _ = gpu.reset(seed=1)
        assert obs.is_cuda and gpu.step(torch.zeros(2, dtype=torch.int64, device="cuda"))[1].is_cuda
