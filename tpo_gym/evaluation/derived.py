"""Presets you derive: an exported preset edited into another, and a bench at another budget.

* :func:`prune_to_present` -- what a preset no longer has (a setting, method or metric removed) taken out of its
  paper numbers, claims and tables, one line said per thing cut (:meth:`~tpo_gym.evaluation.presets.Preset.subset`
  and :func:`~tpo_gym.evaluation.presets.load_preset` use it);
* :func:`export_preset` -- ``tpo-gym presets NAME --export FILE``: a preset's file, pretty-printed, to edit;
* :func:`override_budget` -- ``tpo-gym bench --episodes N`` / ``--steps N``: every selected setting run at
  another budget, the preset's own budget per setting kept in ``data["budget_override"]`` (outside the runs'
  params, so the runs of the preset as it is keep their configuration hashes) for the report to say that
  those cells are not comparable with the paper's;
* :func:`add_methods` -- ``tpo-gym bench --methods TPO_token,RLOO``: a name in ``--methods`` that is no method of
  the preset but names an algorithm (registered, an installed package's entry point, ``$TPO_GYM_ALGORITHMS``,
  ``module:Class``, ``stable_baselines3:PPO``) adds a method row ``{"name": it, "algo": it}``;
* :func:`method_notes` -- the report's notes on the methods that actually ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpo_gym.evaluation.presets import Preset

from tpo_gym.evaluation._prune import prune_to_present

__all__ = ["add_methods", "budget_key", "method_name", "export_preset", "method_notes", "override_budget",
           "paper_budget", "prune_to_present", "reapply_budget", "setting_budget"]


def export_preset(name_or_path: str, file: str, force: bool = False) -> str:
    """Write preset ``name_or_path`` (a packaged name or a preset file) to ``file`` as pretty-printed JSON to edit:
    the file as it is packaged (its ``setups`` not expanded), which :func:`~tpo_gym.evaluation.presets.load_preset`
    loads back as it is.

    :return: the path written.
    :raises PresetError: an unknown or invalid preset, ``file`` exists (without ``force``) or is a directory, or
        it cannot be written (one line naming the path and why).
    """
    import json
    from pathlib import Path

    from tpo_gym.evaluation._io import atomic_write_text, parse_json
    from tpo_gym.evaluation.presets import PresetError, load_preset

    preset = load_preset(name_or_path)  # validated: the export loads back
    target = Path(file)
    if not file.strip():
        raise PresetError("--export '' names no file: give the path of the .json file to write")
    if target.is_dir():
        raise PresetError(f"--export {file}: is a directory; give the path of a .json file to write")
    if target.exists() and not force:
        raise PresetError(f"--export {file}: the file exists; give --force to overwrite it, or another path")
    if not target.parent.is_dir():
        raise PresetError(f"--export {file}: the directory {target.parent} does not exist")
    data = parse_json(Path(preset.source).read_bytes(), f"preset file {preset.source}")
    try:
        atomic_write_text(target, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise PresetError(f"--export {file}: cannot write it: {exc.strerror or exc}") from None
    return str(target)


#: The ``params`` key of a setting's budget, per run kind (any other kind: ``"steps"``), and the flag that sets it.
_BUDGET_KEYS = {"token": "episodes"}


def budget_key(kind: str) -> str:
    """The ``params`` key holding the budget of a setting of run kind ``kind``: ``episodes`` for token tasks,
    ``steps`` for MNIST, the tabular bandits and language models."""
    return _BUDGET_KEYS.get(kind, "steps")


def setting_budget(setting: dict[str, Any]) -> Any:
    """A setting's budget (its ``episodes`` or ``steps``; ``None`` when it has none)."""
    return setting.get("params", {}).get(budget_key(setting["kind"]))


def method_name(reference: str) -> str:
    """The method name :func:`add_methods` gives an algorithm reference: ``module:Class`` -> ``module.Class``."""
    return reference.replace(":", ".")


def add_methods(preset: Preset, names: list[str] | None) -> tuple[Preset, list[str]]:
    """``preset`` with a method row ``{"name": n, "algo": n}`` added for each of ``names`` that is no method of it
    (exactly or in any case) but resolves as an algorithm (:func:`~tpo_gym.agents.common.registry.resolve_algorithm`),
    run in every setting (settings that list their methods get it too); and the names added. A ``module:Class``
    reference is added under the method name ``module.Class`` (a method name has no ``:``). Names that are
    neither are left for :meth:`~tpo_gym.evaluation.presets.Preset.subset` to refuse (with close matches).

    :raises PresetError: an added method that cannot run in a setting's kind (one line, from validation).
    """
    import copy

    from tpo_gym.agents.common.registry import AlgorithmReferenceError, resolve_algorithm
    from tpo_gym.evaluation.presets import Preset, validate_preset

    known = {m["name"].lower() for m in preset.methods}
    added = []
    for name in names or []:
        if name.lower() in known or name in added:
            continue
        try:
            resolve_algorithm(name)
        except AlgorithmReferenceError:
            continue
        added.append(name)
    if not added:
        return preset, []
    data = copy.deepcopy(preset.data)
    data["methods"] += [{"name": method_name(name), "algo": name} for name in added]
    for setting in data["settings"]:
        if setting.get("methods") is not None:
            setting["methods"] = [*setting["methods"], *map(method_name, added)]
    validate_preset(data, source=f"{preset.source} (--methods adds {', '.join(added)})")
    return Preset(data=data, source=preset.source, whole=preset.whole_data, pruned=preset.pruned), added


def override_budget(preset: Preset, episodes: int | None = None, steps: int | None = None) -> Preset:
    """``preset`` with the budget of every setting replaced: ``episodes`` for token settings, ``steps`` for the
    others (``None``: kept). The budget is a run's param, so the runs are other runs (other configuration hashes).
    The budget each setting had before is kept in ``data["budget_override"]["paper"]`` (``{setting: budget}``),
    with the flags, outside every run's params; :func:`paper_budget` reads it.

    :raises PresetError: a flag that no selected setting takes (naming the flag and the kinds it is for).
    """
    import copy

    from tpo_gym.evaluation.presets import Preset, PresetError, validate_preset

    given = {k: v for k, v in (("episodes", episodes), ("steps", steps)) if v is not None}
    if not given:
        return preset
    data = copy.deepcopy(preset.data)
    record = data.setdefault("budget_override", {})
    before = record.setdefault("paper", {})
    used = set()
    for s in data["settings"]:
        key = budget_key(s["kind"])
        if key in given:
            used.add(key)
            before.setdefault(s["name"], setting_budget(s))  # a second override keeps the first budget
            s.setdefault("params", {})[key] = given[key]
    for key in sorted(set(given) - used):
        kinds = "token settings" if key == "episodes" else "MNIST, tabular, llm and gym settings"
        raise PresetError(f"--{key} {given[key]}: no selected setting of preset {preset.name!r} takes it (--{key} "
                          f"sets the budget of {kinds}; the selection: "
                          f"{', '.join(sorted({s['kind'] for s in data['settings']}))})")
    record.update(given)
    validate_preset(data, source=f"{preset.source} (--{' --'.join(given)})")
    return Preset(data=data, source=preset.source, whole=preset.whole_data, pruned=preset.pruned)


def reapply_budget(preset: Preset, like: Preset) -> Preset:
    """``preset`` with the budget override ``like`` was run with (none: ``preset`` as it is): a selection cut
    from the whole preset again (``tpo-gym report DIR --settings ...``) keeps the budget its runs had."""
    record = like.data.get("budget_override")
    if not isinstance(record, dict):
        return preset
    out = override_budget(preset, record.get("episodes") if any(s["kind"] in _BUDGET_KEYS for s in preset.settings)
                          else None,
                          record.get("steps") if any(s["kind"] not in _BUDGET_KEYS for s in preset.settings)
                          else None)
    if out is not preset:  # the budgets before the first override, as recorded
        out.data["budget_override"]["paper"].update(
            {k: v for k, v in record.get("paper", {}).items() if k in out.data["budget_override"]["paper"]})
    return out


def paper_budget(preset: Preset, setting: str) -> tuple[Any, Any, str] | None:
    """``(budget run, budget of the paper's numbers, unit)`` of ``setting`` when a budget override changed it
    (``tpo-gym bench --episodes/--steps``), else ``None``: its cells are not comparable with the paper's."""
    record = preset.data.get("budget_override")
    if not isinstance(record, dict) or setting not in record.get("paper", {}):
        return None
    for s in preset.settings:
        if s["name"] == setting:
            ran, paper = setting_budget(s), record["paper"][setting]
            return (ran, paper, budget_key(s["kind"])) if ran != paper else None
    return None


def method_notes(preset: Preset, recorded: Any = None) -> list[str]:
    """One note per method the report shows: its name, ``algo``, kwargs and where its class comes from (tpo-gym,
    Stable-Baselines3, a plugin's module and distribution as the manifest's ``algorithms`` recorded them, or
    ``tpo-gym import``)."""
    from tpo_gym.evaluation._provenance import distribution_text

    recorded = recorded if isinstance(recorded, dict) else {}
    notes = []
    for m in preset.methods:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in m.get("kwargs", {}).items())
        source = recorded.get(m["algo"])
        path = source.get("path") if isinstance(source, dict) else None
        if m.get("imported"):
            where = "runs of a script, added by `tpo-gym import`"
        elif m["algo"].startswith("stable_baselines3:") or (isinstance(path, str)
                                                             and path.startswith("stable_baselines3")):
            where = "Stable-Baselines3's class, run by tpo-gym's SB3 adapter"
        elif isinstance(path, str) and not path.startswith("tpo_gym."):
            where = f"class `{path}` ({distribution_text(source)})"
        else:
            where = "tpo-gym's built-in agent"
        notes.append(f"Method `{m['name']}`: algo `{m['algo']}`" + (f" with {kwargs}" if kwargs else "")
                     + f"; {where}.")
    return notes
