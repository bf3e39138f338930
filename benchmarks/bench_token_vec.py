"""Steps per second of the token task with 1024 envs: native batched env vs ``SyncVectorEnv``.

Run ``python benchmarks/bench_token_vec.py [--num-envs 1024] [--steps 200]``; prints both rates
(env-steps per second) and their ratio. Target: native >= 20x faster.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import tpo_gym

gym.register_envs(tpo_gym)


def env_steps_per_second(mode: str, num_envs: int, steps: int, env_id: str) -> float:
    """Time ``steps`` vector steps with uniform random actions; return env-steps per second."""
    venv = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode)
    venv.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, venv.single_action_space.n, size=(steps, num_envs))
    venv.step(actions[0])  # warm-up
    start = time.perf_counter()
    for t in range(steps):
        venv.step(actions[t])
    elapsed = time.perf_counter() - start
    venv.close()
    return steps * num_envs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="tpo_gym/TokenReversal-v0")
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    native = env_steps_per_second("vector_entry_point", args.num_envs, args.steps * 10, args.env_id)
    sync = env_steps_per_second("sync", args.num_envs, args.steps, args.env_id)
    print(f"{args.env_id}, {args.num_envs} envs")
    print(f"native (vector_entry_point): {native:,.0f} env-steps/s")
    print(f"SyncVectorEnv:               {sync:,.0f} env-steps/s")
    print(f"ratio native / sync: {native / sync:.1f}x (target >= 20x)")


if __name__ == "__main__":
    main()
