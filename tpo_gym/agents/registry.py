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
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

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
    "reported_diagnostics",
]

#: What a group is, per method: ``"group"`` (K candidates or K rollouts per context, compared within the
#: group), ``"single"`` (one behaviour trajectory per context, a batch baseline) or ``"oracle"`` (every action
#: of a state scored: the supervised CE oracle).
SAMPLINGS = ("group", "single", "oracle")
#: The benchmark's run kinds an agent class can declare (``tabular_*`` also need :attr:`AlgorithmSpec.tabular`).
RUN_KINDS = ("token", "mnist", "llm", "tabular_single", "tabular_multi")
#: Environment variable naming the algorithms registered from outside tpo_gym (``module:qualname,...``).
ENV_VAR = "TPO_GYM_ALGORITHMS"


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    """One number an agent logs in ``history`` each iteration.

    :param key: the history key.
    :param meaning: the report's glossary entry (markdown); ``""`` when another key's entry explains it.
    :param reported: whether the report's diagnostics tables and figures show it.
    """

    key: str
    meaning: str = ""
    reported: bool = True


#: Logged by every agent's update.
UPDATE_DIAGNOSTICS = (
    Diagnostic("grad_norm", "`grad_norm`: L2 norm of the gradient of the first epoch of each step"),
    Diagnostic("loss"),
    Diagnostic("final_loss", reported=False),
)
#: Logged by the group methods (:func:`~tpo_gym.agents.grouping.group_diagnostics`).
GROUP_DIAGNOSTICS = (
    Diagnostic("zero_variance_fraction", "`zero_variance_fraction`: fraction of groups whose K scores are all "
                                         "equal; their z-scores are 0, so they carry no learning signal"),
    Diagnostic("all_fail_fraction", "`all_fail_fraction`: fraction of groups in which every candidate fails "
                                    "(score 0)"),
    Diagnostic("any_success_fraction", "`any_success_fraction`: fraction of groups with at least one success "
                                       "(score 1)"),
)
#: Logged on language models (text envs) in addition.
TEXT_DIAGNOSTICS = (
    Diagnostic("completion_length", "`completion_length`: mean completion length in tokens (up to and including "
                                    "EOS)"),
    Diagnostic("mean_score"),  # explained with the llm kind's error
)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """What an agent class is: its grouping, where it runs, what it logs and how its cost grows.

    :param sampling: what a group is (:data:`SAMPLINGS`); also the cost model: a ``"group"`` method rolls
        out B*K episodes per iteration at ``level="sequence"`` (B at token level: K scored candidates per
        state), the others B, or B*K under ``budget="interaction"``.
    :param run_kinds: the benchmark run kinds (:data:`RUN_KINDS`) a preset may run it in.
    :param diagnostics: every number it logs besides ``iteration``, ``num_timesteps`` and ``error``.
    :param levels: the ``level`` values it takes (``("auto",)``: none, its method fixes it).
    :param tabular: its method name in :mod:`tpo_gym.evaluation.tabular` (``None``: no tabular version).
    :param clipped_surrogate: its loss is a clipped ratio surrogate (minus the mean advantage at the first
        epoch, about 0: the report says so under its loss figure).
    """

    sampling: str
    run_kinds: tuple[str, ...]
    diagnostics: tuple[Diagnostic, ...] = UPDATE_DIAGNOSTICS
    levels: tuple[str, ...] = ("auto",)
    tabular: str | None = None
    clipped_surrogate: bool = False

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"AlgorithmSpec.sampling must be one of {', '.join(SAMPLINGS)}; got {self.sampling!r}")
        unknown = [k for k in self.run_kinds if k not in RUN_KINDS]
        if unknown or not self.run_kinds:
            raise ValueError(f"AlgorithmSpec.run_kinds must be a non-empty subset of {', '.join(RUN_KINDS)}; got "
                             f"{self.run_kinds!r}")
        if "llm" in self.run_kinds and self.sampling != "group":
            raise ValueError(f"AlgorithmSpec: run kind 'llm' needs sampling='group' (language models are trained by "
                             f"group methods), got sampling={self.sampling!r}")
        if any(k.startswith("tabular") for k in self.run_kinds) != (self.tabular is not None):
            raise ValueError("AlgorithmSpec: a tabular run kind and a tabular method name go together; got "
                             f"run_kinds={self.run_kinds!r}, tabular={self.tabular!r}")
        keys = [d.key for d in self.diagnostics]
        if len(set(keys)) != len(keys):
            raise ValueError(f"AlgorithmSpec.diagnostics lists a key twice: {keys}")

    def rollouts_per_iteration(self, batch_size: int, group_size: int, level: str, budget: str) -> int:
        """Episodes rolled out per iteration (the cost model; ``level`` as resolved for the env)."""
        if self.sampling == "group":
            return batch_size * group_size if level == "sequence" else batch_size
        return batch_size * group_size if budget == "interaction" else batch_size


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

    :raises ValueError: if ``cls`` is not a :class:`~tpo_gym.agents.base.GroupAlgorithm` subclass declaring
        its own ``spec``, or another class is registered under its name.
    """
    from tpo_gym.agents.base import GroupAlgorithm

    if not (isinstance(cls, type) and issubclass(cls, GroupAlgorithm)) or cls is GroupAlgorithm:
        raise ValueError(f"register_algorithm takes a GroupAlgorithm subclass, got {cls!r}")
    spec = cls.__dict__.get("spec")
    if not isinstance(spec, AlgorithmSpec):
        raise ValueError(f"{cls.__name__} must declare its own spec = AlgorithmSpec(...) to be registered, got "
                         f"{spec!r}")
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
    _set_environment([p for p in os.environ.get(ENV_VAR, "").split(",") if p and p != _path(entry.cls)])


def _import_from_environment(name: str) -> None:
    """Register the class ``name`` of ``$TPO_GYM_ALGORITHMS`` (set by a parent process), if it lists one."""
    for path in os.environ.get(ENV_VAR, "").split(","):
        module, _, qualname = path.partition(":")
        if qualname.rsplit(".", 1)[-1] != name:
            continue
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        register_algorithm(obj)


def algorithm_registry() -> dict[str, AlgorithmSpec]:
    """Every registered algorithm's spec by class name, in registration order (built-in ones first)."""
    import tpo_gym.agents  # noqa: F401  (registers the built-in agents)

    return {name: entry.spec for name, entry in _REGISTRY.items()}


def algorithm_class(name: str) -> type:
    """The registered agent class ``name``.

    :raises ValueError: naming the allowed names, when ``name`` is not registered.
    """
    import tpo_gym.agents  # noqa: F401  (registers the built-in agents)

    if name not in _REGISTRY and isinstance(name, str) and name.isidentifier():
        _import_from_environment(name)
    if name not in _REGISTRY:
        raise ValueError(f"unknown agent {name!r}; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[name].cls


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The :class:`AlgorithmSpec` of the registered algorithm ``name`` (``ValueError`` when unknown)."""
    algorithm_class(name)
    return _REGISTRY[name].spec


def reported_diagnostics() -> dict[str, str]:
    """Every reported diagnostic key of the registered algorithms, in registration order, with its glossary
    entry (``""`` when another key's entry explains it)."""
    out: dict[str, str] = {}
    for spec in algorithm_registry().values():
        for d in spec.diagnostics:
            if d.reported and (d.key not in out or (d.meaning and not out[d.key])):
                out[d.key] = d.meaning
    return out
