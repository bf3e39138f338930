"""A user's own env as an SB3 / Gymnasium user passes it (issue 34, items 3 and 4).

Item 3: wrappers that do not record their constructor arguments (a plain ``gym.Wrapper`` subclass) are re-applied
around the rebuilt rollout envs instead of failing in ``gym.make``, a ``Monitor`` inside other wrappers keeps giving
the episode statistics, and a wrapper that cannot be re-applied fails at construction with one clear error.
Item 4: a single env with ``score_candidates`` (one that passes ``check_group_env``) trains at ``level="token"`` in
a ``SyncGroupVectorEnv`` of its copies, and ``level="auto"`` says which level it chose.
"""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor, load_results
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor

from tests.agents.lm_toys import lm_kwargs, say_letter_env
from tpo_gym import CE, GRPO, PPO, TPO
from tpo_gym.envs import check_group_env
from tpo_gym.envs.group import SyncGroupVectorEnv

TOKEN = "tpo_gym/TokenReversal-v0"
SMALL = {"policy_kwargs": {"d_model": 8, "d_ff": 16, "n_layers": 1}}


class MyWrap(gym.Wrapper):
    """The plainest user wrapper: no RecordConstructorArgs, so Gymnasium cannot re-create it from a spec."""


class Scale(gym.Wrapper):
    """A reward wrapper with a constructor argument and state, neither recorded."""

    def __init__(self, env: gym.Env[Any, Any], k: float) -> None:
        super().__init__(env)
        self.k, self.steps = k, 0

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        return obs, self.k * float(reward), terminated, truncated, info


class Locked(gym.Wrapper):
    """A wrapper that can be neither re-created nor copied (it holds a lock)."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self.lock = threading.Lock()


class GuessEnv(gym.Env):
    """The docs' example (docs/environments/your-own-task.md): name a hidden digit in one step."""

    def __init__(self) -> None:
        self.action_space = spaces.Discrete(10)
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.digit = int(self.np_random.integers(10))
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> Any:
        reward = float(action == self.digit)
        return np.zeros(1, np.float32), reward, True, False, {"score": reward, "error": 1.0 - reward}

    def score_candidates(self, candidates: Any) -> np.ndarray:
        return (np.asarray(candidates) == self.digit).astype(np.float32)


# ------------------------------------------------------------------------------------------
# item 3: wrappers and Monitor
# ------------------------------------------------------------------------------------------
def test_a_plain_user_wrapper_is_reapplied_and_trains_as_the_env_it_wraps() -> None:
    plain = TPO("MlpPolicy", "CartPole-v1", batch_size=4, seed=0)
    wrapped = TPO("MlpPolicy", MyWrap(gym.make("CartPole-v1")), batch_size=4, seed=0)
    for model in (plain, wrapped):
        model.learn(600)
    assert all(isinstance(e, MyWrap) for e in wrapped.get_rollout_env().venv.envs)
    assert wrapped.rollout_source is not None and wrapped.rollout_source.wrapper_names() == ["MyWrap"]
    assert [h["num_timesteps"] for h in wrapped.history] == [h["num_timesteps"] for h in plain.history]
    assert [e["r"] for e in wrapped.ep_info_buffer] == [e["r"] for e in plain.ep_info_buffer]


def test_a_wrapper_with_unrecorded_arguments_and_state_is_copied_into_every_rollout_env() -> None:
    env = Scale(gym.make("CartPole-v1"), k=3.0)
    env.steps = 5
    model = TPO("MlpPolicy", env, batch_size=4, seed=0)
    model.learn(100)
    batch = model.rollout_batch
    assert batch.returns.tolist() == (3.0 * batch.lengths.float()).tolist()  # the wrapper's reward is trained on
    copies = model.get_rollout_env().venv.envs
    assert all(isinstance(e, Scale) and e.k == 3.0 for e in copies)
    assert len({id(e.env) for e in copies}) == model.n_rollouts  # each copy wraps its own env
    assert env.steps == 5  # the user's env is not stepped by the rollouts


def test_a_plain_user_wrapper_around_a_token_task_trains_at_sequence_level_and_refuses_token() -> None:
    model = TPO("TransformerPolicy", MyWrap(gym.make(TOKEN)), batch_size=4, group_size=2, seed=0, **SMALL)
    assert model.level == "sequence"
    model.learn(2 * model.steps_per_iteration)
    assert len(model.history) == 2 and len(model.ep_info_buffer) == 2 * model.n_rollouts
    with pytest.raises(ValueError, match=r"level='token' needs .* this env is wrapped \(MyWrap\)"):
        TPO("TransformerPolicy", MyWrap(gym.make(TOKEN)), level="token", batch_size=4, group_size=2, **SMALL)


def test_a_monitor_inside_other_wrappers_gives_ep_info_buffer_its_statistics(tmp_path: Any) -> None:
    """SB3 reads its Monitor's "episode" info (make_vec_env puts wrapper_class outside the Monitor): here the
    Monitor sees the env's own reward, the agent trains on the doubled one."""
    env = gym.wrappers.TransformReward(Monitor(gym.make("CartPole-v1")), lambda r: 2.0 * r)
    model = TPO("MlpPolicy", env, batch_size=2, group_size=4, seed=0)
    model.learn(300)
    batch = model.rollout_batch
    last = list(model.ep_info_buffer)[-model.n_rollouts:]
    assert [e["r"] for e in last] == batch.lengths.float().tolist() == (batch.returns / 2).tolist()
    venv = make_vec_env("CartPole-v1", n_envs=2, wrapper_class=lambda e: Scale(e, k=2.0),
                        monitor_dir=str(tmp_path))  # SB3's own recipe: Monitor (with a file) inside the wrapper
    model = TPO("MlpPolicy", venv, batch_size=4, seed=0)
    model.learn(300)
    last = list(model.ep_info_buffer)[-model.n_rollouts:]
    assert [e["r"] for e in last] == (model.rollout_batch.returns / 2).tolist()


def test_an_outermost_monitor_keeps_a_token_task_native_and_fills_ep_info_buffer() -> None:
    model = TPO("TransformerPolicy", Monitor(gym.make(TOKEN)), batch_size=4, group_size=2, seed=0, **SMALL)
    assert model.level == "token" and model.get_rollout_env().native
    model.learn(model.steps_per_iteration)
    assert [e["r"] for e in model.ep_info_buffer] == model.rollout_batch.returns.tolist()


def test_the_users_own_monitor_records_every_episode_as_with_sb3(tmp_path: Any) -> None:
    """Rollouts run in copies, yet the Monitor the user passed (and its file, read by SB3's load_results) gets
    each episode, as SB3's own agents would give it."""
    env = Monitor(gym.make("CartPole-v1"), str(tmp_path / "run"))
    model = TPO("MlpPolicy", env, batch_size=2, group_size=4, seed=0)
    model.learn(300)
    # the same episodes (the Monitor in the order they ended, ep_info_buffer in rollout order)
    assert sorted(env.get_episode_rewards()) == sorted(e["r"] for e in model.ep_info_buffer)
    assert len(model.history) >= 2
    assert sum(env.get_episode_lengths()) == env.get_total_steps() == model.num_timesteps
    frame = load_results(str(tmp_path))
    assert frame["r"].tolist() == env.get_episode_rewards() and frame["l"].sum() == model.num_timesteps


def test_monitor_files_of_make_vec_env_and_vec_monitor_get_the_episodes(tmp_path: Any) -> None:
    venv = make_vec_env("CartPole-v1", n_envs=2, wrapper_class=lambda e: Scale(e, k=2.0),
                        monitor_dir=str(tmp_path / "sub"))  # a Monitor (with a file) inside the wrapper, per sub-env
    model = TPO("MlpPolicy", venv, batch_size=4, seed=0)
    model.learn(300)
    frame = load_results(str(tmp_path / "sub"))
    assert frame["l"].sum() == model.num_timesteps and (frame["r"] == frame["l"]).all()  # the Monitor's reward: 1
    monitors = [e.env for e in venv.envs]  # Scale(Monitor(CartPole))
    assert len(frame) == sum(len(m.get_episode_rewards()) for m in monitors) and all(
        m.get_episode_rewards() for m in monitors)  # the episodes go to the sub-env they ended in
    vec = VecMonitor(DummyVecEnv([lambda: gym.make("CartPole-v1")]), str(tmp_path / "vec"))
    model = TPO("MlpPolicy", vec, batch_size=4, seed=0)
    model.learn(200)
    rows = load_results(str(tmp_path))  # vec.monitor.csv
    assert len(rows) == vec.episode_count > 0 and rows["l"].sum() == model.num_timesteps


def test_a_recorded_wrapper_changed_after_construction_is_rebuilt_as_it_is_now() -> None:
    """A RecordConstructorArgs wrapper is re-created from its arguments, then given copies of the attributes the
    user changed since (its spec alone would re-create it as it was made)."""
    env = gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: 2.0 * r)
    env.func = lambda r: 5.0 * r
    model = TPO("MlpPolicy", env, batch_size=4, seed=0)
    model.learn(100)
    assert model.rollout_batch.returns.tolist() == (5.0 * model.rollout_batch.lengths.float()).tolist()
    assert all(e.func(1.0) == 5.0 for e in model.get_rollout_env().venv.envs)
    unchanged = gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: 2.0 * r)
    source = TPO("MlpPolicy", unchanged, batch_size=4).rollout_source
    assert source is not None and source.spec is not None  # unchanged: still rebuilt from its spec
    locked = gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: r)
    locked.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"cannot copy the attribute 'lock' that was changed on the wrapper "
                                        r"TransformReward after it was made"):
        TPO("MlpPolicy", locked, batch_size=4)


def test_a_dummy_vec_env_of_a_wrapped_env_works() -> None:
    model = TPO("MlpPolicy", DummyVecEnv([lambda: MyWrap(gym.make("CartPole-v1"))] * 2), batch_size=4, seed=0)
    model.learn(100)
    assert isinstance(model.get_rollout_env().venv.envs[0], MyWrap) and model.ep_info_buffer


def test_a_wrapper_that_cannot_be_copied_fails_at_construction_naming_it_and_what_to_do() -> None:
    with pytest.raises(TypeError, match=r"cannot copy the wrapper Locked: it does not record its constructor "
                                        r"arguments .*RecordConstructorArgs.* register an env id"):
        TPO("MlpPolicy", Locked(gym.make("CartPole-v1")), batch_size=4)


def test_a_subproc_vec_env_with_an_unrecorded_wrapper_is_refused_naming_it() -> None:
    venv = SubprocVecEnv([lambda: MyWrap(gym.make("CartPole-v1"))], start_method="fork")
    try:
        with pytest.raises(ValueError, match=r"the wrapper\(s\) MyWrap do not record their constructor arguments.*"
                                             r"Pass the wrapped env itself or a DummyVecEnv"):
            TPO("MlpPolicy", venv, batch_size=4)
    finally:
        venv.close()


# ------------------------------------------------------------------------------------------
# item 4: a single group env at token level, and what level="auto" chose
# ------------------------------------------------------------------------------------------
def test_a_single_env_that_passes_check_group_env_trains_at_token_level() -> None:
    check_group_env(GuessEnv())
    model = TPO("MlpPolicy", GuessEnv(), level="token", batch_size=8, group_size=4, seed=0)
    assert model.grouping is not None and model.grouping.kind == "candidates"
    venv = model.get_rollout_env().venv
    assert isinstance(venv, SyncGroupVectorEnv) and venv.num_envs == 8
    model.learn(3 * model.steps_per_iteration)
    batch = model.rollout_batch
    assert len(model.history) == 3 and batch.candidate_scores is not None
    assert batch.candidate_scores[:, :, 0].tolist() == batch.rewards.tolist()  # candidate 0 is the action taken
    digits = [e.unwrapped.digit for e in venv.envs]
    expected = (batch.candidates[:, 0] == np.asarray(digits)[:, None]).float()
    assert batch.candidate_scores[:, 0].tolist() == expected.tolist()
    CE("MlpPolicy", GuessEnv(), batch_size=8, seed=0).learn(16)  # the oracle scores every action the same way


def test_a_registered_single_group_env_without_a_vector_form_trains_at_token_level() -> None:
    gym.register("test_user_envs/Guess-v0", entry_point=GuessEnv)
    try:
        model = TPO("MlpPolicy", "test_user_envs/Guess-v0", batch_size=4, group_size=2, seed=0)
        assert model.level == "token"
        model.learn(model.steps_per_iteration)
        assert isinstance(model.get_rollout_env().venv, SyncGroupVectorEnv)
    finally:
        gym.registry.pop("test_user_envs/Guess-v0")


def test_level_auto_prints_the_level_it_chose_with_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    token = TPO("MlpPolicy", GuessEnv(), batch_size=4, group_size=2, verbose=1)
    sequence = TPO("MlpPolicy", "CartPole-v1", batch_size=4, verbose=1)
    out = capsys.readouterr().out
    assert (token.level, sequence.level) == ("token", "sequence")
    assert "Using level='token' (K candidates scored per state: GuessEnv has score_candidates)" in out
    assert "Using level='sequence' (K same-seed rollouts per context: CartPole-v1 has no score_candidates)" in out
    TPO("MlpPolicy", GuessEnv(), batch_size=4, group_size=2)
    assert "Using level" not in capsys.readouterr().out  # verbose=0 prints nothing, as SB3


def test_level_auto_is_chosen_again_for_each_env_and_an_explicit_level_is_kept() -> None:
    model = TPO("MlpPolicy", GuessEnv(), batch_size=4, group_size=2, seed=0)
    assert model.level == "token"
    model.set_env(gym.wrappers.TransformReward(GuessEnv(), lambda r: r))  # wrapped: no scoring, same spaces
    assert model.level == "sequence" and model.grouping.kind == "rollouts"
    model.learn(2 * model.steps_per_iteration)
    model.set_env(GuessEnv())
    assert model.level == "token" and model.grouping.kind == "candidates"
    fixed = TPO("MlpPolicy", GuessEnv(), level="token", batch_size=4, group_size=2)
    with pytest.raises(ValueError, match=r"this env is wrapped \(TransformReward\)"):
        fixed.set_env(gym.wrappers.TransformReward(GuessEnv(), lambda r: r))


def test_level_token_without_score_candidates_says_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"CartPole-v1 has no score_candidates method \(give its class "
                                         r"score_candidates\(candidates\) -> float32 \[K\].*level='sequence'"):
        TPO("MlpPolicy", "CartPole-v1", level="token")
    wrapped = gym.wrappers.TransformReward(GuessEnv(), lambda r: r)  # a wrapper may change rewards: no scoring
    with pytest.raises(ValueError, match=r"this env is wrapped \(TransformReward\)"):
        TPO("MlpPolicy", wrapped, level="token", batch_size=4, group_size=2)


def test_sync_group_vector_env_is_a_checked_vector_form_of_a_single_group_env() -> None:
    venv = SyncGroupVectorEnv([GuessEnv] * 4)
    check_group_env(venv)
    obs, _ = venv.reset(seed=3, options={"group_size": 2})
    digits = [e.unwrapped.digit for e in venv.envs]
    assert digits[0] == digits[1] and digits[2] == digits[3]
    with pytest.raises(ValueError, match=r"group_size must divide num_envs=4, got 3"):
        venv.reset(seed=0, options={"group_size": 3})
    with pytest.raises(TypeError, match=r"needs envs with score_candidates .*CartPoleEnv has none"):
        SyncGroupVectorEnv([lambda: gym.make("CartPole-v1")])


# ------------------------------------------------------------------------------------------
# envs made with a render_mode, and SB3's make_vec_env of them
# ------------------------------------------------------------------------------------------
RENDERED = [("tpo_gym/Bandit-v0", {"n_arms": 4}), ("tpo_gym/ContextualBandit-v0", {"n_contexts": 5, "n_arms": 3}),
            ("tpo_gym/TokenTask-v0", {"length": 3}), ("tpo_gym/MNISTBandit-v0", {})]


@pytest.mark.parametrize("cls", [TPO, PPO])
@pytest.mark.parametrize(("env_id", "kwargs"), RENDERED)
def test_agents_train_on_a_tpo_gym_env_made_with_a_render_mode(cls: type, env_id: str, kwargs: dict[str, Any]) -> None:
    for mode in ("ansi", "rgb_array"):
        model = cls("MlpPolicy", gym.make(env_id, render_mode=mode, **kwargs), batch_size=4, seed=0)
        model.learn(model.steps_per_iteration)
        assert len(model.history) == 1


@pytest.mark.parametrize("cls", [TPO, GRPO])
def test_agents_train_on_make_vec_env_of_a_tpo_gym_env_with_a_render_mode(cls: type) -> None:
    for env_id, kwargs in RENDERED[:3]:
        venv = make_vec_env(env_id, n_envs=2, env_kwargs={"render_mode": "rgb_array", **kwargs})
        model = cls("MlpPolicy", venv, batch_size=4, group_size=2, seed=0)
        model.learn(model.steps_per_iteration)
        assert model.get_rollout_env().native and len(model.history) == 1


def test_a_text_env_made_with_a_render_mode_trains() -> None:
    env = gym.make("tpo_gym/ReasoningGym-v0", dataset="gcd", size=10, seed=0, render_mode="ansi")
    model = TPO("CausalLMPolicy", env, policy_kwargs=lm_kwargs(), batch_size=2, group_size=2, seed=0)
    model.learn(model.steps_per_iteration)
    assert len(model.history) == 1


# ------------------------------------------------------------------------------------------
# sequence-level groups score the rewards of the user's reward wrappers
# ------------------------------------------------------------------------------------------
class OneMinus(gym.RewardWrapper):
    def reward(self, reward: float) -> float:
        return 1.0 - reward


class Identity(gym.RewardWrapper):
    def reward(self, reward: float) -> float:
        return reward


class NaNReward(gym.RewardWrapper):
    def reward(self, reward: float) -> float:
        return float("nan")


def _trained_params(cls: type, env: gym.Env[Any, Any]) -> torch.Tensor:
    model = cls("MlpPolicy", env, batch_size=4, group_size=4, seed=0)
    assert model.level == "sequence"
    model.learn(2 * model.steps_per_iteration)
    return torch.cat([p.detach().flatten() for p in model.policy.parameters()])


@pytest.mark.parametrize("cls", [TPO, GRPO])
def test_sequence_level_groups_train_on_the_rewards_of_a_reward_wrapper(cls: type) -> None:
    def bandit() -> gym.Env[Any, Any]:
        return gym.make("tpo_gym/Bandit-v0", n_arms=4, correct_arm=1)

    flipped, same = _trained_params(cls, OneMinus(bandit())), _trained_params(cls, Identity(bandit()))
    assert not torch.equal(flipped, same)
    assert torch.equal(same, _trained_params(cls, MyWrap(bandit())))  # an identity wrapper trains as none
    with pytest.raises(ValueError, match=r"rewards of rollout 0 sum to nan \(after the wrapper\(s\) NaNReward\); "
                                         r"group methods need finite rewards"):
        _trained_params(cls, NaNReward(bandit()))


def test_a_token_task_in_a_reward_wrapper_is_scored_by_the_wrapped_rewards() -> None:
    model = TPO("TransformerPolicy", OneMinus(gym.make(TOKEN, length=3)), batch_size=4, group_size=2, seed=0, **SMALL)
    model.learn(model.steps_per_iteration)
    batch = model.rollout_batch
    scores, _ = model.group_scores(batch)
    assert scores.flatten().tolist() == (batch.returns / 3).tolist()


def test_a_reward_wrapper_around_a_text_env_is_refused_naming_it() -> None:
    model = TPO("CausalLMPolicy", OneMinus(say_letter_env()), policy_kwargs=lm_kwargs(), batch_size=2, group_size=2)
    with pytest.raises(ValueError, match=r"scores a text env's completions with its score_candidates, which the "
                                         r"wrapper\(s\) OneMinus around it cannot change"):
        model.learn(model.steps_per_iteration)
