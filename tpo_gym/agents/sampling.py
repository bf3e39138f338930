"""The one place where the agents act in environments: rollouts and candidate sampling.

Every agent of :mod:`tpo_gym.agents` collects its training batch with :func:`collect_rollouts`:

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
  ``reset(options={"group_size": K})``, any other env through identical reset seeds.

Each call is seeded by one integer (derived by the agent from its seed and the iteration number),
which seeds both the env reset and the torch generator of the action draws: a training iteration is a
pure function of (parameters, seed, iteration), which makes runs reproducible and resumable.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import EnvSpec

from tpo_gym.agents.policies import CategoricalPolicy

__all__ = ["RolloutEnv", "RolloutBatch", "make_rollout_env", "sample_candidates", "collect_rollouts"]

#: Longest episode a probe of a native env may run before it is declared not fixed-length.
_MAX_PROBE_STEPS = 100_000


@dataclass
class RolloutEnv:
    """A vector env ready for rollouts, with what the agents need to know about it.

    :param venv: the Gymnasium vector env (``num_envs`` sub-envs).
    :param native: True for a tpo_gym native vector env (group API: ``score_candidates`` and the
        ``group_size`` reset option); False for any other env (groups through same-seed resets).
    :param horizon: episode length of fixed-length envs (token tasks: H; bandits / MNIST: 1), or the
        ``max_episode_steps`` bound of other envs.
    :param reward_mode: ``"terminal"``, ``"bag"``, ``"sequential"`` for token tasks, else ``None``.
    """

    venv: gym.vector.VectorEnv
    native: bool
    horizon: int
    reward_mode: str | None

    @property
    def num_envs(self) -> int:
        """Number of sub-envs (rollouts per iteration)."""
        return int(self.venv.num_envs)


def _probe_horizon(venv: gym.vector.VectorEnv) -> int:
    """Length of the episodes of a fixed-length native env (reset, step action 0 until all end)."""
    venv.reset(seed=0)
    zeros = np.zeros(venv.num_envs, dtype=np.int64)
    for t in range(1, _MAX_PROBE_STEPS + 1):
        _, _, term, trunc, _ = venv.step(zeros)
        if np.any(term | trunc):
            return t
    raise ValueError(f"episodes of {venv} did not end within {_MAX_PROBE_STEPS} steps")


def make_rollout_env(
    spec: EnvSpec | None, num_envs: int, env_fn: Callable[[], gym.Env[Any, Any]] | None = None
) -> RolloutEnv:
    """Build the vector env of ``num_envs`` sub-envs that the agent rolls out in.

    A registered env with the group API (tpo_gym) is made with ``vectorization_mode=
    "vector_entry_point"``; any other env with ``"sync"`` (one copy per sub-env, seeded per sub-env,
    which is how same-seed groups are formed). ``env_fn`` (a factory) is used when there is no spec.

    :param spec: the env's spec (id and kwargs), or ``None``.
    :param num_envs: number of sub-envs.
    :param env_fn: factory of single envs, for envs without a spec.
    """
    if spec is not None and spec.vector_entry_point is not None and not spec.additional_wrappers:
        probe = gym.make_vec(spec, num_envs=num_envs, vectorization_mode="vector_entry_point")
        if hasattr(probe.unwrapped, "score_candidates"):
            horizon = _probe_horizon(probe)
            return RolloutEnv(probe, True, horizon, getattr(probe.unwrapped, "reward", None))
        probe.close()
    if spec is not None:
        venv = gym.make_vec(spec, num_envs=num_envs, vectorization_mode="sync")
        max_steps = spec.max_episode_steps
    elif env_fn is not None:
        venv = gym.vector.SyncVectorEnv([env_fn] * num_envs)
        max_steps = getattr(getattr(env_fn(), "spec", None), "max_episode_steps", None)
    else:
        raise ValueError("need an env spec or an env factory to build the rollout env")
    if max_steps is None:
        raise ValueError(
            "an env without the tpo_gym group API needs a bounded episode length: register it with "
            "max_episode_steps or wrap it in gymnasium.wrappers.TimeLimit"
        )
    return RolloutEnv(venv, False, int(max_steps), None)


def copy_factory(env: gym.Env[Any, Any]) -> Callable[[], gym.Env[Any, Any]]:
    """A factory of deep copies of ``env`` (for env instances that have no spec)."""
    return lambda: copy.deepcopy(env)


def sample_candidates(logits: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw ``k`` actions per row from ``softmax(logits)`` with replacement: ``int64 [N, k]``.

    Column 0 serves as the behaviour action (the one executed); columns ``1..k-1`` are the extra
    candidates of the same state. All columns are i.i.d. draws from ``pi_old``.

    :param logits: ``[N, n_actions]`` logits of ``pi_old``.
    :param k: number of draws per row (>= 1).
    :param generator: torch generator of the draws.
    """
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, k, replacement=True, generator=generator)


@dataclass
class RolloutBatch:
    """The training batch of one iteration (``N`` rollouts of at most ``T`` steps).

    :param obs: ``[N, T, *obs_shape]`` observation at each step.
    :param actions: ``int64 [N, T]`` behaviour actions.
    :param rewards: ``float32 [N, T]`` rewards (0 after the episode ended).
    :param step_mask: ``bool [N, T]`` valid steps, or ``None`` when every step is valid.
    :param logp_old: ``float32 [N, T, n_actions]`` log pi_old over all actions at each step.
    :param candidates: ``int64 [N, T, K]`` per-state candidates (column 0 = ``actions``), or ``None``.
    :param candidate_scores: ``float32 [N, T, K]`` their scores; with ``score_all_actions`` the scores
        ``[N, T, n_actions]`` of every action; else ``None``.
    :param group_size: K for sequence-level groups (rollouts ``g*K..(g+1)*K-1`` share a context), else 1.
    :param episode_scores: ``float32 [N]`` sequence score of each rollout: mean per-step reward
        (return / horizon), or 0/1 exact match for terminal-reward token tasks.
    :param returns: ``float32 [N]`` undiscounted episode returns.
    :param lengths: ``int64 [N]`` episode lengths.
    :param error: the training error of SPEC section 5 over these rollouts (see :func:`collect_rollouts`).
    :param n_steps: env steps taken (sum of ``lengths``).
    :param reward_mode: the env's reward kind (``"bag"``, ``"sequential"``, ``"terminal"`` for token
        tasks), else ``None``.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    step_mask: torch.Tensor | None
    logp_old: torch.Tensor
    candidates: torch.Tensor | None
    candidate_scores: torch.Tensor | None
    group_size: int
    episode_scores: torch.Tensor
    returns: torch.Tensor
    lengths: torch.Tensor
    error: float
    n_steps: int
    reward_mode: str | None = None

    def credited_rewards(self) -> torch.Tensor:
        r"""Per-position rewards for the single-sample methods, ``[N, T]``.

        Dense rewards (bag, sequential) as the env gave them, ``r_t``. A terminal reward arrives
        only at the last step; SPEC section 3 defines the terminal task as
        ``r_t = 1{all correct}`` at *every* position, so every valid step is credited with the
        episode's reward, i.e. the reward-to-go :math:`\sum_{j \ge t} r_j`.
        """
        if self.reward_mode != "terminal":
            return self.rewards
        to_go = self.rewards.flip(-1).cumsum(-1).flip(-1)
        return to_go if self.step_mask is None else to_go * self.step_mask


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

    The logged **error** (SPEC section 5) is, over these training rollouts: 1 - exact-match rate for
    terminal-reward token tasks; the mean ``info["token_error"]`` for other token tasks (bag and
    sequential); 1 - mean(return / horizon) otherwise (bandits and MNIST: 1 - mean reward).

    :param policy: the policy; its current parameters are pi_old.
    :param env: the rollout env (:func:`make_rollout_env`).
    :param seed: seeds the env reset and the action draws of this call.
    :param n_candidates: K >= 1 to draw and score K candidates at every state (group API needed); 0
        for behaviour actions only.
    :param score_all_actions: also score every action at every state (the CE oracle).
    :param group_size: K > 1 to start rollouts in groups of K from one context (sequence level).
    """
    venv = env.venv
    n = env.num_envs
    if (n_candidates > 0 or score_all_actions) and not env.native:
        raise ValueError("scoring candidates needs the tpo_gym group API (score_candidates); use level='sequence'")
    if n % group_size != 0:
        raise ValueError(f"group_size {group_size} must divide the number of rollouts {n}")
    rng = np.random.default_rng(seed)
    if env.native:
        options = {"group_size": group_size} if group_size > 1 else None
        obs, _ = venv.reset(seed=int(rng.integers(2**31 - 1)), options=options)
    else:
        seeds = np.repeat(rng.integers(2**31 - 1, size=n // group_size), group_size)
        obs, _ = venv.reset(seed=[int(s) for s in seeds])
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    device = policy.device
    n_actions = policy.n_actions
    horizon = env.horizon
    obs = np.asarray(obs)

    obs_buf = np.empty((n, horizon, *obs.shape[1:]), dtype=obs.dtype)
    actions = torch.empty((n, horizon), dtype=torch.int64)
    logp_old = torch.empty((n, horizon, n_actions), dtype=torch.float32)
    rewards = np.zeros((n, horizon), dtype=np.float32)
    mask = np.zeros((n, horizon), dtype=np.bool_)
    k = max(n_candidates, 1)
    candidates = torch.empty((n, horizon, k), dtype=torch.int64) if n_candidates else None
    width = n_actions if score_all_actions else k
    scores = np.zeros((n, horizon, width), dtype=np.float32) if (n_candidates or score_all_actions) else None
    all_actions = np.broadcast_to(np.arange(n_actions, dtype=np.int64), (n, n_actions)) if score_all_actions else None
    token_error = np.full(n, np.nan)
    exact_match = np.full(n, np.nan)
    alive = np.ones(n, dtype=np.bool_)
    steps = horizon
    policy.set_training_mode(False)
    decode = policy.rollout_decoder()
    for t in range(horizon):
        obs_buf[:, t] = obs
        mask[:, t] = alive
        logits = decode(torch.as_tensor(obs, device=device)).float().cpu()
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
            for key, buf in (("token_error", token_error), ("exact_match", exact_match)):
                if key in info:
                    got = done & np.asarray(info.get("_" + key, np.ones(n, np.bool_)))
                    buf[got] = np.asarray(info[key], dtype=np.float64)[got]
        alive &= ~done
        if not alive.any():
            steps = t + 1
            break

    mask = mask[:, :steps]
    returns = rewards[:, :steps].sum(axis=1)
    lengths = mask.sum(axis=1)
    terminal = env.reward_mode == "terminal"
    episode_scores = returns if terminal else returns / horizon
    if terminal and not np.isnan(exact_match).any():
        error = 1.0 - float(exact_match.mean())
    elif not np.isnan(token_error).any():
        error = float(token_error.mean())
    else:
        error = 1.0 - float(np.mean(returns / horizon))
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
        reward_mode=env.reward_mode,
    )
