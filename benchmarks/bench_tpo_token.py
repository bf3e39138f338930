"""Benchmark TPO_token on the paper's Table 1 setting: reverse copy, bag-of-tokens, V=2, H=10, B=100, K=8, 4 epochs.

Reports
* seconds per episode (one training iteration: B rollouts of H tokens, K candidates per state, 4
  full-batch epochs) for one seed, against the JAX reference's 0.92 s and the 0.15 s target;
* steps to 1% error (docs/method.md section 5: first iteration at which the seed-mean training error curve is
  below 0.01), plus the mean +- standard error of the per-seed first crossings, against the paper's 58.

Usage::

    python benchmarks/bench_tpo_token.py [--seeds 5] [--iterations 150] [--adjust-lr-fn match_rms_adamw]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import tpo_gym  # noqa: F401
from tpo_gym import TPO

PAPER_STEPS = 58
JAX_SECONDS = 0.92
TARGET_SECONDS = 0.15


def run(seed: int, iterations: int, adjust_lr_fn: str, muon_on_embeddings: bool) -> tuple[np.ndarray, float]:
    """Train one seed; return its error curve and the mean seconds per iteration (excluding setup)."""
    model = TPO(
        "TransformerPolicy",
        "tpo_gym/TokenReversal-v0",
        batch_size=100,
        group_size=8,
        n_epochs=4,
        seed=seed,
        policy_kwargs={"optimizer_kwargs": {"adjust_lr_fn": adjust_lr_fn}, "muon_on_embeddings": muon_on_embeddings},
    )
    model.learn(model.steps_per_iteration)  # builds the rollout env; first iteration (warm-up)
    start = time.perf_counter()
    model.learn((iterations - 1) * model.steps_per_iteration, reset_num_timesteps=False)
    seconds = (time.perf_counter() - start) / (iterations - 1)
    return np.array([h["error"] for h in model.history]), seconds


def first_below(curve: np.ndarray, threshold: float = 0.01) -> int | None:
    """First index where ``curve < threshold`` (None if never)."""
    hits = np.flatnonzero(curve < threshold)
    return int(hits[0]) if hits.size else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--adjust-lr-fn", default="match_rms_adamw", choices=["match_rms_adamw", "original"])
    parser.add_argument("--no-muon-on-embeddings", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (agents default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    curves, times = [], []
    for seed in range(args.seeds):
        curve, seconds = run(seed, args.iterations, args.adjust_lr_fn, not args.no_muon_on_embeddings)
        curves.append(curve)
        times.append(seconds)
        print(f"seed {seed}: {seconds:.3f} s/episode, first < 1% at {first_below(curve)}, final error {curve[-1]:.4f}")

    mean_curve = np.mean(curves, axis=0)
    steps = first_below(mean_curve)
    per_seed = [first_below(c) for c in curves]
    reached = [s for s in per_seed if s is not None]
    print()
    print(f"setting: reverse copy, bag, V=2, H=10, B=100, K=8, 4 epochs; Muon adjust_lr_fn={args.adjust_lr_fn}, "
          f"Muon on embeddings/head={not args.no_muon_on_embeddings}, threads={args.threads}")
    print(f"seconds per episode (seed 0): {times[0]:.3f} s  | target {TARGET_SECONDS} s: "
          f"{times[0] / TARGET_SECONDS:.2f}x target | JAX reference {JAX_SECONDS} s: "
          f"{JAX_SECONDS / times[0]:.1f}x faster")
    print(f"seconds per episode (mean over {args.seeds} seeds): {np.mean(times):.3f} s")
    print(f"steps to 1% (seed-mean curve, {args.seeds} seeds): {steps}  | paper {PAPER_STEPS}: "
          + (f"{steps / PAPER_STEPS:.2f}x" if steps is not None else "not reached"))
    if reached:
        se = np.std(reached, ddof=1) / np.sqrt(len(reached)) if len(reached) > 1 else float("nan")
        print(f"per-seed steps to 1%: mean {np.mean(reached):.1f} +- {se:.1f} (s.e.), reached by "
              f"{len(reached)}/{len(per_seed)} seeds: {per_seed}")
    print(f"final seed-mean error: {mean_curve[-1]:.4f}")


if __name__ == "__main__":
    main()
