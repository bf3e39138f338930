"""The token tasks' rules as pure functions: the target of a prompt, the three reward rules, the paper's episode
summary, and the check of a task's arguments. Re-exported by :mod:`tpo_gym.envs.token_task`, whose envs (single,
native vector, on-device tensor) all call them."""

from __future__ import annotations

from typing import Any

import numpy as np

from tpo_gym._validation import check_choice
from tpo_gym.envs._common import MAX_LENGTH, MAX_VOCAB, check_size

TARGETS = ("copy", "flip", "reverse_copy", "reverse_flip")
REWARDS = ("bag", "sequential", "terminal")


def _is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (checked without importing torch)."""
    return type(x).__module__.split(".")[0] == "torch"


def token_targets(prompts: Any, target: str, vocab_size: int) -> Any:
    """The tokens the policy must write for each prompt: ``int64``, same shape as ``prompts``.

    ``prompts`` has shape ``[..., H]``. copy: ``x``; flip: ``V - 1 - x``; reverse_copy: ``x`` reversed
    along the last axis; reverse_flip: ``V - 1 - x`` reversed. A pure function (no env needed); a
    torch tensor gives a tensor on its device, anything else a numpy array.
    """
    check_choice("target", target, TARGETS)
    tensor = _is_tensor(prompts)
    x = prompts.long() if tensor else np.asarray(prompts, dtype=np.int64)
    if target in ("flip", "reverse_flip"):
        x = vocab_size - 1 - x
    if target.startswith("reverse"):
        x = x.flip(-1) if tensor else x[..., ::-1]
    return x.contiguous() if tensor else np.ascontiguousarray(x)


def candidate_rewards(correct: Any, prefix_ok: Any, at_last: Any, reward: str) -> Any:
    r"""Which tokens earn reward 1 if written now: **the** definition of the three reward rules.

    .. math::
        \text{bag: } r = c, \qquad \text{sequential: } r = c \wedge p, \qquad
        \text{terminal: } r = c \wedge p \wedge \ell

    with ``c`` = the token is correct at this position, ``p`` = every earlier token of the episode was
    correct, ``\ell`` = this is the last position (H - 1). Bool in, bool out, broadcasting, on numpy
    arrays and torch tensors alike: every token env (single, native vector, on-device tensor) and
    :func:`step_rewards` call it, so the rules live here only.

    :param correct: bool ``[..., K]`` correctness of each candidate.
    :param prefix_ok: bool broadcastable to ``correct`` (``p``).
    :param at_last: bool broadcastable to ``correct`` (``\ell``): a Python bool or an array.
    :param reward: ``"bag"``, ``"sequential"`` or ``"terminal"``.
    """
    if reward == "bag":
        return correct
    ok = correct & prefix_ok
    return ok & at_last if reward == "terminal" else ok


def step_rewards(correct: np.ndarray, reward: str) -> np.ndarray:
    """Per-step rewards ``float32 [..., H]`` from the correctness ``c_t`` of a whole episode.

    bag: ``r_t = c_t``; sequential: ``r_t = prod_{j<=t} c_j``; terminal: ``r_t = 0`` for ``t < H-1``
    and ``r_{H-1} = 1{all correct}`` (:func:`candidate_rewards` at every position). A pure function,
    handy for tests and for sequence scoring.
    """
    check_choice("reward", reward, REWARDS)
    c = np.asarray(correct).astype(bool)
    prefix = np.logical_and.accumulate(c, axis=-1)
    before = np.concatenate([np.ones(c.shape[:-1] + (1,), dtype=bool), prefix[..., :-1]], axis=-1)
    last = np.zeros(c.shape[-1], dtype=bool)
    last[-1:] = True
    return candidate_rewards(c, before, last, reward).astype(np.float32)


def _check_token_kwargs(target: str, reward: str, vocab_size: int, length: int) -> tuple[str, str, int, int]:
    return (
        check_choice("target", target, TARGETS),
        check_choice("reward", reward, REWARDS),
        check_size(
            "vocab_size",
            vocab_size,
            2,
            MAX_VOCAB,
            "prompts are drawn 62 bits at a time and the observation space MultiDiscrete([V+1]*2H) is int64",
        ),
        check_size(
            "length", length, 1, MAX_LENGTH, "the observation holds 2H int64 tokens and every step returns a copy"
        ),
    )


def reward_credit_of(reward: str) -> str:
    """``"episode"`` for the terminal reward (``r_t = 1{all correct}`` belongs to every position), else ``"step"``."""
    return "episode" if check_choice("reward", reward, REWARDS) == "terminal" else "step"


def episode_summary(n_correct: np.ndarray, prefix_len: np.ndarray, length: int, reward: str) -> tuple[Any, Any]:
    """The paper's ``(score, error)`` of finished episodes, float64, from their correctness counts.

    ``n_correct``: correct tokens; ``prefix_len``: length of the all-correct prefix. bag: score =
    return / H = ``n_correct / H``; sequential: score = return / H = ``prefix_len / H``; both with
    error = token error ``1 - n_correct / H``. terminal: score = exact match (0/1), error =
    ``1 - exact match``. numpy arrays or torch tensors (then tensors, float64).
    """

    def f64(x: Any) -> Any:
        return x.double() if _is_tensor(x) else np.asarray(x, dtype=np.float64)

    n_correct = f64(n_correct)
    if reward == "terminal":
        score = f64(n_correct == length)
        return score, 1.0 - score
    token_error = 1.0 - n_correct / length
    if reward == "bag":
        return n_correct / length, token_error
    return f64(prefix_len) / length, token_error

