"""The algorithm registry: what each agent class is, declared once, read by everything that names methods.

Each agent class declares an :class:`AlgorithmSpec` (``spec = AlgorithmSpec(...)``) and is registered with
:func:`register_algorithm` (the built-in ones when :mod:`tpo_gym.agents` is imported). The package exports,
``GroupAlgorithm.load``, the benchmark harness (which ``algo`` a run kind accepts, the tabular method, the
cost estimate) and the report (its diagnostics tables and glossary) read :func:`algorithm_registry`, as
Gymnasium's registry is read for envs. A new method is one class plus one ``register_algorithm`` call::

    class MyPG(GroupAlgorithm):
        spec = AlgorithmSpec(sampling="group", run_kinds=("token",), diagnostics=UPDATE_DIAGNOSTICS)
        def prepare(self, batch, old): ...                 # -> (a typed batch of agents/update.py, diagnostics)
        def compute_loss(self, batch, prepared, current): ...

    register_algorithm(MyPG)

A class registered from outside tpo_gym is also named in ``$TPO_GYM_ALGORITHMS`` (``module:qualname``,
comma-separated), so that the benchmark's worker processes (started with the parent's environment) find it:
a name missing from a process's registry is looked up there, importing that module.

Where a class of your own comes from (:func:`resolve_algorithm`, what a preset's ``algo`` may say):

* a registered name (``"TPO"``, or a class your script registered);
* ``"package.module:Class"``: that module is imported and the class registered if it is not yet;
* a name listed in ``$TPO_GYM_ALGORITHMS`` (``module:qualname,...``; set it, with ``PYTHONPATH``, in the shell);
* a name an installed package publishes in the entry-point group :data:`ENTRY_POINT_GROUP`
  (``[project.entry-points."tpo_gym.algorithms"] RLOO = "tpo_rloo:RLOO"`` in its pyproject.toml).

Nothing else runs: a reference is imported as ``module:qualname`` (modules and classes along the way, no call),
and the object it names must be a :class:`~tpo_gym.agents.common.base.GroupAlgorithm` subclass declaring its
``spec``; anything else is refused with :class:`AlgorithmReferenceError`, one line naming the reference and
how to make it importable. :func:`algorithm_class` (what ``GroupAlgorithm.load`` reads a file's class name
with) takes names only, never a ``module:qualname`` from a file.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import types
from importlib import metadata
from typing import Any

from tpo_gym.agents.common.spec import (
    GROUP_DIAGNOSTICS,
    RUN_KINDS,
    SAMPLINGS,
    TEXT_DIAGNOSTICS,
    UPDATE_DIAGNOSTICS,
    AlgorithmSpec,
    Diagnostic,
)

__all__ = [
    "AlgorithmSpec",
    "Diagnostic",
    "SAMPLINGS",
    "RUN_KINDS",
    "UPDATE_DIAGNOSTICS",
    "GROUP_DIAGNOSTICS",
    "TEXT_DIAGNOSTICS",
    "register_algorithm",
    "unregister_algorithm",
    "algorithm_registry",
    "algorithm_spec",
    "algorithm_class",
    "resolve_algorithm",
    "algorithm_path",
    "AlgorithmReferenceError",
    "ENV_VAR",
    "ENTRY_POINT_GROUP",
    "reported_diagnostics",
    "SB3_SPEC",
    "is_sb3_algorithm",
    "method_spec",
    "is_agent_class",
    "builtin_algorithms",
]

#: Environment variable naming the algorithms registered from outside tpo_gym (``module:qualname,...``).
ENV_VAR = "TPO_GYM_ALGORITHMS"
#: The entry-point group through which an installed package publishes its agent classes by name.
ENTRY_POINT_GROUP = "tpo_gym.algorithms"
#: ``package.module:Qual.Name``: dotted identifiers on both sides of one colon.
_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", re.ASCII)
_MISSING = object()
#: How to make a class of one's own reachable (the end of every message about one that is not).
_HOW = (f"name it as module:Class, pip install the package publishing it (entry-point group {ENTRY_POINT_GROUP}), "
        f"or put its module on PYTHONPATH and set {ENV_VAR}=module:Class")


class AlgorithmReferenceError(ValueError):
    """An algorithm reference that does not name a usable agent class: one line naming the reference, what is
    wrong and how to make it importable."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    cls: type
    spec: AlgorithmSpec


_REGISTRY: dict[str, _Entry] = {}


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _external(cls: type) -> bool:
    return not cls.__module__.startswith("tpo_gym.")


def _set_environment(paths: list[str]) -> None:
    if paths:
        os.environ[ENV_VAR] = ",".join(dict.fromkeys(paths))
    else:
        os.environ.pop(ENV_VAR, None)


def register_algorithm(cls: type) -> type:
    """Register the agent class ``cls`` under its class name, from its ``spec`` (an :class:`AlgorithmSpec`).

    Usable as a class decorator; registering the same class again does nothing.

    :raises ValueError: if ``cls`` is not an agent class (:func:`is_agent_class`: a
        :class:`~tpo_gym.agents.common.base.GroupAlgorithm` subclass with a ``spec``, its own or its parent's),
        or another class is registered under its name.
    """
    if not is_agent_class(cls):
        spec = getattr(cls, "spec", None) if isinstance(cls, type) else None
        if isinstance(cls, type) and _from_tpo_gym_agents(cls) and spec is None:
            raise ValueError(f"{cls.__name__} must declare spec = AlgorithmSpec(...) (or inherit one) to be "
                             f"registered, got {spec!r}")
        raise ValueError(f"register_algorithm takes a GroupAlgorithm subclass, got {cls!r}")
    spec = cls.spec  # type: ignore[attr-defined]
    if getattr(cls, "sampling", None) != spec.sampling:
        raise ValueError(f"{cls.__name__}.sampling is {cls.sampling!r}, its spec says {spec.sampling!r}")
    name = cls.__name__
    known = _REGISTRY.get(name)
    if known is not None and known.cls is not cls:
        raise ValueError(f"an algorithm named {name!r} is already registered ({_path(known.cls)})")
    _REGISTRY[name] = _Entry(cls, spec)
    if _external(cls):
        _set_environment([*(p for p in os.environ.get(ENV_VAR, "").split(",") if p), _path(cls)])
    return cls


def unregister_algorithm(name: str) -> None:
    """Remove the algorithm ``name`` (a class registered from outside tpo_gym; the built-in ones stay).

    :raises ValueError: for an unknown or built-in name.
    """
    entry = _REGISTRY.get(name)
    if entry is None or not _external(entry.cls):
        raise ValueError(f"unregister_algorithm removes algorithms registered from outside tpo_gym; got {name!r}")
    del _REGISTRY[name]
    for alias in [a for a, target in _ALIASES.items() if target == name]:
        del _ALIASES[alias]
    _set_environment([p for p in os.environ.get(ENV_VAR, "").split(",") if p and p != _path(entry.cls)])


def _import_class(reference: str, where: str = "") -> type:
    """The agent class ``reference`` (``module:qualname``) names, imported and registered.

    Only the module is imported; the qualname is followed through modules and classes (no other object is
    touched), and the result must be a :class:`~tpo_gym.agents.common.base.GroupAlgorithm` subclass with its own spec.

    :param where: where the reference was found, for the message (``" (in $TPO_GYM_ALGORITHMS)"``).
    :raises AlgorithmReferenceError: one line naming the reference, what is wrong and how to fix it.
    """
    def fail(problem: str, fix: str = "") -> AlgorithmReferenceError:
        return AlgorithmReferenceError(f"algorithm {reference!r}{where}: {problem}" + (f"; {fix}" if fix else ""))

    if not _REFERENCE.match(reference):
        raise fail("not a reference of the form package.module:Class (dotted names on both sides of one ':')")
    module_name, _, qualname = reference.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - not found, or the module's own code raised while it was imported
        missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + "."))
        if missing:
            raise fail(f"cannot import module {module_name!r} ({exc})",
                       f"pip install the package that provides it, or put its directory on PYTHONPATH (and, for "
                       f"a plain name, set {ENV_VAR}=module:Class)") from None
        first = (str(exc).strip().splitlines() or [""])[0]
        raise fail(f"importing module {module_name!r} raised {type(exc).__name__}: {first}") from None
    for part in qualname.split("."):
        if not isinstance(obj, type | types.ModuleType):
            raise fail(f"{qualname!r} passes through a {type(obj).__name__}; a reference goes through modules and "
                       "classes only")
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            raise fail(f"module {module_name!r} has no attribute {qualname!r}",
                       "check the spelling: module:Class names a class that module defines or imports")
    if not isinstance(obj, type):
        raise fail(f"names a {type(obj).__name__}, not a class; an algorithm is a GroupAlgorithm subclass")
    if is_sb3_algorithm(obj):
        return obj  # Stable-Baselines3's own classes run as they are (tpo_gym.evaluation.sb3_runs), unregistered
    if not is_agent_class(obj):
        raise fail(f"class {obj.__qualname__} is not an agent class (a subclass of "
                   "tpo_gym.agents.GroupAlgorithm declaring spec = AlgorithmSpec(...), or a Stable-Baselines3 "
                   "algorithm)")
    try:
        register_algorithm(obj)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return obj


def _from_environment(name: str) -> type | None:
    """The class ``name`` of ``$TPO_GYM_ALGORITHMS`` (set by a parent process, or in the shell), registered;
    ``None`` if it lists none."""
    for path in os.environ.get(ENV_VAR, "").split(","):
        path = path.strip()
        if path and path.partition(":")[2].rsplit(".", 1)[-1] == name:
            return _import_class(path, f" (in ${ENV_VAR})")
    return None


def _from_entry_points(name: str) -> type | None:
    """The class an installed package publishes as ``name`` in :data:`ENTRY_POINT_GROUP`, registered; ``None``
    if none does."""
    found = {ep.value.strip() for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name}
    if not found:
        return None
    if len(found) > 1:
        raise AlgorithmReferenceError(f"algorithm {name!r}: installed packages publish it as {sorted(found)} "
                                      f"(entry-point group {ENTRY_POINT_GROUP}); uninstall one, or name the class "
                                      "as module:Class")
    return _import_class(found.pop(), f" (entry point {name!r} of group {ENTRY_POINT_GROUP})")


#: ``{reference or published name: registered class name}`` of the references resolved so far.
_ALIASES: dict[str, str] = {}


def algorithm_class(name: str) -> type:
    """The registered agent class ``name``; a name not registered yet is looked up in ``$TPO_GYM_ALGORITHMS``
    and then in the entry points of installed packages (:data:`ENTRY_POINT_GROUP`), and registered.

    Names only (what an agent file's class field is read with): :func:`resolve_algorithm` also takes
    ``module:qualname``.

    :raises AlgorithmReferenceError: (a ``ValueError``) naming the allowed names and how to add one, when
        ``name`` is found nowhere, or the class found cannot be imported.
    """
    if isinstance(name, str) and name not in _REGISTRY and name.isidentifier() and name in _ALIASES:
        name = _ALIASES[name]  # a name an entry point published for a class of another name
    if isinstance(name, str) and name not in _REGISTRY and name.isidentifier():
        cls = _from_environment(name) or _from_entry_points(name)
        if cls is not None:
            _ALIASES[name] = cls.__name__
            return cls
    if name not in _REGISTRY:
        raise AlgorithmReferenceError(f"unknown agent {name!r}; registered: {', '.join(_REGISTRY)}; for a class of "
                                      f"your own, {_HOW}")
    return _REGISTRY[name].cls


def resolve_algorithm(reference: str) -> type:
    """The agent class a preset's ``algo`` names: a name (:func:`algorithm_class`: registered, in
    ``$TPO_GYM_ALGORITHMS`` or published by an installed package) or ``package.module:Class`` (that module
    imported, the class registered if it is not yet).

    :raises AlgorithmReferenceError: one line naming ``reference``, what is wrong (not importable, not a
        class, not an agent class, unknown) and how to make it importable.
    """
    if not isinstance(reference, str) or not reference.strip():
        raise AlgorithmReferenceError(f"an algorithm is a registered name or module:Class, got {reference!r:.80}")
    if ":" not in reference:
        return algorithm_class(reference)
    known = _ALIASES.get(reference)
    if known is not None and known in _REGISTRY:
        return _REGISTRY[known].cls
    cls = _import_class(reference)
    if not is_sb3_algorithm(cls):  # an SB3 class is not registered: its name may be a tpo-gym agent's (PPO)
        _ALIASES[reference] = cls.__name__
    return cls


#: What a Stable-Baselines3 algorithm class is to the benchmark: one behaviour episode per context (a
#: single-sample method), run in token, MNIST and plain Gymnasium (``gym``) settings, logging no update diagnostics.
SB3_SPEC = AlgorithmSpec(sampling="single", run_kinds=("token", "mnist", "gym"), diagnostics=())


def is_sb3_algorithm(cls: Any) -> bool:
    """Whether ``cls`` is a Stable-Baselines3 algorithm class (``BaseAlgorithm``) and not one of tpo-gym's agents."""
    from stable_baselines3.common.base_class import BaseAlgorithm

    return isinstance(cls, type) and issubclass(cls, BaseAlgorithm) and not _from_tpo_gym_agents(cls)


def _from_tpo_gym_agents(cls: type) -> bool:
    """Whether a class of ``tpo_gym.agents`` is in the MRO of ``cls`` (read from the classes: the registry sits
    below the base classes and imports none of them)."""
    return any(c.__module__.startswith("tpo_gym.agents.") for c in cls.__mro__)


def is_agent_class(cls: Any) -> bool:
    """Whether ``cls`` is an agent class that can be registered: a subclass of tpo-gym's base classes
    (:class:`~tpo_gym.agents.common.base.GroupAlgorithm`) declaring ``spec = AlgorithmSpec(...)``, its own or
    inherited; the base classes themselves declare none."""
    from stable_baselines3.common.base_class import BaseAlgorithm

    return (isinstance(cls, type) and issubclass(cls, BaseAlgorithm) and _from_tpo_gym_agents(cls)
            and isinstance(getattr(cls, "spec", None), AlgorithmSpec))


def method_spec(cls: type) -> AlgorithmSpec:
    """The :class:`AlgorithmSpec` of a class :func:`resolve_algorithm` returned: an agent's own, or
    :data:`SB3_SPEC` for a Stable-Baselines3 algorithm."""
    return SB3_SPEC if is_sb3_algorithm(cls) else cls.spec  # type: ignore[attr-defined, no-any-return]


def algorithm_path(cls: type) -> str:
    """``module:qualname`` of an agent class: the reference that imports it again in another process."""
    return _path(cls)


def algorithm_registry() -> dict[str, AlgorithmSpec]:
    """Every registered algorithm's spec by class name, in registration order (built-in ones first)."""

    return {name: entry.spec for name, entry in _REGISTRY.items()}


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The :class:`AlgorithmSpec` of the registered algorithm ``name`` (``ValueError`` when unknown)."""
    return _REGISTRY[algorithm_class(name).__name__].spec


def reported_diagnostics() -> dict[str, str]:
    """Every reported diagnostic key of the registered algorithms, in registration order, with its glossary
    entry (``""`` when another key's entry explains it)."""
    out: dict[str, str] = {}
    for spec in algorithm_registry().values():
        for d in spec.diagnostics:
            if d.reported and (d.key not in out or (d.meaning and not out[d.key])):
                out[d.key] = d.meaning
    return out


def builtin_algorithms() -> dict[str, type]:
    """The built-in agent classes by name (those defined in tpo_gym), in registration order: what
    :mod:`tpo_gym` and :mod:`tpo_gym.agents` export."""
    return {name: entry.cls for name, entry in _REGISTRY.items() if not _external(entry.cls)}
