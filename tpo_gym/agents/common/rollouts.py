"""The containers of a rollout: the vector env it runs in (:class:`RolloutEnv`) and the batch it returns
(:class:`RolloutBatch`), shared by the rollouts of Discrete (:mod:`~tpo_gym.agents.common.sampling`) and Box
(:mod:`~tpo_gym.agents.common.box_rollouts`) actions and re-exported by ``sampling``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from tpo_gym.agents.common.sb3_conventions import episode_entries
from tpo_gym.envs.group import SyncGroupVectorEnv

__all__ = ["RolloutEnv", "RolloutBatch", "record_episode_ends", "episode_summary"]


@dataclass
class RolloutEnv:
    """A vector env ready for rollouts, with what the agents need to know about it.

    :param venv: the Gymnasium vector env (``num_envs`` sub-envs).
    :param native: True for a tpo_gym native vector env (group API: ``score_candidates`` and the
        ``group_size`` reset option); False for any other env (groups through same-seed resets).
    :param horizon: episode length of fixed-length envs (token tasks: H; bandits / MNIST: 1), or the
        ``max_episode_steps`` bound of other envs.
    :param reward_credit: the env's ``reward_credit``: ``"step"`` (per-step rewards are the per-step
        credit) or ``"episode"`` (every step is credited with the episode's reward: the terminal task).
    :param on_device: the venv is a native env's on-device tensor form (see :func:`make_rollout_env`).
    :param fixed_length: every episode lasts ``horizon`` steps; ``False`` for an env bounded by ``max_episode_steps``
        (CartPole), whose episodes vary in length.
    """

    venv: gym.vector.VectorEnv
    native: bool
    horizon: int
    reward_credit: str = "step"
    #: True for an on-device tensor env (``TokenTaskTensorEnv``, ``MNISTBanditTensorEnv``): rollouts stay on its device.
    on_device: bool = False
    fixed_length: bool = True

    @property
    def num_envs(self) -> int:
        """Number of sub-envs (rollouts per iteration)."""
        return int(self.venv.num_envs)

    @property
    def scores_candidates(self) -> bool:
        """Whether the venv scores candidates: a native env, or a single group env's
        :class:`~tpo_gym.envs.group.SyncGroupVectorEnv` (whose groups still come from same-seed resets)."""
        return self.native or isinstance(self.venv, SyncGroupVectorEnv)


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
    :param episode_scores: ``float32 [N]`` sequence score of each rollout: the env's
        ``info["score"]`` at the episode's end (token tasks: mean per-step reward, or 0/1 exact match
        with a terminal reward), else ``return / horizon``.
    :param returns: ``float32 [N]`` undiscounted episode returns.
    :param lengths: ``int64 [N]`` episode lengths.
    :param error: the training error over these rollouts (see :func:`collect_rollouts`).
    :param n_steps: env steps taken (sum of ``lengths``; steps of sub-envs past their episode are not counted).
    :param reward_credit: the env's ``reward_credit`` (``"step"`` or ``"episode"``).
    :param end_infos: per rollout, the ``"episode"`` (``Monitor``, ``RecordEpisodeStatistics``) and ``"is_success"``
        entries of the info that ended its episode, or ``None`` when the env gave none.
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
    reward_credit: str = "step"
    end_infos: list[dict[str, Any]] | None = None

    def credited_rewards(self) -> torch.Tensor:
        r"""Per-position rewards for the single-sample methods, ``[N, T]``.

        With ``reward_credit == "step"`` (dense rewards: bag, sequential) the rewards as the env gave
        them, ``r_t``. With ``"episode"`` (the terminal task, whose reward arrives at the last step
        but is defined as ``r_t = 1{all correct}`` at *every* position) every valid step is credited
        with the episode's reward, i.e. the reward-to-go :math:`\sum_{j \ge t} r_j`.
        """
        if self.reward_credit != "episode":
            return self.rewards
        to_go = self.rewards.flip(-1).cumsum(-1).flip(-1)
        return to_go if self.step_mask is None else to_go * self.step_mask


def record_episode_ends(info: dict[str, Any], done: np.ndarray, ep_score: np.ndarray, ep_error: np.ndarray,
                        end_infos: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """At a step where the sub-envs ``done`` ended their episodes: their ``info["score"]`` / ``info["error"]``
    into ``ep_score`` / ``ep_error`` (in place) and their ``"episode"`` / ``"is_success"`` entries into
    ``end_infos`` (returned)."""
    n = len(done)
    for key, buf in (("score", ep_score), ("error", ep_error)):
        if key in info:
            got = done & np.asarray(info.get("_" + key, np.ones(n, np.bool_)))
            buf[got] = np.asarray(info[key], dtype=np.float64)[got]
    if "episode" in info or "is_success" in info:
        end_infos = episode_entries(info, done, end_infos)
    return end_infos


def episode_summary(rewards: np.ndarray, mask: np.ndarray, steps: int, ep_score: np.ndarray, ep_error: np.ndarray,
                    horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """``(mask, returns, lengths, episode_scores, error)`` of rollouts that took ``steps`` steps: the episode score
    is the env's ``info["score"]`` where it gave one, else ``return / horizon``; the error the env's
    ``info["error"]`` where it gave one, else ``1 - score``, averaged over the rollouts."""
    mask = mask[:, :steps]
    returns = rewards[:, :steps].sum(axis=1)
    lengths = mask.sum(axis=1)
    episode_scores = np.where(np.isnan(ep_score), returns / horizon, ep_score)
    error = float(np.mean(np.where(np.isnan(ep_error), 1.0 - episode_scores, ep_error)))
    return mask, returns, lengths, episode_scores, error
