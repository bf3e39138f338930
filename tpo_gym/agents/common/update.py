"""The update: what ``prepare`` hands ``compute_loss`` (one typed batch per method family) and the one epoch loop.

One iteration's update of one agent (or of S seeds at once, :class:`~tpo_gym.agents.SeedBatch`) is::

    update = agent.begin_update()                    # batch, prepared (frozen targets / advantages), diagnostics
    stats = run_epochs(n_epochs, ...)                # E full-batch optimiser steps, one read-back at the end
    record = agent.finish_update(update, stats)

:func:`run_epochs` is the only epoch loop: ``GroupAlgorithm.train`` runs it for one agent, ``SeedBatch`` for S
agents with its own backward (each seed's, or one stacked forward) and optimiser step (each seed's, or one
stacked optimiser). Language models accumulate the gradient over micro-batches of whole groups
(:func:`accumulate_text_gradients`), slicing the prepared batch with :func:`slice_groups`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tpo_gym.objectives import at_least_float32

__all__ = [
    "Prepared",
    "TargetBatch",
    "GroupAdvantageBatch",
    "ClippedGroupBatch",
    "StepAdvantageBatch",
    "LabelBatch",
    "Update",
    "slice_groups",
    "grad_norm",
    "run_epochs",
    "accumulate_text_gradients",
    "resolve_records",
]


# --------------------------------------------------------------------------------------------
# typed batches: what prepare() freezes for compute_loss()
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Prepared:
    """Base of the frozen quantities of one update (computed once under pi_old, read by every epoch)."""


@dataclasses.dataclass(frozen=True)
class TargetBatch(Prepared):
    """Target methods (TPO): the target ``q`` over each group (shaped like the group log-probs) and its mask."""

    q: torch.Tensor
    mask: torch.Tensor | None


@dataclasses.dataclass(frozen=True)
class GroupAdvantageBatch(Prepared):
    """Group policy gradient (GroupPG): standardised scores ``u`` of each group and its mask."""

    u: torch.Tensor
    mask: torch.Tensor | None


@dataclasses.dataclass(frozen=True)
class ClippedGroupBatch(Prepared):
    """Clipped group surrogate (GRPO): the group scores, their mask, the rollout-time log-probs ``logp_old``
    and, with a frozen reference model, its log-probs ``logp_ref``."""

    scores: torch.Tensor
    mask: torch.Tensor | None
    logp_old: torch.Tensor
    logp_ref: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class StepAdvantageBatch(Prepared):
    """Single-sample methods (PPO, REINFORCE, DG): per-step advantages and the behaviour actions' ``logp_old``."""

    adv: torch.Tensor
    logp_old: torch.Tensor


@dataclasses.dataclass(frozen=True)
class LabelBatch(Prepared):
    """Supervised oracle (CE): the true label of every state."""

    labels: torch.Tensor


def slice_groups(prepared: Any, start: int, stop: int, n_groups: int) -> Any:
    """The part of ``prepared`` for groups ``start .. stop-1`` of ``n_groups``: every tensor whose first dimension
    is ``n_groups`` is sliced, everything else is kept (a :class:`Prepared` or a plain mapping)."""
    def part(v: Any) -> Any:
        return v[start:stop] if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == n_groups else v

    if isinstance(prepared, Prepared):
        return dataclasses.replace(prepared, **{f.name: part(getattr(prepared, f.name))
                                                for f in dataclasses.fields(prepared)})
    if isinstance(prepared, Mapping):
        return {k: part(v) for k, v in prepared.items()}
    raise TypeError(f"prepare() must return a Prepared batch or a mapping, got {type(prepared).__name__}")


# --------------------------------------------------------------------------------------------
# the epoch loop
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Update:
    """One agent's update in progress: its batch, the prepared quantities, the batch's diagnostics, the trained
    parameters and when the epochs started."""

    batch: Any
    prepared: Any
    diagnostics: dict[str, Any]
    params: list[torch.Tensor]
    started: float = dataclasses.field(default_factory=time.perf_counter)


def grad_norm(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm of the gradients of ``params`` (those that have one), a 0-d tensor (read back by the caller)."""
    grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.cat(grads)) if grads else torch.zeros(())


def run_epochs(n_epochs: int, params: Sequence[Sequence[torch.Tensor]], max_grad_norms: Sequence[float | None],
               zero_grad: Callable[[], None], backward: Callable[[], Sequence[torch.Tensor]],
               step: Callable[[], None]) -> list[dict[str, float]]:
    """``n_epochs`` optimiser steps of S >= 1 models; ``[{"loss", "final_loss", "grad_norm"}]`` per model.

    Each epoch: ``zero_grad()``; ``backward()`` computes every model's loss, back-propagates it and returns the S
    losses; each model's gradient norm is taken at the first epoch (before clipping), then clipped to its
    ``max_grad_norms[s]`` (``None``: no clipping); ``step()``. ``loss`` is the first epoch's loss (the loss at
    pi_old), ``final_loss`` the last one's. The values are read back once, at the end (on a GPU, no
    synchronisation inside the epochs).
    """
    first = last = norms = torch.full((len(params),), math.nan)
    for epoch in range(n_epochs):
        zero_grad()
        values = torch.stack([loss.detach() for loss in backward()])
        if epoch == 0:
            norms = torch.stack([grad_norm(ps).to(values.device) for ps in params])
            first = values
        for ps, max_norm in zip(params, max_grad_norms, strict=True):
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(ps, max_norm)
        step()
        last = values
    first_l, last_l, norms_l = torch.stack([first, last, norms.to(first.device)]).double().tolist()
    return [{"loss": first_l[s], "final_loss": last_l[s], "grad_norm": norms_l[s]} for s in range(len(params))]


def accumulate_text_gradients(agent: Any, batch: Any, prepared: Any) -> torch.Tensor:
    """Backward a language-model agent's loss over micro-batches of whole groups; return the full-batch loss.

    Each micro-batch's loss (plus the agent's ``token_penalty``) is scaled by its share of the groups' total
    weight (``agent.group_weights``), so the accumulated gradient is exactly the full-batch gradient.
    """
    n = batch.n_groups
    weights = agent.group_weights(prepared, n).to(torch.float64)
    total_weight = float(weights.sum())
    total = torch.zeros(())
    for a, b in agent.policy.micro_batches(n):
        share = float(weights[a:b].sum()) / total_weight if total_weight > 0 else (b - a) / n
        token_logp = agent.policy.token_logp(batch, a, b)
        current = agent.policy.sequence_logp(token_logp, batch, a, b)
        loss = agent.compute_loss(batch, slice_groups(prepared, a, b, n), current)
        penalty = agent.token_penalty(batch, a, b, token_logp)
        if penalty is not None:
            loss = loss + penalty
        loss = loss * share
        loss.backward()
        total = total + at_least_float32(loss.detach()).cpu()
    return total


def resolve_records(records: list[dict[str, Any]]) -> None:
    """Replace every tensor value of ``records`` by its Python float, in place, with one read-back.

    The diagnostics of an update stay on the device until its record is made; reading them back one
    by one would synchronise a GPU once per value.
    """
    keys = [(r, k) for r in records for k, v in r.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return
    device = keys[0][0][keys[0][1]].device
    values = torch.stack([r[k].detach().reshape(()).to(device, torch.float64) for r, k in keys]).tolist()
    for (r, k), v in zip(keys, values, strict=True):
        r[k] = v
