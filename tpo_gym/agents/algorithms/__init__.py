"""The agent classes, one module each; importing this package registers them (the registry's order).

A built-in method is one module here, holding one class decorated with
:func:`~tpo_gym.agents.common.registry.register_algorithm`, plus its name in :data:`BUILTIN` (its place in the
registry, the report and the docs). Everything else (the exports of :mod:`tpo_gym` and :mod:`tpo_gym.agents`, the
docs pages, the per-method tests) follows from the registry. ``single`` is the shared base of PPO, REINFORCE and
DG, not a method.
"""

import importlib

#: The built-in method modules, in the registry's order (the paper's).
BUILTIN = ("tpo", "grpo", "group_pg", "ppo", "reinforce", "dg", "ce", "lpo", "maxrl", "tailrl")

for _name in BUILTIN:
    importlib.import_module(f"{__name__}.{_name}")
