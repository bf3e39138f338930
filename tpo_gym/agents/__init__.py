"""Stable-Baselines3-style agents: TPO and the paper's baselines.

=============== ======================================================================
``TPO``         Target Policy Optimization (token / sequence level, ``candidates="single"``
                for MNIST, ``anchor=False`` ablation)
``GRPO``        GRPO with k3 KL (``beta=0.0``, ``mask_zero_variance=True`` ablations)
``GroupPG``     TPO's groups with scalar weighting (ablation)
``PPO``         the paper's critic-free PPO (not SB3's)
``REINFORCE``   policy gradient with a batch-mean or expected-reward baseline
``DG``          Delightful Policy Gradient
``CE``          the supervised oracle
=============== ======================================================================

The package is laid out as Stable-Baselines3 lays out its own (docs/architecture.md):

=========================================  ===========================================================
:mod:`tpo_gym.agents.algorithms`           one module per method (the list above), registered on import
:mod:`tpo_gym.agents.common`               base classes (``GroupAlgorithm`` on SB3's ``BaseAlgorithm``),
                                           the registry, rollouts, the update, save / load, ``SeedBatch``
:mod:`tpo_gym.agents.policies`             ``MlpPolicy``, ``TransformerPolicy`` and their optimisers
:mod:`tpo_gym.agents.lm`                   ``CausalLMPolicy``: Hugging Face language models on text envs
:mod:`tpo_gym.agents.files`                the saved agent's containers and plain-data encodings
=========================================  ===========================================================

Imports flow one way, ``algorithms`` → ``common`` → ``lm`` → ``policies`` → ``files``. The modules' paths
before this layout (``tpo_gym.agents.base``, ``tpo_gym.agents.tpo``, ``tpo_gym.agents.lm_files``, ...) still
import, as aliases of their new homes (:data:`MOVED`).

All agents share :class:`~tpo_gym.agents.common.base.GroupAlgorithm`: ``learn``, ``predict``, ``save`` /
``load`` (plain JSON + ``weights_only`` tensors: loading runs no code from the file), SB3 callbacks and logger,
``history``, ``steps_per_iteration``. :func:`train_seeds` / :class:`SeedBatch` train S seeds of one agent in
one process.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

from tpo_gym.agents import algorithms  # noqa: F401  (registers the agent classes)
from tpo_gym.agents.common.base import GroupAlgorithm
from tpo_gym.agents.common.registry import (
    AlgorithmSpec,
    algorithm_registry,
    builtin_algorithms,
    register_algorithm,
)
from tpo_gym.agents.common.seed_batch import SeedBatch, train_seeds
from tpo_gym.agents.lm import CausalLMPolicy, PromptFormat
from tpo_gym.agents.policies import CategoricalPolicy, MlpPolicy, MuonAdamW, TransformerPolicy

#: The agent classes, from the registry (every module of :mod:`tpo_gym.agents.algorithms`).
globals().update(builtin_algorithms())

__all__ = [
    *builtin_algorithms(),  # the agent classes: TPO, GRPO, GroupPG, PPO, REINFORCE, DG, CE, ...
    "GroupAlgorithm",
    "CategoricalPolicy",
    "MlpPolicy",
    "TransformerPolicy",
    "CausalLMPolicy",
    "PromptFormat",
    "MuonAdamW",
    "SeedBatch",
    "train_seeds",
    "AlgorithmSpec",
    "algorithm_registry",
    "register_algorithm",
]

#: ``{old module path: new module path(s)}``: the modules of ``tpo_gym.agents`` before it was split into
#: subpackages. Each old path imports as its new module (the same module object), or, where one module became
#: several, as a module holding the public names of all of them.
MOVED: dict[str, tuple[str, ...]] = {
    **{f"{__name__}.{m}": (f"{__name__}.common.{m}",) for m in (
        "algorithm_base", "base", "registry", "grouping", "update", "sampling", "env_setup", "env_copies",
        "sb3_conventions", "seed_batch", "persistence")},
    **{f"{__name__}.{m}": (f"{__name__}.policies.{m}",) for m in (
        "transformer", "optimizers", "reference_setup", "stacked_optim")},
    **{f"{__name__}.{m}": (f"{__name__}.lm.{m}",) for m in ("text_rollouts", "prompts", "smollm2")},
    **{f"{__name__}.{m}": (f"{__name__}.files.{m}",) for m in ("agent_files", "serialization")},
    **{f"{__name__}.{m}": (f"{__name__}.algorithms.{m}",) for m in ("tpo", "grpo", "group_pg", "ce")},
    f"{__name__}.lm_files": (f"{__name__}.lm.files",),
    f"{__name__}.single": tuple(f"{__name__}.algorithms.{m}" for m in ("single", "ppo", "reinforce", "dg")),
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path of :data:`MOVED` as its new module, on first use.

    ``import tpo_gym.agents.base`` gives the module object ``tpo_gym.agents.common.base`` itself (not a copy: its
    classes are the same classes), ``tpo_gym.agents.single`` a module holding the public names of its four new
    modules, and ``python -m tpo_gym.agents.<old>`` runs the new module's code.
    """

    def __init__(self) -> None:
        self.specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=MOVED[fullname][0])

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = [importlib.import_module(name) for name in MOVED[spec.name]]
        if len(new) == 1:
            self.specs[spec.name] = new[0].__spec__  # the import system sets __spec__ to the alias's: restored below
            return new[0]
        merged = types.ModuleType(spec.name, f"The names of {', '.join(MOVED[spec.name])} (the module they were).")
        merged.__all__ = [name for m in new for name in m.__all__]  # type: ignore[attr-defined]
        for m in new:
            merged.__dict__.update({name: getattr(m, name) for name in m.__all__})  # type: ignore[attr-defined]
        return merged

    def exec_module(self, module: types.ModuleType) -> None:
        alias = module.__spec__.name  # type: ignore[union-attr]
        if alias in self.specs:
            module.__spec__ = self.specs.pop(alias)

    def get_code(self, fullname: str) -> Any:
        """The new module's code (``python -m`` with an old path)."""
        new = importlib.util.find_spec(MOVED[fullname][0])
        return new.loader.get_code(new.name)  # type: ignore[union-attr]


sys.meta_path.append(_MovedModules())
