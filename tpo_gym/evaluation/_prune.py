"""What a preset no longer has, taken out of its paper numbers, claims and tables (:func:`prune_to_present`; re-exported
by :mod:`tpo_gym.evaluation.derived`). Below :mod:`tpo_gym.evaluation.presets`, which calls it on every subset."""

from __future__ import annotations

from typing import Any

__all__ = ["prune_to_present"]


def _claim_cut(claim: Any, settings: set[str], methods: set[str], metrics: set[str] | None = None
               ) -> tuple[Any, str]:
    """``(claim, why)``: the claim cut to ``settings``, or ``None`` when a check names a method outside ``methods``
    (or a metric id outside ``metrics``, when given) or needs a setting left out; ``why`` says what was cut
    (``""``: nothing)."""
    if isinstance(claim, str):
        return claim, ""
    checks, cut = [], []
    for check in claim.get("checks", []):
        named = ([check["method"]] if "method" in check else []) + list(check.get("methods", [])) \
            + list(check.get("among", []))
        gone = [n for n in named if n not in methods]
        if gone:
            return None, f"it names method {gone[0]!r}"
        metric = check.get("metric")
        if metrics is not None and isinstance(metric, str) and metric not in metrics:
            return None, f"it names metric {metric!r}"
        check = dict(check)
        if "settings" in check:
            cut += [x for x in check["settings"] if x not in settings]
            check["settings"] = [x for x in check["settings"] if x in settings]
            if not check["settings"]:
                return None, "none of the settings it checks is left"
        if "setting" in check and check["setting"] not in settings:
            return None, f"it needs setting {check['setting']!r}"
        checks.append(check)
    why = f"now checked without settings {sorted(set(cut))}" if cut else ""
    return dict(claim, checks=checks), why


def prune_to_present(data: dict[str, Any], metrics: bool = False) -> tuple[int, list[str]]:
    """Cut everything of ``data`` (a parsed preset, changed in place) that names a method, setting or (with
    ``metrics``) metric id it no longer has: the methods lists and method changes of settings and setups, settings
    left with no method, the paper numbers, the tables and the claims (a claim goes when it names a method or
    needs a setting left out; a check over several settings keeps the rest).

    What :meth:`~tpo_gym.evaluation.presets.Preset.subset` cuts after its selection, and
    :func:`~tpo_gym.evaluation.presets.load_preset` for a preset file derived from another (an exported preset
    with a setting or method removed).

    :return: ``(claims dropped, one line per thing cut)``.
    """
    said: list[str] = []
    keep_m = {m["name"] for m in data["methods"]}
    keep_metric = {m["id"] for m in data["metrics"]} if metrics else None
    for s in data["settings"]:
        if s.get("methods") is not None:
            gone = [m for m in s["methods"] if m not in keep_m]
            s["methods"] = [m for m in s["methods"] if m in keep_m]
            said += [f"setting {s['name']!r}: dropped method {m!r} from its methods" for m in gone]
        if s.get("method_overrides"):  # a setup's changes to methods left out go with them
            s["method_overrides"] = {m: o for m, o in s["method_overrides"].items() if m in keep_m}
    for u in data.get("setups", []) or []:
        if u.get("methods"):
            gone = [m for m in u["methods"] if m not in keep_m]
            u["methods"] = {m: o for m, o in u["methods"].items() if m in keep_m}
            said += [f"setup {u['name']!r}: dropped its change to method {m!r}" for m in gone]
    said += [f"setting {s['name']!r}: dropped (none of its methods is left)" for s in data["settings"]
             if s.get("methods") is not None and not s["methods"]]
    data["settings"] = [s for s in data["settings"] if s.get("methods") is None or s["methods"]]
    keep_s = {s["name"] for s in data["settings"]}
    paper: dict[str, Any] = {}
    for mid, rows in data.get("paper", {}).items():
        if keep_metric is not None and mid not in keep_metric:
            said.append(f"paper: dropped the numbers of metric {mid!r} (not among the metrics)")
            continue
        paper[mid] = {}
        for m, cols in rows.items():
            if m not in keep_m:
                said.append(f"paper: dropped {len(cols)} number(s) of method {m!r} for {mid!r}")
                continue
            gone = [x for x in cols if x not in keep_s]
            if gone:
                said.append(f"paper: dropped {mid!r} of method {m!r} in settings {gone}")
            paper[mid][m] = {x: v for x, v in cols.items() if x in keep_s}
    if "paper" in data:
        data["paper"] = paper
    if "tables" in data:
        tables = []
        for t in data["tables"] or []:
            cut = dict(t, settings=[s for s in t.get("settings", []) if s in keep_s],
                       methods=[m for m in t.get("methods", []) if m in keep_m])
            gone = [x for k in ("settings", "methods") for x in t.get(k, []) if x not in cut[k]]
            if cut["settings"]:
                tables.append(cut)
                said += [f"table {t['title']!r}: dropped {x!r}" for x in gone]
            else:
                said.append(f"table {t['title']!r}: dropped (none of its settings is left)")
        data["tables"] = tables
    kept, omitted = [], 0
    for claim in data.get("paper_claims", []):
        cut, why = _claim_cut(claim, keep_s, keep_m, keep_metric)
        if why:
            text = claim["text"] if isinstance(claim, dict) else claim
            said.append(f"paper_claims: {'dropped' if cut is None else 'changed'} {text!r:.80}: {why}")
        if cut is None:
            omitted += 1
        else:
            kept.append(cut)
    if "paper_claims" in data:
        data["paper_claims"] = kept
    return omitted, said
