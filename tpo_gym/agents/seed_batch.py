"""Seed-batched training: S independent seeds of one method x setting in one process.

Each seed stays a complete agent (its own env, RNG streams, optimiser state, ``history``, SB3 logger);
a :class:`SeedBatch` only shares the *update* between them. While it trains, every seed's parameters
(and gradients) are views into tensors stacked over seeds, ``[S, *shape]``, so the update can run
in two ways, chosen per part:

``forward``
    ``"loop"``: each seed's own ``policy.step_logits`` and backward, one after the other: the exact
    computation of the seed trained alone (bit-identical histories). ``"stacked"``: one forward of
    all S models at once (:meth:`~tpo_gym.agents.policies.CategoricalPolicy.stacked_step_logits`: batched
    matrix products over the seed dimension, attention over the S N sequences), one backward of the
    sum of the S losses. The seeds stay independent (seed ``s``'s loss depends only on weights
    ``[s]``); results agree with the loop to float rounding (the stacked forward's logits are equal
    to the per-seed ones on CPU, the backward's reductions may round differently).
``optimizer``
    ``"loop"``: each seed's own optimiser steps its own parameters (exact, any optimiser).
    ``"stacked"``: one optimiser on the stacked tensors: torch's ``Adam`` / ``AdamW`` / ``SGD``
    themselves (elementwise, so seed ``s`` gets exactly its own update), and :class:`StackedMuon`
    for ``torch.optim.Muon`` (Newton-Schulz batched over the seeds with batched matrix products).
    :class:`~tpo_gym.agents.policies.MuonAdamW` is stacked part by part, and
    :class:`~tpo_gym.agents.reference_setup.ReferenceMuon` (the reference setup) runs on the stacked
    tensors itself. The per-seed optimiser states
    are read in before and written back after every :meth:`SeedBatch.learn`, so ``save`` / ``load``
    of each seed work as usual.

``"auto"`` (the default of both) picks ``"loop"`` on CPU and ``"stacked"`` on CUDA. On one CPU core
the loop is the faster: one seed's update is already near the core's matrix-product throughput, and
stacking S seeds only makes every intermediate S times larger (out of cache) and trades ``mm`` for the
slower ``bmm`` (``benchmarks/bench_seed_batch.py`` measures both). On a GPU one small model cannot
fill the device; stacking is what lets S models share it.

Covered: every non-text agent (token- and sequence-level group methods, single-sample methods) on
:class:`~tpo_gym.agents.policies.TransformerPolicy` and :class:`~tpo_gym.agents.policies.MlpPolicy`
(the MNIST runs).

``rollout``
    ``"loop"``: each seed's own ``collect_rollouts`` (its own env). ``"stacked"``: the S seeds roll out
    together in one on-device tensor env of ``S N`` sub-envs
    (:func:`~tpo_gym.agents.sampling.collect_stacked_rollouts`: one stacked decode of all S models per
    step, one candidate scoring and one env step for all), each seed with its own contexts and action
    generator, so each batch is the seed's own on-device rollout (its log-probs to float rounding). Needs
    agents whose envs have an
    on-device form (the token tasks, MNIST) and ``rollouts_on_device`` (on by default on CUDA). ``"auto"``:
    stacked when the agents are on CUDA and it can, else loop.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from tpo_gym._validation import check_bool, check_choice, check_int
from tpo_gym.agents.base import GroupAlgorithm, resolve_records
from tpo_gym.agents.policies import CategoricalPolicy, MuonAdamW
from tpo_gym.agents.reference_setup import ReferenceMuon
from tpo_gym.objectives import deferred_checks

MODES = ("auto", "loop", "stacked")
#: torch optimisers whose update is elementwise: one instance on stacked tensors is S exact copies.
ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.Adam, torch.optim.AdamW,
                                                                    torch.optim.SGD)


# --------------------------------------------------------------------------------------------
# Muon on stacked matrices
# --------------------------------------------------------------------------------------------
def stacked_newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                          eps: float) -> torch.Tensor:
    """torch Muon's Newton-Schulz orthogonalisation of each matrix of ``g`` ``[S, A, B]`` at once.

    Per matrix ``X`` (in bfloat16, transposed to the wide orientation when ``A > B``):
    ``X <- X / max(||X||_F, eps)``, then ``steps`` times ``G = X X^T``, ``X <- a X + (b G + c G G) X``.
    """
    if g.ndim != 3:
        raise ValueError(f"stacked_newton_schulz needs [S, A, B] matrices, got shape {tuple(g.shape)}")
    a, b, c = coefficients
    x = g.bfloat16()
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
    return list(optimizer._optimizers) if isinstance(optimizer, MuonAdamW) else [optimizer]


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


class _StackedOptimizer:
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


def _state_bytes(agent: GroupAlgorithm) -> int:
    """Parameters, gradients and two optimiser moments of one seed, in bytes."""
    return 4 * sum(p.numel() * p.element_size() for p in agent.policy.parameters())


# --------------------------------------------------------------------------------------------
# the batch
# --------------------------------------------------------------------------------------------
class SeedBatch:
    """Train S agents that differ only in their seed together (module docstring).

    :param agents: S >= 1 agents of one class, with policies of one class and parameter shapes,
        the same ``n_epochs``, ``max_grad_norm``, ``steps_per_iteration`` and device; not text policies.
    :param forward: ``"auto"`` (default), ``"loop"`` or ``"stacked"``.
    :param optimizer: ``"auto"`` (default), ``"loop"`` or ``"stacked"``.
    :param rollout: ``"auto"`` (default), ``"loop"`` or ``"stacked"``.
    """

    def __init__(self, agents: Iterable[GroupAlgorithm], forward: str = "auto", optimizer: str = "auto",
                 rollout: str = "auto") -> None:
        self.agents = list(agents)
        if not self.agents:
            raise ValueError("SeedBatch needs at least one agent (S >= 1), got none")
        first = self.agents[0]
        for a in self.agents:
            if not isinstance(a, GroupAlgorithm):
                raise ValueError(f"SeedBatch trains tpo-gym agents, got {type(a).__name__}")
            if a._text:
                raise ValueError("SeedBatch does not batch language-model (text) policies: train their seeds one "
                                 "by one, or on TRL (tpo_gym.integrations.trl)")
            if type(a) is not type(first) or type(a.policy) is not type(first.policy):
                raise ValueError(f"SeedBatch needs agents of one class and policy class; got "
                                 f"{type(first).__name__}/{type(first.policy).__name__} and "
                                 f"{type(a).__name__}/{type(a.policy).__name__}")
            shapes = [(n, tuple(p.shape)) for n, p in a.policy.named_parameters()]
            if shapes != [(n, tuple(p.shape)) for n, p in first.policy.named_parameters()]:
                raise ValueError("SeedBatch needs policies with the same parameters (names and shapes)")
            for attr in ("n_epochs", "max_grad_norm", "steps_per_iteration"):
                if getattr(a, attr) != getattr(first, attr):
                    raise ValueError(f"SeedBatch needs one {attr} for every seed; got {getattr(first, attr)} "
                                     f"and {getattr(a, attr)}")
            if a.device != first.device:
                raise ValueError(f"SeedBatch needs every agent on one device; got {first.device} and {a.device}")
            if type(a.policy.optimizer) is not type(first.policy.optimizer):
                raise ValueError("SeedBatch needs one optimiser class for every seed")
        if len({id(a) for a in self.agents}) != len(self.agents):
            raise ValueError("SeedBatch got the same agent twice")
        cuda = first.device.type == "cuda"
        forward = check_choice("forward", forward, MODES)
        optimizer = check_choice("optimizer", optimizer, MODES)
        can_stack = type(first.policy).stacked_step_logits is not CategoricalPolicy.stacked_step_logits
        if forward == "stacked" and not can_stack:
            raise ValueError(f"forward='stacked': {type(first.policy).__name__} has no seed-stacked forward; "
                             f"use forward='loop'")
        stackable = stackable_optimizer(first.policy.optimizer)
        if optimizer == "stacked" and not stackable:
            raise ValueError(f"optimizer='stacked' does not support {first.policy.optimizer!r} (supported: "
                             f"Adam, AdamW, SGD, torch.optim.Muon, MuonAdamW, ReferenceMuon); use optimizer='loop'")
        differ = optimizer_difference(self.agents) if optimizer != "loop" else None
        if optimizer == "stacked" and differ:
            raise ValueError(f"optimizer='stacked' steps every seed with one set of optimiser settings, but {differ}; "
                             f"use optimizer='loop' (each seed its own optimiser)")
        self.forward = forward if forward != "auto" else ("stacked" if cuda and can_stack else "loop")
        self.optimizer = optimizer if optimizer != "auto" else ("stacked" if cuda and stackable and not differ
                                                                else "loop")
        rollout = check_choice("rollout", rollout, MODES)
        why_not = self._why_not_stacked_rollout()
        if rollout == "stacked" and why_not:
            raise ValueError(f"rollout='stacked': {why_not}; use rollout='loop'")
        self.rollout = rollout if rollout != "auto" else ("stacked" if cuda and not why_not else "loop")
        self._stacked_env: Any = None
        self._bound = False

    def _why_not_stacked_rollout(self) -> str | None:
        """Why the seeds cannot roll out in one on-device env (``None`` when they can)."""
        from tpo_gym.agents.sampling import tensor_env_available

        first = self.agents[0]
        if any(a._source is None or not tensor_env_available(a._source) or a._rollout_device() is None
               for a in self.agents):
            return ("every seed must roll out on its device (rollouts_on_device=True, or CUDA) in an env with an "
                    "on-device form (the token tasks, MNIST)")
        specs = {repr((a._source.spec.id, sorted(a._source.spec.kwargs.items()))) for a in self.agents}  # type: ignore[union-attr]
        if len(specs) != 1:
            return "every seed must roll out in the same env (id and arguments)"
        if type(first.policy).stacked_step_logits is CategoricalPolicy.stacked_step_logits:
            return f"{type(first.policy).__name__} has no seed-stacked forward"
        return None

    @property
    def n_seeds(self) -> int:
        return len(self.agents)

    @property
    def histories(self) -> list[list[dict[str, float]]]:
        """Each seed's ``history`` (one record per iteration)."""
        return [a.history for a in self.agents]

    # ------------------------------------------------------------------ binding to stacked tensors
    def _bind(self) -> None:
        first = self.agents[0]
        names = [n for n, p in first.policy.named_parameters() if p.requires_grad]
        per_seed = [dict(a.policy.named_parameters()) for a in self.agents]
        self._params = {n: torch.stack([ps[n].detach() for ps in per_seed]) for n in names}
        self._grads = {n: torch.zeros_like(t) for n, t in self._params.items()}
        for s, ps in enumerate(per_seed):
            for n in names:
                ps[n].data = self._params[n][s]
                ps[n].grad = self._grads[n][s]
        for n in names:  # the stacked forward differentiates the stacked tensors; the stacked optimiser reads .grad
            self._params[n].requires_grad_(self.forward == "stacked")
            self._params[n].grad = self._grads[n]
        self._opt: _StackedOptimizer | None = None
        if self.optimizer == "stacked":
            p0 = per_seed[0]
            stacked = {id(p0[n]): self._params[n] for n in names}
            self._opt = _StackedOptimizer([a.policy.optimizer for a in self.agents], stacked)
            for a in self.agents:
                a._seed_batch_sync = self._opt.write_states
        self._bound = True

    def _unbind(self) -> None:
        if not self._bound:
            return
        if self._opt is not None:
            self._opt.write_states()
        for a in self.agents:
            a._seed_batch_sync = None
            for p in a.policy.parameters():
                p.data = p.data.clone()
                p.grad = None
        self._params, self._grads, self._opt = {}, {}, None
        self._bound = False

    # ------------------------------------------------------------------ one update of every seed
    def _check_activation_memory(self, batches: list[Any], prepared: list[tuple[Any, Any]]) -> None:
        """Count the bytes autograd saves for seed 0's loss; S times that is the stacked forward's need."""
        a, batch = self.agents[0], batches[0]
        saved = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            a.loss_from_logits(batch, prepared[0][0], a.policy.step_logits(batch.obs))
        stacked = self.forward == "stacked"  # activations of every seed at once, or of one seed at a time
        check_memory(self.n_seeds, _state_bytes(a) + (saved[0] if stacked else 0), 0 if stacked else saved[0],
                     a.device, "parameters, gradients, optimiser moments" + (" and activations" if stacked else ""))

    def _train(self) -> list[dict[str, float]]:
        agents = self.agents
        batches, prepared = [], []
        for a in agents:
            batch, fixed, diagnostics = a._begin_update()
            batches.append(batch)
            prepared.append((fixed, diagnostics))
        if not self._memory_checked:
            self._check_activation_memory(batches, prepared)
            self._memory_checked = True
        obs = None
        if self.forward == "stacked":
            shapes = {tuple(b.obs.shape) for b in batches}
            if len(shapes) != 1:
                raise ValueError(f"forward='stacked' needs rollouts of one shape in every seed, got {sorted(shapes)}; "
                                 f"use forward='loop'")
            obs = torch.stack([b.obs for b in batches])
        params = [a._trained_parameters() for a in agents]
        n = len(agents)
        first = last = norms = torch.full((n,), math.nan)
        policy0 = agents[0].policy
        for epoch in range(agents[0].n_epochs):
            for g in self._grads.values():
                g.zero_()
            if obs is not None:
                logits = policy0.stacked_step_logits(self._params, obs)
                losses = [a.loss_from_logits(b, f, logits[s])
                          for s, (a, b, (f, _)) in enumerate(zip(agents, batches, prepared, strict=True))]
                torch.stack(losses).sum().backward()
            else:
                losses = []
                for a, b, (f, _) in zip(agents, batches, prepared, strict=True):
                    loss = a.loss_from_logits(b, f, a.policy.step_logits(b.obs))
                    loss.backward()
                    losses.append(loss)
            values = torch.stack([loss.detach() for loss in losses])
            if epoch == 0:
                norms = torch.stack([GroupAlgorithm._grad_norm(ps).to(values.device) for ps in params])
                first = values
            for a, ps in zip(agents, params, strict=True):
                if a.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(ps, a.max_grad_norm)
            if self._opt is not None:
                self._opt.step()
            else:
                for a in agents:
                    a.policy.optimizer.step()
            last = values
        # one read-back per update of all seeds (on a GPU, no synchronisation inside the epochs)
        first, last, norms = torch.stack([first, last, norms]).float().tolist()
        stats = []
        for s, a in enumerate(agents):
            a._n_updates += a.n_epochs
            stats.append({"loss": first[s], "final_loss": last[s], "grad_norm": norms[s], **prepared[s][1]})
        return stats

    # ------------------------------------------------------------------ stacked rollouts
    def _collect_stacked(self) -> list[Any]:
        """Every seed's next batch from one on-device env of S N sub-envs (see ``rollout``)."""
        from tpo_gym.agents.sampling import collect_stacked_rollouts, make_rollout_env

        first = self.agents[0]
        grouping = first._require_grouping()
        n = first.n_rollouts
        if self._stacked_env is None or self._stacked_env.num_envs != n * self.n_seeds:
            self._stacked_env = make_rollout_env(first._source, n * self.n_seeds, first._rollout_device())  # type: ignore[arg-type]
        seeds = []
        for a in self.agents:
            a.policy.set_training_mode(False)
            seeds.append(a._iteration_seed(a._rollout_index))
            a._rollout_index += 1
        decode = first.policy.stacked_rollout_decoder(self._params)
        return collect_stacked_rollouts(decode, first.policy.n_actions, self._stacked_env, seeds,
                                        grouping.n_candidates, grouping.score_all_actions, grouping.rollout_group)

    # ------------------------------------------------------------------ learn
    def learn(self, total_timesteps: int, callback: Sequence[Any] | None = None, log_interval: int = 1,
              reset_num_timesteps: bool = True, progress_bar: bool = False) -> SeedBatch:
        """Train every seed for ``total_timesteps`` env steps, as each agent's ``learn`` would.

        :param total_timesteps: env steps per seed (``n * steps_per_iteration`` runs ``n`` iterations).
        :param callback: ``None`` or one SB3 callback (or list) per seed.
        :param log_interval: dump each seed's logs every ``log_interval`` iterations.
        :param reset_num_timesteps: restart each seed's step count and ``history``.
        :param progress_bar: one tqdm bar over the iterations of the batch.
        :return: self (each seed's ``history`` holds its records).
        """
        total_timesteps = check_int("total_timesteps", total_timesteps, 0, allow_integral_float=True)
        log_interval = check_int("log_interval", log_interval, 1)
        check_bool("reset_num_timesteps", reset_num_timesteps)
        check_bool("progress_bar", progress_bar)
        callbacks = [None] * self.n_seeds if callback is None else list(callback)
        if len(callbacks) != self.n_seeds:
            raise ValueError(f"callback: one per seed ({self.n_seeds}), got {len(callbacks)}")
        previous_threads = torch.get_num_threads()
        if self.agents[0].n_threads is not None:
            torch.set_num_threads(self.agents[0].n_threads)
        set_up = []
        for a, cb in zip(self.agents, callbacks, strict=True):
            a._require_grouping()
            total, cb = a._setup_learn(total_timesteps, cb, reset_num_timesteps, "run", False)
            a._get_rollout_env()
            cb.on_training_start(locals(), globals())
            set_up.append((total, cb))
        from tqdm.auto import tqdm

        first = self.agents[0]
        n_iter = max(0, math.ceil((set_up[0][0] - first.num_timesteps) / first.steps_per_iteration))
        bar = tqdm(total=n_iter, desc=f"{type(first).__name__} x {self.n_seeds} seeds", unit="it",
                   disable=not progress_bar, dynamic_ncols=True)
        self._memory_checked = False
        try:
            self._bind()
            while all(a.num_timesteps < total for a, (total, _) in zip(self.agents, set_up, strict=True)):
                go_on = True
                for _, cb in set_up:
                    cb.on_rollout_start()
                batches = self._collect_stacked() if self.rollout == "stacked" else [None] * self.n_seeds
                for a, (total, cb), stacked in zip(self.agents, set_up, batches, strict=True):
                    a.rollout_batch = batch = stacked if stacked is not None else a.collect_rollouts()
                    a.num_timesteps += batch.n_steps
                    cb.update_locals(locals())
                    go_on = cb.on_step() and go_on
                    cb.on_rollout_end()
                    a._update_current_progress_remaining(a.num_timesteps, total)
                if not go_on:
                    break
                with deferred_checks():  # the objectives' value checks of all seeds, read back at once
                    all_stats = self._train()
                episodes = [a._episode_means(a.rollout_batch) for a in self.agents]
                resolve_records(all_stats + episodes)  # every seed's diagnostics in one read-back
                for a, stats, episode in zip(self.agents, all_stats, episodes, strict=True):
                    a._record_iteration(a.rollout_batch, stats, log_interval, episode)
                bar.update(1)
        finally:
            bar.close()
            self._unbind()
            torch.set_num_threads(previous_threads)
        for _, cb in set_up:
            cb.on_training_end()
        return self


def train_seeds(algo: type[GroupAlgorithm], policy: str | type, env: str | Callable[[], Any],
                seeds: int | Sequence[int], total_timesteps: int, *, forward: str = "auto",
                optimizer: str = "auto", progress_bar: bool = False, **agent_kwargs: Any) -> list[GroupAlgorithm]:
    """Build one agent per seed and train them together with :class:`SeedBatch`.

    ``train_seeds(TPO, "TransformerPolicy", "tpo_gym/TokenReversal-v0", seeds=20, total_timesteps=...)``
    trains seeds 0..19; each returned agent is the one ``algo(policy, env, seed=s, **agent_kwargs)``
    trained alone would be (its ``history``, ``save`` and ``predict`` work as usual).

    :param algo: the agent class (``TPO``, ``GRPO``, ``PPO``, ...).
    :param policy: its policy argument.
    :param env: an env id (each seed makes its own env) or a zero-argument factory called once per seed.
        An env instance is refused: seeds must not share an env.
    :param seeds: ``S >= 1`` (seeds ``0 .. S-1``) or the list of seeds.
    :param total_timesteps: env steps per seed.
    :param forward: / :param optimizer: see :class:`SeedBatch`.
    :param progress_bar: a tqdm bar over the iterations.
    :return: the S trained agents, in the order of ``seeds``.
    :raises ValueError: for S < 1, repeated seeds, an env instance, or an S whose parameters and
        optimiser state alone would not fit in the free memory of the device.
    """
    if isinstance(seeds, bool) or not isinstance(seeds, (int, Sequence)):
        raise ValueError(f"seeds must be a count S >= 1 or a list of ints, got {seeds!r}")
    if isinstance(seeds, int):
        n = check_int("seeds", seeds, 1)
        seed_list: Sequence[int] = range(n)
    else:
        seed_list = [check_int("seed", s, 0) for s in seeds]
        if not seed_list:
            raise ValueError("seeds: need at least one seed (S >= 1), got an empty list")
        if len(set(seed_list)) != len(seed_list):
            raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    if not (isinstance(env, str) or callable(env)) or hasattr(env, "step"):
        raise ValueError(f"env must be an env id or a zero-argument env factory (seeds must not share one env), "
                         f"got {type(env).__name__}")

    def make(seed: int) -> GroupAlgorithm:
        return algo(policy, env if isinstance(env, str) else env(), seed=seed, **agent_kwargs)

    first = make(seed_list[0])
    check_memory(len(seed_list), _state_bytes(first), 0, first.device, "parameters, gradients, optimiser moments")
    agents = [first, *(make(s) for s in list(seed_list)[1:])]
    SeedBatch(agents, forward=forward, optimizer=optimizer).learn(total_timesteps, progress_bar=progress_bar)
    return agents
