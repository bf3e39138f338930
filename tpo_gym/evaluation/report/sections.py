"""The sections of ``report.md``: setup, terms (the glossary), results, claims, aggregate, diagnostics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tpo_gym.agents.common.registry import reported_diagnostics
from tpo_gym.evaluation import claims as C
from tpo_gym.evaluation import metrics as M
from tpo_gym.evaluation._provenance import distribution_text, git_commit, package_versions
from tpo_gym.evaluation.presets import Preset
from tpo_gym.evaluation.report.budget import not_comparable
from tpo_gym.evaluation.report.values import Cell, _diagnostic_keys, _fmt_stat, _metric_label, _metric_value, _paper

_FLAG = "⚠"


def _seed_steps_table(preset: Preset, cells: dict[tuple[str, str], Cell]) -> list[str]:
    """Median and quartiles of the per-seed steps to each threshold, and how many seeds never got there."""
    md: list[str] = []
    for metric in preset.metrics:
        if metric["type"] != M.STEPS_TO_THRESHOLD:
            continue
        key, thr = metric.get("key", "error"), float(metric["threshold"])
        settings = [s["name"] for s in preset.settings]
        label = C.metric_label(metric)
        md += [f"### Per seed: {label[0].lower() + label[1:]}\n", "| Method | " + " | ".join(settings) + " |",
               "|---|" + "---|" * len(settings)]
        for method in [m["name"] for m in preset.methods]:
            texts = []
            for setting in settings:
                cell = cells.get((method, setting))
                steps, mat = cell.matrix(key) if cell is not None and cell.rows else (None, np.empty(0))
                if not mat.size:
                    texts.append("n/a")
                    continue
                values = M.per_seed_steps_to_threshold(mat, thr, steps)
                never = int(np.sum(~np.isfinite(values)))
                # quartiles with "never" as +inf: a quartile that lands on a never-seed reads "never"
                q1, med, q3 = (float(np.quantile(values, q, method="lower")) for q in (0.25, 0.5, 0.75))
                fmt = lambda v: "never" if not math.isfinite(v) else f"{v:.0f}"  # noqa: E731
                texts.append(f"{fmt(med)} [{fmt(q1)}–{fmt(q3)}]"
                             + (f", never {never}/{values.size}" if never else ""))
            md.append(f"| {method} | " + " | ".join(texts) + " |")
        md += ["", "Cells: **median [lower quartile – upper quartile]** of the per-seed steps (each seed's own first "
               "step below the threshold), and the seeds that never got there.\n"]
    return md


_STEP_TERMS = {
    "tabular_single": "single-context bandit: one normalised update of the logit table from B sampled actions",
    "tabular_multi": "multi-context bandit: one exact (population) update of all N x K logits, normalised",
    "token": ("token task: one iteration, an *episode* in the paper: B prompts rolled out with the current policy "
              "(B·K complete rollouts for sequence-level methods, and for single-sample methods under the "
              "interaction budget), then E full-batch optimiser steps on them"),
    "mnist": ("MNIST: one batch of B training images, one sampled class each, and the method's update on it; "
              "test error is measured every `eval_every` steps"),
    "llm": ("language model: one iteration: B prompts, K sampled completions each scored by the dataset's own "
            "scorer, then E optimiser steps over micro-batches of whole groups; step 0 is the base model"),
    "gym": "Gymnasium env: one window of the setting's `window` env steps (`env_steps` counts them)",
}
_ERROR_TERMS = {
    "tabular_single": "single-context bandit: 1 − π(y*), the probability not on the correct arm",
    "tabular_multi": "multi-context bandit: 1 − mean over contexts of π_n(y_n)",
    "token": ("token task: 1 − mean reward of the training rollouts (sampled, not greedy): per-token error with "
              "bag-of-tokens reward, credit up to the first mistake with sequential reward, exact-match error with "
              "terminal reward"),
    "mnist": ("MNIST: `test_error` is the greedy (argmax) error on the 10,000 test images; `error` the training "
              "error averaged over the last `eval_every` steps"),
    "llm": ("language model: `mean_score` is the train mean score of the step's B x K sampled completions "
            "(`error` = 1 − it); `test_score` the mean score of greedy completions of the first `eval_size` "
            "held-out questions (the same dataset with another seed), every `eval_every` steps; `test_accuracy` "
            "the fraction of those scored 1"),
    "gym": ("Gymnasium env: no error; `return` is the mean undiscounted return of the training episodes (sampled "
            "actions, exploration noise included) that ended in the window"),
}


def _terms(preset: Preset, present: set[str]) -> list[str]:
    kinds = list(dict.fromkeys(s["kind"] for s in preset.settings))
    md = ["## Terms\n"]
    md.append("- **step** — " + "; ".join(_STEP_TERMS.get(k, k) for k in kinds) + ".")
    md.append("- **error** — " + "; ".join(_ERROR_TERMS.get(k, k) for k in kinds) + ".")
    if "misalignment" in present:
        md.append("- **misalignment** — 1 − cos(g, g*) between the update direction g a method takes and the "
                  "oracle direction g*: π(y*)(e_y* − π) on the single-context bandit, the cross-entropy (CE) "
                  "direction on the multi-context bandit. 0 = the oracle's direction, 1 = orthogonal to it.")
    if any(m["type"] == M.STEPS_TO_THRESHOLD for m in preset.metrics):
        md.append("- **steps to X** — the first (0-indexed) step at which the seed-mean curve is below X; "
                  "`never` = not within the budget. Its ± is a bootstrap s.e. (200 resamples of the seeds).")
    md.append("- **±** — standard error over seeds, std (ddof = 1) / sqrt(n). **⚠** — outside 2 s.e. of the "
              "paper's value; the paper's `-` means never reached (steps) or above the stated bound (error). "
              "**n/a** — the setting does not run this method, or no run finished.")
    for key, text in reported_diagnostics().items():  # the glossary entries the agent classes declare
        if text and key in present:
            md.append(f"- {text}.")
    md.append("- Method definitions, tasks and the paper's numbers: docs/method.md of the tpo-gym repository "
              "(sections 1-6).")
    md.append("")
    return md


def _results(preset: Preset, cells: dict[tuple[str, str], Cell], values: dict[tuple[str, str, str], C.Stat],
             n_seeds: int) -> list[str]:
    md = ["## Results\n"]
    titled = bool(preset.data.get("tables"))
    compared = flagged = 0
    for table in preset.tables():
        settings = table.get("settings") or [s["name"] for s in preset.settings]
        methods = table.get("methods") or [m["name"] for m in preset.methods]
        for metric in preset.metrics:
            label = _metric_label(metric)
            md.append(f"### {table['title']}: {label[0].lower() + label[1:]}\n" if titled else f"### {label}\n")
            md.append("| Method | " + " | ".join(settings) + " |")
            md.append("|---|" + "---|" * len(settings))
            for method in methods:
                texts = []
                for setting in settings:
                    cell = cells.get((method, setting))
                    if cell is None:
                        texts.append("n/a")
                        continue
                    stat = values[(metric["id"], method, setting)]
                    txt = _fmt_stat(stat, metric)
                    paper = _paper(preset, metric["id"], method, setting)
                    gap = not_comparable(preset, setting)
                    if paper is not None and gap:
                        txt += f" ({paper}; {gap})"
                    elif paper is not None:
                        txt += f" ({paper})"
                        if stat.has_data:
                            compared += 1
                            if M.paper_agrees(stat.value, stat.se, paper, metric.get("paper_dash", "never")) is False:
                                txt += f" {_FLAG}"
                                flagged += 1
                    if cell.failed:
                        txt += f" [{len(cell.failed)} failed]"
                    if not cell.rows and not cell.failed:
                        txt = "not run yet"
                    elif len(cell.rows) < n_seeds:
                        txt += f" [n={len(cell.rows)}]"
                    texts.append(txt)
                md.append(f"| {method} | " + " | ".join(texts) + " |")
            md.append("")
    md.append("Cells: **ours ± s.e. (paper)**." if compared else "Cells: **ours ± s.e.**")
    if compared:
        md.append(f"{flagged} of {compared} cells with a published number differ from it by more than 2 s.e. "
                  f"({_FLAG}).\n")
    gaps = [f"{s['name']} ({not_comparable(preset, s['name'])})" for s in preset.settings
            if not_comparable(preset, s["name"])]
    if not compared:
        md.append("Nothing was compared with the paper: " + ("no cell run at the paper's budget has a published "
                                                             "number." if gaps else
                                                             "no cell of this run has a published number.") + "\n")
    if gaps:
        md.append(f"Run at another budget than the paper's numbers (`tpo-gym bench --episodes/--steps`), so not "
                  f"compared with them: {', '.join(gaps)}.\n")
    return md


def _direction_text(preset: Preset) -> str:
    higher = [C.metric_label(m) for m in preset.metrics if C.higher_is_better(m)]
    if not higher:
        return "lower is better for every metric"
    if len(higher) == len(preset.metrics):
        return "higher is better for every metric"
    return "higher is better for " + ", ".join(f"*{h[0].lower() + h[1:]}*" for h in higher) + ", lower for the rest"


def _claims(preset: Preset, full_methods: list[str], cells: dict[tuple[str, str], Cell],
            values: dict[tuple[str, str, str], C.Stat]) -> list[str]:
    claims = preset.data.get("paper_claims", [])
    omitted = int(preset.data.get("omitted_claims", 0))
    if not claims and not omitted:
        return []
    run_methods = [m["name"] for m in preset.methods]
    ran = {s["name"]: [m["name"] for m in preset.setting_methods(s)] for s in preset.settings}
    extra: dict[tuple[str, str, str], C.Stat] = {}

    def lookup(metric: dict[str, Any], method: str, setting: str) -> C.Stat | None:
        cell = cells.get((method, setting))
        if cell is None:
            return None
        key = (metric["id"], method, setting)
        if key in values and any(m["id"] == metric["id"] for m in preset.metrics):
            return values[key]
        if key not in extra:
            extra[key] = _metric_value(cell, metric)
        return extra[key]

    md = ["## Claims\n", "The paper's claims for this experiment, checked against this run's numbers "
          f"({_direction_text(preset)}; `never` ranks last). **{C.TIE}**: nothing contradicts the claim, but a "
          "check rests on equal values (the named method only ties with another), so it does not hold outright.\n"]
    skipped = omitted
    by_setup: dict[str, dict[str, str]] = {}  # unexpanded claim -> {setup: verdict}
    for claim in claims:
        text = claim if isinstance(claim, str) else claim["text"]
        others = set(full_methods) - set(run_methods)
        if (C.claim_methods(claim) - set(run_methods)) or C.mentioned_methods(text, sorted(others)):
            skipped += 1
            continue
        verdict = C.evaluate_claim(claim, preset.metrics, ran, lookup, _fmt_stat,
                                   lambda mid, m, s: None if not_comparable(preset, s) else _paper(preset, mid, m, s))
        md.append(f"- **{verdict.status}** — {text}")
        md.extend(f"  - {line}" for line in verdict.evidence)
        if isinstance(claim, dict) and "setup" in claim:
            by_setup.setdefault(claim["claim"], {})[claim["setup"]] = verdict.status
    if skipped:
        md.append(f"\n{skipped} more claim(s) of the full preset concern methods or settings this run did not "
                  "include.")
    md.append("")
    setups = [u for u in preset.setups if any(u in v for v in by_setup.values())]
    if len(setups) > 1:
        md += ["### Claims under each setup\n",
               "Whether each claim holds under the reference code's setup and under ours (docs/method.md "
               "section 4b): a claim that holds under one only depends on the setup.\n",
               "| Claim | " + " | ".join(setups) + " |", "|---" * (len(setups) + 1) + "|"]
        md += [f"| {text} | " + " | ".join(v.get(u, "n/a") for u in setups) + " |" for text, v in by_setup.items()]
        md.append("")
    return md


def _setting_groups(methods: list[str], covered: dict[str, list[str]]) -> list[tuple[list[str], list[str]]]:
    """``[(settings, methods compared over exactly those settings)]`` for the IQM aggregate.

    Candidates: the settings every method ran, and each method's own settings; a group compares every
    method that ran all of its settings. Groups comparing a single method are dropped unless nothing
    else is left; the widest groups come first.
    """
    sets = []
    common = [s for s in next(iter(covered.values()), []) if all(s in covered[m] for m in covered)]
    for cand in [common, *covered.values()]:
        if cand and cand not in sets:
            sets.append(cand)
    groups = [(s, [m for m in methods if m in covered and all(x in covered[m] for x in s)]) for s in sets]
    multi = [g for g in groups if len(g[1]) > 1]
    groups = multi or groups[:1]
    return sorted(groups, key=lambda g: (-len(g[0]), -len(g[1])))


def _min_max_normalised(scores: dict[str, dict[str, np.ndarray]], settings: list[str], members: list[str]
                        ) -> dict[str, dict[str, np.ndarray]]:
    """``{method: {setting: per-seed values}}`` of ``members`` min-max normalised per setting over every run the
    column compares (all of ``members``' seeds in that setting): 0 = the lowest final value of those runs, 1 =
    the highest; a setting where they are all equal reads 0. NaN (a seed without the key) stays NaN."""
    out: dict[str, dict[str, np.ndarray]] = {m: {} for m in members}
    for setting in settings:
        pooled = np.concatenate([scores[m][setting] for m in members])
        finite = pooled[np.isfinite(pooled)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        span = high - low
        for m in members:
            values = scores[m][setting]
            out[m][setting] = (values - low) / span if span > 0 else np.where(np.isfinite(values), 0.0, np.nan)
    return out


def _aggregate(preset: Preset, cells: dict[tuple[str, str], Cell]) -> list[str]:
    metrics = [m for m in preset.metrics if m["type"] == M.FINAL] or [
        {"id": "final_error", "type": M.FINAL, "key": preset.data.get("curves", ["error"])[0]}]
    methods = [m["name"] for m in preset.methods]
    setting_order = [s["name"] for s in preset.settings]
    md = ["## Aggregate (IQM)\n",
          "Interquartile mean of the per-seed final values with a 95% stratified-bootstrap interval (2000 "
          "replicates resampling seeds within each setting). As rliable recommends, each column pools the same "
          "settings for every method it compares; a method that did not run all of a column's settings reads "
          "n/a there. A column over one setting is in the metric's own units. A column over several settings "
          "pools their scores only once each setting's are on one scale, as rliable normalises scores per task "
          "before aggregating: **min-max normalised per setting** over every run the column compares (0 = the "
          "lowest final value of any of its methods' seeds in that setting, 1 = the highest), so a setting at "
          "0.01% and one at 37% weigh alike; its numbers rank the methods, they are not in the metric's units.\n"]
    for metric in metrics:
        key = metric.get("key", "error")
        scores: dict[str, dict[str, np.ndarray]] = {}
        for (method, setting), cell in cells.items():
            if cell.rows:
                _, mat = cell.matrix(key)
                if mat.size:
                    scores.setdefault(method, {})[setting] = (M.final_value(mat, int(metric.get("window", 1)))
                                                              * float(metric.get("scale", 1.0)))
        covered = {m: [s for s in setting_order if s in scores[m]] for m in methods if m in scores}
        if not covered:
            continue
        groups = _setting_groups(methods, covered)
        heads = []
        pooled: list[dict[str, dict[str, np.ndarray]]] = []
        for settings, members in groups:
            heads.append(f"over {settings[0]}" if len(settings) == 1 else
                         f"over {len(settings)} settings" + ("" if len(settings) == len(setting_order) else
                                                             f" ({', '.join(settings)})") + ", min-max normalised")
            pooled.append(scores if len(settings) == 1 else _min_max_normalised(scores, settings, members))
        md.append(f"### IQM {_metric_label(metric)[0].lower() + _metric_label(metric)[1:]}\n")
        md.append("| Method | " + " | ".join(heads) + " |")
        md.append("|---|" + "---|" * len(groups))
        for method in methods:
            if method not in covered:
                continue
            texts = []
            for (settings, members), column in zip(groups, pooled, strict=True):
                if method not in members:
                    texts.append("n/a")
                    continue
                point, lo, hi = M.stratified_bootstrap_ci({s: column[method][s] for s in settings})
                texts.append(f"{point:.3g} [{lo:.3g}, {hi:.3g}]")
            md.append(f"| {method} | " + " | ".join(texts) + " |")
        md.append("")
    return md


def _diagnostics(preset: Preset, cells: dict[tuple[str, str], Cell], present: set[str]) -> list[str]:
    diag = [k for k in _diagnostic_keys() if k in present]
    if not diag:
        return []
    groups: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for setting in preset.settings:
        for method in preset.setting_methods(setting):
            cell = cells[(method["name"], setting["name"])]
            if cell.rows:
                keys = tuple(k for k in diag if k in cell.keys())
                if keys:
                    groups.setdefault(keys, []).append((method["name"], setting["name"]))
    md = ["## Diagnostics\n", "Seed mean at the first logged step → the last; one table per set of logged "
          "diagnostics, n/a where a method does not log one.\n"]
    for keys, members in groups.items():
        columns = [k for k in diag if k in keys or any(k in cells[m].keys() for m in members)]
        md.append("| Method | Setting | " + " | ".join(f"`{k}`" for k in columns) + " |")
        md.append("|---|---|" + "---|" * len(columns))
        for method, setting in members:
            parts = []
            for key in columns:
                _, mat = cells[(method, setting)].matrix(key)
                mean = M.seed_mean_curve(mat) if mat.size else np.array([])
                ok = mean[~np.isnan(mean)] if mean.size else mean
                parts.append(f"{ok[0]:.3g} → {ok[-1]:.3g}" if ok.size else "n/a")
            md.append(f"| {method} | {setting} | " + " | ".join(parts) + " |")
        md.append("")
    return md


def _own_algorithms(recorded: Any) -> list[str]:
    """One setup row per algorithm from outside tpo_gym (a manifest's ``algorithms``): where its class came
    from, ``module:qualname`` and the distribution that installed it."""
    rows = []
    for algo, source in (recorded or {}).items() if isinstance(recorded, dict) else ():
        path = source.get("path") if isinstance(source, dict) else None
        if not isinstance(path, str) or path.startswith("tpo_gym."):
            continue
        rows.append(f"| algorithm `{algo}` | `{path}` ({distribution_text(source)}) |")
    return rows


def _setup(preset: Preset, manifest: dict[str, Any], cells: dict[tuple[str, str], Cell], n_seeds: int,
           from_jsonl: int) -> list[str]:
    invocations = manifest.get("invocations", [])
    bench_env = invocations[-1] if invocations else {}
    md = ["## Setup\n", "| | |", "|---|---|"]
    for name, ver in (bench_env.get("versions") or package_versions()).items():
        md.append(f"| {name} | {ver} |")
    commits = sorted({i["git_commit"] for i in invocations if i.get("git_commit")})
    md.append(f"| git commit (runs) | {', '.join(f'`{c}`' for c in commits) or 'unknown'} |")
    md.append(f"| git commit (report) | `{git_commit()}` |")
    md.append(f"| command | `{manifest.get('command', '')}` |")
    md += _own_algorithms(manifest.get("algorithms"))
    md.append(f"| seeds | {n_seeds} (0..{n_seeds - 1}) |")
    md.append(f"| backend / workers | {manifest.get('backend')} / {manifest.get('workers')} |")
    if invocations:
        last = invocations[-1]
        md.append(f"| wall time (last invocation) | {last['wall_s']:.1f} s ({last['executed']} runs executed, "
                  f"{last['skipped']} resumed, {last['failed']} failed) |")
        md.append(f"| wall time (all invocations) | {sum(i['wall_s'] for i in invocations):.1f} s |")
    walls = [w for c in cells.values() for w in c.walls]
    n_ok = sum(len(c.rows) for c in cells.values())
    if walls:
        md.append(f"| compute time (sum over runs) | {sum(walls):.1f} s"
                  + (f" ({n_ok - len(walls)} runs without a stored time)" if len(walls) < n_ok else "") + " |")
    elif n_ok:
        md.append("| compute time (sum over runs) | not stored |")
    if from_jsonl:
        md.append(f"| run source | {from_jsonl} runs rebuilt from `results.jsonl` (no per-run record in `runs/`) |")
    md.append("")
    return md
