"""The budget of a report: what each method used (env steps, reward queries) and which cells ran at another
budget than the paper's numbers (``tpo-gym bench --episodes/--steps``: :mod:`tpo_gym.evaluation.derived`)."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from tpo_gym.evaluation.derived import paper_budget
from tpo_gym.evaluation.presets import Preset
from tpo_gym.evaluation.report.values import Cell

#: The row keys that count env steps: an SB3 method's and a script's ``env_steps``, a built-in agent's
#: ``num_timesteps``.
_ENV_KEYS = ("env_steps", "num_timesteps")


def not_comparable(preset: Preset, setting: str) -> str | None:
    """``"budget N of M episodes, not comparable"`` when ``setting`` ran at another budget than the paper's
    numbers (``None``: the same budget)."""
    gap = paper_budget(preset, setting)
    return None if gap is None else f"budget {gap[0]} of {gap[1]} {gap[2]}, not comparable"


def _last(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> float | None:
    """The last logged value of the first of ``keys`` a row of ``rows`` holds (a cumulative count)."""
    for row in reversed(rows):
        for key in keys:
            value = row.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value):
                return float(value)
    return None


def _queries_per_step(method: dict[str, Any], setting: dict[str, Any]) -> int | None:
    """Rewards a built-in agent asks for per env step where that is well defined (token tasks): K for a
    token-level group method (K candidates scored at every visited state), 1 for a sequence-level group method
    and a single-sample one; ``None`` otherwise (MNIST, bandits, language models, one-hot candidates, a class
    not found)."""
    from tpo_gym.agents.common.registry import AlgorithmReferenceError, is_sb3_algorithm, method_spec, resolve_algorithm

    if setting["kind"] != "token" or method.get("imported"):
        return None
    try:
        cls = resolve_algorithm(method["algo"])
    except AlgorithmReferenceError:
        return None
    if is_sb3_algorithm(cls):
        return None
    kwargs = dict(setting.get("params", {}).get("agent_kwargs", {}), **method.get("kwargs", {}))
    sampling = method_spec(cls).sampling
    if sampling == "single":
        return 1
    if sampling != "group" or kwargs.get("candidates", "group") == "single":
        return None
    if kwargs.get("level", "auto") == "sequence":
        return 1
    default = inspect.signature(cls).parameters.get("group_size")
    k = kwargs.get("group_size", default.default if default is not None else None)
    return int(k) if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else None


def budget_used(preset: Preset, cells: dict[tuple[str, str], Cell]) -> dict[tuple[str, str], tuple[Any, Any]]:
    """``{(method, setting): (env steps, reward queries)}``: the median over seeds of each run's final cumulative
    count (``None``: not logged or not defined). A run's counts are its rows' ``env_steps`` / ``num_timesteps``
    and ``reward_queries``, else its record's ``env_interactions`` / ``reward_queries`` (``tpo-gym import``);
    a built-in agent's reward queries are its env steps times :func:`_queries_per_step`."""
    out = {}
    for setting in preset.settings:
        for method in preset.setting_methods(setting):
            cell = cells.get((method["name"], setting["name"]))
            if cell is None or not cell.rows:
                continue
            per = _queries_per_step(method, setting)
            env, queries = [], []
            for i, rows in enumerate(cell.rows):
                counts = cell.counts[i] if i < len(cell.counts) else {}
                steps = _last(rows, _ENV_KEYS)
                steps = counts.get("env_interactions") if steps is None else steps
                asked = _last(rows, ("reward_queries",))
                asked = counts.get("reward_queries") if asked is None else asked
                if asked is None and steps is not None and per is not None:
                    asked = steps * per
                env.append(steps)
                queries.append(asked)
            out[(method["name"], setting["name"])] = tuple(
                float(np.median(v)) if v and all(x is not None for x in v) else None for v in (env, queries))
    return out


def _count(value: Any) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def budget_table(preset: Preset, used: dict[tuple[str, str], tuple[Any, Any]]) -> list[str]:
    """The report's "Budget used" section: env steps / reward queries per method x setting."""
    if not used:
        return []
    settings = [s["name"] for s in preset.settings]
    md = ["## Budget used\n", "| Method | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
    for method in [m["name"] for m in preset.methods]:
        if not any((method, s) in used for s in settings):
            continue
        texts = [f"{_count(used[(method, s)][0])} / {_count(used[(method, s)][1])}" if (method, s) in used
                 else "n/a" for s in settings]
        md.append(f"| {method} | " + " | ".join(texts) + " |")
    md += ["", "Cells: **env steps / reward queries**, the median over seeds of each run's final count. Env steps: "
           "the actions taken in the environment (a built-in agent's `num_timesteps`; an SB3 method's or a "
           "script's `env_steps`). Reward queries: rewards asked for; a token-level group method scores K "
           "candidates at every visited state (env steps × K), sequence-level and single-sample methods one per env "
           "step. **n/a**: not logged, or not defined from the records (MNIST, bandits, language models, one-hot "
           "candidates, a class not importable here).\n"]
    return md
