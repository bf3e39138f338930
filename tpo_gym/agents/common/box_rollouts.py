"""Rollouts on a Box action space: :func:`~tpo_gym.agents.common.sampling.collect_rollouts` for a
:class:`~tpo_gym.agents.policies.gaussian.GaussianMlpPolicy` (it hands its calls here).

The same batch as on Discrete actions, seeded the same way (one integer seeds the env resets and the
torch generator of the Gaussian draws; sequence-level groups from same-seed resets,
:func:`~tpo_gym.envs.group.group_reset`), with what differs about continuous actions:

* ``actions`` are the Gaussian samples ``[N, T, A]`` (``A = prod(action_shape)``) *before* clipping / squashing:
  the env gets :meth:`~tpo_gym.agents.policies.gaussian.GaussianMlpPolicy.to_env_actions` of them, the
  log-probability is the sample's own;
* ``logp_old`` is the log-density of the action taken at each step, ``[N, T]``, not a distribution over actions;
* per-state candidates (``level="token"``, on an env with the group API): K Gaussian samples per state,
  ``candidates`` ``[N, T, K, A]`` (column 0 = the action taken), ``logp_old`` ``[N, T, K]``, and the env scores
  the actions it would get, ``score_candidates(float [N, K, *action_shape]) -> float32 [N, K]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tpo_gym.agents.common.rollouts import episode_summary, record_episode_ends
from tpo_gym.envs.group import group_reset
from tpo_gym.objectives import at_least_float32, working_dtype

if TYPE_CHECKING:
    from tpo_gym.agents.common.rollouts import RolloutBatch, RolloutEnv
    from tpo_gym.agents.policies.gaussian import GaussianMlpPolicy

__all__ = ["collect_box_rollouts"]


@torch.no_grad()
def collect_box_rollouts(
    policy: GaussianMlpPolicy,
    env: RolloutEnv,
    seed: int,
    n_candidates: int = 0,
    score_all_actions: bool = False,
    group_size: int = 1,
) -> RolloutBatch:
    """Roll out ``env.num_envs`` episodes with the Gaussian ``policy`` (= pi_old); see the module docstring and
    :func:`~tpo_gym.agents.common.sampling.collect_rollouts` (same arguments, same score / error per episode)."""
    from tpo_gym.agents.common.rollouts import RolloutBatch

    if score_all_actions:
        raise ValueError("scoring every action needs a Discrete action space; a Box action space has no finite set")
    if env.on_device:
        raise ValueError("on-device rollouts need a tpo_gym tensor env (Discrete actions); roll out on the host")
    venv, n = env.venv, env.num_envs
    if n_candidates > 0 and not env.scores_candidates:
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
    device, horizon, dtype = policy.device, env.horizon, working_dtype(policy)
    obs = np.asarray(obs)
    k = max(n_candidates, 1)
    obs_buf = np.empty((n, horizon, *obs.shape[1:]), dtype=obs.dtype)
    samples = torch.empty((n, horizon, k, policy.action_dim), dtype=dtype)
    logp_old = torch.empty((n, horizon, k), dtype=dtype)
    rewards = np.zeros((n, horizon), dtype=np.float32)
    mask = np.zeros((n, horizon), dtype=np.bool_)
    scores = np.zeros((n, horizon, k), dtype=np.float32) if n_candidates else None
    ep_score, ep_error = np.full(n, np.nan), np.full(n, np.nan)
    end_infos: list[dict[str, Any]] | None = None
    alive = np.ones(n, dtype=np.bool_)
    steps = horizon
    policy.set_training_mode(False)
    decode = policy.rollout_decoder()
    for t in range(horizon):
        obs_buf[:, t] = obs
        mask[:, t] = alive
        params = at_least_float32(decode(torch.as_tensor(obs, device=device))).cpu()
        draws = policy.sample(params, k, generator)  # [N, K, A], before clipping / squashing
        samples[:, t] = draws
        logp_old[:, t] = policy.log_prob(params.unsqueeze(1), draws)
        env_actions = policy.to_env_actions(draws)  # [N, K, *action_shape]
        if scores is not None:
            scores[:, t] = venv.score_candidates(env_actions)  # type: ignore[attr-defined]
        obs, reward, terminated, truncated, info = venv.step(env_actions[:, 0])
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
    candidates = samples[:, :steps].contiguous().to(device) if n_candidates else None
    return RolloutBatch(
        obs=torch.from_numpy(np.ascontiguousarray(obs_buf[:, :steps])).to(device),
        actions=samples[:, :steps, 0].contiguous().to(device),
        rewards=torch.from_numpy(np.ascontiguousarray(rewards[:, :steps])).to(device),
        step_mask=None if mask.all() else torch.from_numpy(mask).to(device),
        logp_old=(logp_old[:, :steps] if n_candidates else logp_old[:, :steps, 0]).contiguous().to(device),
        candidates=candidates,
        candidate_scores=None if scores is None else torch.from_numpy(np.ascontiguousarray(scores[:, :steps])).to(
            device),
        group_size=group_size,
        episode_scores=torch.from_numpy(episode_scores.astype(np.float32)).to(device),
        returns=torch.from_numpy(returns).to(device),
        lengths=torch.from_numpy(lengths.astype(np.int64)).to(device),
        error=error,
        n_steps=int(lengths.sum()),
        reward_credit=env.reward_credit,
        end_infos=end_infos,
    )
