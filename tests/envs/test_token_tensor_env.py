"""TokenTaskTensorEnv: the token task on a torch device, value for value the numpy vector env."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpo_gym.envs.token_task import (
    REWARDS,
    TARGETS,
    TokenTaskTensorEnv,
    TokenTaskVectorEnv,
    candidate_rewards,
    step_rewards,
    token_targets,
)


def _same(a, b) -> None:
    b = b.cpu().numpy() if isinstance(b, torch.Tensor) else b
    np.testing.assert_array_equal(np.asarray(a), b)


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
        _same(o1, o2)
        for _ in range(6):  # 4 steps, the autoreset step, one more
            acts, cand = rng.integers(0, 3, 8), rng.integers(0, 3, (8, 5))
            _same(ref.score_candidates(cand), env.score_candidates(torch.from_numpy(cand)))
            out1, out2 = ref.step(acts), env.step(torch.from_numpy(acts))
            for x, y in zip(out1[:4], out2[:4], strict=True):
                _same(x, y)
            assert out2[1].dtype == torch.float32 and out2[2].dtype == torch.bool
            assert set(out1[4]) == set(out2[4])
            for key in out1[4]:
                _same(out1[4][key], out2[4][key])


def test_targets_and_rules_are_one_definition_for_numpy_and_torch() -> None:
    prompts = np.array([[0, 1, 2, 2], [2, 0, 0, 1]])
    for target in TARGETS:
        _same(token_targets(prompts, target, 3), token_targets(torch.from_numpy(prompts), target, 3))
    c = np.array([[True, False, True, True], [True, True, True, True]])
    for reward in REWARDS:  # step_rewards is candidate_rewards over a whole episode
        per_step = step_rewards(c, reward)
        ok = np.ones(2, dtype=bool)
        for t in range(4):
            now = candidate_rewards(c[:, t:t + 1], ok[:, None], t == 3, reward)
            _same(per_step[:, t:t + 1], now.astype(np.float32))
            _same(now, candidate_rewards(torch.from_numpy(c[:, t:t + 1]), torch.from_numpy(ok)[:, None], t == 3,
                                         reward))
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


def test_mnist_tensor_env_equals_the_numpy_env_step_for_step() -> None:
    from tpo_gym.envs.mnist_bandit import MNISTBanditTensorEnv, MNISTBanditVectorEnv

    ref, env = MNISTBanditVectorEnv(6), MNISTBanditTensorEnv(6)
    assert env.observation_space == ref.observation_space and env.fixed_horizon == 1
    rng = np.random.default_rng(1)
    for episode in range(2):
        opts = {"group_size": 3} if episode else None
        _same(ref.reset(seed=episode, options=opts)[0], env.reset(seed=episode, options=opts)[0])
        for _ in range(3):  # a step, the autoreset step, a step
            acts, cand = rng.integers(0, 10, 6), rng.integers(0, 10, (6, 4))
            _same(ref.score_candidates(cand), env.score_candidates(torch.from_numpy(cand)))
            out1, out2 = ref.step(acts), env.step(torch.from_numpy(acts))
            for x, y in zip(out1[:4], out2[:4], strict=True):
                _same(x, y)
            assert set(out1[4]) == set(out2[4])
            for key in out1[4]:
                _same(out1[4][key], out2[4][key])
    other = MNISTBanditTensorEnv(2)
    assert other._images is env._images, "one copy of the split per device"
    other.reset(seed=0)
    with pytest.raises(ValueError, match=r"in \[0, 10\)"):
        other.step(torch.tensor([3, 10]))
