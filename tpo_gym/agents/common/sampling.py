"""Where the agents act in discrete environments: rollouts and candidate sampling (text envs:
:mod:`tpo_gym.agents.lm.text_rollouts`; the two are the only places agents act in envs).

Every agent of :mod:`tpo_gym.agents` on a ``Discrete`` action space collects its training batch with
:func:`collect_rollouts`:

* **Behaviour trajectories.** ``num_envs`` episodes are rolled out in a Gymnasium vector env with
  one batched policy forward per time step (no per-env Python loop). A native tpo_gym vector env
  (``vector_entry_point``) steps them with array operations.
* **Per-state candidates** (``n_candidates = K``; TPO_token, GRPO_token, Group PG on bandits and
  MNIST). At every visited state K actions are drawn from the rollout-time policy ``pi_old`` *with
  replacement*; candidate 0 is the behaviour action, which is the one executed. Each candidate is
  scored by the env's group API, ``venv.score_candidates(int [N, K]) -> float32 [N, K]``: the reward
  it would receive if taken now.
* **All actions scored** (``score_all_actions``; the CE oracle): the scores of every action, from
  which the true label is the argmax.
* **Groups of K complete rollouts** (``group_size = K``; sequence-level methods). Sub-envs
  ``g*K .. (g+1)*K-1`` start from the same context: native envs through
  ``reset(options={"group_size": K})``, any other env through identical reset seeds
  (:func:`tpo_gym.envs.group.group_reset`).

Each call is seeded by one integer (derived by the agent from its seed and the iteration number),
which seeds both the env reset and the torch generator of the action draws: a training iteration is a
pure function of (parameters, seed, iteration), which makes runs reproducible and resumable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from tpo_gym.agents.common.box_rollouts import collect_box_rollouts
from tpo_gym.agents.common.env_copies import (
    RolloutSource,
    _probe_horizon,
    _reward_credit,
    _vector_creator,
    group_api_available,
    rebuild_plan,
    scoring_available,
    single_group_api_available,
)
from tpo_gym.agents.common.rollouts import RolloutBatch, RolloutEnv, episode_summary, record_episode_ends
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.envs.group import SyncGroupVectorEnv, group_reset
from tpo_gym.objectives import at_least_float32, working_dtype

__all__ = [
    "RolloutSource",
    "RolloutEnv",
    "RolloutBatch",
    "group_api_available",
    "single_group_api_available",
    "scoring_available",
    "rebuild_plan",
    "make_rollout_env",
    "tensor_env_available",
    "sample_candidates",
    "collect_rollouts",
    "collect_stacked_rollouts",
]

#: The same for an env without the group API and without ``max_episode_steps`` (assumed fixed-length).
_MAX_SYNC_PROBE_STEPS = 10_000


def tensor_env_available(source: RolloutSource) -> bool:
    """Whether ``source``'s native vector env has an on-device tensor form (its ``tensor_env`` class)."""
    if not group_api_available(source):
        return False
    return getattr(_vector_creator(source.spec), "tensor_env", None) is not None  # type: ignore[arg-type]


def make_rollout_env(source: RolloutSource, num_envs: int, device: Any = None) -> RolloutEnv:
    """Build the vector env of ``num_envs`` sub-envs that the agent rolls out in.

    An env with the group API (:func:`group_api_available`) is made with
    ``vectorization_mode="vector_entry_point"``; any other env with ``"sync"`` (one copy per
    sub-env, seeded per sub-env, which is how same-seed groups are formed). With a ``device``, a
    native env that has an on-device form (:func:`tensor_env_available`: the token tasks and MNIST) is built
    as that tensor env on ``device``, so rollouts, scoring and the batch never leave it.

    :param source: the env's spec or factory (:class:`RolloutSource`).
    :param num_envs: number of sub-envs.
    :param device: ``None`` (numpy envs), or the torch device of an on-device tensor env.
    :raises ValueError: a ``device`` for an env without an on-device form.
    """
    spec = source.spec
    if device is not None:
        if not tensor_env_available(source):
            name = spec.id if spec is not None else "this env"
            raise ValueError(f"{name} has no on-device tensor form (the token tasks and MNIST have one); "
                             "roll out on the host")
        assert spec is not None
        venv = _vector_creator(spec).tensor_env(num_envs=num_envs, device=device, check_actions=False, **spec.kwargs)
        return RolloutEnv(venv, True, int(venv.fixed_horizon), _reward_credit(venv), on_device=True)
    if group_api_available(source):
        assert spec is not None
        venv = gym.make_vec(spec, num_envs=num_envs, vectorization_mode="vector_entry_point")
        return RolloutEnv(venv, True, _probe_horizon(venv), _reward_credit(venv.unwrapped))
    if single_group_api_available(source):  # a single env's group API, in a vector form of its copies
        make_one = source.env_fn if source.env_fn is not None else (lambda: gym.make(spec))
        venv = SyncGroupVectorEnv([make_one] * num_envs)
        max_steps = venv.envs[0].spec.max_episode_steps if venv.envs[0].spec is not None else None
    elif spec is not None:
        venv = gym.make_vec(spec, num_envs=num_envs, vectorization_mode="sync")
        max_steps = spec.max_episode_steps
    elif source.env_fn is not None:
        venv = gym.vector.SyncVectorEnv([source.env_fn] * num_envs)
        first_spec = venv.envs[0].spec
        max_steps = None if first_spec is None else first_spec.max_episode_steps
    else:
        raise ValueError("need an env spec or an env factory to build the rollout env")
    fixed_length = max_steps is None
    if max_steps is None:  # a fixed-length env without a registered bound (e.g. a wrapped token task)
        try:
            max_steps = _probe_horizon(venv, _MAX_SYNC_PROBE_STEPS)
        except ValueError:
            raise ValueError(
                "an env without the tpo_gym group API needs a bounded episode length: register it with "
                "max_episode_steps or wrap it in gymnasium.wrappers.TimeLimit"
            ) from None
    first = venv.envs[0].unwrapped if hasattr(venv, "envs") else None
    return RolloutEnv(venv, False, int(max_steps), _reward_credit(first), fixed_length=fixed_length)


def sample_candidates(logits: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw ``k`` actions per row from ``softmax(logits)`` with replacement: ``int64 [N, k]``.

    Column 0 serves as the behaviour action (the one executed); columns ``1..k-1`` are the extra
    candidates of the same state. All columns are i.i.d. draws from ``pi_old``.

    :param logits: ``[N, n_actions]`` logits of ``pi_old``.
    :param k: number of draws per row (>= 1).
    :param generator: torch generator of the draws.
    """
    probs = torch.softmax(at_least_float32(logits), dim=-1)
    return torch.multinomial(probs, k, replacement=True, generator=generator)


@torch.no_grad()
def collect_rollouts(
    policy: CategoricalPolicy,
    env: RolloutEnv,
    seed: int,
    n_candidates: int = 0,
    score_all_actions: bool = False,
    group_size: int = 1,
) -> RolloutBatch:
    """Roll out ``env.num_envs`` episodes with ``policy`` (= pi_old) and score candidates.

    What an episode means is the env's: at the step that ends it, tpo_gym envs report
    ``info["score"]`` (the episode's score, used by sequence-level groups) and ``info["error"]``
    (the paper's logged error of that episode: token error, or 1 - exact match with a terminal reward,
    or 1 - reward for bandits and MNIST). The batch's **error** is the mean ``info["error"]``; for an
    env that reports neither, ``score = return / horizon`` and ``error = 1 - score``.

    :param policy: the policy; its current parameters are pi_old.
    :param env: the rollout env (:func:`make_rollout_env`).
    :param seed: seeds the env reset and the action draws of this call.
    :param n_candidates: K >= 1 to draw and score K candidates at every state (group API needed); 0
        for behaviour actions only.
    :param score_all_actions: also score every action at every state (the CE oracle).
    :param group_size: K > 1 to start rollouts in groups of K from one context (sequence level).
    """
    if getattr(policy, "continuous", False):  # a Box action space: tpo_gym.agents.common.box_rollouts
        return collect_box_rollouts(policy, env, seed, n_candidates, score_all_actions, group_size)  # type: ignore
    if env.on_device:
        return _collect_on_device(policy, env, seed, n_candidates, score_all_actions, group_size)
    venv = env.venv
    n = env.num_envs
    if (n_candidates > 0 or score_all_actions) and not env.scores_candidates:
        raise ValueError("scoring candidates needs the tpo_gym group API (score_candidates); use level='sequence'")
    if n % group_size != 0:
        raise ValueError(f"group_size {group_size} must divide the number of rollouts {n}")
    rng = np.random.default_rng(seed)
    if env.native:
        options = {"group_size": group_size} if group_size > 1 else None
        obs, _ = venv.reset(seed=int(rng.integers(2**31 - 1)), options=options)
    else:
        obs, _ = group_reset(venv, rng.integers(2**31 - 1, size=n // group_size))
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    device = policy.device
    n_actions = policy.n_actions
    horizon = env.horizon
    obs = np.asarray(obs)

    obs_buf = np.empty((n, horizon, *obs.shape[1:]), dtype=obs.dtype)
    actions = torch.empty((n, horizon), dtype=torch.int64)
    logp_old = torch.empty((n, horizon, n_actions), dtype=working_dtype(policy))
    rewards = np.zeros((n, horizon), dtype=np.float32)
    mask = np.zeros((n, horizon), dtype=np.bool_)
    k = max(n_candidates, 1)
    candidates = torch.empty((n, horizon, k), dtype=torch.int64) if n_candidates else None
    width = n_actions if score_all_actions else k
    scores = np.zeros((n, horizon, width), dtype=np.float32) if (n_candidates or score_all_actions) else None
    all_actions = np.broadcast_to(np.arange(n_actions, dtype=np.int64), (n, n_actions)) if score_all_actions else None
    ep_score = np.full(n, np.nan)
    ep_error = np.full(n, np.nan)
    end_infos: list[dict[str, Any]] | None = None
    alive = np.ones(n, dtype=np.bool_)
    steps = horizon
    policy.set_training_mode(False)
    decode = policy.rollout_decoder()
    for t in range(horizon):
        obs_buf[:, t] = obs
        mask[:, t] = alive
        logits = at_least_float32(decode(torch.as_tensor(obs, device=device))).cpu()
        logp_old[:, t] = torch.log_softmax(logits, dim=-1)
        draws = sample_candidates(logits, k, generator)
        act = draws[:, 0]
        actions[:, t] = act
        if candidates is not None:
            candidates[:, t] = draws
            scores[:, t] = venv.score_candidates(draws.numpy())  # type: ignore[index, attr-defined]
        elif all_actions is not None:
            scores[:, t] = venv.score_candidates(all_actions)  # type: ignore[index, attr-defined]
        obs, reward, terminated, truncated, info = venv.step(act.numpy())
        obs = np.asarray(obs)
        rewards[:, t] = np.asarray(reward, dtype=np.float32) * alive
        done = alive & (np.asarray(terminated) | np.asarray(truncated))
        if done.any():
            end_infos = record_episode_ends(info, done, ep_score, ep_error, end_infos)
        alive &= ~done
        if not alive.any():
            steps = t + 1
            break

    mask, returns, lengths, episode_scores, error = episode_summary(rewards, mask, steps, ep_score, ep_error, horizon)
    return RolloutBatch(
        obs=torch.from_numpy(np.ascontiguousarray(obs_buf[:, :steps])).to(device),
        actions=actions[:, :steps].contiguous().to(device),
        rewards=torch.from_numpy(np.ascontiguousarray(rewards[:, :steps])).to(device),
        step_mask=None if mask.all() else torch.from_numpy(mask).to(device),
        logp_old=logp_old[:, :steps].contiguous().to(device),
        candidates=None if candidates is None else candidates[:, :steps].contiguous().to(device),
        candidate_scores=None if scores is None else torch.from_numpy(np.ascontiguousarray(scores[:, :steps])).to(
            device
        ),
        group_size=group_size,
        episode_scores=torch.from_numpy(episode_scores.astype(np.float32)).to(device),
        returns=torch.from_numpy(returns).to(device),
        lengths=torch.from_numpy(lengths.astype(np.int64)).to(device),
        error=error,
        n_steps=int(lengths.sum()),
        reward_credit=env.reward_credit,
        end_infos=end_infos,
    )


def _collect_on_device(
    policy: CategoricalPolicy, env: RolloutEnv, seed: int, n_candidates: int, score_all_actions: bool,
    group_size: int,
) -> RolloutBatch:
    """:func:`collect_rollouts` for an on-device tensor env: the one-seed case of :func:`collect_stacked_rollouts`."""
    decode = policy.rollout_decoder(lockstep=True)
    policy.set_training_mode(False)
    return collect_stacked_rollouts(lambda obs: decode(obs[0])[None], policy.n_actions, env, [seed],
                                    n_candidates, score_all_actions, group_size)[0]


@torch.no_grad()
def collect_stacked_rollouts(
    decode: Callable[[torch.Tensor], torch.Tensor], n_actions: int, env: RolloutEnv, seeds: list[int],
    n_candidates: int = 0, score_all_actions: bool = False, group_size: int = 1,
) -> list[RolloutBatch]:
    """The rollouts of S seeds at once in one on-device tensor env of ``S * N`` sub-envs: one batch per seed.

    Seed ``s`` owns sub-envs ``s N .. (s+1) N - 1``, reset exactly as its own env of N sub-envs would be
    (sub-env ``i`` from seed ``r_s + i``, ``r_s`` drawn from ``seeds[s]`` as :func:`collect_rollouts`
    draws it), and its actions come from its own generator, so each batch is what that seed's own
    :func:`collect_rollouts` on an on-device env gives: the same contexts, draws and scores, with
    ``logp_old`` to float rounding (the stacked decode's batched matrix products may round differently
    from one model's; a draw could then differ only where a probability sits on a sampling boundary).
    With a one-seed ``decode`` that calls the policy's own decoder the batch is exact. Per step: one
    ``decode`` of all S models, S draws, one ``score_candidates`` and one ``step`` of the whole env; the
    only value read back is each batch's logged error, once, after the last step.

    :param decode: ``obs [S, N, *obs_shape] -> logits [S, N, n_actions]`` for steps 0, 1, ... (e.g.
        :meth:`~tpo_gym.agents.policies.transformer.TransformerPolicy.stacked_rollout_decoder`).
    :param env: an on-device rollout env (``env.on_device``) with ``S * N`` sub-envs.
    :param seeds: one rollout seed per seed of the batch (S of them).
    """
    if not env.on_device:
        raise ValueError("collect_stacked_rollouts needs an on-device tensor env (make_rollout_env(..., device=))")
    venv, n_seeds = env.venv, len(seeds)
    if n_seeds < 1 or env.num_envs % n_seeds:
        raise ValueError(f"{env.num_envs} sub-envs cannot be split among {n_seeds} seeds")
    n = env.num_envs // n_seeds
    if n % group_size != 0:
        raise ValueError(f"group_size {group_size} must divide the number of rollouts {n}")
    rngs = [np.random.default_rng(s) for s in seeds]
    starts = [int(rng.integers(2**31 - 1)) for rng in rngs]
    options = {"group_size": group_size} if group_size > 1 else None
    obs, _ = venv.reset(seed=[r + i for r in starts for i in range(n)], options=options)
    device = venv.device
    generators = [torch.Generator(device=device).manual_seed(int(rng.integers(2**62))) for rng in rngs]
    horizon, shape = env.horizon, (n_seeds, n)
    obs_buf = torch.empty((*shape, horizon, *obs.shape[1:]), dtype=obs.dtype, device=device)
    actions = torch.empty((*shape, horizon), dtype=torch.int64, device=device)
    rewards = torch.zeros((*shape, horizon), dtype=torch.float32, device=device)
    k = max(n_candidates, 1)
    candidates = torch.empty((*shape, horizon, k), dtype=torch.int64, device=device) if n_candidates else None
    width = n_actions if score_all_actions else k
    scores = torch.zeros((*shape, horizon, width), dtype=torch.float32, device=device) \
        if (n_candidates or score_all_actions) else None
    all_actions = torch.arange(n_actions, device=device).expand(env.num_envs, n_actions) if score_all_actions else None
    ep_score = ep_error = None
    for t in range(horizon):
        obs = obs.reshape(*shape, *obs.shape[1:])
        obs_buf[:, :, t] = obs
        logits = at_least_float32(decode(obs))
        if t == 0:  # the decoder's working dtype: float32, or float64 for a float64 policy
            logp_old = torch.empty((*shape, horizon, n_actions), dtype=logits.dtype, device=device)
        logp_old[:, :, t] = torch.log_softmax(logits, dim=-1)
        draws = torch.stack([sample_candidates(logits[s], k, g) for s, g in enumerate(generators)])
        actions[:, :, t] = draws[..., 0]
        if candidates is not None:
            candidates[:, :, t] = draws
            scores[:, :, t] = venv.score_candidates(draws.reshape(-1, k)).reshape(*shape, k)  # type: ignore[index]
        elif all_actions is not None:
            scores[:, :, t] = venv.score_candidates(all_actions).reshape(*shape, n_actions)  # type: ignore[index]
        obs, reward, _, _, info = venv.step(draws[..., 0].reshape(-1))
        rewards[:, :, t] = reward.reshape(shape)
        if "score" in info:
            ep_score, ep_error = info["score"].reshape(shape), info["error"].reshape(shape)
    if ep_score is None:  # pragma: no cover - a tensor env ends every episode at its fixed horizon
        raise RuntimeError(f"{type(venv).__name__}: episodes did not end within their fixed horizon {horizon}")
    errors = ep_error.cpu().numpy()
    returns = rewards.sum(dim=2)
    lengths = torch.full((n,), horizon, dtype=torch.int64, device=device)
    # each seed's tensors are its own allocations (not views of the stacked buffers): CPU kernels may
    # reduce differently at another memory offset, and a seed's update must not depend on its position
    return [RolloutBatch(
        obs=obs_buf[s].clone(), actions=actions[s].clone(), rewards=rewards[s].clone(), step_mask=None,
        logp_old=logp_old[s].clone(), candidates=None if candidates is None else candidates[s].clone(),
        candidate_scores=None if scores is None else scores[s].clone(), group_size=group_size,
        episode_scores=ep_score[s].float(), returns=returns[s].clone(), lengths=lengths,
        error=float(np.mean(errors[s])), n_steps=n * horizon, reward_credit=env.reward_credit,
    ) for s in range(n_seeds)]
