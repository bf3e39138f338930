r"""RLOO for tpo-gym: REINFORCE with a leave-one-out baseline over each group, as a plugin package.

Installed (``pip install examples/rloo_plugin``), it publishes the class through the entry-point group
``tpo_gym.algorithms`` (its pyproject.toml), so a preset's method row ``{"name": "RLOO", "algo": "RLOO"}``
runs it in ``tpo-gym bench``; without installing, ``"algo": "tpo_rloo:RLOO"`` with this directory on
``PYTHONPATH`` does the same (docs: "Benchmark your own algorithm").
"""

from __future__ import annotations

from typing import Any

import torch

from tpo_gym.agents import GroupAlgorithm
from tpo_gym.agents.common.registry import GROUP_DIAGNOSTICS, TEXT_DIAGNOSTICS, UPDATE_DIAGNOSTICS, AlgorithmSpec
from tpo_gym.agents.common.update import GroupAdvantageBatch
from tpo_gym.objectives import group_pg_loss

__all__ = ["RLOO", "leave_one_out_advantages"]


def leave_one_out_advantages(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Each candidate's score minus the mean score of the other candidates of its group.

    .. math::
        A_k = s_k - \frac{1}{n - 1} \sum_{j \ne k} s_j = \frac{n}{n - 1}\,\big(s_k - \bar s\big)

    over the ``n`` valid candidates of a group (the last axis). Masked candidates, and every candidate of a
    group with fewer than two valid ones (no other candidate to compare with), get 0. Computed in float64,
    returned in the dtype of ``scores``.

    :param scores: ``[..., K]`` scores of the candidates (their rewards).
    :param mask: optional ``[..., K]`` boolean, the valid candidates; masked entries are ignored whatever they hold.
    """
    valid = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask
    s = torch.where(valid, scores.double(), 0.0)
    n = valid.sum(dim=-1, keepdim=True).double()
    advantages = (n * s - s.sum(dim=-1, keepdim=True)) / (n - 1).clamp(min=1)
    return torch.where(valid & (n >= 2), advantages, 0.0).to(scores.dtype)


class RLOO(GroupAlgorithm):
    r"""REINFORCE with a leave-one-out baseline (RLOO) over the groups of tpo-gym.

    For the K scored candidates of each group (K next-token candidates of a state at ``level="token"``, K
    rollouts of a context at ``level="sequence"``), the baseline of candidate k is the mean score of the
    other K - 1 (:func:`leave_one_out_advantages`), and the loss is REINFORCE's with those advantages:

    .. math::
        A_{g,k} = s_{g,k} - \frac{1}{K - 1} \sum_{j \ne k} s_{g,j}, \qquad
        L = -\frac{1}{G} \sum_g \sum_{k=1}^{K} A_{g,k} \, \log \pi_\theta(y_{g,k})

    (``tpo_gym.objectives.group_pg_loss`` with ``u = A`` and ``eta = 1``). Unlike GroupPG the advantages are
    not divided by the group's standard deviation. One full-batch step per epoch, ``n_epochs`` epochs, on the
    rollouts of pi_old, as every group method of tpo-gym.
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), run_kinds=("token", "mnist", "llm"),
        diagnostics=(*UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS, *TEXT_DIAGNOSTICS),
    )

    def prepare(self, batch: Any, old: torch.Tensor) -> tuple[GroupAdvantageBatch, dict[str, Any]]:
        """The leave-one-out advantages of every group, and the group diagnostics."""
        scores, mask = self.group_scores(batch)
        return GroupAdvantageBatch(u=leave_one_out_advantages(scores, mask), mask=mask), \
            self.group_diagnostics(scores, mask)

    def compute_loss(self, batch: Any, prepared: GroupAdvantageBatch, current: torch.Tensor) -> torch.Tensor:
        """``-mean_g sum_k A_k log pi(y_k)``: :func:`~tpo_gym.objectives.group_pg_loss` with ``eta = 1``."""
        return group_pg_loss(current, prepared.u, 1.0, prepared.mask)
