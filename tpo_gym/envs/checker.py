"""Check that an env keeps the group API the tpo_gym agents rely on: :func:`check_group_env`.

Run it on your own env, as Gymnasium's :func:`~gymnasium.utils.env_checker.check_env` (which it calls
for the plain-Gymnasium part of a single env)::

    from tpo_gym.envs import check_group_env

    check_group_env(MyTaskEnv())                 # a single env with score_candidates
    check_group_env(MyTaskVectorEnv(num_envs=4))  # its native vector env (e.g. a NativeVectorEnv)

A broken contract raises :class:`GroupEnvError` (an ``AssertionError``, like the errors of Gymnasium's
checker) naming what is wrong; what works but is unusual warns (``UserWarning``), and Gymnasium's
checker warns as it does on its own. The contract is stated in :mod:`tpo_gym.envs.group`.
"""

from __future__ import annotations

import copy
import numbers
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector.utils import batch_space, iterate

from tpo_gym._validation import check_int
from tpo_gym.envs.group import GroupEnv, GroupVectorEnv

__all__ = ["check_group_env", "GroupEnvError"]


class GroupEnvError(AssertionError):
    """An env breaks the group API contract of :mod:`tpo_gym.envs.group`; the message says where."""


def check_group_env(
    env: gym.Env[Any, Any] | gym.vector.VectorEnv,
    *,
    n_candidates: int | None = None,
    seed: int = 0,
    max_steps: int = 1000,
    skip_render_check: bool = True,
) -> None:
    """Check ``env`` (its ``unwrapped`` form) against the group API and raise :class:`GroupEnvError` if it breaks it.

    A **single env** (:class:`~tpo_gym.envs.group.GroupEnv`) first goes through Gymnasium's
    ``check_env``; then, with candidates drawn from its action space (see ``n_candidates``; candidate 0
    is the action taken) and episodes reset with ``seed``:

    * it has ``score_candidates``, and ``reward_credit`` (if set) is ``"step"`` or ``"episode"``;
    * a ``Box`` action space is bounded (finite ``low`` / ``high``) and of a floating dtype, as the agents' Gaussian
      policy needs; its candidates are an array ``[K, *action_shape]`` of actions in the bounds;
    * ``score_candidates`` returns a finite float32 array of shape ``[K]`` (another dtype, float64 too, raises),
      the same on a second call at the same state, and candidate 0's score equals the reward ``step`` then
      pays for it, at every step of the episode;
    * ``score_candidates`` leaves the env's random number generators as they were (``np_random`` and any
      numpy / Python / torch generator among its attributes): drawing from them is a side effect that changes
      what the episode does next;
    * ``score_candidates`` leaves the candidates it is given as they were (it gets a copy, compared afterwards);
    * same-seed resets give the same observation, and the same candidates the same scores at every step;
    * scoring has no side effect: the episode without ``score_candidates`` calls is the same;
    * the ``info`` of the step that ends the episode has ``score`` and ``error``, real numbers in
      ``[0, 1]`` (missing: a warning, the agents then use ``return / horizon``).

    A **vector env** (:class:`~tpo_gym.envs.group.GroupVectorEnv`; Gymnasium has no checker for these):
    ``observation_space`` / ``action_space`` are ``batch_space`` of the single spaces; the same checks per
    sub-env with scores ``[num_envs, K]`` (candidates ``[num_envs, K]``, or ``[num_envs, K, *action_shape]`` for a
    ``Box``) up to the first step that ends an episode (whose ``info`` has
    ``score`` / ``error`` with their ``_score`` / ``_error`` masks); ``reset(options={"group_size": G})``
    gives each group of G sub-envs one context (same observations, same scores for the same candidates);
    a ``group_size`` that does not divide ``num_envs`` raises ``ValueError``. Torch outputs (the on-device
    envs) are read back to numpy.

    :param env: the env; wrappers are looked through (``env.unwrapped``), as the agents do.
    :param n_candidates: ``None`` (default): candidate 0 sampled from the action space, then every action
        of a ``Discrete`` space of at most 1024 actions (so that a context the seed does not fix, or a
        group that does not share one, cannot hide behind candidates that all score 0), else 7 more
        samples; an integer K >= 1: K samples.
    :param seed: seed of the resets and of the candidate draws (>= 0).
    :param max_steps: steps an episode may take before the checks stop following it (>= 1).
    :param skip_render_check: passed to Gymnasium's ``check_env`` (default ``True``: no rendering).
    :raises GroupEnvError: the env breaks the contract (the message names the part).
    :raises TypeError: ``env`` is neither a Gymnasium env nor a vector env.
    """
    k = None if n_candidates is None else check_int("n_candidates", n_candidates, minimum=1, maximum=2**16)
    seed = check_int("seed", seed, minimum=0)
    max_steps = check_int("max_steps", max_steps, minimum=1)
    inner = getattr(env, "unwrapped", env)
    if isinstance(inner, gym.vector.VectorEnv):
        _check_vector(inner, k, seed, max_steps)
    elif isinstance(inner, gym.Env):
        _check_single(inner, k, seed, max_steps, skip_render_check)
    else:
        raise TypeError("check_group_env needs a gymnasium.Env or gymnasium.vector.VectorEnv, "
                        f"got {type(env).__name__}")


# ------------------------------------------------------------------------------------------
# shared pieces
# ------------------------------------------------------------------------------------------
#: Discrete action spaces up to this size have every action scored (``n_candidates=None``).
_ALL_ACTIONS_MAX = 1024


def _candidates(space: spaces.Space[Any], k: int | None, seed: int, rows: int | None) -> Any:
    """Candidates of one state (``rows=None``: an array ``[K]``, or a list of K strings for text
    actions) or of ``rows`` sub-envs (``[rows, K]``); candidate 0 is a sample (see :func:`check_group_env`)."""
    space.seed(seed)
    every = k is None and isinstance(space, spaces.Discrete) and int(space.n) <= _ALL_ACTIONS_MAX

    def one() -> list[Any]:
        first = space.sample()
        if every:
            return [first, *range(int(space.start), int(space.start + space.n))]  # type: ignore[attr-defined]
        return [first, *(space.sample() for _ in range((k or 8) - 1))]

    if rows is not None:
        return np.asarray([one() for _ in range(rows)])
    draws = one()
    return draws if all(isinstance(d, str) for d in draws) else np.asarray(draws)


def _numpy(x: Any) -> Any:
    """A torch tensor (on-device envs) as a numpy array; anything else unchanged."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        return x.detach().cpu().numpy()
    return x


def _check_action_space(space: Any, name: str) -> None:
    """A Box action space must be bounded and of a floating dtype: the agents' Gaussian policy samples real actions
    and clips them to the bounds (tpo_gym.agents.policies.gaussian)."""
    if not isinstance(space, spaces.Box):
        return
    if not np.issubdtype(space.dtype, np.floating):
        raise GroupEnvError(f"{name}.action_space {space} has dtype {space.dtype}: a Box action space needs a floating "
                            "dtype (the agents sample real-valued actions); use Discrete for integer actions")
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise GroupEnvError(f"{name}.action_space {space} is unbounded: a Box action space needs finite low and high "
                            "(the agents clip their Gaussian actions to the bounds)")


def _check_reward_credit(env: Any, name: str) -> None:
    credit = getattr(env, "reward_credit", "step")
    if credit not in ("step", "episode"):
        raise GroupEnvError(f"{name}.reward_credit must be 'step' or 'episode' (or absent: 'step'), got {credit!r}")


def _rng_states(env: Any) -> dict[str, Any]:
    """The states of the env's random number generators: ``np_random`` and the numpy, Python and torch
    generators among its attributes (also inside lists and tuples), by attribute name."""
    import random

    def state(value: Any) -> Any:
        if isinstance(value, np.random.Generator):
            return value.bit_generator.state
        if isinstance(value, np.random.RandomState):
            return value.get_state(legacy=False)
        if isinstance(value, random.Random):
            return value.getstate()
        if type(value).__name__ == "Generator" and hasattr(value, "get_state"):  # torch.Generator
            return value.get_state().tolist()
        if isinstance(value, (list, tuple)):
            states = [state(v) for v in value]
            return states if any(s is not None for s in states) else None
        return None

    attributes = dict(vars(env)) if hasattr(env, "__dict__") else {}
    states = {key: state(value) for key, value in attributes.items()}
    return {key: value for key, value in states.items() if value is not None}


def _changed(before: Any, after: Any) -> bool:
    try:
        return not data_equivalence(before, after, exact=True)
    except Exception:  # states data_equivalence cannot compare
        return repr(before) != repr(after)


def _first_change(before: Any, after: Any) -> str:
    """Where the candidates ``after`` a call first differ from those ``before`` it (for the message)."""
    if np.shape(before) != np.shape(after):
        return f"shape {np.shape(before)}, left shape {np.shape(after)}"
    old, new = np.asarray(before, dtype=object).ravel(), np.asarray(after, dtype=object).ravel()
    at = next((i for i in range(old.size) if old[i] != new[i]), None)
    if at is None:
        return f"dtype {np.asarray(before).dtype}, left dtype {np.asarray(after).dtype}"
    index = tuple(int(i) for i in np.unravel_index(at, np.shape(before)))
    return f"candidates{list(index)} was {old[at]!r}, left {new[at]!r}"


def _scores(env: Any, name: str, candidates: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
    """``env.score_candidates(candidates)`` as a checked numpy array of ``shape``, with no RNG side effect."""
    before = _rng_states(env)
    given = copy.deepcopy(candidates)  # a copy, compared with the original afterwards
    try:
        value = env.score_candidates(given)
    except Exception as exc:
        raise GroupEnvError(f"{name}.score_candidates raised {type(exc).__name__} {where}: {exc}") from exc
    if _changed(candidates, given):
        raise GroupEnvError(f"{name}.score_candidates {where} overwrote the candidates it was given "
                            f"({_first_change(candidates, given)}): the agents keep and "
                            "train on that array, so scoring must only read it (copy it first to change it)")
    after = _rng_states(env)
    drawn = sorted(key for key in before if key not in after or _changed(before[key], after[key]))
    if drawn:
        attrs = ", ".join(f"{name}.{key.lstrip('_') if key == '_np_random' else key}" for key in drawn)
        raise GroupEnvError(f"{name}.score_candidates {where} drew from the env's random number generator ({attrs}): "
                            "scoring must have no side effects, and a draw changes what the env does next; compute "
                            "the scores from the state alone (draw what the context needs in reset)")
    value = _numpy(value)
    call = f"{name}.score_candidates {where}"
    if not isinstance(value, np.ndarray):
        raise GroupEnvError(f"{call} must return a numpy array (a torch tensor for on-device envs), "
                            f"got {type(value).__name__}")
    if value.shape != shape:
        raise GroupEnvError(f"{call} must return shape {shape} (one score per candidate), got {value.shape}")
    if value.dtype != np.float32:
        raise GroupEnvError(f"{call} must return a floating dtype (float32), got {value.dtype}: the group API "
                            "returns float32 scores (e.g. .astype(np.float32))")
    if not np.all(np.isfinite(value)):
        raise GroupEnvError(f"{call} must return finite scores, got {value.tolist()}")
    return value


def _episode(env: Any, name: str, seed: int, candidates: Any, vector: bool, max_steps: int, score: bool,
             ) -> list[tuple[Any, np.ndarray | None, Any, Any, dict[str, Any]]]:
    """One seeded episode acting candidate 0 (per sub-env: up to the first step that ends one).

    Each step gives ``(observation, scores or None, reward, done, info)``. With ``score``, the
    candidates are scored twice at every state (the same values) and candidate 0's score must be the
    reward the step pays.
    """
    obs, _ = env.reset(seed=seed)
    action = candidates[:, 0] if vector else candidates[0]
    shape = np.shape(candidates)[:2] if vector else (len(candidates),)  # Box candidates: [N, K, *action_shape]
    out = []
    for t in range(max_steps):
        scores = None
        if score:
            where = f"at step {t} of an episode reset with seed={seed}"
            scores = _scores(env, name, candidates, shape, where)
            if not np.array_equal(_scores(env, name, candidates, shape, where), scores):
                raise GroupEnvError(f"{name}.score_candidates gave different scores for the same candidates at the "
                                    f"same state ({where}): scoring must be a pure function of the state")
        next_obs, reward, terminated, truncated, info = env.step(action)
        reward = np.asarray(_numpy(reward), dtype=np.float64)
        done = np.asarray(_numpy(terminated)) | np.asarray(_numpy(truncated))
        if scores is not None:
            paid = scores[:, 0] if vector else scores[0]
            if not np.allclose(paid, reward, rtol=1e-6, atol=1e-6):
                raise GroupEnvError(
                    f"{name}.score_candidates scored candidate 0 {np.asarray(paid).tolist()} at step {t}, but step() "
                    f"paid {reward.tolist()} for it: a score must be the reward the candidate gets if taken now")
        out.append((_numpy(obs), scores, reward, done, info))
        obs = next_obs
        if np.any(done):
            break
    return out


def _compare_episodes(name: str, seed: int, first: list[Any], second: list[Any], what: str) -> None:
    """Same observations, rewards and (when both have them) scores, step by step."""
    for t, (a, b) in enumerate(zip(first, second, strict=False)):
        if not data_equivalence(a[0], b[0], exact=True):
            if t == 0:
                raise GroupEnvError(f"{name}: two resets with seed={seed} gave different observations: the same seed "
                                    "must give the same context")
            raise GroupEnvError(f"{name}: {what} changed the observation at step {t}")
        if a[1] is not None and b[1] is not None and not np.array_equal(a[1], b[1]):
            raise GroupEnvError(f"{name}: the same candidates got different scores at step {t} after two resets with "
                                f"seed={seed}: the context (and so the scores) must be a function of the seed")
        if not np.array_equal(a[2], b[2]) or not np.array_equal(a[3], b[3]):
            raise GroupEnvError(f"{name}: {what} changed the reward or the episode end at step {t}")
    if len(first) != len(second):
        raise GroupEnvError(f"{name}: {what} changed the episode length ({len(first)} != {len(second)} steps)")


def _warn_missing_summary(name: str, missing: list[str]) -> None:
    warnings.warn(f"{name}: the info of the step that ends an episode has no {missing}; the agents then use "
                  "score = return / horizon and error = 1 - score (see tpo_gym.envs)", UserWarning, stacklevel=4)


# ------------------------------------------------------------------------------------------
# single envs
# ------------------------------------------------------------------------------------------
def _check_single(env: gym.Env[Any, Any], k: int | None, seed: int, max_steps: int, skip_render_check: bool) -> None:
    name = type(env).__name__
    if not isinstance(env, GroupEnv):
        raise GroupEnvError(f"{name} has no score_candidates(candidates) method, the group API "
                            "(tpo_gym.envs.GroupEnv); without it agents form groups from same-seed resets only "
                            "(level='sequence')")
    check_env(env, skip_render_check=skip_render_check)
    _check_reward_credit(env, name)
    _check_action_space(env.action_space, name)
    candidates = _candidates(env.action_space, k, seed, None)
    env.reset(seed=seed)
    _scores(env, name, candidates, (len(candidates),), f"after reset(seed={seed})")
    first = _episode(env, name, seed, candidates, False, max_steps, score=True)
    _compare_episodes(name, seed, first, _episode(env, name, seed, candidates, False, max_steps, score=True),
                      "a second reset with the same seed")
    _compare_episodes(name, seed, first, _episode(env, name, seed, candidates, False, max_steps, score=False),
                      "calling score_candidates")
    if not first[-1][3]:
        warnings.warn(f"{name}: no episode ended within max_steps={max_steps}; its info['score'] / info['error'] "
                      "were not checked", UserWarning, stacklevel=3)
        return
    info = first[-1][4]
    missing = [key for key in ("score", "error") if key not in info]
    for key in ("score", "error"):
        value = info.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
            raise GroupEnvError(f"{name}: info[{key!r}] of the step that ends an episode must be a real number in "
                                f"[0, 1], got {value!r}")
    if missing:
        _warn_missing_summary(name, missing)


# ------------------------------------------------------------------------------------------
# vector envs
# ------------------------------------------------------------------------------------------
def _check_vector(env: gym.vector.VectorEnv, k: int | None, seed: int, max_steps: int) -> None:
    name = type(env).__name__
    if not isinstance(env, GroupVectorEnv):
        raise GroupEnvError(f"{name} has no score_candidates(candidates) method, the group API of vector envs "
                            "(tpo_gym.envs.GroupVectorEnv)")
    n = getattr(env, "num_envs", None)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise GroupEnvError(f"{name}.num_envs must be an integer >= 1, got {n!r}")
    n = int(n)
    for kind in ("observation", "action"):
        single = getattr(env, f"single_{kind}_space", None)
        if not isinstance(single, spaces.Space):
            raise GroupEnvError(f"{name}.single_{kind}_space must be a gymnasium Space, got {single!r}")
        if getattr(env, f"{kind}_space", None) != batch_space(single, n):
            raise GroupEnvError(f"{name}.{kind}_space must be batch_space(single_{kind}_space, num_envs={n}) (as "
                                f"SyncVectorEnv's), got {getattr(env, f'{kind}_space', None)}")
    _check_reward_credit(env, name)
    _check_action_space(env.single_action_space, name)
    candidates = _candidates(env.single_action_space, k, seed, n)
    env.reset(seed=seed)
    _scores(env, name, candidates, candidates.shape[:2], f"after reset(seed={seed})")
    first = _episode(env, name, seed, candidates, True, max_steps, score=True)
    _compare_episodes(name, seed, first, _episode(env, name, seed, candidates, True, max_steps, score=True),
                      "a second reset with the same seed")
    _compare_episodes(name, seed, first, _episode(env, name, seed, candidates, True, max_steps, score=False),
                      "calling score_candidates")
    _check_vector_summary(name, first[-1][3], first[-1][4], max_steps)
    _check_groups(env, name, n, seed, candidates)


def _check_vector_summary(name: str, ended: np.ndarray, info: dict[str, Any], max_steps: int) -> None:
    """``info["score"]`` / ``info["error"]`` with their masks at the first step that ends an episode (under
    ``AutoresetMode.SAME_STEP`` the ended episodes' info is ``info["final_info"]``, as in SyncVectorEnv)."""
    if "final_info" in info and not any(key in info for key in ("score", "error")):
        info = info["final_info"]
    if not ended.any():
        warnings.warn(f"{name}: no episode ended within max_steps={max_steps}; info['score'] / info['error'] were "
                      "not checked", UserWarning, stacklevel=4)
        return
    missing = [key for key in ("score", "error") if key not in info]
    for key in ("score", "error"):
        if key in missing:
            continue
        values, mask = np.asarray(_numpy(info[key])), np.asarray(_numpy(info.get("_" + key)))
        if values.shape != ended.shape or mask.shape != ended.shape or not np.array_equal(mask, ended):
            raise GroupEnvError(f"{name}: info[{key!r}] and its mask info['_{key}'] must have one entry per sub-env, "
                                f"the mask True where an episode ended ({ended.tolist()}), got {values.tolist()} and "
                                f"{mask.tolist()}")
        if not np.issubdtype(values.dtype, np.floating) or not np.all((values[ended] >= 0) & (values[ended] <= 1)):
            raise GroupEnvError(f"{name}: info[{key!r}] of the sub-envs whose episode ended must be floats in [0, 1], "
                                f"got {values[ended].tolist()}")
    if missing:
        _warn_missing_summary(name, missing)


def _check_groups(env: gym.vector.VectorEnv, name: str, n: int, seed: int, candidates: np.ndarray) -> None:
    """``reset(options={"group_size": G})``: one context per group; a G that does not divide ``num_envs`` fails."""
    g = next((d for d in range(2, n + 1) if n % d == 0), 1)
    try:
        obs, _ = env.reset(seed=seed, options={"group_size": g})
    except Exception as exc:
        raise GroupEnvError(f"{name}.reset(options={{'group_size': {g}}}) raised {type(exc).__name__}: {exc} "
                            f"(num_envs={n} is a multiple of {g})") from exc
    leaders = np.arange(n) // g * g
    rows = list(iterate(env.observation_space, _numpy(obs)))
    for i in range(n):
        if not data_equivalence(rows[i], rows[leaders[i]], exact=True):
            raise GroupEnvError(f"{name}.reset(options={{'group_size': {g}}}): sub-envs {leaders[i]} and {i} are in "
                                "one group but got different observations (a group shares one context)")
    shared = candidates[leaders]
    scores = _scores(env, name, shared, shared.shape[:2], f"after reset(options={{'group_size': {g}}})")
    if not np.array_equal(scores, scores[leaders]):
        raise GroupEnvError(f"{name}.reset(options={{'group_size': {g}}}): sub-envs of one group gave different scores "
                            "for the same candidates (a group shares one context)")
    try:
        env.reset(seed=seed, options={"group_size": n + 1})
    except ValueError:
        return
    except Exception as exc:
        raise GroupEnvError(f"{name}.reset(options={{'group_size': {n + 1}}}) must raise ValueError (num_envs={n} is "
                            f"not a multiple of it), raised {type(exc).__name__}: {exc}") from exc
    raise GroupEnvError(f"{name}.reset(options={{'group_size': {n + 1}}}) must raise ValueError (num_envs={n} is not a "
                        "multiple of it); it returned")
