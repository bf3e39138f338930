"""Optimisers on seed-stacked tensors ``[S, *shape]`` (one optimiser stepping S seeds), and the memory check of S.

Elementwise torch optimisers (``Adam``, ``AdamW``, ``SGD``) on stacked tensors are S exact copies of the seeds'
own; :class:`StackedMuon` batches ``torch.optim.Muon``'s Newton-Schulz over the seeds;
:class:`~tpo_gym.agents.policies.optimizers.MuonAdamW` is stacked part by part and
:class:`~tpo_gym.agents.policies.reference_setup.ReferenceMuon` runs stacked itself. :class:`StackedOptimizer` reads the
seeds' optimiser states in and writes them back; :class:`SyncedOptimizer` stands in for a seed's optimiser while
the stacked one steps, so the seed's ``state_dict()`` (and so its ``save``) is always current.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from tpo_gym.agents.policies.optimizers import MuonAdamW
from tpo_gym.agents.policies.reference_setup import ReferenceMuon

__all__ = [
    "ELEMENTWISE_OPTIMIZERS",
    "stacked_newton_schulz",
    "StackedMuon",
    "StackedOptimizer",
    "SyncedOptimizer",
    "stackable_optimizer",
    "optimizer_difference",
    "available_memory",
    "check_memory",
]

#: torch optimisers whose update is elementwise: one instance on stacked tensors is S exact copies.
ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.Adam, torch.optim.AdamW,
                                                                    torch.optim.SGD)


# --------------------------------------------------------------------------------------------
# Muon on stacked matrices
# --------------------------------------------------------------------------------------------
def stacked_newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                          eps: float, dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    """torch Muon's Newton-Schulz orthogonalisation of each matrix of ``g`` ``[S, A, B]`` at once.

    Per matrix ``X`` (in ``dtype``: bfloat16 as torch's Muon, or ``None`` for ``g``'s own dtype; transposed to
    the wide orientation when ``A > B``): ``X <- X / max(||X||_F, eps)``, then ``steps`` times ``G = X X^T``,
    ``X <- a X + (b G + c G G) X``.
    """
    if g.ndim != 3:
        raise ValueError(f"stacked_newton_schulz needs [S, A, B] matrices, got shape {tuple(g.shape)}")
    a, b, c = coefficients
    x = g if dtype is None else g.to(dtype)
    transposed = g.size(1) > g.size(2)
    if transposed:
        x = x.mT
    x = x / torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, update, x, beta=a)
    return x.mT if transposed else x


class StackedMuon(torch.optim.Optimizer):
    """``torch.optim.Muon``'s update on seed-stacked matrices ``[S, A, B]``, each seed its own matrix.

    Per seed and matrix, as torch's single-tensor Muon: ``B <- lerp(B, g, 1 - mu)``; the update
    ``O = NS(lerp(g, B, mu))`` (Nesterov) or ``NS(B)``; ``theta <- theta (1 - lr wd) - lr' O`` with
    ``lr' = `` torch's ``adjust_lr_fn`` of the matrix shape ``[A, B]``. Param groups carry torch Muon's
    keys (``lr``, ``weight_decay``, ``momentum``, ``nesterov``, ``ns_coefficients``, ``eps``,
    ``ns_steps``, ``adjust_lr_fn``); the state of a parameter is its ``momentum_buffer``, as torch's.
    """

    def __init__(self, param_groups: list[dict[str, Any]]) -> None:
        for group in param_groups:
            for p in group["params"]:
                if p.ndim != 3:
                    raise ValueError(f"StackedMuon needs [S, A, B] parameters, got shape {tuple(p.shape)}")
        super().__init__(param_groups, {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """One Muon step of every stacked matrix with a gradient (closures are not supported)."""
        from torch.optim._muon import _adjust_lr

        if closure is not None:
            raise ValueError("StackedMuon.step does not support closures")
        for group in self.param_groups:
            lr, momentum = float(group["lr"]), group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = stacked_newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape[1:]))


def _inner_optimizers(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    return list(optimizer.optimizers) if isinstance(optimizer, MuonAdamW) else [optimizer]


def stackable_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer="stacked"`` can stand in for this optimiser (see the module docstring)."""
    return all(type(o) in ELEMENTWISE_OPTIMIZERS or type(o) in (torch.optim.Muon, ReferenceMuon)
               for o in _inner_optimizers(optimizer))


def optimizer_difference(agents: Sequence[Any]) -> str | None:
    """How the agents' optimiser settings differ (``None``: they are one set), which ``optimizer="stacked"``
    cannot follow: it steps every seed with the first seed's settings (param-group entries other than the
    parameters, and the learning-rate schedule at the start, middle and end of training)."""
    def settings(agent: Any) -> list[tuple[str, Any]]:
        out = [(f"{type(o).__name__} group {g} {key!r}", value)
               for o in _inner_optimizers(agent.policy.optimizer)
               for g, group in enumerate(o.param_groups) for key, value in group.items() if key != "params"]
        schedule = getattr(agent, "lr_schedule", None)
        if callable(schedule):
            out += [(f"learning-rate schedule at progress {x}", float(schedule(x))) for x in (1.0, 0.5, 0.0)]
        return out

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        return bool(a == b)

    first = settings(agents[0])
    for s, agent in enumerate(agents[1:], start=1):
        mine = settings(agent)
        if len(mine) != len(first):
            return f"seed {s} has other optimiser parameter groups than seed 0"
        for (name, v0), (_, v) in zip(first, mine, strict=True):
            if not same(v0, v):
                return f"seed {s} differs from seed 0 in {name}: {v!r} vs {v0!r}"
    return None


class StackedOptimizer:
    """One optimiser per inner optimiser of the seeds' (same-class) optimisers, on the stacked tensors."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], stacked: dict[int, torch.Tensor]) -> None:
        """
        :param optimizers: the S seeds' optimisers.
        :param stacked: ``id(param of seed 0) -> [S, *shape]`` stacked tensor.
        """
        self._parts: list[tuple[list[torch.optim.Optimizer], torch.optim.Optimizer]] = []
        self._stacked = stacked
        inners = [_inner_optimizers(o) for o in optimizers]
        for k, first in enumerate(inners[0]):
            groups = [{**{key: v for key, v in g.items() if key != "params"},
                       "params": [stacked[id(p)] for p in g["params"]]} for g in first.param_groups]
            if type(first) is torch.optim.Muon:
                batched: torch.optim.Optimizer = StackedMuon(groups)
            elif type(first) is ReferenceMuon:
                batched = ReferenceMuon([{**g, "stacked": True} for g in groups])
            elif type(first) in ELEMENTWISE_OPTIMIZERS:
                batched = type(first)(groups)
            else:
                supported = ", ".join(c.__name__ for c in ELEMENTWISE_OPTIMIZERS)
                raise ValueError(f"optimizer='stacked' supports {supported}, torch.optim.Muon, MuonAdamW and "
                                 f"ReferenceMuon; "
                                 f"got {type(first).__name__}: use optimizer='loop'")
            self._parts.append(([inner[k] for inner in inners], batched))
        self._read_states()

    def _pairs(self) -> Iterable[tuple[list[torch.optim.Optimizer], torch.optim.Optimizer, int, int]]:
        for seeds, batched in self._parts:
            for gi, group in enumerate(seeds[0].param_groups):
                for pi in range(len(group["params"])):
                    yield seeds, batched, gi, pi

    def _read_states(self) -> None:
        """Stack the seeds' optimiser states into the batched optimisers' state."""
        for seeds, batched, gi, pi in self._pairs():
            key0 = id(seeds[0].param_groups[gi]["params"][pi])
            states = [opt.state.get(opt.param_groups[gi]["params"][pi], {}) for opt in seeds]
            if not states[0]:
                if any(states):
                    raise ValueError("the seeds' optimisers are at different steps: some have state, some not")
                continue
            merged: dict[str, Any] = {}
            for name, value in states[0].items():  # tensors of >= 1 dim are per seed; step counts shared
                values = [st[name] for st in states]
                if isinstance(value, torch.Tensor) and value.ndim:
                    merged[name] = torch.stack(values)
                elif isinstance(value, torch.Tensor):
                    if not all(torch.equal(value, v) for v in values):
                        raise ValueError(f"the seeds' optimisers differ in {name!r}: they must be at the same step")
                    merged[name] = value.clone()
                else:
                    if any(v != value for v in values):
                        raise ValueError(f"the seeds' optimisers differ in {name!r}: they must be at the same step")
                    merged[name] = value
            batched.state[self._stacked[key0]] = merged

    def write_states(self) -> None:
        """Slice the batched state back into each seed's optimiser state."""
        for seeds, batched, gi, pi in self._pairs():
            key0 = id(seeds[0].param_groups[gi]["params"][pi])
            state = batched.state.get(self._stacked[key0])
            if not state:
                continue
            for s, opt in enumerate(seeds):
                param = opt.param_groups[gi]["params"][pi]
                opt.state[param] = {name: (v[s].clone() if v.ndim else v.clone()) if isinstance(v, torch.Tensor)
                                    else v for name, v in state.items()}

    def step(self) -> None:
        for seeds, batched in self._parts:
            for g_batched, g_seed in zip(batched.param_groups, seeds[0].param_groups, strict=True):
                g_batched["lr"] = g_seed["lr"]  # the schedule, written into seed 0's groups by SB3
            batched.step()


class SyncedOptimizer:
    """One seed's optimiser while a :class:`StackedOptimizer` steps it: everything is the seed's own optimiser's,
    except that ``state_dict()`` first writes the stacked state back (``sync``), so saving a seed mid-training
    (from a callback) saves its current optimiser state. The agent never knows it is in a seed batch."""

    def __init__(self, inner: torch.optim.Optimizer, sync: Callable[[], None]) -> None:
        self.__dict__["inner"], self.__dict__["_sync"] = inner, sync

    def state_dict(self) -> dict[str, Any]:
        """The seed's optimiser state, brought up to date from the stacked optimiser first."""
        self._sync()
        return self.inner.state_dict()

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(optimizer, torch.optim.Optimizer) holds, as for the seed's own
        return type(self.inner)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "_sync"):  # not set yet (an object being rebuilt): no lookup through inner
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy is the seed's own optimiser, up to date (a copy made mid-training trains on its own)."""
        import copy

        self._sync()
        return copy.deepcopy(self.inner, memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled as the seed's own optimiser, up to date."""
        self._sync()
        return self.inner.__reduce_ex__(protocol)

    def __repr__(self) -> str:
        return f"SyncedOptimizer({self.inner!r})"


# --------------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------------
def available_memory(device: torch.device) -> int:
    """Bytes free for a new allocation: ``torch.cuda.mem_get_info`` on CUDA, ``MemAvailable`` on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_memory(n_seeds: int, per_seed: int, shared: int, device: torch.device, what: str) -> None:
    """``ValueError`` when ``n_seeds * per_seed + shared`` bytes exceed the free memory of ``device``."""
    need, free = n_seeds * per_seed + shared, available_memory(device)
    if need > free:
        raise ValueError(f"a seed batch of S={n_seeds} needs about {_gib(need)} on {device} ({what}: "
                         f"{_gib(per_seed)} per seed), but only {_gib(free)} is free; use a smaller S "
                         f"(at most {max(0, (free - shared) // max(per_seed, 1))})")
