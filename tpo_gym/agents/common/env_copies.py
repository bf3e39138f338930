"""How an agent makes copies of the env it was given, and whether those copies can score candidates.

:func:`rebuild_plan` decides how a passed env is rebuilt (its inner part from the spec, the user's
wrappers re-applied around each copy); :func:`group_api_available` / :func:`single_group_api_available`
decide whether the rollouts of a :class:`RolloutSource` score candidates in a
native vector env or in a :class:`~tpo_gym.envs.group.SyncGroupVectorEnv` of copies.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, load_env_creator

from tpo_gym.envs.group import GroupVectorEnv

#: Longest episode a probe of a native env may run before it is declared not fixed-length.
_MAX_PROBE_STEPS = 100_000

__all__ = ["RolloutSource", "rebuild_plan", "wrapper_levels", "reward_wrappers", "copy_factory", "group_api_available",
           "single_group_api_available", "scoring_available"]


def _is_monitor(env: Any) -> bool:
    from stable_baselines3.common.monitor import Monitor

    return isinstance(env, Monitor)


def rebuild_plan(env: gym.Env[Any, Any]) -> tuple[EnvSpec | None, list[gym.Wrapper[Any, Any, Any, Any]]]:
    """How copies of ``env`` are made: the spec of its inner part and the wrappers to re-apply around it.

    Going inwards from ``env``, the first level whose spec re-creates every wrapper it lists (each records its
    constructor arguments, ``gymnasium.utils.RecordConstructorArgs``, and none has had an attribute changed since it
    was made) is rebuilt from that spec; the wrappers
    outside it (outermost first) are re-applied around each copy (:func:`_rewrap_factory`). Without a spec
    every wrapper is re-applied around deep copies of ``env.unwrapped`` (spec ``None``). Outermost SB3
    ``Monitor`` s are dropped (they only record, and the rollouts give the episodes as they do); one inside
    other wrappers is re-applied, so its ``"episode"`` entries are the statistics SB3 would report. Either way
    the user's own ``Monitor`` objects get the episodes after each rollout
    (:func:`~tpo_gym.agents.common.sb3_conventions.record_in_monitors`).
    """
    outer: list[gym.Wrapper[Any, Any, Any, Any]] = []
    level: Any = env
    while True:
        spec = getattr(level, "spec", None)
        if (spec is not None and all(w.kwargs is not None for w in spec.additional_wrappers)
                and not any(_changed_since_made(w) for w in wrapper_levels(level)[:len(spec.additional_wrappers)])):
            base = spec
            break
        if not isinstance(level, gym.Wrapper):
            base = None if spec is None else dataclasses.replace(spec, additional_wrappers=())
            break
        outer.append(level)
        level = level.env
    while outer and _is_monitor(outer[0]):
        outer.pop(0)
    return base, outer


def wrapper_levels(env: Any) -> list[Any]:
    """``env`` and every env it wraps, outermost first (down to ``env.unwrapped``)."""
    levels = [env]
    while isinstance(levels[-1], gym.Wrapper):
        levels.append(levels[-1].env)
    return levels


def _keeps_rewards(wrapper: Any) -> bool:
    """Whether ``wrapper`` gives its env's rewards unchanged: it is no ``RewardWrapper`` and either does not override
    ``step`` or is one of the wrappers that only limit, check, record or change observations / actions."""
    from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, RecordEpisodeStatistics, TimeLimit
    from stable_baselines3.common.monitor import Monitor

    if isinstance(wrapper, gym.RewardWrapper):
        return False
    keepers = (TimeLimit, OrderEnforcing, PassiveEnvChecker, RecordEpisodeStatistics, Monitor, gym.ObservationWrapper,
               gym.ActionWrapper)
    return isinstance(wrapper, keepers) or type(wrapper).step is gym.Wrapper.step


def reward_wrappers(env: Any) -> list[str]:
    """Names of the wrappers around ``env`` (outermost first) that may change its rewards.

    A ``gymnasium.RewardWrapper``, or any wrapper whose class overrides ``step`` other than Gymnasium's
    ``TimeLimit``, ``OrderEnforcing``, ``PassiveEnvChecker``, ``RecordEpisodeStatistics``, SB3's ``Monitor`` and
    observation / action wrappers. The env's own ``info["score"]`` and its ``score_candidates`` do not see what
    such a wrapper does to the rewards.
    """
    return [type(w).__name__ for w in wrapper_levels(env)[:-1] if not _keeps_rewards(w)]


def _rewrap(wrapper: Any, inner: gym.Env[Any, Any], memo: dict[int, Any], who: str) -> gym.Env[Any, Any]:
    """``wrapper`` re-applied around ``inner``: re-created from its recorded constructor arguments (with deep copies
    of the attributes changed since it was made, :func:`_keep_changed_attributes`), an SB3 ``Monitor`` re-created
    without a file, any other wrapper deep-copied with ``inner`` in place of its env."""
    from gymnasium.utils import RecordConstructorArgs
    from stable_baselines3.common.monitor import Monitor

    if isinstance(wrapper, Monitor):
        return Monitor(inner, allow_early_resets=True, reset_keywords=wrapper.reset_keywords,
                       info_keywords=wrapper.info_keywords)
    name = type(wrapper).__name__
    if isinstance(wrapper, RecordConstructorArgs):
        kwargs = {k: v for k, v in wrapper._saved_kwargs.items() if k != "env"}
        rebuilt = type(wrapper)(env=inner, **kwargs)
        _keep_changed_attributes(wrapper, rebuilt, memo, who)
        return rebuilt
    try:
        copied = copy.deepcopy(wrapper, dict(memo))
    except Exception as exc:
        raise TypeError(
            f"{who} rolls out in its own copies of the env, and cannot copy the wrapper {name}: it does not record "
            f"its constructor arguments (gymnasium.utils.RecordConstructorArgs) and copy.deepcopy failed "
            f"({type(exc).__name__}: {exc}). Make {name} inherit gymnasium.utils.RecordConstructorArgs (calling "
            f"RecordConstructorArgs.__init__(self, **its arguments) in __init__), make it deep-copyable, or register "
            "an env id whose entry point builds the wrapped env (gymnasium.register) and pass the id"
        ) from exc
    if getattr(copied, "env", None) is not inner:
        raise TypeError(f"{who} could not copy the wrapper {name} around a new env (its copy does not wrap it); "
                        f"make {name} inherit gymnasium.utils.RecordConstructorArgs")
    copied._cached_spec = None
    return copied


#: Attributes of a wrapper that are its plumbing, not its settings: never carried over to a rebuilt copy.
_WRAPPER_PLUMBING = frozenset({"env", "_saved_kwargs", "_cached_spec", "_action_space", "_observation_space",
                               "_metadata", "_reward_range"})


def _same_value(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same object or equal (arrays element-wise); ``False`` when they cannot be compared."""
    if a is b:
        return True
    try:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return bool(np.array_equal(a, b))
        return bool(a == b)
    except Exception:
        return False


def _changed_attributes(wrapper: Any, rebuilt: Any) -> list[str]:
    """The instance attributes of ``wrapper`` that differ from those of ``rebuilt`` (the same wrapper re-created from
    its constructor arguments): what the user changed after construction, env references and plumbing aside."""
    fresh = vars(rebuilt)
    return [key for key, value in vars(wrapper).items()
            if key not in _WRAPPER_PLUMBING and not isinstance(value, (gym.Env, gym.vector.VectorEnv))
            and not (key in fresh and _same_value(value, fresh[key]))]


def _changed_since_made(wrapper: Any) -> bool:
    """Whether a ``RecordConstructorArgs`` wrapper has attributes changed after construction (so its recorded
    arguments, and a spec listing it, no longer re-create it as it is)."""
    from gymnasium.utils import RecordConstructorArgs

    if not isinstance(wrapper, RecordConstructorArgs) or not isinstance(wrapper, gym.Wrapper):
        return False
    kwargs = {k: v for k, v in wrapper._saved_kwargs.items() if k != "env"}
    try:
        return bool(_changed_attributes(wrapper, type(wrapper)(env=wrapper.env, **kwargs)))
    except Exception:  # cannot be re-created around its own env: leave it to the spec, as before
        return False


def _keep_changed_attributes(wrapper: Any, rebuilt: Any, memo: dict[int, Any], who: str) -> None:
    """Give ``rebuilt`` (re-created from ``wrapper``'s constructor arguments) a deep copy of every instance attribute
    the user changed on ``wrapper`` after construction (one that differs from the rebuilt value), so a copy wraps
    as the user's wrapper does now; env references and the wrapper's plumbing are left as rebuilt.

    :raises TypeError: such an attribute cannot be copied (the message names it).
    """
    for key in _changed_attributes(wrapper, rebuilt):
        try:
            setattr(rebuilt, key, copy.deepcopy(vars(wrapper)[key], dict(memo)))
        except Exception as exc:
            name = type(wrapper).__name__
            raise TypeError(
                f"{who} rolls out in its own copies of the env, and cannot copy the attribute {key!r} that was "
                f"changed on the wrapper {name} after it was made ({type(exc).__name__}: {exc}); pass the new value "
                f"as a constructor argument of {name} instead, or make it deep-copyable"
            ) from exc


def _rewrap_factory(base_fn: Callable[[], gym.Env[Any, Any]], old_base: gym.Env[Any, Any], outer: list[Any],
                    who: str) -> Callable[[], gym.Env[Any, Any]]:
    """A factory of copies: ``base_fn()`` with the wrappers ``outer`` (outermost first) re-applied around it."""

    def make() -> gym.Env[Any, Any]:
        env = base_fn()
        memo: dict[int, Any] = {}
        for old, new in zip(wrapper_levels(old_base), wrapper_levels(env), strict=False):
            if type(old) is not type(new):
                break
            memo[id(old)] = new
        for wrapper in reversed(outer):
            env = memo[id(wrapper)] = _rewrap(wrapper, env, memo, who)
        return env

    return make


def group_api_available(source: RolloutSource) -> bool:
    """Whether rollouts of ``source`` run in a native tpo_gym vector env with the group API.

    The one place that decides it: true for a registered env whose ``vector_entry_point`` class is a
    :class:`~tpo_gym.envs.group.GroupVectorEnv` (has ``score_candidates``) and that carries no extra
    wrappers (wrappers may change observations or rewards, and a native vector env cannot apply them,
    so wrapped envs roll out in a sync vector env without the group API).
    """
    spec = source.spec
    if spec is None or spec.vector_entry_point is None or spec.additional_wrappers:
        return False
    return isinstance(creator := _vector_creator(spec), type) and issubclass(creator, GroupVectorEnv)


def single_group_api_available(source: RolloutSource) -> bool:
    """Whether ``source`` makes single envs with ``score_candidates`` and no extra wrappers, but no native vector
    env: rollouts then score candidates in a :class:`~tpo_gym.envs.group.SyncGroupVectorEnv` of their copies."""
    if group_api_available(source):
        return False
    spec = source.spec
    if spec is None:
        return source.group_env and not source.wrappers
    if spec.additional_wrappers or spec.entry_point is None:
        return False
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    if isinstance(creator, type):
        return callable(getattr(creator, "score_candidates", None))
    env = gym.make(spec)  # a function entry point: look at what it makes
    try:
        return callable(getattr(env.unwrapped, "score_candidates", None))
    finally:
        env.close()


def scoring_available(source: RolloutSource) -> bool:
    """Whether the rollouts of ``source`` can score candidates (native vector env or a single group env)."""
    return group_api_available(source) or single_group_api_available(source)


def _vector_creator(spec: EnvSpec) -> Any:
    """The class (or function) of ``spec``'s ``vector_entry_point``, loaded if given as a string."""
    creator = spec.vector_entry_point
    return load_env_creator(creator) if isinstance(creator, str) else creator


def copy_factory(env: gym.Env[Any, Any]) -> Callable[[], gym.Env[Any, Any]]:
    """A factory of deep copies of ``env`` (for env instances that have no spec)."""
    return lambda: copy.deepcopy(env)


def _probe_horizon(venv: gym.vector.VectorEnv, limit: int = _MAX_PROBE_STEPS) -> int:
    """Length of the episodes of a fixed-length env (reset, step action 0 until one ends)."""
    venv.reset(seed=0)
    zeros = np.zeros(venv.num_envs, dtype=np.int64)
    if isinstance(space := getattr(venv, "single_action_space", None), gym.spaces.Box):  # 0 clipped to the bounds
        zeros = np.broadcast_to(np.clip(0, space.low, space.high), venv.action_space.shape).astype(space.dtype)
    for t in range(1, limit + 1):
        _, _, term, trunc, _ = venv.step(zeros)
        if np.any(term | trunc):
            return t
    raise ValueError(f"episodes of {venv} did not end within {_MAX_PROBE_STEPS} steps")


def _reward_credit(env: Any) -> str:
    credit = getattr(env, "reward_credit", "step")
    if credit not in ("step", "episode"):
        raise ValueError(f"the env's reward_credit must be 'step' or 'episode', got {credit!r}")
    return str(credit)


@dataclasses.dataclass(frozen=True)
class RolloutSource:
    """Where an agent's rollout envs come from: a registered spec, or a factory of copies of an env instance.

    :param spec: the env's spec without SB3's ``Monitor`` (rollouts keep their own statistics), or
        ``None`` for an env rebuilt by ``env_fn``.
    :param env_fn: factory of copies of the env, used when there is no spec.
    :param wrappers: names of the wrappers ``env_fn`` re-applies around its copies (outermost first).
    :param group_env: the envs ``env_fn`` makes are unwrapped single envs with ``score_candidates``.
    """

    spec: EnvSpec | None
    env_fn: Callable[[], gym.Env[Any, Any]] | None = None
    wrappers: tuple[str, ...] = ()
    group_env: bool = False

    @classmethod
    def from_spec(cls, spec: EnvSpec) -> RolloutSource:
        """A source from a spec (SB3's ``Monitor`` wrapper dropped)."""
        kept = tuple(w for w in spec.additional_wrappers if w.name != "Monitor")
        return cls(dataclasses.replace(spec, additional_wrappers=kept))

    @classmethod
    def from_env(cls, env: gym.Env[Any, Any], who: str = "the agent") -> RolloutSource:
        """A source from an env instance, which keeps its wrappers (see :func:`rebuild_plan`).

        :raises TypeError: a wrapper can neither be re-created nor copied (the message names it).
        """
        base, outer = rebuild_plan(env)
        if base is None:  # no spec: deep copies of the unwrapped env
            inner = env.unwrapped
            base_fn = copy_factory(inner)
            if not outer:
                return cls(None, base_fn, group_env=callable(getattr(inner, "score_candidates", None)))
        elif not outer:
            return cls.from_spec(base)
        else:
            spec = base
            base_fn = lambda: gym.make(spec)  # noqa: E731
        old_base = env
        for _ in outer:
            old_base = old_base.env  # type: ignore[attr-defined]
        factory = _rewrap_factory(base_fn, old_base, outer, who)
        factory().close()  # a wrapper that cannot be copied fails now, not at the first rollout
        return cls(None, factory, wrappers=tuple(type(w).__name__ for w in outer))

    def wrapper_names(self) -> list[str]:
        """Names of the wrappers the spec or the factory re-applies."""
        return list(self.wrappers) if self.spec is None else [w.name for w in self.spec.additional_wrappers]
