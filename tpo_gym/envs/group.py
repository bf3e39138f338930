"""The group API: score K candidate actions at one state, or roll out K episodes from one context.

TPO, GRPO and the other group methods need, for one context, the scores of K candidates. tpo_gym
exposes that in three ways; this contract is relied on by :mod:`tpo_gym.agents`, stated as two
``typing.Protocol`` s (:class:`GroupEnv`, :class:`GroupVectorEnv`) and checked on any env by
:func:`tpo_gym.envs.check_group_env`.

1. **Single envs** (every ``tpo_gym/`` env; :class:`GroupEnv`)::

       env.unwrapped.score_candidates(candidates) -> np.ndarray  # float32 [K]

   the reward each of K candidate actions would receive if taken *now*, at the current state,
   without advancing, copying or mutating the env and without touching its RNG. Bandits / MNIST:
   K arms / labels (int array ``[K]``) for the current context. A ``Box`` action space: K actions, a float array
   ``[K, *action_shape]`` (a vector env: ``[N, K, *action_shape]``). Token tasks: K candidate next tokens
   at the current prefix (sequential reward: the candidate's correctness times the prefix product;
   terminal: nonzero only at the last step and only if the prefix is all correct). ReasoningGym: a
   list of K completion strings. Calling it with no episode in progress raises ``RuntimeError``.
   ``gym.make`` wraps envs, so call it on ``env.unwrapped`` (or use :func:`score_candidates`).

2. **Native vector envs** (``gym.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point")``
   for the bandits, MNIST and token tasks; :class:`GroupVectorEnv`, built on
   :class:`~tpo_gym.envs.vector.NativeVectorEnv`)::

       venv.score_candidates(candidates)  # int array [N, K] -> float32 [N, K]

   the same per sub-env, with array operations (sub-envs whose episode just ended and that wait
   for their ``NEXT_STEP`` autoreset score 0, which is what stepping them gives). And::

       venv.reset(seed=s, options={"group_size": G})

   makes sub-envs ``i*G .. (i+1)*G-1`` share one context (prompt / image / arm), for sequence-level
   methods that need K complete rollouts per prompt; new contexts after autoreset are shared the
   same way. ``N % G != 0`` (or ``G < 1``) raises ``ValueError``. The group size holds until the
   next ``reset``; a ``reset`` without the option sets it back to 1.

3. **Any other Gymnasium env**: :func:`group_rollout_envs` makes a vector env of K copies and
   :func:`group_reset` resets each group of copies with one and the same seed, so the K rollouts of a
   group start from the same context (for deterministic resets, e.g. ``CartPole-v1``, the same
   initial observation). The agents form their sequence-level groups on such envs with it.

A single env with the group API but no native vector form (your own :class:`GroupEnv`, such as
the ``GuessEnv`` of the docs) gets one from :class:`SyncGroupVectorEnv`: a ``SyncVectorEnv`` of its
copies whose ``score_candidates`` asks each copy, with the ``group_size`` reset option given by
same-seed resets. The agents roll out per-state candidates (``level="token"``) on such an env in it.

Both kinds may carry ``reward_credit`` (``"step"``, the default, or ``"episode"``) and report the
episode summary ``info["score"]`` / ``info["error"]`` (see :mod:`tpo_gym.envs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, SupportsFloat, runtime_checkable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from tpo_gym._validation import check_choice, check_int, check_seed
from tpo_gym.envs._common import MAX_NUM_ENVS

__all__ = ["GroupEnv", "GroupVectorEnv", "SyncGroupVectorEnv", "score_candidates", "group_rollout_envs",
           "group_reset"]


@runtime_checkable
class GroupEnv(Protocol):
    """A single Gymnasium env with the group API (structural: nothing to inherit).

    Besides a Gymnasium env's ``action_space`` / ``observation_space``, ``reset`` and ``step``:
    ``score_candidates(candidates) -> float32 [K]``, the reward each of K candidate actions (an array,
    or a list of strings for text actions) would get if taken now, with no side effects. Optional:
    ``reward_credit``, ``"step"`` (default) or ``"episode"``. ``isinstance(env.unwrapped, GroupEnv)``
    tells that the method is there (a runtime check sees method names only, so it cannot tell a single
    env from a vector env: ``isinstance(env, gymnasium.vector.VectorEnv)`` does);
    :func:`tpo_gym.envs.check_group_env` checks that it keeps the contract.
    """

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Start an episode; the same ``seed`` gives the same context."""
        ...

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take ``action``; its reward is what :meth:`score_candidates` said it would be."""
        ...

    def score_candidates(self, candidates: Any) -> Any:
        """Reward ``float32 [K]`` of each of K candidate actions at the current state, no side effects."""
        ...


@runtime_checkable
class GroupVectorEnv(Protocol):
    """A Gymnasium vector env with the group API (what :class:`~tpo_gym.envs.vector.NativeVectorEnv` gives).

    Besides a vector env's ``num_envs``, spaces (``observation_space == batch_space(single_observation_space,
    num_envs)``, the same for actions), ``reset`` and ``step``: ``score_candidates(int [num_envs, K]) ->
    float32 [num_envs, K]`` with no side effects, and the reset option ``{"group_size": G}`` that makes
    sub-envs ``i*G .. (i+1)*G-1`` share one context (``num_envs % G != 0`` raises ``ValueError``).
    Optional: ``reward_credit``, and a class attribute ``tensor_env`` naming its on-device form.
    """

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-env; ``options={"group_size": G}`` makes groups of G share a context."""
        ...

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """One step of every sub-env (``NEXT_STEP`` autoreset)."""
        ...

    def score_candidates(self, candidates: Any) -> Any:
        """Reward ``float32 [num_envs, K]`` of K candidate actions per sub-env, no side effects."""
        ...


class SyncGroupVectorEnv(gym.vector.SyncVectorEnv):
    """The vector form of a single group env (:class:`GroupEnv`): a ``SyncVectorEnv`` of its copies with the
    group API of vector envs (:class:`GroupVectorEnv`), for envs that have no native vector form.

    ``score_candidates(int [num_envs, K]) -> float32 [num_envs, K]`` (``[num_envs, K, *action_shape]`` for a
    ``Box``) calls each copy's ``unwrapped.score_candidates`` on its row (a copy waiting for its ``NEXT_STEP``
    autoreset scores 0, as stepping it pays). ``reset(seed=s, options={"group_size": G})`` gives sub-env ``i`` the seed
    ``s + i // G`` (``s`` drawn from the vector env's RNG when ``None``), so each group of G copies starts
    from one context when the env's context is a function of its seed (what :func:`~tpo_gym.envs.check_group_env`
    checks); the episodes that follow an autoreset are not shared. A sequence of seeds is passed as it is.
    ``num_envs % G != 0`` raises ``ValueError``; the other options go to every copy.

    :param env_fns: functions that make the copies (as for ``SyncVectorEnv``).
    :param kwargs: passed to ``SyncVectorEnv`` (``copy``, ``observation_mode``, ``autoreset_mode``).
    :raises TypeError: a copy's ``unwrapped`` env has no ``score_candidates``.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env[Any, Any]]], **kwargs: Any) -> None:
        super().__init__(env_fns, **kwargs)
        missing = sorted({type(e.unwrapped).__name__ for e in self.envs
                          if not callable(getattr(e.unwrapped, "score_candidates", None))})
        if missing:
            self.close()
            raise TypeError(f"SyncGroupVectorEnv needs envs with score_candidates (tpo_gym.envs.GroupEnv); "
                            f"{', '.join(missing)} has none")
        self.reward_credit = getattr(self.envs[0].unwrapped, "reward_credit", "step")

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every copy; ``options={"group_size": G}`` makes each group of G copies share a seed."""
        options = dict(options or {})
        group = options.pop("group_size", None)
        if group is not None:
            group = check_int("group_size", group, minimum=1)
            if self.num_envs % group:
                raise ValueError(f"group_size must divide num_envs={self.num_envs}, got {group}")
            if not isinstance(seed, (list, tuple)):
                start = int(self.np_random.integers(2**31 - 1)) if seed is None else check_int("seed", seed, 0)
                seed = [start + i // group for i in range(self.num_envs)]
        return super().reset(seed=seed, options=options or None)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Scores ``float32 [num_envs, K]`` of the candidates ``[num_envs, K, *action_shape]`` (``[num_envs, K]`` for
        Discrete actions), one row per copy."""
        candidates = np.asarray(candidates)
        if candidates.ndim < 2 or candidates.shape[0] != self.num_envs:
            raise ValueError(f"candidates must be an array [num_envs={self.num_envs}, K, *action_shape], got shape "
                             f"{candidates.shape}")
        scores = np.zeros(candidates.shape[:2], np.float32)
        waiting = self._autoreset_envs if self.autoreset_mode == AutoresetMode.NEXT_STEP else np.zeros(
            self.num_envs, np.bool_)
        for i, env in enumerate(self.envs):
            if not waiting[i]:
                scores[i] = np.asarray(env.unwrapped.score_candidates(candidates[i]), dtype=np.float32)
        return scores


def score_candidates(env: gym.Env[Any, Any] | gym.vector.VectorEnv, candidates: Any) -> np.ndarray:
    """Call ``score_candidates`` on the env under any wrappers (single or native vector env)."""
    inner = env.unwrapped
    if not isinstance(inner, (GroupEnv, GroupVectorEnv)):
        raise TypeError(
            f"{type(inner).__name__} has no score_candidates(); it is part of the tpo_gym envs and their "
            "native vector envs. For other envs use group_rollout_envs()."
        )
    return inner.score_candidates(candidates)


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


def group_reset(
    venv: gym.vector.VectorEnv, seed: int | Sequence[int], options: dict[str, Any] | None = None
) -> tuple[Any, Any]:
    """Reset the sub-envs of ``venv`` in groups that share one seed, hence one context each.

    ``seed`` an integer >= 0: every sub-env gets it (one group of ``num_envs`` rollouts). A sequence of
    G such integers (numpy integers too), with ``num_envs % G == 0``: sub-envs ``g*K .. (g+1)*K-1``,
    ``K = num_envs // G``, get ``seed[g]`` (G groups of K rollouts).
    """
    many = isinstance(seed, (list, tuple)) or (isinstance(seed, np.ndarray) and seed.ndim == 1)
    seeds = list(seed) if many else [seed]
    checked = [check_seed(s, "seed" if len(seeds) == 1 else f"seed[{g}]") for g, s in enumerate(seeds)]
    if any(s is None for s in checked):
        raise ValueError("seed must be an integer >= 0 (one seed shared by the group), got None")
    if not checked or venv.num_envs % len(checked):
        raise ValueError(f"seed must be one integer >= 0 or a sequence of G of them with num_envs={venv.num_envs} "
                         f"divisible by G, got {len(checked)} seeds")
    size = venv.num_envs // len(checked)
    return venv.reset(seed=[s for s in checked for _ in range(size)], options=options)
