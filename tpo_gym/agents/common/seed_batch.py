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
    :class:`~tpo_gym.agents.policies.optimizers.MuonAdamW` is stacked part by part, and
    :class:`~tpo_gym.agents.policies.reference_setup.ReferenceMuon` (the reference setup) runs on the stacked
    tensors itself (:mod:`~tpo_gym.agents.policies.stacked_optim`). The per-seed optimiser states
    are read in before and written back after every :meth:`SeedBatch.learn`, so ``save`` / ``load``
    of each seed work as usual; a ``save`` from a callback mid-training reads the stacked state through
    :class:`~tpo_gym.agents.policies.stacked_optim.SyncedOptimizer` (the agent does not know its batch).

``"auto"`` (the default of both) picks ``"loop"`` on CPU and ``"stacked"`` on CUDA. On one CPU core
the loop is the faster: one seed's update is already near the core's matrix-product throughput, and
stacking S seeds only makes every intermediate S times larger (out of cache) and trades ``mm`` for the
slower ``bmm`` (``benchmarks/bench_seed_batch.py`` measures both). On a GPU one small model cannot
fill the device; stacking is what lets S models share it.

Covered: every non-text agent (token- and sequence-level group methods, single-sample methods) on
:class:`~tpo_gym.agents.policies.transformer.TransformerPolicy` and :class:`~tpo_gym.agents.policies.MlpPolicy`
(the MNIST runs).

``rollout``
    ``"loop"``: each seed's own ``collect_rollouts`` (its own env). ``"stacked"``: the S seeds roll out
    together in one on-device tensor env of ``S N`` sub-envs
    (:func:`~tpo_gym.agents.common.sampling.collect_stacked_rollouts`: one stacked decode of all S models per
    step, one candidate scoring and one env step for all), each seed with its own contexts and action
    generator, so each batch is the seed's own on-device rollout (its log-probs to float rounding). Needs
    agents whose envs have an
    on-device form (the token tasks, MNIST) and ``rollouts_on_device`` (on by default on CUDA). ``"auto"``:
    stacked when the agents are on CUDA and it can, else loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from tpo_gym._validation import check_bool, check_choice, check_int
from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.update import Update, resolve_records, run_epochs
from tpo_gym.agents.policies.categorical import CategoricalPolicy
from tpo_gym.agents.policies.stacked_optim import (
    ELEMENTWISE_OPTIMIZERS,
    StackedMuon,
    StackedOptimizer,
    SyncedOptimizer,
    available_memory,
    check_memory,
    optimizer_difference,
    stackable_optimizer,
    stacked_newton_schulz,
)
from tpo_gym.objectives import deferred_checks

__all__ = ["SeedBatch", "train_seeds", "MODES", "ELEMENTWISE_OPTIMIZERS", "StackedMuon", "stacked_newton_schulz",
           "stackable_optimizer", "optimizer_difference", "available_memory", "check_memory"]

MODES = ("auto", "loop", "stacked")


def _state_bytes(agent: GroupAlgorithm) -> int:
    """Parameters, gradients and two optimiser moments of one seed, in bytes."""
    return 4 * sum(p.numel() * p.element_size() for p in agent.policy.parameters())


# --------------------------------------------------------------------------------------------
# the batch
# --------------------------------------------------------------------------------------------
class SeedBatch:
    """Train S agents that differ only in their seed together (module docstring).

    :param agents: S >= 1 agents of one class, with policies of one class and parameter shapes,
        the same ``n_epochs``, ``max_grad_norm``, ``n_rollouts``, ``steps_per_iteration`` (on fixed-length envs)
        and device; not text policies.
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
            if a.is_text:
                raise ValueError("SeedBatch does not batch language-model (text) policies: train their seeds one "
                                 "by one, or on TRL (tpo_gym.integrations.trl)")
            if type(a) is not type(first) or type(a.policy) is not type(first.policy):
                raise ValueError(f"SeedBatch needs agents of one class and policy class; got "
                                 f"{type(first).__name__}/{type(first.policy).__name__} and "
                                 f"{type(a).__name__}/{type(a.policy).__name__}")
            shapes = [(n, tuple(p.shape)) for n, p in a.policy.named_parameters()]
            if shapes != [(n, tuple(p.shape)) for n, p in first.policy.named_parameters()]:
                raise ValueError("SeedBatch needs policies with the same parameters (names and shapes)")
            for attr in ("n_epochs", "max_grad_norm", "fixed_steps_per_iteration", "n_rollouts"):
                if getattr(a, attr) != getattr(first, attr):
                    name = "steps_per_iteration" if attr == "fixed_steps_per_iteration" else attr
                    raise ValueError(f"SeedBatch needs one {name} for every seed; got {getattr(first, attr)} "
                                     f"and {getattr(a, attr)}")
            if a.skip_uninformative_steps:
                raise ValueError("SeedBatch steps every seed together; the skip_uninformative_steps ablation skips a "
                                 "seed's step on its own: train those agents one by one")
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
        from tpo_gym.agents.common.sampling import tensor_env_available

        first = self.agents[0]
        if any(a.rollout_source is None or not tensor_env_available(a.rollout_source) or a.rollout_device is None
               for a in self.agents):
            return ("every seed must roll out on its device (rollouts_on_device=True, or CUDA) in an env with an "
                    "on-device form (the token tasks, MNIST)")
        specs = {repr((a.rollout_source.spec.id, sorted(a.rollout_source.spec.kwargs.items())))  # type: ignore[union-attr]
                 for a in self.agents}
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
        self._opt: StackedOptimizer | None = None
        if self.optimizer == "stacked":
            p0 = per_seed[0]
            stacked = {id(p0[n]): self._params[n] for n in names}
            self._opt = StackedOptimizer([a.policy.optimizer for a in self.agents], stacked)
            for a in self.agents:  # a save mid-training (a callback) reads the stacked state through it
                a.policy.optimizer = SyncedOptimizer(a.policy.optimizer, self._opt.write_states)
        self._bound = True

    def _unbind(self) -> None:
        if not self._bound:
            return
        if self._opt is not None:
            self._opt.write_states()
        for a in self.agents:
            if isinstance(a.policy.optimizer, SyncedOptimizer):
                a.policy.optimizer = a.policy.optimizer.inner
            for p in a.policy.parameters():
                p.data = p.data.clone()
                p.grad = None
        self._params, self._grads, self._opt = {}, {}, None
        self._bound = False

    # ------------------------------------------------------------------ one update of every seed
    def _check_activation_memory(self, updates: list[Update]) -> None:
        """Count the bytes autograd saves for seed 0's loss; S times that is the stacked forward's need."""
        a, update = self.agents[0], updates[0]
        saved = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            a.loss_from_logits(update.batch, update.prepared, a.policy.step_logits(update.batch.obs))
        stacked = self.forward == "stacked"  # activations of every seed at once, or of one seed at a time
        check_memory(self.n_seeds, _state_bytes(a) + (saved[0] if stacked else 0), 0 if stacked else saved[0],
                     a.device, "parameters, gradients, optimiser moments" + (" and activations" if stacked else ""))

    def _train(self) -> list[dict[str, Any]]:
        """One update of every seed: the agents' own epoch loop (:func:`~tpo_gym.agents.common.update.run_epochs`) with
        the batch's backward (each seed's own, or one stacked forward) and optimiser step."""
        agents = self.agents
        updates = [a.begin_update() for a in agents]
        if not self._memory_checked:
            self._check_activation_memory(updates)
            self._memory_checked = True
        obs = None
        if self.forward == "stacked":
            shapes = {tuple(u.batch.obs.shape) for u in updates}
            if len(shapes) != 1:
                raise ValueError(f"forward='stacked' needs rollouts of one shape in every seed, got {sorted(shapes)}; "
                                 f"use forward='loop'")
            obs = torch.stack([u.batch.obs for u in updates])
        policy0 = agents[0].policy

        def zero_grad() -> None:
            for g in self._grads.values():
                g.zero_()

        def backward() -> list[torch.Tensor]:
            if obs is None:
                return [a.backward_loss(u) for a, u in zip(agents, updates, strict=True)]
            logits = policy0.stacked_step_logits(self._params, obs)
            losses = [a.loss_from_logits(u.batch, u.prepared, logits[s])
                      for s, (a, u) in enumerate(zip(agents, updates, strict=True))]
            torch.stack(losses).sum().backward()
            return losses

        def step() -> None:
            if self._opt is not None:
                self._opt.step()
            else:
                for a in agents:
                    a.policy.optimizer.step()

        stats = run_epochs(agents[0].n_epochs, [u.params for u in updates], [a.max_grad_norm for a in agents],
                           zero_grad, backward, step)
        return [a.finish_update(u, st) for a, u, st in zip(agents, updates, stats, strict=True)]

    # ------------------------------------------------------------------ stacked rollouts
    def _collect_stacked(self) -> list[Any]:
        """Every seed's next batch from one on-device env of S N sub-envs (see ``rollout``)."""
        from tpo_gym.agents.common.sampling import collect_stacked_rollouts, make_rollout_env

        first = self.agents[0]
        grouping = first.require_grouping()
        n = first.n_rollouts
        if self._stacked_env is None or self._stacked_env.num_envs != n * self.n_seeds:
            self._stacked_env = make_rollout_env(first.rollout_source, n * self.n_seeds,  # type: ignore[arg-type]
                                                 first.rollout_device)
        seeds = []
        for a in self.agents:
            a.policy.set_training_mode(False)
            seeds.append(a.next_rollout_seed())
        decode = first.policy.stacked_rollout_decoder(self._params)
        return collect_stacked_rollouts(decode, first.policy.n_actions, self._stacked_env, seeds,
                                        grouping.n_candidates, grouping.score_all_actions, grouping.rollout_group)

    # ------------------------------------------------------------------ learn
    def learn(self, total_timesteps: int, callback: Sequence[Any] | None = None, log_interval: int = 1,
              reset_num_timesteps: bool = True, progress_bar: bool = False) -> SeedBatch:
        """Train every seed for ``total_timesteps`` env steps, as each agent's ``learn`` would.

        Every seed runs the same iterations: the batch stops at the end of the first iteration in which a seed's
        ``num_timesteps`` reaches ``total_timesteps`` (on fixed-length envs, all at once; where episodes vary,
        the others may have taken fewer steps). Each seed's callbacks see its own env steps, as in its ``learn``.

        :param total_timesteps: env steps per seed (``n * steps_per_iteration`` runs ``n`` iterations).
        :param callback: ``None`` or one SB3 callback (or list) per seed.
        :param log_interval: dump each seed's logs every ``log_interval`` iterations.
        :param reset_num_timesteps: restart each seed's step count and ``history``.
        :param progress_bar: one tqdm bar over the iterations of the batch (no total where episodes vary).
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
            set_up.append(a.start_learning(total_timesteps, cb, reset_num_timesteps, "run", False))
        from tqdm.auto import tqdm

        first = self.agents[0]
        fixed = first.fixed_steps_per_iteration  # iterations to go, where known (None: episodes vary in length)
        n_iter = None if fixed is None else max(0, math.ceil((set_up[0][0] - first.num_timesteps) / fixed))
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
                    batch = stacked if stacked is not None else a.collect_rollouts()
                    go_on = a.after_rollout(batch, cb, total) and go_on
                if not go_on:
                    break
                with deferred_checks():  # the objectives' value checks of all seeds, read back at once
                    all_stats = self._train()
                resolve_records(all_stats)  # every seed's diagnostics in one read-back
                for a, stats in zip(self.agents, all_stats, strict=True):
                    a.record_iteration(a.rollout_batch, stats, log_interval)
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
