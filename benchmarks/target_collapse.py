r"""Does TPO's target collapse on a language model? p_old's entropy per group, measured (generation only).

TPO's target over a group of K completions is :math:`q \propto p^{old} e^{u/\eta}` with
:math:`p^{old} = \mathrm{softmax}(\ell^{old})` over the group and :math:`\ell` the completion's sequence
log-prob. Summed over tokens (the paper's definition, ``length_normalize=False``), sequence log-probs of
sampled completions differ by many nats, so :math:`p^{old}` is near one-hot, :math:`q \approx p^{old}`
and the update is near zero. This measures it for SmolLM2-135M-Instruct (the offline package) on Reasoning
Gym tasks with the answer prefill, at several ``max_new_tokens``, temperature 1, through the agent's own
rollout (``agent.collect_rollouts()``: the same prompts, sampling, scores and
log-probs as training), for summed and for length-normalised log-probs of the same samples:

* the distribution over groups of :math:`H(p^{old})` (nats; its maximum is :math:`\log K`);
* the fraction of informative groups (scores not all equal) whose best-scored completions get
  :math:`\sum q > 0.01` (:func:`tpo_gym.agents.algorithms.tpo.collapsed_target_fraction` is one minus it), at eta = 1.

Usage (the committed results: ``benchmarks/results/target-collapse/``)::

    python benchmarks/target_collapse.py [--groups 16] [--k 8] [--tokens 8,32,128]
        [--tasks gcd,knights_knaves,graph_color]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import tpo_gym
from tpo_gym import TPO
from tpo_gym.agents.algorithms.tpo import collapsed_target_fraction
from tpo_gym.objectives import standardize_scores, tpo_target

gym.register_envs(tpo_gym)

#: Tasks (kwargs of ``tpo_gym/ReasoningGym-v0``): gcd as in the llm-cpu preset, the paper's two at defaults.
TASKS: dict[str, dict[str, Any]] = {
    "gcd": {"dataset": "gcd", "min_value": 1, "max_value": 20},
    "knights_knaves": {"dataset": "knights_knaves"},
    "graph_color": {"dataset": "graph_color"},
}
OUT_DIR = Path(__file__).resolve().parent / "results" / "target-collapse"


def group_entropy(logp: torch.Tensor) -> torch.Tensor:
    """``H(softmax(logp))`` per group ``[G]`` (nats)."""
    p = torch.softmax(logp.double(), dim=-1)
    return -(p * torch.log(p.clamp(min=1e-300))).sum(dim=-1)


def measure(logp: torch.Tensor, scores: torch.Tensor, eta: float = 1.0) -> dict[str, Any]:
    """Entropy quartiles of p_old and the informative groups' best-candidate q mass for one log-prob kind."""
    h = group_entropy(logp).numpy()
    u = standardize_scores(scores.double())
    q = tpo_target(logp.double(), u, eta)
    collapsed = float(collapsed_target_fraction(q, scores.double(), None))
    informative = int((scores.max(dim=-1).values > scores.min(dim=-1).values).sum())
    return {
        "entropy_p_old": {"min": float(h.min()), "q25": float(np.quantile(h, 0.25)), "median": float(np.median(h)),
                          "q75": float(np.quantile(h, 0.75)), "max": float(h.max())},
        "informative_groups": informative,
        "best_q_above_1pct": None if math.isnan(collapsed) else 1.0 - collapsed,
    }


def run_cell(task: str, max_new_tokens: int, groups: int, k: int, seed: int) -> dict[str, Any]:
    """One (task, max_new_tokens) cell: one rollout of ``groups`` prompts x ``k`` completions."""
    env = gym.make("tpo_gym/ReasoningGym-v0", size=2000, seed=seed, **TASKS[task])
    agent = TPO("CausalLMPolicy", env, batch_size=groups, group_size=k, seed=seed,
                policy_kwargs={"model": "smollm2-135m-instruct", "max_new_tokens": max_new_tokens,
                               "prompt_format": "answer_prefill", "temperature": 1.0, "micro_batch_size": 4})
    start = time.perf_counter()
    batch = agent.collect_rollouts()  # the first iteration's rollout, exactly as learn() draws it
    seconds = time.perf_counter() - start
    lengths = batch.token_mask.sum(dim=1).reshape(groups, k).double().clamp(min=1)
    summed = batch.logp_old.double()
    return {
        "task": task, "max_new_tokens": max_new_tokens, "groups": groups, "k": k,
        "mean_score": float(batch.scores.mean()), "mean_length": float(lengths.mean()),
        "summed": measure(summed, batch.scores), "length_normalized": measure(summed / lengths, batch.scores),
        "seconds": round(seconds, 1),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| task | new tokens | mean length | mean score | informative groups | H(p_old) summed: median [min, max] "
            "| best q > 0.01, summed | H(p_old) length-normalised: median [min, max] | best q > 0.01, normalised |\n"
            "|---|---:|---:|---:|---:|---|---:|---|---:|\n")

    def h(m: dict[str, Any]) -> str:
        e = m["entropy_p_old"]
        return f"{e['median']:.3f} [{e['min']:.3f}, {e['max']:.3f}]"

    def frac(m: dict[str, Any]) -> str:
        return "n/a" if m["best_q_above_1pct"] is None else f"{m['best_q_above_1pct']:.2f}"

    return head + "".join(
        f"| {r['task']} | {r['max_new_tokens']} | {r['mean_length']:.1f} | {r['mean_score']:.3f} | "
        f"{r['summed']['informative_groups']} / {r['groups']} | {h(r['summed'])} | {frac(r['summed'])} | "
        f"{h(r['length_normalized'])} | {frac(r['length_normalized'])} |\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=16, help="prompts per cell (default 16)")
    parser.add_argument("--k", type=int, default=8, help="completions per prompt (default 8)")
    parser.add_argument("--tokens", default="8,32,128", help="max_new_tokens values (default 8,32,128)")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"tasks (default {','.join(TASKS)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {unknown}; allowed: {sorted(TASKS)}")
    tokens = [int(t) for t in args.tokens.split(",") if t]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for n in tokens:  # shortest first; the files are rewritten after every cell (a stopped run keeps its cells)
        for task in tasks:
            rows.append(run_cell(task, n, args.groups, args.k, args.seed))
            r = rows[-1]
            print(f"{task} {n}: H median summed {r['summed']['entropy_p_old']['median']:.3f} / normalised "
                  f"{r['length_normalized']['entropy_p_old']['median']:.3f}, best q > 0.01: "
                  f"{r['summed']['best_q_above_1pct']} / {r['length_normalized']['best_q_above_1pct']} "
                  f"({r['seconds']} s)", flush=True)
            result = {"date": datetime.date.today().isoformat(), "settings": {**vars(args), "out": str(args.out)},
                      "versions": {"python": platform.python_version(), "torch": torch.__version__,
                                   "tpo_gym": tpo_gym.__version__},
                      "threads": torch.get_num_threads(), "rows": rows}
            (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
            (args.out / "table.md").write_text(table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
