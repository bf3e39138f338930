"""Check the paper's claims of a preset against the numbers of one benchmark run.

A claim (``paper_claims`` of a preset) is ``{"text", "checks": [...]}``; each check compares this run's
values of one metric across methods (or settings). Lower is better (errors, steps to a threshold,
misalignment) unless the metric says ``"better": "higher"`` (scores, accuracies); a threshold never
reached ranks as infinitely many steps. ``best`` / ``worst`` / ``order`` / ``worst_setting`` follow the
metric's direction; ``below`` / ``above`` compare raw values.

Tests (``check["test"]``):

``best`` / ``worst``
    the named ``method`` (or ``methods``) have the best / worst values among ``among`` (default:
    every method of the setting that has data); a named method whose value equals another's
    (and beats the rest) is a tie: the check reads ``tie``, and the evidence names the methods tied
    with the named one.
``order``
    the named ``methods`` are in order from best to worst (two equal neighbours: a tie).
``below`` / ``above``
    every named method's value is strictly below / above ``value``.
``never``
    no named method reaches the threshold of a ``steps_to_threshold`` metric.
``paper``
    every named method's value is within 2 s.e. of the paper's number for that cell.
``worst_setting``
    for the one named method, ``setting`` has the highest value among ``settings`` (shared with
    another setting: a tie).

A claim holds when every check holds; it is a ``tie`` when nothing fails and some check rests on
equal values (a tie), so a claim is never said to hold on a tie.

A check runs over ``settings`` (default: every setting of the run in which the named methods ran).
The metric is ``metric`` (a preset metric id, or an inline ``{"type", "key", ...}`` where type
``ratio`` is the seed-mean curve's last value over its first) or ``key`` (the final value of a
logged key).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpo_gym.evaluation import metrics as M

__all__ = ["HOLDS", "FAILS", "PARTLY", "TIE", "UNTESTED", "Stat", "Verdict", "check_metric", "claim_methods",
           "evaluate_claim", "higher_is_better", "mentioned_methods", "metric_label"]

#: A claim's status: every check of it holds on this run's numbers.
HOLDS = "holds"
#: A claim's status: a check of it fails.
FAILS = "does not hold"
#: A claim's status: the checks that could be made hold, others could not be made (missing methods or settings).
PARTLY = "holds where tested"
#: A claim's status: no check of it could be made on this run.
UNTESTED = "not tested here"
#: A claim's status: no check fails, but one is decided by equal values (the named method ties with
#: another for best / worst, two methods of an order are equal, or two settings share the worst value).
TIE = "tie"


@dataclass(frozen=True)
class Stat:
    """One cell's value: ``value`` ``None`` = threshold never reached, ``NaN`` = no data; ``se`` its s.e."""

    value: float | None
    se: float = math.nan

    @property
    def has_data(self) -> bool:
        return self.value is None or math.isfinite(self.value)

    @property
    def rank(self) -> float:
        """Sort key: never reached ranks last."""
        return math.inf if self.value is None else float(self.value)


@dataclass
class Verdict:
    """The outcome of one claim: a status and the numbers that decided it."""

    status: str
    evidence: list[str] = field(default_factory=list)


#: ``lookup(metric, method, setting)`` -> the cell's :class:`Stat`, or ``None`` when the cell was not run.
Lookup = Callable[[dict[str, Any], str, str], "Stat | None"]
#: ``fmt(stat, metric)`` -> the cell as text (``"49 ± 2"``).
Formatter = Callable[[Stat, dict[str, Any]], str]


def metric_label(metric: Mapping[str, Any]) -> str:
    """``Steps to error < 1%``, ``Final test error (%)``, ``Final misalignment``, ``Grad norm last / first``."""
    key = metric.get("key", "error")
    words = key.replace("_", " ")
    if metric["type"] == M.STEPS_TO_THRESHOLD:
        thr = float(metric["threshold"])
        bound = f"{thr * 100:g}%" if key in ("error", "test_error") and thr < 1 else f"{thr:g}"
        return f"Steps to {words} < {bound}"
    if metric["type"] == M.RATIO:
        return f"{words[0].upper() + words[1:]} last / first"
    unit = f" ({metric['unit']})" if metric.get("unit") else ""
    window = int(metric.get("window", 1))
    span = f", mean of the last {window} steps" if window > 1 else ""
    return f"{'Initial' if metric['type'] == M.INITIAL else 'Final'} {words}{unit}{span}"


def higher_is_better(metric: Mapping[str, Any]) -> bool:
    """Whether larger values of ``metric`` are better (``"better": "higher"``; default lower)."""
    return metric.get("better", "lower") == "higher"


def check_metric(check: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The metric a check compares: a preset metric by id, an inline metric, or the final value of ``key``."""
    if "key" in check:
        return {"id": f"final {check['key']}", "type": M.FINAL, "key": check["key"]}
    metric = check["metric"]
    if isinstance(metric, str):
        return dict(next(m for m in metrics if m["id"] == metric))
    out = dict(metric)
    out.setdefault("key", "error")
    out.setdefault("id", f"{out['type']} {out['key']}")
    return out


def claim_methods(claim: Mapping[str, Any] | str) -> set[str]:
    """Every method a claim's checks name (``method``, ``methods``, ``among``)."""
    if isinstance(claim, str):
        return set()
    names: set[str] = set()
    for check in claim.get("checks", []):
        names.update([check["method"]] if "method" in check else [])
        names.update(check.get("methods", []))
        names.update(check.get("among", []))
    return names


def mentioned_methods(text: str, names: Sequence[str]) -> set[str]:
    """The method names of ``names`` that ``text`` mentions as whole words (longest names first,
    so ``Group PG`` is not also read as ``PG``)."""
    found = set()
    for name in sorted(names, key=len, reverse=True):
        pattern = r"(?<![\w-])" + re.escape(name) + r"(?![\w-])"
        if re.search(pattern, text):
            found.add(name)
            text = re.sub(pattern, " ", text)
    return found


def _named(check: Mapping[str, Any]) -> list[str]:
    return ([check["method"]] if "method" in check else []) + list(check.get("methods", []))


def _run_check(check: Mapping[str, Any], metric: dict[str, Any], ran: Mapping[str, Sequence[str]],
               lookup: Lookup, fmt: Formatter, paper: Callable[[str, str, str], Any]) -> tuple[str, list[str]]:
    """``(status, evidence lines)`` of one check; status HOLDS, TIE, FAILS, PARTLY or UNTESTED."""
    test = check["test"]
    named = _named(check)
    wanted = list(check.get("settings", [])) or [s for s in ran if all(m in ran[s] for m in named)]
    if test == "worst_setting":
        wanted = list(dict.fromkeys([*wanted, check["setting"]]))
    settings = [s for s in wanted if s in ran and all(m in ran[s] for m in named)]
    missing = [s for s in wanted if s not in settings]
    if not settings:
        where = f" (needs {', '.join(missing)})" if missing else ""
        return UNTESTED, [f"not run here{where}"]

    def cell(method: str, setting: str) -> Stat | None:
        stat = lookup(metric, method, setting)
        return stat if stat is not None and stat.has_data else None

    def show(method: str, stat: Stat) -> str:
        return f"{method} {fmt(stat, metric)}"

    sign = -1.0 if higher_is_better(metric) else 1.0

    def rank(stat: Stat) -> float:  # smaller is better, whatever the metric's direction
        return sign * stat.rank

    if test == "worst_setting":
        (method,) = named
        stats = {s: cell(method, s) for s in settings}
        if any(v is None for v in stats.values()) or check["setting"] not in stats:
            return UNTESTED, [f"no data for {method} in every setting"]
        worst = max(rank(v) for v in stats.values())
        edge = rank(stats[check["setting"]])
        ok = edge >= worst
        ties = [s for s, v in stats.items() if s != check["setting"] and rank(v) == edge]
        line = f"{method}: " + ", ".join(f"{s} {fmt(v, metric)}" for s, v in stats.items())
        if ok and ties:
            return TIE, [line + f" (tied with {', '.join(ties)})"]
        return (HOLDS if ok else FAILS), [line]

    results, lines = [], []
    for setting in settings:
        if test in ("best", "worst"):
            pool = list(check.get("among", [])) or list(ran[setting])
            pool = list(dict.fromkeys([*named, *[m for m in pool if m in ran[setting]]]))
        else:
            pool = named
        stats = {m: cell(m, setting) for m in pool}
        absent = [m for m in named if stats.get(m) is None]
        if absent:
            lines.append(f"{setting}: no data for {', '.join(absent)}")
            results.append(UNTESTED)
            continue
        stats = {m: v for m, v in stats.items() if v is not None}
        shown = ", ".join(show(m, v) for m, v in sorted(stats.items(), key=lambda kv: rank(kv[1])))
        others = [rank(v) for m, v in stats.items() if m not in named]
        ok: bool | None
        if test == "best":
            ok = None if not others else max(rank(stats[m]) for m in named) <= min(others)
        elif test == "worst":
            ok = None if not others else min(rank(stats[m]) for m in named) >= max(others)
        elif test == "order":
            ranks = [rank(stats[m]) for m in named]
            ok = all(a <= b for a, b in zip(ranks, ranks[1:], strict=False))
            shown = (" ≥ " if sign < 0 else " ≤ ").join(show(m, stats[m]) for m in named)
            equal = [f"{a} = {b}" for a, b, x, y in zip(named, named[1:], ranks, ranks[1:], strict=False) if x == y]
        elif test == "below":
            ok = all(stats[m].rank < float(check["value"]) for m in named)
            shown += f" (bound: below {check['value']:g})"
        elif test == "above":
            ok = all(stats[m].rank > float(check["value"]) for m in named)
            shown += f" (bound: above {check['value']:g})"
        elif test == "never":
            ok = all(stats[m].value is None for m in named)
        else:  # paper
            agree = []
            for m in named:
                number = paper(metric["id"], m, setting)
                agree.append(None if number is None else M.paper_agrees(
                    stats[m].value, stats[m].se, number, metric.get("paper_dash", "never")))
            ok = None if any(a is None for a in agree) else all(agree)
            shown = ", ".join(f"{show(m, stats[m])} (paper {paper(metric['id'], m, setting)})" for m in named)
        if ok is None:
            lines.append(f"{setting}: nothing to compare with ({shown or 'no data'})")
            results.append(UNTESTED)
            continue
        tied = ""
        if ok and test in ("best", "worst"):
            edge = (max if test == "best" else min)(rank(stats[m]) for m in named)
            ties = [m for m, v in stats.items() if m not in named and rank(v) == edge]
            tied = f" (tied with {', '.join(ties)})" if ties else ""
        elif ok and test == "order" and equal:
            tied = f" (tied: {', '.join(equal)})"
        results.append((TIE if tied else HOLDS) if ok else FAILS)
        lines.append(f"{setting}: {shown}" + tied + ("" if ok else " ✗"))
    if missing:
        lines.append(f"not run here: {', '.join(missing)}")
        results.append(UNTESTED)
    return _combine(results), lines


def _combine(statuses: Sequence[str]) -> str:
    """The status of several results (a check's settings, a claim's checks): any failure fails; else a tie
    anywhere is a tie (a claim never holds on equal values); else it holds if all hold, holds where tested
    if some do, and is not tested if none could be made."""
    if FAILS in statuses:
        return FAILS
    if TIE in statuses:
        return TIE
    if all(s == HOLDS for s in statuses):
        return HOLDS
    return PARTLY if any(s in (HOLDS, PARTLY) for s in statuses) else UNTESTED


def evaluate_claim(claim: Mapping[str, Any] | str, metrics: Sequence[Mapping[str, Any]],
                   ran: Mapping[str, Sequence[str]], lookup: Lookup, fmt: Formatter,
                   paper: Callable[[str, str, str], Any] = lambda *_: None) -> Verdict:
    """Check one claim against a run.

    :param ran: ``{setting: [methods run there]}``, in preset order.
    :param lookup: the value of a cell (see :data:`Lookup`).
    :param fmt: how a value is written in the evidence.
    :param paper: ``paper(metric_id, method, setting)``: the paper's number of a cell, or ``None``.
    """
    if isinstance(claim, str) or not claim.get("checks"):
        return Verdict(UNTESTED, ["no check defined for this claim"])
    statuses, evidence = [], []
    for check in claim["checks"]:
        metric = check_metric(check, metrics)
        status, lines = _run_check(check, metric, ran, lookup, fmt, paper)
        statuses.append(status)
        label = _describe(check, metric)
        evidence.extend(f"{label}: {line}" for line in lines)
    return Verdict(_combine(statuses), evidence)


def _describe(check: Mapping[str, Any], metric: Mapping[str, Any]) -> str:
    """A short label of what a check compares, e.g. ``steps to error < 1%, lowest (TPO)``."""
    label = metric_label(metric)
    what = label[0].lower() + label[1:]
    named = ", ".join(_named(check))
    best, worst = ("highest", "lowest") if higher_is_better(metric) else ("lowest", "highest")
    verb = {"best": best, "worst": worst, "order": "in this order", "below": "below", "above": "above",
            "never": "never reached", "paper": "as in the paper", "worst_setting": f"{worst} at {check.get('setting')}"}
    return f"{what}, {verb[check['test']]} ({named})"
