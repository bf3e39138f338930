"""Seconds per seed-episode of seed-batched training (tpo_gym.agents.SeedBatch) vs one seed alone.

At the Table 1 setting (reverse copy, bag reward, V = 2, H = 10, B = 100, K = 8, 4 epochs, the
transformer and optimiser of the tuned setup), on one thread, in one run:

* today's path (S = 1: ``agent.learn``) and SeedBatch at S = 5, 10, 20 with the loop update
  (``forward="loop", optimizer="loop"``, what ``"auto"`` picks on CPU) and the stacked update
  (``forward="stacked", optimizer="stacked"``, what ``"auto"`` picks on CUDA), for TPO_token,
  GRPO_token and PPO: seconds per seed-episode (one iteration of one seed), the ratio to S = 1, and the
  achieved GFLOP/s of the update (6 x weight-matrix parameters x tokens x epochs) beside the GFLOP/s
  of a matrix product of the update's own shape ([B (2H - 1), 64] x [64, 256]) measured in this run;
* where the time goes (rollout, scoring, forward, backward, optimiser, the rest = Python overhead)
  for S = 1 and S = 20.

    python benchmarks/bench_seed_batch.py [--iterations 3] [--device cpu]

On a GPU (``--device cuda --sizes 1,20,100``) the same script measures the stacked path there: the
stacked rollout (one on-device env of S N sub-envs, ``SeedBatch(rollout="stacked")``) with the stacked
update, seed-episodes per second beside the issue's target (1,000 for TPO_token at S = 100); its
per-phase profile synchronises the device around each phase (the seconds per seed-episode come from a
run without it).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch

import tpo_gym  # noqa: F401  (registers the envs)
from tpo_gym import GRPO, PPO, TPO
from tpo_gym.agents import seed_batch as sb
from tpo_gym.agents import stacked_optim

ENV_KWARGS = {"target": "reverse_copy", "reward": "bag", "vocab_size": 2, "length": 10}
METHODS: dict[str, tuple[type, dict[str, Any]]] = {
    "TPO_token": (TPO, {"level": "token"}),
    "GRPO_token": (GRPO, {"level": "token"}),
    "PPO": (PPO, {}),
}


def make_agents(name: str, seeds: int, device: str, on_device: bool | None = None) -> list[Any]:
    cls, kwargs = METHODS[name]
    return [cls("TransformerPolicy", gym.make("tpo_gym/TokenTask-v0", **ENV_KWARGS), batch_size=100, group_size=8,
                seed=s, device=device, rollouts_on_device=on_device, **kwargs) for s in range(seeds)]


class Phases:
    """Exclusive wall time per phase (a phase nested in another is not counted twice), by wrapping the
    functions of each phase while a run is measured."""

    def __init__(self, sync: bool = False) -> None:
        self.sync = sync  # CUDA: synchronise around each phase, so its time is its kernels' time
        self.seconds: dict[str, float] = defaultdict(float)
        self._undo: list[Callable[[], None]] = []
        self._stack: list[float] = []  # per open phase: time spent in phases nested in it

    def wrap(self, owner: Any, attr: str, phase: str) -> None:
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append(0.0)
            if self.sync:
                torch.cuda.synchronize()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if self.sync:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - start
                nested = self._stack.pop()
                self.seconds[phase] += elapsed - nested
                if self._stack:
                    self._stack[-1] += elapsed

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, original))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def instrument(agents: list[Any], phases: Phases) -> None:
    from tpo_gym.envs.token_task import TokenTaskTensorEnv, TokenTaskVectorEnv

    for env_class in (TokenTaskVectorEnv, TokenTaskTensorEnv):
        phases.wrap(env_class, "score_candidates", "scoring (env)")
        phases.wrap(env_class, "step", "scoring (env)")
    phases.wrap(sb.SeedBatch, "_collect_stacked", "rollout (policy sampling, buffers)")
    for a in agents:
        phases.wrap(a, "collect_rollouts", "rollout (policy sampling, buffers)")
        phases.wrap(a.policy, "step_logits", "forward")
        phases.wrap(a.policy, "stacked_step_logits", "forward")
        phases.wrap(a.policy.optimizer, "step", "optimiser")
    phases.wrap(torch.Tensor, "backward", "backward")
    phases.wrap(stacked_optim.StackedOptimizer, "step", "optimiser")


def measure(name: str, seeds: int, mode: str, iterations: int, device: str) -> tuple[float, dict[str, float]]:
    """Seconds per seed-episode (after one warm-up iteration) and seconds per phase per seed-episode.

    ``mode``: ``"alone"`` (each seed's ``learn``), ``"loop"`` (SeedBatch, every part per seed) or
    ``"stacked"`` (SeedBatch, stacked rollout, forward and optimiser: rollouts on the device, also on CPU).
    """
    cuda = device.startswith("cuda")
    agents = make_agents(name, seeds, device, True if mode == "stacked" else None)
    steps = agents[0].steps_per_iteration
    batch = None if mode == "alone" else sb.SeedBatch(agents, forward=mode, optimizer=mode, rollout=mode)

    def run(n: int) -> None:
        if batch is None:
            for a in agents:
                a.learn(n * steps, reset_num_timesteps=False)
        else:
            batch.learn(n * steps, reset_num_timesteps=False)

    def timed(n: int) -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run(n)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    run(1)
    phases = Phases(sync=cuda)
    plain = timed(iterations) if cuda else None  # on a GPU the profile's synchronisations would slow it
    instrument(agents, phases)
    try:
        profiled = timed(iterations)
    finally:
        phases.restore()
    per = (plain if plain is not None else profiled) / (iterations * seeds)
    split = {k: v / (iterations * seeds) for k, v in phases.seconds.items()}
    split["rest (Python overhead, bookkeeping)"] = profiled / (iterations * seeds) - sum(split.values())
    return per, split


def update_flops(name: str, device: str) -> float:
    """6 x weight-matrix parameters x tokens x epochs of one update (forward + backward)."""
    agent = make_agents(name, 1, device)[0]
    matrices = sum(p.numel() for n, p in agent.policy.named_parameters() if p.ndim == 2 and "emb" not in n)
    h = ENV_KWARGS["length"]
    tokens = 100 * (2 * h - 1) * (agent.group_size if getattr(agent, "level", "token") == "sequence" else 1)
    return 6.0 * matrices * tokens * agent.n_epochs


def gemm_gflops(device: str, m: int = 1900, k: int = 64, n: int = 256, repeats: int = 200) -> float:
    a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
    for _ in range(10):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2.0 * m * k * n * repeats / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=3, help="measured iterations per cell (default 3)")
    parser.add_argument("--sizes", default="1,5,10,20", help="seed counts S (default 1,5,10,20)")
    parser.add_argument("--methods", default=",".join(METHODS), help="methods (default: all three)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: one core)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = args.methods.split(",")
    gemm = gemm_gflops(args.device)
    print(f"device {args.device}, {args.threads} thread(s); GEMM [1900 x 64] x [64 x 256]: {gemm:.1f} GFLOP/s "
          f"(the update's matrix-product floor)\n")
    header = ("| method | S | path | s / seed-episode | seed-episodes / s | vs S = 1 | update GFLOP/s | vs GEMM |\n"
              "|---|---|---|---|---|---|---|---|")
    print(header)
    for name in methods:
        flops = update_flops(name, args.device)

        def gflops(split: dict[str, float], flops: float = flops) -> float:
            return flops / max(split["forward"] + split["backward"] + split.get("optimiser", 0.0), 1e-12) / 1e9

        base, base_split = measure(name, 1, "alone", args.iterations, args.device)
        print(f"| {name} | 1 | alone (`learn`) | {base:.4f} | {1 / base:.1f} | 1.00 | {gflops(base_split):.1f} | "
              f"{gemm / gflops(base_split):.2f}x |", flush=True)
        profiles = {"S=1 alone": base_split}
        for s in sizes:
            if s == 1:
                continue
            for mode in ("loop", "stacked"):
                per, split = measure(name, s, mode, args.iterations, args.device)
                if s == max(sizes):
                    profiles[f"S={s} {mode}"] = split
                print(f"| {name} | {s} | {mode} | {per:.4f} | {1 / per:.1f} | {per / base:.2f} | "
                      f"{gflops(split):.1f} | {gemm / gflops(split):.2f}x |", flush=True)
                if name == "TPO_token" and s >= 100 and mode == "stacked":
                    verdict = "met" if 1 / per >= 1000 else "NOT met"
                    print(f"\ntarget (issue 12): >= 1,000 seed-episodes/s for TPO_token at S = 100: {1 / per:.0f}, "
                          f"{verdict}\n", flush=True)
        print(f"\nwhere the time goes, {name} (ms per seed-episode):\n")
        keys = sorted({k for p in profiles.values() for k in p})
        print("| phase | " + " | ".join(profiles) + " |")
        print("|---|" + "---|" * len(profiles))
        for k in keys:
            print(f"| {k} | " + " | ".join(f"{1000 * p.get(k, 0.0):.1f}" for p in profiles.values()) + " |")
        print("| total | " + " | ".join(f"{1000 * sum(p.values()):.1f}" for p in profiles.values()) + " |\n",
              flush=True)
        if name != methods[-1]:
            print(header)


if __name__ == "__main__":
    main()
