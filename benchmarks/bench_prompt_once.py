"""A prompt once per group: the before / after ratio of a Table 3 episode (issue 46), measured in one run.

A sequence-level update of the transformer computes, without it, every rollout's prompt again: K rollouts of a
group share their H prompt tokens, so ``TransformerPolicy.step_logits(obs, group_size=K)`` computes the prompts
once (``[G, H]``) and the answers' ``T - 1`` positions attend to their group's prompt keys / values. This script
builds a Table 3 agent (reverse copy, V = 2, terminal reward, B = 100, K = 8, reference setup, one thread), and
times whole episodes (rollout + update) and the update alone, with the prompt computed once per group ("after")
and per rollout ("before", ``policy.shares_group_prefix = False``), interleaved ``--repeats`` times; it prints
the medians and their ratios (CPU time of this one-threaded process, so a busy machine changes little). Usage::

    .venv/bin/python benchmarks/bench_prompt_once.py [--horizon 10] [--repeats 5] [--methods TPO,GRPO]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tpo_gym.evaluation.experiments import _make_env, make_agent  # noqa: E402

KWARGS = {"TPO": {"level": "sequence"}, "GRPO": {"level": "sequence", "beta": 0.04}}


def _agent(algo: str, horizon: int) -> object:
    params = {"env_id": "tpo_gym/TokenTask-v0",
              "env_kwargs": {"target": "reverse_copy", "reward": "terminal", "vocab_size": 2, "length": horizon},
              "agent_kwargs": {"batch_size": 100, "group_size": 8}, "setup": "reference"}
    return make_agent(algo, _make_env(params["env_id"], params["env_kwargs"]), 0, params, KWARGS[algo])


def _time(fn: object) -> float:
    """CPU seconds of this process (one thread: unaffected by other processes on a busy machine)."""
    start = time.process_time()
    fn()  # type: ignore[operator]
    return time.process_time() - start


def measure(algo: str, horizon: int, repeats: int) -> dict[str, dict[str, float]]:
    """Median seconds of an episode and of its update, before and after."""
    agent = _agent(algo, horizon)
    agent.learn(agent.steps_per_iteration)  # warm-up
    times: dict[str, dict[str, list[float]]] = {k: {"episode": [], "update": []} for k in ("before", "after")}
    for _ in range(repeats):
        for mode in ("before", "after"):
            agent.policy.shares_group_prefix = mode == "after"
            times[mode]["episode"].append(_time(lambda: agent.learn(agent.steps_per_iteration,
                                                                    reset_num_timesteps=False)))
            times[mode]["update"].append(_time(agent.train))
    return {m: {k: statistics.median(v) for k, v in d.items()} for m, d in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", default="TPO,GRPO")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"Table 3 P H={args.horizon}, reference setup, B=100, K=8, one thread; medians of {args.repeats}, "
          "interleaved")
    for algo in args.methods.split(","):
        r = measure(algo, args.horizon, args.repeats)
        print(f"{algo:5s} episode {r['before']['episode']:.3f} s -> {r['after']['episode']:.3f} s "
              f"({r['before']['episode'] / r['after']['episode']:.2f}x); update {r['before']['update']:.3f} s -> "
              f"{r['after']['update']:.3f} s ({r['before']['update'] / r['after']['update']:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
