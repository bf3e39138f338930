"""The group API: score K candidate actions at one state, or roll out K episodes from one context.

TPO, GRPO and the other group methods need, for one context, the scores of K candidates. tpo_gym
exposes that in three ways; this contract is relied on by :mod:`tpo_gym.agents`.

1. **Single envs** (every ``tpo_gym/`` env)::

       env.unwrapped.score_candidates(candidates) -> np.ndarray  # float32 [K]

   the reward each of K candidate actions would receive if taken *now*, at the current state,
   without advancing, copying or mutating the env and without touching its RNG. Bandits / MNIST:
   K arms / labels (int array ``[K]``) for the current context. Token tasks: K candidate next tokens
   at the current prefix (sequential reward: the candidate's correctness times the prefix product;
   terminal: nonzero only at the last step and only if the prefix is all correct). ReasoningGym: a
   list of K completion strings. Calling it with no episode in progress raises ``RuntimeError``.
   ``gym.make`` wraps envs, so call it on ``env.unwrapped`` (or use :func:`score_candidates`).

2. **Native vector envs** (``gym.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point")``
   for the bandits, MNIST and token tasks)::

       venv.score_candidates(candidates)  # int array [N, K] -> float32 [N, K]

   the same per sub-env, with array operations (sub-envs whose episode just ended and that wait
   for their ``NEXT_STEP`` autoreset score 0, which is what stepping them gives). And::

       venv.reset(seed=s, options={"group_size": G})

   makes sub-envs ``i*G .. (i+1)*G-1`` share one context (prompt / image / arm), for sequence-level
   methods that need K complete rollouts per prompt; new contexts after autoreset are shared the
   same way. ``N % G != 0`` (or ``G < 1``) raises ``ValueError``. The group size holds until the
   next ``reset``; a ``reset`` without the option sets it back to 1.

3. **Any other Gymnasium env**: :func:`group_rollout_envs` makes a vector env of K copies reset with
   one and the same seed, so the K rollouts start from the same context (for deterministic
   resets, e.g. ``CartPole-v1``, the same initial observation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from tpo_gym._validation import check_choice, check_int, check_seed
from tpo_gym.envs._common import MAX_NUM_ENVS

__all__ = ["score_candidates", "group_rollout_envs", "group_reset"]


def score_candidates(env: gym.Env[Any, Any] | gym.vector.VectorEnv, candidates: Any) -> np.ndarray:
    """Call ``score_candidates`` on the env under any wrappers (single or native vector env)."""
    inner = env.unwrapped
    fn = getattr(inner, "score_candidates", None)
    if fn is None:
        raise TypeError(
            f"{type(inner).__name__} has no score_candidates(); it is part of the tpo_gym envs and their "
            "native vector envs. For other envs use group_rollout_envs()."
        )
    return fn(candidates)


def group_rollout_envs(
    env_id_or_fn: str | Callable[[], gym.Env[Any, Any]],
    group_size: int,
    vectorization_mode: str = "sync",
    **make_kwargs: Any,
) -> gym.vector.VectorEnv:
    """A vector env of ``group_size`` copies of one env, meant to be reset with one shared seed.

    Reset it with :func:`group_reset` (or ``venv.reset(seed=[s] * group_size)``): every copy then
    starts from the context that seed gives, and the K rollouts form one group. Works for any
    Gymnasium env id or env factory; ``vectorization_mode`` is "sync" (default) or "async".
    """
    group_size = check_int("group_size", group_size, minimum=1, maximum=MAX_NUM_ENVS)
    check_choice("vectorization_mode", vectorization_mode, ("sync", "async"))
    if isinstance(env_id_or_fn, str):
        return gym.make_vec(env_id_or_fn, num_envs=group_size, vectorization_mode=vectorization_mode, **make_kwargs)
    if make_kwargs:
        raise ValueError("make_kwargs are only used with an env id; bind them in the env factory instead")
    fns = [env_id_or_fn] * group_size
    cls = gym.vector.SyncVectorEnv if vectorization_mode == "sync" else gym.vector.AsyncVectorEnv
    return cls(fns)


def group_reset(venv: gym.vector.VectorEnv, seed: int, options: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """Reset every sub-env of ``venv`` with the same ``seed`` (an integer >= 0): one context, ``num_envs`` rollouts."""
    s = check_seed(seed)
    if s is None:
        raise ValueError("seed must be an integer >= 0 (one seed shared by the group), got None")
    return venv.reset(seed=[s] * venv.num_envs, options=options)
