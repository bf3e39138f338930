"""The check of a parsed preset (:func:`validate_preset`), its limits and its error (:class:`PresetError`).
Re-exported by :mod:`tpo_gym.evaluation.presets`, which loads, expands and selects presets."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from tpo_gym.agents.common.registry import method_spec
from tpo_gym.evaluation.experiments import RUN_KINDS, methods_for_kind
from tpo_gym.evaluation.metrics import FINAL, STEPS_TO_THRESHOLD, summary_column, unit_suffix
from tpo_gym.evaluation.metrics import METRIC_TYPES as _INLINE_METRIC_TYPES
from tpo_gym.evaluation.metrics import TABLE_METRIC_TYPES as _METRIC_TYPES

#: The most runs one preset selection may expand into (method x setting x seed): the largest paper preset
#: has under 1,000; a million runs' specs alone take gigabytes, so a larger count is refused before any is made.
MAX_RUNS = 100_000

#: The tests a claim check may name (evaluated by :mod:`tpo_gym.evaluation.claims`).
CHECK_TESTS = ("best", "worst", "order", "below", "above", "never", "paper", "worst_setting")

_PAPER_STR = re.compile(r"^(-|[<>]\d+(\.\d+)?)$")
_NAME = re.compile(r"^[A-Za-z0-9_.=+\-() ]+$")
#: The longest preset name (it names the default output directory ``runs/<name>``).
MAX_NAME_LENGTH = 100


class PresetError(ValueError):
    """A preset name that does not exist, or a preset file that does not validate."""


def _fail(source: str, msg: str) -> None:
    raise PresetError(f"{source}: {msg}")


def _check_paper_value(source: str, where: str, value: Any) -> None:
    if value is None or isinstance(value, bool):
        if value is None:
            return
        _fail(source, f"paper value at {where} must be a number, '-', '>x', '<x' or null; got {value!r}")
    if isinstance(value, int | float):
        if value != value or value < 0:
            _fail(source, f"paper value at {where} must be a finite number >= 0; got {value!r}")
        return
    if not isinstance(value, str) or not _PAPER_STR.match(value):
        _fail(source, f"paper value at {where} must be a number, '-', '>x', '<x' or null; got {value!r}")


def validate_preset(data: Any, source: str = "<preset>") -> None:
    """Check a parsed preset: required fields, known kinds and method names, well-formed paper numbers.

    :raises PresetError: the first problem found, naming the field.
    """
    if not isinstance(data, dict):
        _fail(source, "a preset must be a JSON object")
    for key, typ in (("name", str), ("description", str), ("paper_ref", str), ("seeds", int),
                     ("settings", list), ("methods", list), ("metrics", list)):
        if key not in data:
            _fail(source, f"missing field {key!r}")
        if not isinstance(data[key], typ) or isinstance(data[key], bool):
            _fail(source, f"field {key!r} must be {typ.__name__}")
    _check_preset_name(source, data["name"])
    if "\n" in data["description"] or not data["description"].strip():
        _fail(source, "description must be one non-empty line")
    for key in ("description", "paper_ref"):
        if any(unicodedata.category(c) == "Cc" for c in data[key]):
            _fail(source, f"{key} must be printable text, without control characters; got {data[key]!r:.80}")
    if not 1 <= data["seeds"] <= MAX_RUNS:
        _fail(source, f"seeds must be >= 1 and <= {MAX_RUNS}, got {data['seeds']}")
    if not data["settings"] or not data["methods"] or not data["metrics"]:
        _fail(source, "settings, methods and metrics must be non-empty")

    method_names: list[str] = []
    for m in data["methods"]:
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not isinstance(m.get("algo"), str):
            _fail(source, f"each method needs string 'name' and 'algo'; got {m!r}")
        if not _NAME.match(m["name"]):
            _fail(source, f"method name {m['name']!r} has unsupported characters")
        if not isinstance(m.get("kwargs", {}), dict):
            _fail(source, f"method {m['name']!r}: kwargs must be an object")
        method_names.append(m["name"])
    if len(set(method_names)) != len(method_names):
        _fail(source, f"duplicate method names in {method_names}")

    setups = data.get("setups", [])
    if not isinstance(setups, list):
        _fail(source, "setups must be a list of {\"name\", \"description\"?, \"params\"?, \"methods\"?}")
    setup_names: list[str] = []
    for u in setups:
        if not isinstance(u, dict) or not isinstance(u.get("name"), str) or not _NAME.match(u["name"]):
            _fail(source, f"each setup needs a 'name' of letters, digits and _.=+-() ; got {u!r}")
        unknown = sorted(set(u) - {"name", "description", "params", "methods"})
        if unknown:
            _fail(source, f"setup {u['name']!r}: unknown fields {unknown}; allowed: name, description, params, methods")
        if not isinstance(u.get("description", ""), str) or not isinstance(u.get("params", {}), dict):
            _fail(source, f"setup {u['name']!r}: description must be a string and params an object")
        _check_overrides(source, f"setup {u['name']!r}", u.get("methods", {}), method_names)
        setup_names.append(u["name"])
    if len(set(setup_names)) != len(setup_names):
        _fail(source, f"duplicate setup names in {setup_names}")
    overrides_of = {u["name"]: u.get("methods", {}) for u in setups}

    setting_names: list[str] = []
    classes: dict[str, type] = {}
    for s in data["settings"]:
        if not isinstance(s, dict) or not isinstance(s.get("name"), str):
            _fail(source, f"each setting needs a string 'name'; got {s!r}")
        if not _NAME.match(s["name"]):
            _fail(source, f"setting name {s['name']!r} has unsupported characters")
        kind = s.get("kind")
        if kind not in RUN_KINDS:
            _fail(source, f"setting {s['name']!r}: unknown kind {kind!r}; known: {', '.join(RUN_KINDS)}")
        if not isinstance(s.get("params", {}), dict):
            _fail(source, f"setting {s['name']!r}: params must be an object")
        subset = s.get("methods")
        if subset is not None:
            unknown = [n for n in subset if n not in method_names]
            if unknown:
                _fail(source, f"setting {s['name']!r} lists unknown methods {unknown}")
        if "setup" in s:
            if s["setup"] not in setup_names:
                _fail(source, f"setting {s['name']!r} names unknown setup {s['setup']!r}; setups: {setup_names}")
            _check_overrides(source, f"setting {s['name']!r}", s.get("method_overrides", {}), method_names)
            variants = [s.get("method_overrides", {})]
        else:  # unexpanded: the setting runs under every setup
            variants = list(overrides_of.values()) or [{}]
        for overrides in variants:
            for m in data["methods"]:
                algo = overrides.get(m["name"], {}).get("algo", m["algo"])
                if (subset is None or m["name"] in subset) and \
                        kind not in method_spec(_algo_class(source, m["name"], algo, classes)).run_kinds:
                    _fail(source, f"method {m['name']!r} (algo {algo!r}) cannot run in setting {s['name']!r} "
                                  f"of kind {kind!r}; known algos there: {', '.join(methods_for_kind(kind))}")
        setting_names.append(s["name"])
    if len(set(setting_names)) != len(setting_names):
        _fail(source, f"duplicate setting names in {setting_names}")

    metric_ids: list[str] = []
    for mt in data["metrics"]:
        if not isinstance(mt, dict) or not isinstance(mt.get("id"), str) or mt.get("type") not in _METRIC_TYPES:
            _fail(source, f"each metric needs a string 'id' and a type in {_METRIC_TYPES}; got {mt!r}")
        if not isinstance(mt.get("key", "error"), str):
            _fail(source, f"metric {mt['id']!r}: key must be a string")
        if mt["type"] == STEPS_TO_THRESHOLD and not isinstance(mt.get("threshold"), int | float):
            _fail(source, f"metric {mt['id']!r}: steps_to_threshold needs a numeric threshold")
        if mt.get("better", "lower") not in ("lower", "higher"):
            _fail(source, f"metric {mt['id']!r}: better must be 'lower' or 'higher', got {mt.get('better')!r}")
        window = mt.get("window", 1)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1 or (
                window > 1 and mt["type"] != FINAL):
            _fail(source, f"metric {mt['id']!r}: window must be an integer >= 1, and only final metrics take one; "
                          f"got {window!r}")
        dash = mt.get("paper_dash", "never")
        if dash != "never" and not (isinstance(dash, str) and _PAPER_STR.match(dash) and dash != "-"):
            _fail(source, f"metric {mt['id']!r}: paper_dash must be 'never' or a bound like '>95'")
        unit = mt.get("unit")
        if unit is not None and not (isinstance(unit, str) and unit_suffix(unit)):
            _fail(source, f"metric {mt['id']!r}: unit must be a string with a letter, a digit or '%' (it names "
                          f"the summary.csv column, e.g. '%' -> {mt['id']}_pct); got {unit!r}")
        metric_ids.append(mt["id"])
    if len(set(metric_ids)) != len(metric_ids):
        _fail(source, f"duplicate metric ids in {metric_ids}")
    columns = [summary_column(mt) for mt in data["metrics"]]
    if len(set(columns)) != len(columns):
        _fail(source, f"metrics {metric_ids} give summary.csv columns {columns}: two share a name (a unit adds "
                      "its suffix to the id, '%' -> _pct); rename one")

    paper = data.get("paper", {})
    if not isinstance(paper, dict):
        _fail(source, "paper must be an object {metric: {method: {setting: value}}}")
    for mid, rows in paper.items():
        if mid not in metric_ids:
            _fail(source, f"paper numbers for unknown metric {mid!r}")
        if not isinstance(rows, dict):
            _fail(source, f"paper[{mid!r}] must be an object")
        for meth, cols in rows.items():
            if meth not in method_names:
                _fail(source, f"paper[{mid!r}] names unknown method {meth!r}")
            if not isinstance(cols, dict):
                _fail(source, f"paper[{mid!r}][{meth!r}] must be an object")
            for sett, value in cols.items():
                if sett not in setting_names:
                    _fail(source, f"paper[{mid!r}][{meth!r}] names unknown setting {sett!r}")
                _check_paper_value(source, f"paper[{mid!r}][{meth!r}][{sett!r}]", value)

    for t in data.get("tables", []) or []:
        if not isinstance(t, dict) or not isinstance(t.get("title"), str):
            _fail(source, f"each table needs a title; got {t!r}")
        for sett in t.get("settings", []):
            if sett not in setting_names:
                _fail(source, f"table {t['title']!r} names unknown setting {sett!r}")
        for meth in t.get("methods", []):
            if meth not in method_names:
                _fail(source, f"table {t['title']!r} names unknown method {meth!r}")
    curves = data.get("curves", ["error"])
    if not isinstance(curves, list) or not all(isinstance(c, str) for c in curves):
        _fail(source, "curves must be a list of logged keys")
    notes = data.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        _fail(source, "notes must be a list of strings")
    claims = data.get("paper_claims", [])
    if not isinstance(claims, list):
        _fail(source, "paper_claims must be a list")
    for i, claim in enumerate(claims):
        if isinstance(claim, str):
            continue
        if not isinstance(claim, dict) or not isinstance(claim.get("text"), str) or not claim["text"].strip():
            _fail(source, f"paper_claims[{i}] must be a string or an object with a non-empty 'text'")
        checks = claim.get("checks", [])
        if not isinstance(checks, list):
            _fail(source, f"paper_claims[{i}].checks must be a list")
        for j, check in enumerate(checks):
            _validate_check(source, f"paper_claims[{i}].checks[{j}]", check, method_names, setting_names,
                            metric_ids)


def _algo_class(source: str, method: str, algo: str, classes: dict[str, type]) -> type:
    """The agent class ``algo`` names (:func:`~tpo_gym.agents.common.registry.resolve_algorithm`: a registered name,
    ``module:Class``, a name in ``$TPO_GYM_ALGORITHMS`` or an installed package's entry point), resolved once
    per preset (``classes`` keeps them).

    :raises PresetError: one line naming the method, the reference and how to make it importable.
    """
    from tpo_gym.agents.common.registry import AlgorithmReferenceError, resolve_algorithm

    if algo not in classes:
        try:
            classes[algo] = resolve_algorithm(algo)
        except AlgorithmReferenceError as exc:
            raise PresetError(f"{source}: method {method!r}: {exc}") from exc
    return classes[algo]


def _check_preset_name(source: str, name: str) -> None:
    """A preset name: letters, digits and ``_.=+-()`` and inner spaces, not starting with ``.``, at most
    :data:`MAX_NAME_LENGTH` characters (it names the default output directory ``runs/<name>``, so never a path
    such as ``../x`` or ``/``)."""
    if not (_NAME.match(name) and not name.startswith(".") and name.strip() == name
            and len(name) <= MAX_NAME_LENGTH):
        _fail(source, f"preset name {name!r:.120} is not allowed: use letters, digits and _.=+-() (spaces inside), "
                      f"not starting with '.', at most {MAX_NAME_LENGTH} characters")


def _check_overrides(source: str, where: str, overrides: Any, method_names: list[str]) -> None:
    """A setup's ``methods``: ``{method name: {"algo"?: str, "kwargs"?: object}}``."""
    if not isinstance(overrides, dict):
        _fail(source, f"{where}: methods must be an object {{method name: {{\"algo\"?, \"kwargs\"?}}}}")
    for name, o in overrides.items():
        if name not in method_names:
            _fail(source, f"{where}: methods names unknown method {name!r}; methods: {', '.join(method_names)}")
        if not isinstance(o, dict) or set(o) - {"algo", "kwargs"} or not isinstance(o.get("algo", ""), str) \
                or not isinstance(o.get("kwargs", {}), dict):
            _fail(source, f"{where}: methods[{name!r}] must be {{\"algo\"?: str, \"kwargs\"?: object}}; got {o!r}")


def _validate_check(source: str, where: str, check: Any, method_names: list[str], setting_names: list[str],
                    metric_ids: list[str]) -> None:
    if not isinstance(check, dict):
        _fail(source, f"{where} must be an object")
    test = check.get("test")
    if test not in CHECK_TESTS:
        _fail(source, f"{where}: test must be one of {', '.join(CHECK_TESTS)}; got {test!r}")
    metric, key = check.get("metric"), check.get("key")
    if (metric is None) == (key is None):
        _fail(source, f"{where}: give exactly one of 'metric' (an id or an inline metric) and 'key'")
    if key is not None and not isinstance(key, str):
        _fail(source, f"{where}: key must be a string")
    if isinstance(metric, str):
        if metric not in metric_ids:
            _fail(source, f"{where}: unknown metric {metric!r}; metrics: {', '.join(metric_ids)}")
    elif metric is not None:
        if not isinstance(metric, dict) or metric.get("type") not in _INLINE_METRIC_TYPES \
                or not isinstance(metric.get("key", "error"), str):
            _fail(source, f"{where}: an inline metric needs a type in {_INLINE_METRIC_TYPES} and a string key")
        if metric["type"] == STEPS_TO_THRESHOLD and not isinstance(metric.get("threshold"), int | float):
            _fail(source, f"{where}: an inline steps_to_threshold metric needs a numeric threshold")
    if test == "paper" and not isinstance(metric, str):
        _fail(source, f"{where}: test 'paper' needs the id of a metric with paper numbers")
    names = ([check["method"]] if "method" in check else []) + list(check.get("methods", [])) \
        + list(check.get("among", []))
    if not names or not all(isinstance(n, str) for n in names):
        _fail(source, f"{where}: name the method(s) with 'method' or 'methods'")
    unknown = [n for n in names if n not in method_names]
    if unknown:
        _fail(source, f"{where}: unknown methods {unknown}")
    settings = list(check.get("settings", [])) + ([check["setting"]] if "setting" in check else [])
    unknown = [n for n in settings if n not in setting_names]
    if unknown:
        _fail(source, f"{where}: unknown settings {unknown}")
    if test in ("below", "above") and not isinstance(check.get("value"), int | float):
        _fail(source, f"{where}: test {test!r} needs a numeric 'value'")
    if test == "worst_setting" and ("setting" not in check or len(names) != 1):
        _fail(source, f"{where}: test 'worst_setting' needs one 'method' and the 'setting' expected worst")
    if test == "order" and len(names) < 2:
        _fail(source, f"{where}: test 'order' needs at least two methods")
