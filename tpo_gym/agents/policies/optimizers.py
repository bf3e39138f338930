"""The optimiser of the transformer policy: :class:`MuonAdamW`.

``torch.optim.Muon`` on every 2-D weight matrix and AdamW on the other parameters, behind one
``torch.optim.Optimizer`` (param groups, state and ``state_dict`` of both parts), the default of
:class:`~tpo_gym.agents.policies.transformer.TransformerPolicy` (``setup="tuned"``). The reference setup's
optimiser is :class:`~tpo_gym.agents.policies.reference_setup.ReferenceMuon`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["MuonAdamW"]


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on the 2-D weight matrices, ``torch.optim.AdamW`` on every other parameter.

    This is the optimiser of the paper's token experiments (docs/method.md section 4: "Muon at lr 1e-3 on 2-D
    weight matrices, AdamW on the rest"). Choices, documented because the paper does not spell them out:

    * **Which parameters get Muon**: every 2-D parameter, *including* the token / position embeddings
      and the output head, as in ``optax.contrib.muon`` (the JAX optimiser of the reference code), which
      applies Muon to all 2-D parameters and Adam to the others. ``muon_on_embeddings=False`` in
      :class:`~tpo_gym.agents.policies.transformer.TransformerPolicy` moves embeddings and head to AdamW (Keller
      Jordan's convention).
    * **Learning-rate scale**: ``adjust_lr_fn="match_rms_adamw"`` (Muon update scaled by
      ``0.2 * sqrt(max(rows, cols))``): every weight matrix moves ``0.2 * lr`` in RMS per step, the
      typical RMS of an AdamW step, whatever its shape. torch's ``"original"`` scale
      (``sqrt(max(1, rows / cols))``) moves a ``64 x 64`` matrix ``lr / 8`` in RMS, 1.6x less (1.6x to
      3.2x less on this transformer's shapes): on reverse copy (V=2, H=10) TPO_token then needs
      ~80 episodes to 1% error instead of ~55 (paper: 58); ``benchmarks/bench_tpo_token.py
      --adjust-lr-fn original`` measures it.
    * **No weight decay** (Muon's torch default is 0.1; optax's muon and its Adam part default to 0).

    SB3's learning-rate schedule writes ``param_groups[i]["lr"]``; both inner optimisers share the
    schedule. ``state_dict`` / ``load_state_dict`` hold both inner states, so ``save``/``load``
    resume training exactly.

    :param params: parameters (tensors) to optimise; 2-D ones go to Muon unless listed in
        ``adamw_params``.
    :param lr: learning rate of both parts.
    :param weight_decay: decoupled weight decay of both parts (default 0).
    :param momentum: Muon momentum (default 0.95, Nesterov).
    :param adjust_lr_fn: Muon's per-matrix learning-rate scale, ``"match_rms_adamw"`` (default) or
        ``"original"``.
    :param betas: AdamW betas.
    :param eps: AdamW epsilon.
    :param adamw_params: parameters that must go to AdamW even if 2-D (e.g. embeddings).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        adjust_lr_fn: str = "match_rms_adamw",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adamw_params: Iterable[torch.Tensor] = (),
    ) -> None:
        params = list(params)
        if not params or not all(isinstance(p, torch.Tensor) for p in params):
            raise ValueError("MuonAdamW expects a non-empty iterable of parameter tensors")
        forced = {id(p) for p in adamw_params}
        matrices = [p for p in params if p.ndim == 2 and id(p) not in forced]
        rest = [p for p in params if not (p.ndim == 2 and id(p) not in forced)]
        if adjust_lr_fn not in ("match_rms_adamw", "original"):
            raise ValueError(f"adjust_lr_fn must be 'match_rms_adamw' or 'original', got {adjust_lr_fn!r}")
        self.defaults = {"lr": lr, "weight_decay": weight_decay}
        self._optimizers: list[torch.optim.Optimizer] = []
        if matrices:
            self._optimizers.append(
                torch.optim.Muon(
                    matrices, lr=lr, weight_decay=weight_decay, momentum=momentum, adjust_lr_fn=adjust_lr_fn
                )
            )
        if rest:
            self._optimizers.append(torch.optim.AdamW(rest, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def __getstate__(self) -> dict[str, Any]:  # type: ignore[override]
        """Copy / pickle state: the inner optimisers (``torch.optim.Optimizer``'s own would write ``state`` and
        ``param_groups`` over this class's properties and patch its ``step`` as if it were built by ``Optimizer``)."""
        return {"defaults": self.defaults, "_optimizers": self._optimizers}

    def __setstate__(self, state: dict[str, Any]) -> None:  # type: ignore[override]
        self.__dict__.update(state)

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """The inner optimisers, in order: Muon (if any 2-D parameter goes to it), then AdamW (if any other).

        Read-only view of ``_optimizers`` (e.g. to stack the inner states part by part).
        """
        return tuple(self._optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The param groups of both inner optimisers (the same dict objects: writing ``lr`` works)."""
        return [g for opt in self._optimizers for g in opt.param_groups]

    @property
    def state(self) -> dict[Any, Any]:  # type: ignore[override]
        """Merged per-parameter state of both inner optimisers."""
        merged: dict[Any, Any] = {}
        for opt in self._optimizers:
            merged.update(opt.state)
        return merged

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of every parameter."""
        for opt in self._optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """One step of both inner optimisers (closures are not supported)."""
        if closure is not None:
            raise ValueError("MuonAdamW.step does not support closures")
        for opt in self._optimizers:
            opt.step()

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """``{"optimizers": [muon_state, adamw_state]}``."""
        return {"optimizers": [opt.state_dict() for opt in self._optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:  # type: ignore[override]
        """Load the states written by :meth:`state_dict`."""
        states = state_dict.get("optimizers")
        if states is None or len(states) != len(self._optimizers):
            raise ValueError("state_dict does not come from a MuonAdamW with the same parameter split")
        for opt, sd in zip(self._optimizers, states, strict=True):
            opt.load_state_dict(sd)

    def __repr__(self) -> str:
        return f"MuonAdamW({', '.join(type(o).__name__ for o in self._optimizers)}, lr={self.defaults['lr']})"
