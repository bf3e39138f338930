"""Tensor helpers of :class:`~tpo_gym.integrations.trl.TargetPOTrainer`: the KL term, the position ids of a padded
batch, and the whole-group layout of its micro-batches. Re-exported by :mod:`tpo_gym.integrations.trl`."""

from __future__ import annotations

from typing import Any

import torch

from tpo_gym.objectives import kl_penalty


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""GRPO's k3 estimate of :math:`\mathrm{KL}(\pi_\theta \,\|\, \pi_{ref})`, per token, averaged per completion.

    .. math::
        k_{i,t} = e^{\log\pi_{ref}(o_{i,t}) - \log\pi_\theta(o_{i,t})}
                  - \big(\log\pi_{ref}(o_{i,t}) - \log\pi_\theta(o_{i,t})\big) - 1 \;\ge 0, \qquad
        \mathrm{KL} = \frac1N \sum_{i=1}^{N} \frac{\sum_t m_{i,t}\, k_{i,t}}{\max(1, \sum_t m_{i,t})}

    over the N completions (rows) and their valid tokens (``mask``), GRPO's ``loss_type="grpo"``
    averaging; the gradient per token is :math:`(1 - e^{\log\pi_{ref} - \log\pi_\theta})\,\nabla\log\pi_\theta`.
    Masked tokens are ignored whatever they hold.

    :param logp: ``[N, T]`` token log-probs under the policy (with gradient).
    :param ref_logp: ``[N, T]`` token log-probs under the frozen reference.
    :param mask: ``[N, T]`` valid tokens (bool or 0/1).
    :return: a 0-d tensor.
    """
    return kl_penalty(logp, ref_logp, mask.bool())  # the one implementation, shared with the native loop


def mask_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    r"""Position ids of a padded batch from its attention mask: :math:`\max(\mathrm{cumsum}(m) - 1, 0)`.

    The positions generation gives left-padded prompts (each row's first real token is position 0;
    padding gets 0 and is masked anyway).
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log(p.clamp(min=torch.finfo(p.dtype).tiny))).sum(dim=-1)


def _shuffle_groups(batch: dict[str, Any], k: int) -> dict[str, Any]:
    """Permute the rows of ``batch`` by whole groups of ``k`` consecutive rows (TRL's shuffle, per group)."""
    n = len(batch["completion_ids"])
    order = (torch.randperm(n // k).unsqueeze(1) * k + torch.arange(k)).reshape(-1)

    def permute(v: Any) -> Any:
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[order.to(v.device)]
        if isinstance(v, (list, tuple)) and len(v) == n:
            return [v[i] for i in order.tolist()]
        return v

    return {key: permute(value) for key, value in batch.items()}


def _grouped(seq: torch.Tensor, group: torch.Tensor, k: int, *per_row: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``[G, K]`` views of the whole groups of a micro-batch (rows sorted by group): ``seq`` then ``per_row``."""
    order = torch.argsort(group, stable=True)
    ids = group[order]
    if ids.numel() % k or bool((ids.view(-1, k) != ids.view(-1, k)[:, :1]).any()):
        raise RuntimeError("TargetPOTrainer: a micro-batch does not hold whole groups; use target_update='weights'")
    return tuple(x[order].view(-1, k) for x in (seq, *per_row))

