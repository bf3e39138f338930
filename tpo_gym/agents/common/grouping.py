"""What a group is: the G x K view of a batch, its scores and its diagnostics (pure functions).

One vocabulary. After an agent gets its env, **what a group is** is one :class:`Grouping`, and every part of
the code (rollouts, :func:`view`, :func:`group_scores`, the update) reads that, never the arguments it came
from. The arguments that decide it, and the grouping each gives:

====================================  ===============================  ==============================================
method (``AlgorithmSpec.sampling``)   argument                         :attr:`Grouping.kind`
====================================  ===============================  ==============================================
``"group"`` (TPO, GRPO, GroupPG)      ``level="token"``                ``"candidates"``: K actions drawn and scored at
                                                                       every visited state (the group API)
``"group"``                           ``level="sequence"``             ``"rollouts"``: K complete same-seed rollouts
                                                                       per context, scored by the episode
``"group"`` (TPO, GroupPG)            ``candidates="single"``          ``"actions"``: one sampled action; scores over
                                                                       every action (one-hot advantage)
``"oracle"`` (CE)                     --                               ``"actions"`` with every action scored
``"single"`` (PPO, REINFORCE, DG)     --                               ``"none"``: one behaviour trajectory per
                                                                       context
any, on a language model              --                               ``"rollouts"``: K completions per prompt
====================================  ===============================  ==============================================

``level="auto"`` is ``"token"`` on an env with the group API and ``"sequence"`` otherwise
(:func:`resolve_grouping`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

__all__ = [
    "GROUPING_KINDS",
    "Grouping",
    "resolve_grouping",
    "view",
    "group_scores",
    "group_diagnostics",
    "single_candidate_scores",
]

#: The values of :attr:`Grouping.kind` (see the module docstring).
GROUPING_KINDS = ("candidates", "rollouts", "actions", "none")


@dataclasses.dataclass(frozen=True)
class Grouping:
    """How one agent's batch forms groups: decided once, read by the rollout side and by :func:`view`.

    :param kind: one of :data:`GROUPING_KINDS`: ``"candidates"`` (K actions drawn and scored at every visited
        state: TPO_token, GRPO_token, bandits), ``"rollouts"`` (K complete rollouts per context: sequence
        level, language models), ``"actions"`` (every action of a state: the one-hot TPO of MNIST, the CE
        oracle) or ``"none"`` (one behaviour trajectory per context: PPO, REINFORCE, DG).
    :param n_candidates: K for ``"candidates"``, else 0.
    :param rollout_group: K for ``"rollouts"``, else 1.
    :param score_all_actions: whether the rollouts score every action of every state.
    """

    kind: str
    n_candidates: int = 0
    rollout_group: int = 1
    score_all_actions: bool = False

    def __post_init__(self) -> None:
        if self.kind not in GROUPING_KINDS:
            raise ValueError(f"Grouping.kind must be one of {', '.join(GROUPING_KINDS)}; got {self.kind!r}")

    @property
    def needs_group_api(self) -> bool:
        """Whether the env must score candidates without stepping (tpo_gym's group API)."""
        return self.n_candidates > 0 or self.score_all_actions

    @property
    def compares_k(self) -> bool:
        """Whether groups are K candidates or K rollouts compared with each other (so K >= 2)."""
        return self.kind in ("candidates", "rollouts")


def resolve_grouping(sampling: str, level: str, group_size: int, *, native: bool, text: bool = False,
                     single_candidate: bool = False) -> Grouping:
    """The :class:`Grouping` of a method on an env (see the module docstring's table).

    :param sampling: the method's ``AlgorithmSpec.sampling`` (``"group"``, ``"single"``, ``"oracle"``).
    :param level: ``"auto"``, ``"token"`` or ``"sequence"``.
    :param group_size: K.
    :param native: whether the env has the group API (``score_candidates``).
    :param text: a language model on a text env (groups are K completions per prompt).
    :param single_candidate: ``candidates="single"`` (TPO, GroupPG): one sampled action, scores over all.
    """
    if single_candidate:
        if text:
            raise ValueError("candidates='single' scores every action of a Discrete action space (MNIST); a language "
                             "model's groups are K sampled completions per prompt: use candidates='sampled'")
        return Grouping("actions")
    if text:
        if level == "token":
            raise ValueError("level='token' is for Discrete token tasks; a language model's groups are K "
                             "completions per prompt (level='sequence')")
        return Grouping("rollouts", rollout_group=group_size)
    if sampling == "single":
        return Grouping("none")
    if sampling == "oracle":
        return Grouping("actions", score_all_actions=True)
    if (level if level != "auto" else ("token" if native else "sequence")) == "token":
        return Grouping("candidates", n_candidates=group_size)
    return Grouping("rollouts", rollout_group=group_size)


def view(grouping: Grouping, logp: torch.Tensor, batch: Any) -> torch.Tensor:
    """The log-probs the objective reads, from ``logp`` ``[N, T, n_actions]``, by the grouping.

    ``"candidates"``: ``[N, T, K]`` of the per-state candidates; ``"rollouts"``: ``[B, K]``
    sequence log-probs (sum over steps) of the K rollouts of each context; ``"actions"``: ``logp``
    itself; ``"none"``: ``[N, T]`` of the behaviour actions (0 at invalid steps).
    """
    if grouping.kind == "candidates":
        assert batch.candidates is not None
        return logp.gather(-1, batch.candidates)
    if grouping.kind == "actions":
        return logp
    taken = logp.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
    if batch.step_mask is not None:
        taken = torch.where(batch.step_mask, taken, torch.zeros_like(taken))
    if grouping.kind == "rollouts":
        return taken.sum(dim=1).reshape(-1, batch.group_size)
    return taken


def group_scores(grouping: Grouping, batch: Any, wrapped: list[str] | None = None,
                 horizon: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores of the groups and their validity mask, shaped like :func:`view` (``"rollouts"``: ``[B, K]``).

    :param wrapped: names of the rollouts' wrappers that may change rewards
        (:func:`~tpo_gym.agents.common.env_copies.reward_wrappers`): with any, a ``"rollouts"`` group scores each
        rollout by the rewards those wrappers gave, ``return / horizon``, not by the env's own ``info["score"]``, and a
        non-finite score is a ``ValueError`` naming them.
    :param horizon: the rollout env's horizon (see :class:`~tpo_gym.agents.common.sampling.RolloutEnv`).
    """
    if grouping.kind == "rollouts":
        if not wrapped:
            return batch.episode_scores.reshape(-1, batch.group_size), None
        scores = batch.returns.to(batch.episode_scores.dtype) / horizon
        _check_finite_returns(scores, wrapped)
        return scores.reshape(-1, batch.group_size), None
    if batch.candidate_scores is None:
        raise RuntimeError(f"a {grouping.kind!r} grouping has no candidate scores")
    mask = None
    if batch.step_mask is not None:
        mask = batch.step_mask.unsqueeze(-1).expand_as(batch.candidate_scores)
    return batch.candidate_scores, mask


def _check_finite_returns(scores: torch.Tensor, wrapped: list[str]) -> None:
    """``ValueError`` naming the first rollout whose (wrapped) return is not finite."""
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"the rewards of rollout {first} sum to {float(scores[first])!r} (after the wrapper(s) "
            f"{', '.join(wrapped)}); group methods need finite rewards: make the reward wrapper return finite numbers"
        )


def group_diagnostics(scores: torch.Tensor, mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Fractions of zero-variance, all-fail (every score <= 0) and any-success (a score >= 1) groups
    (0-d tensors: read back with the iteration's record, see :func:`~tpo_gym.agents.common.update.resolve_records`)."""
    from tpo_gym.objectives import zero_variance_groups

    valid = torch.ones(scores.shape[:-1], dtype=torch.bool, device=scores.device)
    if mask is not None:
        valid = mask.any(dim=-1)
    hi = scores if mask is None else scores.masked_fill(~mask, -math.inf)
    n = valid.sum().clamp(min=1)

    def frac(x: torch.Tensor) -> torch.Tensor:
        return (x & valid).sum() / n

    return {
        "zero_variance_fraction": frac(zero_variance_groups(scores, mask)),
        "all_fail_fraction": frac(hi.max(dim=-1).values <= 0),
        "any_success_fraction": frac(hi.max(dim=-1).values >= 1),
    }


def single_candidate_scores(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """Scores over *all* actions from one sampled action per state (``candidates="single"``).

    ``s = A onehot(a)`` with ``A = r - sum_k pi_old(k)^2``
    (:func:`~tpo_gym.objectives.onehot_advantage_scores`), shaped ``[N, T, n_actions]``, with the
    validity mask of the valid steps and the all-fail / any-success diagnostics of the rewards.
    """
    from tpo_gym.objectives import onehot_advantage_scores

    n, t, n_actions = batch.logp_old.shape
    scores = onehot_advantage_scores(
        batch.actions.reshape(-1), batch.rewards.reshape(-1), batch.logp_old.exp().reshape(-1, n_actions)
    ).reshape(n, t, n_actions)
    mask = None if batch.step_mask is None else batch.step_mask.unsqueeze(-1).expand(n, t, n_actions)
    step_mask = None if batch.step_mask is None else batch.step_mask.unsqueeze(-1)
    diagnostics = group_diagnostics(batch.rewards.unsqueeze(-1), step_mask)
    diagnostics.pop("zero_variance_fraction")
    return scores, mask, diagnostics
