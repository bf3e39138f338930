"""Native vector envs under ``autoreset_mode=SAME_STEP`` (as ``SyncVectorEnv``), and the single envs' render modes
(``"ansi"`` / ``"rgb_array"``: SB3's ``make_vec_env`` builds them without a warning, Gymnasium's render checks pass)."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import load_env_creator
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector import AutoresetMode

from tests.envs.conftest import NATIVE_IDS, fast_kwargs
from tpo_gym.envs import NativeVectorEnv
from tpo_gym.envs.bandit import BanditEnv, BanditVectorEnv
from tpo_gym.envs.mnist_bandit import MNISTBanditEnv, MNISTBanditVectorEnv
from tpo_gym.envs.token_task import TokenTaskEnv, TokenTaskVectorEnv, token_targets

SAME = AutoresetMode.SAME_STEP


def _native(env_id: str, n: int, mode: Any = SAME, **kw: Any) -> Any:
    return gym.make_vec(env_id, n, vectorization_mode="vector_entry_point", autoreset_mode=mode, **kw)


def _run(venv: Any, seed: int, actions: list[np.ndarray]) -> list[Any]:
    """Every result of a reset and one step per action, kept to the end (catches returned arrays reused later)."""
    out = [venv.reset(seed=seed)]
    out += [venv.step(a) for a in actions]
    return out


# -- autoreset_mode=SAME_STEP ------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_same_step_equals_sync_vector_env_same_step(env_id: str) -> None:
    """Same seeds and actions: the reset observations, rewards, flags, final_obs and final_info of
    ``SyncVectorEnv(autoreset_mode=SAME_STEP)``, value for value and dtype for dtype."""
    kw, n = fast_kwargs(env_id), 4
    native = _native(env_id, n, **kw)
    sync = gym.make_vec(env_id, n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": SAME}, **kw)
    assert native.metadata["autoreset_mode"] is SAME is sync.metadata["autoreset_mode"]
    sync.action_space.seed(5)
    actions = [sync.action_space.sample() for _ in range(23)]
    got, want = _run(native, 5, actions), _run(sync, 5, actions)
    ends = 0
    for t, (a, b) in enumerate(zip(got, want, strict=True)):
        assert data_equivalence(a, b, exact=True), f"call {t}: {a} != {b}"
        if t and b[2].any():
            ends += 1
            np.testing.assert_array_equal(a[4]["_final_obs"], b[2] | b[3])
            assert set(a[4]) >= {"final_obs", "_final_obs", "final_info", "_final_info"}
            assert "score" in a[4]["final_info"] and "score" not in a[4]
    assert ends >= 2


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, "SameStep"])
def test_a_one_step_bandit_takes_a_real_step_on_every_call(mode: Any) -> None:
    """SAME_STEP: N pulls per call (NEXT_STEP wastes every other call on resets); the new episode is ready at once."""
    n, calls = 8, 10
    for env_id, kw in (("tpo_gym/Bandit-v0", {"n_arms": 5, "correct_arm": 2}), ("tpo_gym/MNISTBandit-v0", {})):
        pulls = {}
        for m in (mode, AutoresetMode.NEXT_STEP):
            venv = _native(env_id, n, m, **kw)
            venv.reset(seed=0)
            done = 0
            for _ in range(calls):
                if env_id == "tpo_gym/Bandit-v0":
                    cand = np.full((n, 1), 2)
                    assert m is AutoresetMode.NEXT_STEP or venv.score_candidates(cand).all()
                    _, rewards, terminated, _, info = venv.step(np.full(n, 2))
                    assert rewards.sum() == terminated.sum()  # every real pull pays 1
                else:
                    _, _, terminated, _, info = venv.step(np.zeros(n, np.int64))
                done += int(terminated.sum())
            pulls[m if isinstance(m, AutoresetMode) else AutoresetMode(m)] = done
        assert pulls == {AutoresetMode.SAME_STEP: n * calls, AutoresetMode.NEXT_STEP: n * calls // 2}, env_id


def test_same_step_keeps_groups_and_draws_the_next_step_contexts() -> None:
    """group_size under SAME_STEP: the new prompts (shared within each group) are the ones NEXT_STEP draws a step
    later, and score_candidates scores them straight away."""
    n, g, h = 6, 3, 3
    kw = {"target": "copy", "vocab_size": 4, "length": h}
    same, nxt = TokenTaskVectorEnv(n, autoreset_mode=SAME, **kw), TokenTaskVectorEnv(n, **kw)
    opts = {"group_size": g}
    np.testing.assert_array_equal(same.reset(seed=2, options=opts)[0], nxt.reset(seed=2, options=opts)[0])
    for _ in range(2):  # two episodes
        first = same.prompts
        for t in range(h):
            obs_s, r_s, term_s, _, info_s = same.step(first[:, t])
            obs_n, r_n, term_n, _, info_n = nxt.step(first[:, t])
            np.testing.assert_array_equal(r_s, r_n)
            np.testing.assert_array_equal(term_s, term_n)
        assert term_s.all() and r_s.all()
        np.testing.assert_array_equal(np.stack(info_s["final_obs"].tolist()), obs_n)  # the last observation
        assert data_equivalence(info_s["final_info"], info_n, exact=True)
        obs_n = nxt.step(np.zeros(n, np.int64))[0]  # NEXT_STEP's reset call
        np.testing.assert_array_equal(obs_s, obs_n)
        prompts = same.prompts.reshape(n // g, g, h)
        assert (prompts == prompts[:, :1]).all() and not np.array_equal(prompts.reshape(n, h), first)
        targets = token_targets(same.prompts, "copy", 4)[:, :1]
        np.testing.assert_array_equal(same.score_candidates(targets), 1)  # no sub-env waits for a reset


def test_next_step_stays_the_default_and_metadata_is_per_instance() -> None:
    default = gym.make_vec("tpo_gym/TokenReversal-v0", 2, vectorization_mode="vector_entry_point")
    same = _native("tpo_gym/TokenReversal-v0", 2)
    assert default.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP is default.autoreset_mode
    assert same.metadata["autoreset_mode"] is SAME is same.autoreset_mode
    assert TokenTaskVectorEnv.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP  # the class is untouched
    again = gym.make_vec(same.spec)  # the spec records the mode
    assert again.metadata["autoreset_mode"] is SAME


class _NextStepOnly(NativeVectorEnv):
    """A subclass that does not list SAME_STEP (its step would not apply it)."""

    def __init__(self, num_envs: int = 1, autoreset_mode: Any = AutoresetMode.NEXT_STEP) -> None:
        super().__init__(num_envs, autoreset_mode)


def test_unsupported_autoreset_modes_raise_naming_the_mode_and_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"BanditVectorEnv supports autoreset_mode .*'NextStep'.*'SameStep'.*DISABLED"):
        BanditVectorEnv(2, autoreset_mode=AutoresetMode.DISABLED)
    with pytest.raises(ValueError, match=r"autoreset_mode must be .*'NextStep'.*'SameStep'.*, got 'same_step'"):
        _native("tpo_gym/Bandit-v0", 2, "same_step")
    with pytest.raises(ValueError, match=r"got \['SameStep'\]"):
        MNISTBanditVectorEnv(2, autoreset_mode=["SameStep"])
    only_next = r"_NextStepOnly supports autoreset_mode AutoresetMode.NEXT_STEP \('NextStep'\), got .*SAME_STEP"
    with pytest.raises(ValueError, match=only_next):
        _NextStepOnly(2, autoreset_mode="SameStep")
    for env_id in NATIVE_IDS:  # the on-device forms keep NEXT_STEP
        spec = gym.spec(env_id)
        tensor_env = load_env_creator(spec.vector_entry_point).tensor_env
        if tensor_env is not None:
            assert tensor_env(2, **spec.kwargs).metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
            with pytest.raises(ValueError, match=r"TensorEnv supports autoreset_mode .*NEXT_STEP.*got .*SAME_STEP "
                                                 r"\(the on-device forms"):
                tensor_env(2, autoreset_mode="SameStep", **spec.kwargs)


# -- render modes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_sb3_make_vec_env_builds_every_env_without_a_warning(env_id: str) -> None:
    from stable_baselines3.common.env_util import make_vec_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        venv = make_vec_env(env_id, n_envs=2, env_kwargs=fast_kwargs(env_id))
        venv.reset()
        frames = venv.get_images()
    assert [str(w.message) for w in caught] == []
    assert venv.get_attr("render_mode") == ["rgb_array"] * 2
    assert all(f.dtype == np.uint8 and f.ndim == 3 and f.shape[2] == 3 for f in frames)
    venv.close()


@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_native_vector_and_tensor_envs_take_the_render_mode_of_their_single_env(env_id: str) -> None:
    """An env made with a render_mode carries it in its spec, which the vector forms are built from (Gymnasium's
    make_vec, an agent's rollouts): they take it, keep it, and say they do not render."""
    spec = gym.make(env_id, render_mode="ansi", **fast_kwargs(env_id)).spec
    venv = gym.make_vec(spec, 2, vectorization_mode="vector_entry_point")
    assert venv.render_mode == "ansi"
    venv.reset(seed=0)
    with pytest.raises(NotImplementedError, match=r"does not render \(its render_mode 'ansi' is only recorded\); "
                                                  r"render a single env"):
        venv.render()
    tensor_env = load_env_creator(spec.vector_entry_point).tensor_env
    if tensor_env is not None:
        assert tensor_env(2, **spec.kwargs).render_mode == "ansi"
    with pytest.raises(ValueError, match=r"render_mode must be None or one of \['ansi', 'rgb_array'\], got 'human'"):
        gym.make_vec(env_id, 2, vectorization_mode="vector_entry_point", render_mode="human", **fast_kwargs(env_id))


@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_gymnasium_checker_passes_with_its_render_checks(env_id: str) -> None:
    """``check_env`` with the render checks: every declared mode, made from the spec, renders what it should."""
    assert gym.spec(env_id).entry_point is not None
    for mode in (None, "ansi", "rgb_array"):
        env = gym.make(env_id, render_mode=mode, **fast_kwargs(env_id))
        assert env.metadata["render_modes"] == ["ansi", "rgb_array"] and env.metadata["render_fps"] > 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
        assert [str(w.message) for w in caught] == []
        env.close()


def test_token_task_renders_the_prompt_and_the_written_tokens() -> None:
    env = TokenTaskEnv(target="copy", vocab_size=3, length=4, render_mode="ansi")
    env.reset(options={"prompt": [2, 0, 1, 2]})
    assert env.render() == "prompt : 2 0 1 2\nwritten: _ _ _ _\n"
    env.step(2)
    env.step(1)
    assert env.render() == "prompt : 2 0 1 2\nwritten: 2 1 _ _\n"
    wide = TokenTaskEnv(vocab_size=12, length=2, render_mode="ansi")
    wide.reset(options={"prompt": [11, 3]})
    assert wide.render() == "prompt : 11  3\nwritten:  _  _\n"
    pic = TokenTaskEnv(target="copy", vocab_size=3, length=4, render_mode="rgb_array")
    pic.reset(options={"prompt": [2, 0, 1, 2]})
    pic.step(0)
    frame = pic.render()
    assert frame.shape == (16, 32, 3) and frame.dtype == np.uint8
    cells = frame[::8, ::8]  # one pixel per token: the prompt row, then the written row
    np.testing.assert_array_equal(cells[0, :, 0], [255, 0, 128, 255])  # gray from 0 (black) to V-1 (white)
    np.testing.assert_array_equal(cells[1, 0], [0, 0, 0])
    assert (cells[1, 1:] == cells[1, 1]).all() and cells[1, 1, 2] > cells[1, 1, 0]  # unwritten: blue
    assert (frame[:8, :8] == 255).all()  # a whole 8x8 cell


def test_mnist_renders_the_image_and_after_the_guess_the_label() -> None:
    env = MNISTBanditEnv(render_mode="rgb_array")
    assert (env.render() == 0).all()  # before the first reset: black
    obs, _ = env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (28, 28, 3) and frame.dtype == np.uint8
    np.testing.assert_array_equal(frame[..., 1], np.round(obs.reshape(28, 28) * 255))
    env.step(0)
    np.testing.assert_array_equal(env.render(), frame)  # the last episode's image stays
    text_env = MNISTBanditEnv(render_mode="ansi")
    assert text_env.render().endswith("no image yet (call reset())\n")
    text_env.reset(seed=0)
    lines = text_env.render().splitlines()
    assert len(lines) == 29 and all(len(line) == 28 for line in lines[:28])
    assert lines[28] == f"train image {text_env.index}: awaiting a guess"
    assert "@" in "".join(lines[:28])
    index = text_env.index
    label = text_env.step(3)[4]["label"]
    assert text_env.render().splitlines()[28] == (
        f"train image {index}: guessed 3, label {label}, reward {float(label == 3)}")


def test_bandits_render_the_pull() -> None:
    env = BanditEnv(n_arms=4, correct_arm=1, render_mode="ansi")
    env.reset(seed=0)
    assert env.render() == "bandit of 4 arms: awaiting a pull\n"
    env.step(1)
    assert env.render() == "bandit of 4 arms: pulled arm 1, reward 1.0\n"
    ctx = gym.make("tpo_gym/ContextualBandit-v0", n_contexts=5, n_arms=3, render_mode="ansi")
    ctx.reset(seed=0)
    c = ctx.unwrapped.context
    assert ctx.render() == f"context {c} of 5, 3 arms: awaiting a pull\n"
    wrong = (int(ctx.unwrapped.correct_arms[c]) + 1) % 3
    ctx.step(wrong)
    assert ctx.render() == f"context {c} of 5, 3 arms: pulled arm {wrong}, reward 0.0\n"
    tile = BanditEnv(n_arms=4, correct_arm=1, render_mode="rgb_array")
    colors = []
    for arm in (1, 2):
        tile.reset()
        colors.append(tuple(tile.render()[0, 0]))
        tile.step(arm)
        frame = tile.render()
        assert frame.shape == (32, 32, 3) and frame.dtype == np.uint8 and (frame == frame[0, 0]).all()
        colors.append(tuple(frame[0, 0]))
    gray, green, _, red = colors
    assert colors[0] == colors[2] == gray and gray[0] == gray[1] == gray[2]
    assert green[1] > green[0] and red[0] > red[1]


def test_render_mode_is_checked_and_none_renders_nothing() -> None:
    for make in (TokenTaskEnv, MNISTBanditEnv, BanditEnv):
        with pytest.raises(ValueError, match=r"render_mode must be None or one of \['ansi', 'rgb_array'\], "
                                             r"got 'human'"):
            make(render_mode="human")
    env = TokenTaskEnv()
    env.reset(seed=0)
    with pytest.warns(UserWarning, match="without specifying any render mode"):
        assert env.render() is None


def test_check_group_env_reads_the_summary_from_final_info_under_same_step() -> None:
    """Under SAME_STEP the ended episodes' score / error are in info["final_info"]: checked, no warning."""
    from tpo_gym.envs import check_group_env

    venv = gym.make_vec("tpo_gym/Bandit-v0", 4, vectorization_mode="vector_entry_point", autoreset_mode="SameStep")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_group_env(venv)


def test_an_agent_takes_a_same_step_vector_env() -> None:
    """The agent rebuilds its rollouts from the spec without the vector-only autoreset_mode."""
    from tpo_gym import TPO

    venv = gym.make_vec("tpo_gym/Bandit-v0", 4, vectorization_mode="vector_entry_point", autoreset_mode="SameStep")
    model = TPO("MlpPolicy", venv, batch_size=4, seed=0)
    model.learn(model.steps_per_iteration)
    assert len(model.history) == 1 and np.isfinite(model.history[0]["loss"])
