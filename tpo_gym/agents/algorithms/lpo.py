r"""LPO: listwise projection onto a softmax target with a uniform prior (arXiv:2605.06139)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from stable_baselines3.common.type_aliases import GymEnv

from tpo_gym._validation import check_choice, check_float
from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.registry import (
    GROUP_DIAGNOSTICS,
    TEXT_DIAGNOSTICS,
    UPDATE_DIAGNOSTICS,
    AlgorithmSpec,
    register_algorithm,
)
from tpo_gym.agents.common.sampling import RolloutBatch
from tpo_gym.agents.common.update import Prepared
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.objectives.listwise import LPO_FITS, LPO_TAUS, lpo_loss, lpo_target

__all__ = ["LPO", "ListwiseTargetBatch"]


@dataclasses.dataclass(frozen=True)
class ListwiseTargetBatch(Prepared):
    """LPO: the target ``w`` over each group (float64, shaped like the group log-probs), the rollout-time
    log-probs ``logp_old`` of the candidates (the policy side is ``softmax(logp - logp_old)``) and the mask."""

    w: torch.Tensor
    logp_old: torch.Tensor
    mask: torch.Tensor | None


@register_algorithm
class LPO(GroupAlgorithm):
    r"""Listwise policy optimisation: project the policy, relative to pi_old, onto ``softmax(R / tau)`` over each group.

    Same candidates as :class:`~tpo_gym.agents.TPO` (``level="token"``: K next-token candidates per state;
    ``"sequence"``: K rollouts per context; a language model: K completions per prompt). With ``s`` the K scores
    of a group and ``ell`` the candidates' log-probabilities:

    .. math::
        w^* = \operatorname{softmax}\big((s - \bar s)/\tau\big), \qquad
        p^\theta = \operatorname{softmax}\big(\ell^\theta - \ell^{old}\big), \qquad
        L = \mathrm{KL}(w^* \,\|\, p^\theta) \ \ (\texttt{fit="forward\_kl"}) \quad\text{or}\quad
        \mathrm{KL}(p^\theta \,\|\, w^*) \ \ (\texttt{"reverse\_kl"})

    averaged over groups, ``w*`` frozen for the ``n_epochs`` full-batch steps
    (:func:`~tpo_gym.objectives.listwise.lpo_target`, :func:`~tpo_gym.objectives.listwise.lpo_loss`; forward
    gradient :math:`p^\theta - w^*`). ``tau``: ``"std"`` (the group's standard deviation, GRPO-like: ``w* =
    softmax(u)``), ``"one"``, ``"mean"`` (the group's mean, MaxRL-like; scores must be >= 0) or a fixed number.
    All-equal groups get the uniform target (no signal at the on-policy point).

    **Why a class of its own, not TPO options.** LPO differs from TPO on *both* sides of the fit, so
    ``TPO(prior="uniform")`` would not be LPO: TPO's target is :math:`q \propto p^{old} e^{u/\eta}` and its policy
    side :math:`\operatorname{softmax}(\ell^\theta)` (the policy renormalised over the group); LPO's target has
    a uniform prior and its policy side is the *ratio* :math:`\pi_\theta / \pi_{old}` renormalised over the group
    (uniform at the on-policy point, since the candidates were drawn from pi_old). Dropping only TPO's prior
    is ``TPO(anchor=False)``, a different method (its fixed point :math:`\pi_\theta \propto e^{u/\eta}` forgets
    pi_old). LPO's fixed point is :math:`\pi_\theta \propto \pi_{old}\, w^*` over the group, which for
    ``tau="std"`` is exactly TPO's :math:`q` at ``eta=1``: the ratio parametrisation carries the anchor, and
    ``TPO`` vs ``LPO`` compares two geometries with the same optimum (TPO's step on candidate i is weighted by
    :math:`p^{old}_i`, LPO's is not: with sequence-level log-probs p_old is often near one-hot, which is where
    they part). It also needs ``logp_old`` at loss time, which TPO's loss does not.

    Diagnostics: ``zero_variance_fraction``, ``all_fail_fraction``, ``any_success_fraction`` (and on language
    models ``completion_length``, ``mean_score``).

    :param fit: ``"forward_kl"`` (default, :math:`\mathrm{KL}(w^* \| p^\theta)`, gradient
        :math:`p^\theta - w^*`) or ``"reverse_kl"`` (:math:`\mathrm{KL}(p^\theta \| w^*)`; at the on-policy
        point a group policy gradient with advantages :math:`(s - \bar s)/\tau`).
    :param tau: temperature of the target: ``"std"`` (default), ``"one"``, ``"mean"`` or a finite number > 0.
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), run_kinds=("token", "mnist", "llm"),
        diagnostics=(*UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS, *TEXT_DIAGNOSTICS),
    )

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        *,
        fit: str = "forward_kl",
        tau: str | float = "std",
        **kwargs: Any,
    ) -> None:
        self.fit = check_choice("fit", fit, LPO_FITS)
        self.tau = check_choice("tau", tau, LPO_TAUS) if isinstance(tau, str) else check_float(
            "tau", tau, 0.0, strict_min=True)
        super().__init__(policy, env, **kwargs)

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[ListwiseTargetBatch, dict[str, Any]]:
        """Scores and the frozen target ``w*`` of every group (in float64: no candidate's weight underflows)."""
        scores, mask = self.group_scores(batch)
        w = lpo_target(scores.to(torch.float64), self.tau, mask)
        return ListwiseTargetBatch(w=w, logp_old=old, mask=mask), self.group_diagnostics(scores, mask)

    def compute_loss(self, batch: RolloutBatch, prepared: ListwiseTargetBatch, current: torch.Tensor) -> torch.Tensor:
        """:func:`~tpo_gym.objectives.listwise.lpo_loss` of the group log-probs against the frozen target."""
        return lpo_loss(current, prepared.logp_old, prepared.w, self.fit, prepared.mask)
