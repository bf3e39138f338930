"""Base (untrained) scores of SmolLM2-135M-Instruct on Reasoning Gym tasks, for two prompt formats.

Which task gives an LLM run something to learn from at this scale? A group of K samples of one
prompt carries a learning signal (for TPO and for GRPO alike) only when its scores differ, so for
each (task, prompt format) this measures, over N prompts x K samples of the untrained model:

* ``mean``: the mean score (the dataset's own ``score_answer``, partial credit included);
* ``nonzero``: the fraction of samples with a non-zero score;
* ``solved``: the fraction with score 1;
* ``tagged``: the fraction whose scored completion has an ``<answer>...</answer>`` pair;
* ``var_groups``: the fraction of the N groups whose K scores are not all equal (groups that give a
  gradient);
* ``seconds``: wall time of generation and scoring.

The prompt formats are those of :mod:`tpo_gym.agents.lm.prompts`: ``env`` (``PromptFormat()``: the env's
system prompt, which asks for answer tags) and ``answer_prefill`` (``PromptFormat.answer_prefill()``:
no system prompt, "Give only the final answer.", the assistant turn prefilled with ``<answer>``).
Every format sees the same N questions (paired comparison). Sampling: temperature 1, top-p 1, left
padding, ``torch.manual_seed(seed)`` before every (task, format) cell.

Usage (the committed results, ``benchmarks/results/llm-base-scores/``)::

    python -m tpo_gym.agents.lm.smollm2            # once: fetch the model
    python benchmarks/llm_base_scores.py [--n-prompts 8] [--k 8] [--tasks graph_color,knights_knaves,...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import inspect
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import tpo_gym
from tpo_gym.agents.lm import smollm2
from tpo_gym.agents.lm.prompts import PromptFormat, build_prompt, completion_for_env

gym.register_envs(tpo_gym)

#: The tasks, each a Reasoning Gym dataset with a config (kwargs of ``tpo_gym/ReasoningGym-v0``).
#: ``graph_color`` and ``knights_knaves`` are the paper's tasks (default configs); the others are
#: made easy enough for a 135M model.
TASKS: dict[str, dict[str, Any]] = {
    "graph_color": {"dataset": "graph_color"},
    "knights_knaves": {"dataset": "knights_knaves"},
    "basic_arithmetic": {
        "dataset": "basic_arithmetic", "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
        "operators": ("+", "-"), "allow_parentheses": False, "allow_negation": False,
    },
    "chain_sum": {"dataset": "chain_sum", "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "spell_backward": {"dataset": "spell_backward", "min_word_len": 3, "max_word_len": 4},
    "letter_counting": {"dataset": "letter_counting", "min_words": 3, "max_words": 5},
    "leg_counting": {"dataset": "leg_counting", "min_animals": 1, "max_animals": 2, "max_instances": 3},
    "gcd": {"dataset": "gcd", "min_value": 1, "max_value": 20},
}
FORMATS: dict[str, PromptFormat] = {"env": PromptFormat(), "answer_prefill": PromptFormat.answer_prefill()}
OUT_DIR = Path(__file__).resolve().parent / "results" / "llm-base-scores"
#: Example completions kept per cell in results.json (truncated to EXAMPLE_CHARS).
N_EXAMPLES = 3
EXAMPLE_CHARS = 300


def draw_prompts(task: dict[str, Any], n: int, seed: int, size: int) -> tuple[Any, list[int], list[dict[str, str]]]:
    """The env and N distinct questions: the reset seeds that draw them and their ``info``."""
    env = gym.make("tpo_gym/ReasoningGym-v0", size=size, seed=seed, **task)
    seeds: list[int] = []
    infos: list[dict[str, str]] = []
    seen: set[int] = set()
    s = seed
    while len(seeds) < n:
        _, info = env.reset(seed=s)
        if info["index"] not in seen:
            seen.add(info["index"])
            seeds.append(s)
            infos.append(info)
        s += 1
    return env, seeds, infos


@torch.no_grad()
def sample_shared_prefix(model: Any, enc: dict[str, torch.Tensor], k: int, **gen_kwargs: Any) -> torch.Tensor:
    """``model.generate`` of K samples per prompt with the prompt's forward computed once, not K times.

    The prompts (all but their last token) go through one forward; its KV cache is repeated K times
    and handed to ``generate`` with the K-fold inputs, so ``generate`` only runs the last prompt token
    and the new ones. Same distribution as ``generate(..., num_return_sequences=k)`` (the prompt's
    cache is the same for its K copies; positions follow the attention mask as ``generate``'s do),
    K times less prompt compute. Returns ``[len(prompts) * k, prompt_len + new]``, K rows per prompt.
    """
    ids, mask = enc["input_ids"], enc["attention_mask"]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    # transformers 5.x names the KV cache `cache` (`past_key_values` is its deprecated alias, 4.x's name).
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    prefix = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], use_cache=True)
    cache = getattr(prefix, name)
    cache.batch_repeat_interleave(k)
    return model.generate(
        input_ids=ids.repeat_interleave(k, 0),
        attention_mask=mask.repeat_interleave(k, 0),
        **{name: cache},
        **gen_kwargs,
    )


@torch.no_grad()
def generate(model: Any, tok: Any, prompts: list[str], k: int, max_new_tokens: int, batch_rows: int) -> list[list[str]]:
    """K sampled completions (decoded, special tokens dropped) of each prompt, in prompt order."""
    out: list[list[str]] = []
    per_batch = max(1, batch_rows // k)
    for start in range(0, len(prompts), per_batch):
        chunk = prompts[start:start + per_batch]
        enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = sample_shared_prefix(
            model, enc, k, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
            max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
        )
        texts = tok.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        out += [texts[i * k:(i + 1) * k] for i in range(len(chunk))]
    return out


def run_cell(model: Any, tok: Any, env: Any, seeds: list[int], infos: list[dict[str, str]], fmt: PromptFormat,
             k: int, max_new_tokens: int, seed: int, batch_rows: int) -> dict[str, Any]:
    """Generate and score one (task, format) cell."""
    from reasoning_gym.utils import extract_answer

    t0 = time.perf_counter()
    prompts = [build_prompt(tok, info["question"], info["system_prompt"], fmt) for info in infos]
    torch.manual_seed(seed)
    generated = generate(model, tok, prompts, k, max_new_tokens, batch_rows)
    scores = np.zeros((len(seeds), k), dtype=np.float64)
    tagged = np.zeros((len(seeds), k), dtype=bool)
    examples: list[dict[str, Any]] = []
    for i, (s, gens) in enumerate(zip(seeds, generated, strict=True)):
        _, info = env.reset(seed=s)
        assert info["question"] == infos[i]["question"]
        completions = [completion_for_env(g, fmt) for g in gens]
        scores[i] = env.unwrapped.score_candidates(completions)
        tagged[i] = [extract_answer(c) is not None for c in completions]
        if i == 0:
            answer = env.unwrapped.entry["answer"]
            examples = [{"completion": c[:EXAMPLE_CHARS], "score": float(scores[i, j]), "answer": str(answer)[:100]}
                        for j, c in enumerate(completions[:N_EXAMPLES])]
    seconds = time.perf_counter() - t0
    prompt_tokens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    return {
        "mean": float(scores.mean()),
        "nonzero": float((scores > 0).mean()),
        "solved": float((scores >= 1).mean()),
        "tagged": float(tagged.mean()),
        "var_groups": float((scores.max(1) > scores.min(1)).mean()),
        "seconds": round(seconds, 1),
        "prompt_tokens_mean": float(np.mean(prompt_tokens)),
        "max_new_tokens": max_new_tokens,
        "scores": scores.round(4).tolist(),
        "examples": examples,
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "tpo_gym": tpo_gym.__version__}
    for pkg in ("torch", "transformers", "reasoning-gym", "gguf", "gymnasium"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pick(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best cell for a TPO vs GRPO run: most groups with a signal, mean score above 0 and at most 0.5."""
    ok = [r for r in rows if 0 < r["mean"] <= 0.5 and r["var_groups"] > 0]
    return max(ok, key=lambda r: (r["var_groups"], r["nonzero"], -r["mean"])) if ok else None


def table(rows: list[dict[str, Any]]) -> str:
    head = "| task | format | mean score | non-zero | solved | tagged | groups with variance | prompt tokens | s |\n"
    head += "|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
    return head + "".join(
        f"| {r['task']} | {r['format']} | {r['mean']:.3f} | {r['nonzero']:.2f} | {r['solved']:.2f} | "
        f"{r['tagged']:.2f} | {r['var_groups']:.2f} | {r['prompt_tokens_mean']:.0f} | {r['seconds']:.0f} |\n"
        for r in rows
    )


def reading(rows: list[dict[str, Any]], k: int) -> str:
    """The README's paragraph, computed from the rows."""
    best = pick(rows)
    env_rows = [r for r in rows if r["format"] == "env"]
    env_tagged = max((r["tagged"] for r in env_rows), default=0.0)
    parts = []
    for fmt in sorted({r["format"] for r in rows}):
        cells = [r for r in rows if r["format"] == fmt]
        live = [r["task"] for r in cells if r["var_groups"] > 0]
        parts.append(f"with the {fmt} format, {len(live)} of {len(cells)} tasks have at least one group whose "
                     f"scores differ ({', '.join(live) or 'none'})")
    if env_tagged == 0.0:
        env_text = "never closes an answer tag (no sample of any task is tagged), so every score is 0"
    else:
        env_text = (f"rarely closes an answer tag (at most {env_tagged:.0%} of the samples of any task are "
                    f"tagged), so nearly every score is 0")
    text = (
        f"With the env's own system prompt the model {env_text} and every group of {k} is, or nearly is, "
        f"zero-variance: neither TPO nor GRPO gets a gradient from such groups. By format: "
        f"{'; '.join(parts)}. "
    )
    if best is None:
        return text + "No cell starts above 0 and at most 0.5: no task here is a good start for RL at this scale."
    return text + (
        f"The best start for a TPO vs GRPO comparison is **{best['task']}** with the **{best['format']}** "
        f"format: mean score {best['mean']:.3f} (well below 1, room to learn), {best['nonzero']:.0%} of the "
        f"samples score above 0 and {best['var_groups']:.0%} of the groups carry a signal. Both methods learn "
        f"only from groups with variance; a start where only some groups do is the sparse-signal regime "
        f"where TPO's target (a fixed point once the policy matches it) is claimed to help most, and the "
        f"groups it leaves out are the ones GRPO's zero-variance masking drops too."
    )


def write_readme(path: Path, result: dict[str, Any]) -> None:
    s = result["settings"]
    v = result["versions"]
    rows = result["rows"]
    lines = [
        "# SmolLM2-135M-Instruct: base scores on Reasoning Gym tasks",
        "",
        f"Untrained model, {s['n_prompts']} prompts x {s['k']} samples per (task, format); written by "
        "`benchmarks/llm_base_scores.py`.",
        "",
        table(rows),
        "Columns: mean score (the dataset's own scorer, partial credit included); fraction of samples with a "
        "non-zero score; fraction solved (score 1); fraction whose scored completion holds an "
        "`<answer>...</answer>` pair; fraction of the prompts whose K scores are not all equal; mean prompt "
        "length in tokens; seconds for generation and scoring.",
        "",
        "## Reading",
        "",
        reading(rows, s["k"]),
        "",
        "## Settings",
        "",
        f"- model: SmolLM2-135M-Instruct, `{smollm2.GGUF_NAME}` from `{smollm2.WHEEL_REQUIREMENT}` "
        f"(sha256 `{smollm2.GGUF_SHA256}`), dequantised to fp32, {result['n_parameters']:,} parameters, CPU, "
        f"{s['threads']} threads",
        f"- sampling: temperature {s['temperature']}, top-p {s['top_p']}, top-k off, max new tokens "
        f"{', '.join(f'{n} ({f})' for f, n in s['max_new_tokens'].items())}, "
        f"`torch.manual_seed({s['seed']})` before each cell, left padding, batches of at most "
        f"{s['batch_rows']} sequences",
        f"- formats: `env` = `PromptFormat()` {json.dumps(FORMATS['env'].to_data())}; `answer_prefill` = "
        f"`PromptFormat.answer_prefill()` {json.dumps(FORMATS['answer_prefill'].to_data())}. SmolLM2's chat "
        "template adds its own default system message (\"You are a helpful AI assistant named SmolLM, trained "
        "by Hugging Face\") when there is none, so `answer_prefill` prompts carry that one.",
        f"- envs: `gym.make(\"tpo_gym/ReasoningGym-v0\", size={s['size']}, seed={s['seed']}, **config)`, the same "
        f"{s['n_prompts']} distinct questions (reset seeds {s['seed']}, {s['seed']} + 1, ...) for both formats; "
        "configs:",
        "",
    ]
    lines += [f"  - `{name}`: `{json.dumps(cfg)}`" for name, cfg in result["tasks"].items()]
    lines += [
        "",
        f"- versions: {', '.join(f'{k} {val}' for k, val in v.items())}",
        f"- date: {result['date']}; git commit: `{result['git_commit']}`; total {result['total_seconds']:.0f} s "
        f"(model load {result['load_seconds']:.0f} s)",
        f"- machine: {result['machine']}",
        f"- command: `{result['command']}`",
        "",
        "Per-sample scores and a few example completions per cell are in `results.json`.",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-prompts", type=int, default=8, help="prompts (groups) per cell")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt (group size)")
    parser.add_argument("--prefill-tokens", type=int, default=32, help="max new tokens, answer_prefill format")
    parser.add_argument("--env-tokens", type=int, default=96, help="max new tokens, env format")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {list(TASKS)}")
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, from {list(FORMATS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=1000, help="dataset size of each env")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-rows", type=int, default=32, help="sequences per generate call")
    parser.add_argument("--data-dir", default=None, help="data dir of the model (default $TPO_GYM_DATA_DIR)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where results.json and README.md go")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    formats = [f for f in args.formats.split(",") if f]
    for t in tasks:
        if t not in TASKS:
            parser.error(f"unknown task {t!r}; choose from {list(TASKS)}")
    for f in formats:
        if f not in FORMATS:
            parser.error(f"unknown format {f!r}; choose from {list(FORMATS)}")
    torch.set_num_threads(args.threads)

    t_start = time.perf_counter()
    model, tok = smollm2.load(data_dir=args.data_dir)
    load_seconds = time.perf_counter() - t_start
    n_params = sum(p.numel() for p in model.parameters())
    print(f"loaded SmolLM2-135M-Instruct ({n_params:,} parameters) in {load_seconds:.0f} s", flush=True)
    tokens = {"env": args.env_tokens, "answer_prefill": args.prefill_tokens}

    rows: list[dict[str, Any]] = []
    for name in tasks:
        env, seeds, infos = draw_prompts(TASKS[name], args.n_prompts, args.seed, args.size)
        for fname in formats:
            cell = run_cell(model, tok, env, seeds, infos, FORMATS[fname], args.k, tokens[fname], args.seed,
                            args.batch_rows)
            row = {"task": name, "format": fname, **cell}
            rows.append(row)
            print(f"{name:>18} {fname:>15}  mean {row['mean']:.3f}  nonzero {row['nonzero']:.2f}  "
                  f"tagged {row['tagged']:.2f}  var_groups {row['var_groups']:.2f}  {row['seconds']:.0f} s", flush=True)
        env.close()
    total = time.perf_counter() - t_start
    print()
    print(table(rows))
    print(reading(rows, args.k))
    if args.no_write:
        return 0
    result = {
        "model": "SmolLM2-135M-Instruct",
        "model_file": smollm2.GGUF_NAME,
        "model_sha256": smollm2.GGUF_SHA256,
        "model_source": smollm2.WHEEL_REQUIREMENT,
        "n_parameters": n_params,
        "settings": {
            "n_prompts": args.n_prompts, "k": args.k, "seed": args.seed, "size": args.size,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0, "threads": args.threads, "batch_rows": args.batch_rows,
            "max_new_tokens": {f: tokens[f] for f in formats},
        },
        "formats": {f: FORMATS[f].to_data() for f in formats},
        "tasks": {t: TASKS[t] for t in tasks},
        "versions": versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": git_commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "command": "python benchmarks/llm_base_scores.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "load_seconds": round(load_seconds, 1),
        "total_seconds": round(total, 1),
        "pick": {k: v for k, v in (pick(rows) or {}).items() if k in ("task", "format", "mean", "var_groups")},
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    write_readme(args.out / "README.md", result)
    print(f"wrote {args.out / 'results.json'} and {args.out / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
