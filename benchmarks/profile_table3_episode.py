"""Where one Table 3 episode spends its time on the CPU: rollouts vs the update's forward, backward and
optimiser step, for each sequence-level method of the preset (one thread, the reference setup).

A Table 3 episode (docs/method.md section 6): K = 8 rollouts of H tokens for B = 100 prompts (reverse
copy, V = 2, terminal exact-match reward), then 4 full-batch epochs. The script times ``--iterations``
iterations after one warm-up and prints, per method, seconds per iteration and the share of each phase
(cProfile's cumulative times of the agent's own steps and of torch's backward and optimiser step): the
share left outside them is what is not model compute (Python, environment, bookkeeping).

Usage::

    python benchmarks/profile_table3_episode.py [--horizon 10] [--iterations 3] [--methods TPO,GRPO,PPO,DG]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

import torch

from tpo_gym.evaluation.experiments import _make_env, make_agent

METHOD_KWARGS = {"TPO": {"level": "sequence"}, "GRPO": {"level": "sequence", "beta": 0.04}, "PPO": {}, "DG": {}}
#: (label, file suffix, function name) of the phases read from the profile.
PHASES = [("rollouts", "agents/base.py", "collect_rollouts"), ("update", "agents/base.py", "train"),
          ("  backward", "torch/autograd/__init__.py", "backward"), ("  optimiser step", "torch/optim/optimizer.py",
                                                                     "wrapper")]


def profile(algo: str, horizon: int, iterations: int, setup: str) -> tuple[float, dict[str, float]]:
    """Seconds per iteration of ``algo`` and the share of each phase of :data:`PHASES`."""
    params = {"env_id": "tpo_gym/TokenTask-v0",
              "env_kwargs": {"target": "reverse_copy", "reward": "terminal", "vocab_size": 2, "length": horizon},
              "agent_kwargs": {"batch_size": 100, "group_size": 8, "budget": "prompt"}, "setup": setup}
    model = make_agent(algo, _make_env(params["env_id"], params["env_kwargs"]), 0, params, METHOD_KWARGS[algo])
    model.learn(model.steps_per_iteration)  # warm-up: first-call allocations are not an episode's cost
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    model.learn(iterations * model.steps_per_iteration, reset_num_timesteps=False)
    prof.disable()
    total = time.perf_counter() - start
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    shares = {}
    for label, suffix, name in PHASES:
        cum = sum(v[3] for (file, _, func), v in stats.items() if func == name and file.endswith(suffix))
        shares[label] = cum / total
    return total / iterations, shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--methods", default="TPO,GRPO,PPO,DG")
    parser.add_argument("--setup", default="reference", choices=("reference", "tuned"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    print(f"Table 3 episode, H={args.horizon}, B=100, K=8, 4 epochs, {args.setup} setup, 1 thread")
    for algo in args.methods.split(","):
        per_iter, shares = profile(algo, args.horizon, args.iterations, args.setup)
        other = 1.0 - shares["rollouts"] - shares["update"]
        parts = ", ".join(f"{k.strip()} {v:.0%}" for k, v in shares.items())
        print(f"{algo:5s} {per_iter:.3f} s/iteration: {parts}; outside rollouts and update {other:.0%}")


if __name__ == "__main__":
    main()
