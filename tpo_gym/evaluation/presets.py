"""Benchmark presets: JSON data files, loaded, validated and expanded into runs.

A preset (``tpo_gym/evaluation/preset_files/NAME.json``; docs/presets.md describes every field) mirrors one
published result (docs/method.md section 6). Its fields:

``name``, ``description`` (one line), ``paper_ref`` (where in the paper), ``seeds`` (default count),
``settings`` -- the table's columns: ``{"name", "kind", "params", "methods"?}``; ``kind`` is a run
kind of :mod:`tpo_gym.evaluation.experiments`; ``params`` its budget and task; ``methods`` (optional)
the subset of methods run in this setting.
``methods`` -- the table's rows: ``{"name", "algo", "kwargs"?}``; ``algo`` is an agent class name
(``TPO``, ``GRPO``, ``PPO``, ``REINFORCE``, ``GroupPG``, ``DG``, ``CE``, or a class of your own: its
registered name, ``package.module:Class``, a name in ``$TPO_GYM_ALGORITHMS`` or one an installed package
publishes in the entry-point group ``tpo_gym.algorithms``; see
:func:`~tpo_gym.agents.common.registry.resolve_algorithm`), ``kwargs`` extra arguments of that method.
Validation resolves every ``algo`` (importing only the module a reference names).
``metrics`` -- ``{"id", "type": "steps_to_threshold" | "final" | "initial", "key", "threshold"?, "scale"?,
"unit"?, "paper_dash"?, "better"?, "window"?}``; the first is the headline. ``unit``: ``"%"`` or a word, which
names the summary.csv column (``final_error`` in ``%``: ``final_error_pct``). ``better``: ``"lower"``
(default) or ``"higher"`` (scores); ``window``: a final metric's per-seed mean over the last N logged values.
``paper`` -- ``{metric_id: {method: {setting: value}}}``: a number, ``"-"`` (the paper's dash:
never reached / above ``paper_dash``), a bound ``">99"`` / ``"<2.3"``, or ``null`` (not reported).
``paper_claims`` (optional) -- the paper's statements, each checked against the run's numbers in the
report: ``{"text", "checks": [check, ...]}`` (a plain string is shown as not tested). A check is
``{"test", "metric" | "key", "method" | "methods", "among"?, "settings"?, "value"?, "setting"?}``
with ``test`` one of :data:`CHECK_TESTS` (see :mod:`tpo_gym.evaluation.claims`).
``omitted_claims`` (set by :meth:`Preset.subset`) -- how many claims were dropped because they name a
method, or need a setting, outside the subset.
``notes`` (optional) -- remarks on how this preset runs the paper's setup, printed in the report.
``tables`` (optional) -- ``{"title", "settings", "methods"}`` groups, one report table each.
``setups`` (optional) -- named model / optimiser setups the table runs side by side (docs/method.md
section 4b): ``[{"name", "description"?, "params"?, "methods"?}, ...]``, the first the default. Loading
expands every setting ``S`` into one column ``S (name)`` per setup: ``params`` is merged key by key
into the setting's ``params`` (``{"agent_kwargs": {"policy_kwargs": {"setup": "reference"}}}``), and
``methods`` maps a method name to what it runs as under that setup (``{"algo"?, "kwargs"?}``; kwargs
merged into the method's). Paper numbers, tables and the ``settings`` of claim checks name the
unexpanded settings; each paper number applies to every setup's column, and each claim is checked
once per setup. Expanded settings carry ``"base"`` and ``"setup"``.
``curves`` (optional) -- logged keys to plot (default ``["error"]``); ``log_y`` (optional bool).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tpo_gym.evaluation._io import parse_json
from tpo_gym.evaluation._preset_validation import (
    CHECK_TESTS,
    MAX_NAME_LENGTH,
    MAX_RUNS,
    PresetError,
    validate_preset,
)
from tpo_gym.evaluation._prune import prune_to_present

# in the order of the API reference page (docs/reference/evaluation/presets.md)
__all__ = ["MAX_RUNS", "CHECK_TESTS", "MAX_NAME_LENGTH", "PresetError", "RunSpec", "Preset", "setup_setting_name",
           "expand_setups", "resolve_names", "PRESET_FOLDER", "is_packaged_source", "available_presets", "load_preset",
           "validate_preset"]


@dataclass(frozen=True)
class RunSpec:
    """One independent run: method x setting x seed of a preset."""

    preset: str
    kind: str
    method: str
    algo: str
    setting: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    method_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def config_hash(self) -> str:
        """Hash of everything that determines the run's result (a changed preset reruns it)."""
        blob = json.dumps(
            [self.kind, self.algo, self.params, self.method_kwargs, self.seed], sort_keys=True, default=str
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def run_id(self) -> str:
        """File-name-safe identifier ``<setting>__<method>__seed<k>``."""
        raw = f"{self.setting}__{self.method}__seed{self.seed}"
        return re.sub(r"[^A-Za-z0-9_.=+\-]", "_", raw)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (what a worker receives and what the run record stores)."""
        return {
            "preset": self.preset, "kind": self.kind, "method": self.method, "algo": self.algo,
            "setting": self.setting, "seed": self.seed, "params": self.params, "method_kwargs": self.method_kwargs,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(**{k: d[k] for k in ("preset", "kind", "method", "algo", "setting", "seed", "params",
                                        "method_kwargs")})


@dataclass
class Preset:
    """A validated preset (the parsed JSON in :attr:`data`); :attr:`whole` is the preset a
    :meth:`subset` was cut from (``None``: this is the whole preset)."""

    data: dict[str, Any]
    source: str
    whole: dict[str, Any] | None = None
    #: What :func:`load_preset` cut from the file because it names a setting, method or metric the file no longer
    #: has (one line each, see :func:`prune_to_present`); the command line prints them.
    pruned: list[str] = field(default_factory=list)

    @property
    def whole_data(self) -> dict[str, Any]:
        """The whole preset's data: this one's unless it is a subset."""
        return self.data if self.whole is None else self.whole

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def seeds(self) -> int:
        return int(self.data["seeds"])

    @property
    def methods(self) -> list[dict[str, Any]]:
        return self.data["methods"]

    @property
    def settings(self) -> list[dict[str, Any]]:
        return self.data["settings"]

    @property
    def metrics(self) -> list[dict[str, Any]]:
        return self.data["metrics"]

    @property
    def metric_keys(self) -> frozenset[str]:
        """The logged keys the report computes numbers from: those of the metrics and of the claim checks
        (a run record's values under them must be finite and in range: :mod:`~tpo_gym.evaluation.records`)."""
        keys = {m.get("key", "error") for m in self.metrics}
        for claim in self.data.get("paper_claims", []):
            for check in claim.get("checks", []) if isinstance(claim, dict) else []:
                metric = check.get("metric")
                keys.add(metric.get("key", "error") if isinstance(metric, dict) else check.get("key"))
        return frozenset(k for k in keys if isinstance(k, str))

    @property
    def setups(self) -> list[str]:
        """Names of the preset's setups (its ``setups`` field; empty when it has none)."""
        return [u["name"] for u in self.data.get("setups", [])]

    def setting_methods(self, setting: dict[str, Any]) -> list[dict[str, Any]]:
        """The methods run in ``setting`` (all, or the setting's ``methods`` subset), in preset order.

        Under a setup that changes a method, its entry here is the changed one (``algo``, ``kwargs``).
        """
        subset = setting.get("methods")
        override = setting.get("method_overrides", {})
        return [_override_method(m, override.get(m["name"])) for m in self.methods
                if subset is None or m["name"] in subset]

    def tables(self) -> list[dict[str, Any]]:
        """Report tables: the preset's ``tables`` or one table with every setting and method."""
        if self.data.get("tables"):
            return self.data["tables"]
        return [{"title": self.data.get("paper_ref", self.name), "settings": [s["name"] for s in self.settings],
                 "methods": [m["name"] for m in self.methods]}]

    def subset(self, settings: list[str] | None = None, methods: list[str] | None = None,
               setups: list[str] | None = None) -> Preset:
        """A preset restricted to some settings, methods and/or setups (paper numbers and tables pruned to match).

        Names match exactly or, failing that, case-insensitively (``ppo`` selects ``PPO``). In a preset
        with setups, a setting's unexpanded name (``V=2``) selects its column under every setup.

        :raises PresetError: a name that is not in the preset (with close matches).
        """
        data = copy.deepcopy(self.data)
        if setups is not None:
            if not self.setups:
                raise PresetError(f"preset {self.name!r} has no setups (it runs one configuration)")
            chosen = resolve_names(setups, self.setups, f"preset {self.name!r}", "setups")
            data["setups"] = [u for u in data["setups"] if u["name"] in chosen]
            data["settings"] = [x for x in data["settings"] if x["setup"] in chosen]
        for kind, wanted in (("settings", settings), ("methods", methods)):
            if wanted is None:
                continue
            known = [x["name"] for x in data[kind]]
            if kind == "settings":
                bases = list(dict.fromkeys(x["base"] for x in data[kind] if "base" in x))
                chosen = resolve_names(wanted, known + [b for b in bases if b not in known],
                                       f"preset {self.name!r}", kind)
                chosen = [x["name"] for x in data[kind] if x["name"] in chosen or x.get("base") in chosen]
            else:
                chosen = resolve_names(wanted, known, f"preset {self.name!r}", kind)
            data[kind] = [x for x in data[kind] if x["name"] in chosen]
        omitted, _ = prune_to_present(data)
        if omitted:
            data["omitted_claims"] = int(data.get("omitted_claims", 0)) + omitted
        if "setups" in data:
            ran = {x["setup"] for x in data["settings"]}
            data["setups"] = [u for u in data["setups"] if u["name"] in ran]
        if not data["settings"] or not data["methods"]:
            raise PresetError(f"preset {self.name!r}: the selection leaves no run")
        validate_preset(data, source=f"{self.source} (subset)")
        return Preset(data=data, source=self.source, whole=self.whole_data)

    def run_count(self, n_seeds: int | None = None) -> int:
        """How many runs :meth:`runs` makes with ``n_seeds`` seeds (default: the preset's count), counted
        without making them.

        :raises PresetError: more than :data:`MAX_RUNS` runs (naming the seeds and the most that fit).
        """
        n = self.seeds if n_seeds is None else n_seeds
        per_seed = sum(len(self.setting_methods(s)) for s in self.settings)
        if n * per_seed > MAX_RUNS:
            raise PresetError(f"{n} seeds x {per_seed} runs per seed of preset {self.name!r} = {n * per_seed} runs; "
                              f"at most {MAX_RUNS} runs are allowed (seeds <= {MAX_RUNS // per_seed} here)")
        return n * per_seed

    def runs(self, n_seeds: int | None = None) -> list[RunSpec]:
        """Expand into independent runs, seeds ``0 .. n_seeds-1`` (default: the preset's count).

        :raises PresetError: more than :data:`MAX_RUNS` runs (see :meth:`run_count`).
        """
        n = self.seeds if n_seeds is None else n_seeds
        self.run_count(n)
        out = []
        for setting in self.settings:
            for method in self.setting_methods(setting):
                for seed in range(n):
                    out.append(RunSpec(
                        preset=self.name, kind=setting["kind"], method=method["name"], algo=method["algo"],
                        setting=setting["name"], seed=seed, params=copy.deepcopy(setting.get("params", {})),
                        method_kwargs=copy.deepcopy(method.get("kwargs", {})),
                    ))
        return out


def _override_method(method: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    """``method`` as a setup runs it: ``override``'s ``algo`` replaces the method's, its ``kwargs`` merge in."""
    if not override:
        return method
    return dict(method, algo=override.get("algo", method["algo"]),
                kwargs=_merge(method.get("kwargs", {}), override.get("kwargs", {})))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated with ``extra`` key by key, recursing into mappings both hold (copies; neither changes)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def setup_setting_name(setting: str, setup: str) -> str:
    """The column name of ``setting`` run under ``setup``: ``"V=2 (reference)"``."""
    return f"{setting} ({setup})"


def expand_setups(data: dict[str, Any]) -> dict[str, Any]:
    """A validated preset with ``setups`` expanded: one setting per (setting, setup), setup-major within each setting.

    Paper numbers of a setting apply to each of its columns; a table lists a setting's columns side
    by side; each claim becomes one claim per setup, its checks restricted to that setup's columns
    (text suffixed ``[<setup> setup]``; the claim keeps ``"claim"``, the unexpanded text, and ``"setup"``).
    Each setup's description becomes a note. A preset without
    setups, or one already expanded, comes back unchanged (a copy).
    """
    data = copy.deepcopy(data)
    setups = data.get("setups")
    if not setups or any("setup" in s for s in data["settings"]):
        return data
    names = [u["name"] for u in setups]
    columns = {s["name"]: [setup_setting_name(s["name"], u) for u in names] for s in data["settings"]}
    settings = []
    for s in data["settings"]:
        for u in setups:
            e = dict(s, name=setup_setting_name(s["name"], u["name"]), base=s["name"], setup=u["name"],
                     params=_merge(s.get("params", {}), u.get("params", {})))
            if u.get("methods"):
                e["method_overrides"] = copy.deepcopy(u["methods"])
            settings.append(e)
    data["settings"] = settings
    data["paper"] = {mid: {m: {c: v for sett, v in cols.items() for c in columns[sett]} for m, cols in rows.items()}
                     for mid, rows in data.get("paper", {}).items()}
    for t in data.get("tables", []) or []:
        t["settings"] = [c for sett in t.get("settings", []) for c in columns[sett]]
    claims = []
    for claim in data.get("paper_claims", []):
        if isinstance(claim, str):
            claims.append(claim)
            continue
        for i, u in enumerate(names):
            checks = []
            for check in claim.get("checks", []):
                check = dict(check)
                check["settings"] = [columns[x][i] for x in check.get("settings", columns)]
                if "setting" in check:
                    check["setting"] = columns[check["setting"]][i]
                checks.append(check)
            claims.append(dict(claim, text=f"{claim['text']} [{u} setup]", checks=checks, setup=u,
                               claim=claim["text"]))
    if "paper_claims" in data:
        data["paper_claims"] = claims
    notes = [f"Setup `{u['name']}`: {u['description']}" for u in setups if u.get("description")]
    if notes:
        data["notes"] = notes + list(data.get("notes", []))
    return data


def resolve_names(wanted: list[str], known: list[str], owner: str, kind: str) -> list[str]:
    """Map user-typed names to ``known`` ones: exact match first, then case-insensitive.

    :param kind: ``"settings"`` or ``"methods"`` (for the message).
    :raises PresetError: a name that matches nothing (with close matches) or several names that differ only by case.
    """
    out = []
    for name in wanted:
        if name in known:
            out.append(name)
            continue
        folded = [k for k in known if k.casefold() == name.casefold()]
        if len(folded) == 1:
            out.append(folded[0])
            continue
        if folded:
            raise PresetError(f"{owner}: {kind[:-1]} {name!r} is ambiguous: {', '.join(folded)}")
        by_fold = {k.casefold(): k for k in known}
        close = [by_fold[c] for c in difflib.get_close_matches(name.casefold(), list(by_fold), n=3, cutoff=0.5)]
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise PresetError(f"{owner} has no {kind[:-1]} {name!r}.{hint} Its {kind}: {', '.join(known)}")
    return out


#: The package folder of the packaged preset files (not ``presets``: that name is this module's, and a data folder
#: of the same name would shadow it for :mod:`importlib.resources`).
PRESET_FOLDER = "preset_files"
#: Folder names a packaged preset file was loaded from: :data:`PRESET_FOLDER`, and ``presets``, its name in
#: older versions (the ``preset_source`` of manifests written then).
_PACKAGED_FOLDERS = (PRESET_FOLDER, "presets")


def _presets_dir() -> Path:
    return Path(str(resources.files("tpo_gym.evaluation") / PRESET_FOLDER))


def is_packaged_source(name: str, source: str | Path) -> bool:
    """Whether a preset named ``name`` loaded from ``source`` is the packaged preset of that name (a preset
    file may carry a packaged preset's name): a packaged name, loaded from ``<folder>/<name>.json`` of the
    package's preset folder (under its current name or the one older manifests record)."""
    path = Path(source)
    return name in available_presets() and path.name == f"{name}.json" and path.parent.name in _PACKAGED_FOLDERS


def available_presets() -> dict[str, Path]:
    """``{name: path}`` of the packaged presets, sorted by name."""
    return {p.stem: p for p in sorted(_presets_dir().glob("*.json"))}


def load_preset(name_or_path: str | Path) -> Preset:
    """Load and validate a packaged preset by name, or a preset JSON file by path.

    :raises PresetError: unknown name (with close matches and the valid names) or an invalid file.
    """
    text = str(name_or_path)
    path = Path(text)
    if text.endswith(".json") or path.is_file():
        if not path.is_file():
            raise PresetError(f"preset file {text!r} does not exist")
    else:
        presets = available_presets()
        if text not in presets:
            close = difflib.get_close_matches(text, list(presets), n=3, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise PresetError(
                f"unknown preset {text!r}.{hint} Valid presets: {', '.join(presets)} (or a path to a .json file)."
            )
        path = presets[text]
    try:
        data = parse_json(path.read_bytes(), f"preset file {path}")
    except OSError as exc:
        raise PresetError(f"preset file {path} cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PresetError(str(exc)) from None
    pruned = _prune_derived(data)
    validate_preset(data, source=str(path))
    data = expand_setups(data)
    validate_preset(data, source=str(path))
    return Preset(data=data, source=str(path), pruned=pruned)


def _prune_derived(data: Any) -> list[str]:
    """Cut, in place, the paper numbers, claims, tables and methods lists of a preset file that name a setting,
    method or metric id it does not have (a preset derived from an exported one by removing some): one line per
    thing cut (:func:`prune_to_present`). A file whose shape is wrong is left as it is, for
    :func:`validate_preset` to name the problem."""
    trial = copy.deepcopy(data)
    try:
        _, said = prune_to_present(trial, metrics=True)
    except (TypeError, KeyError, AttributeError, ValueError):
        return []
    if said:
        data.clear()
        data.update(trial)
    return said

