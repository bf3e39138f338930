"""What an agent class is, declared once: :class:`AlgorithmSpec` and the :class:`Diagnostic` numbers it logs.

The registry (:mod:`tpo_gym.agents.common.registry`) keeps one spec per registered class; the base classes read
only this module, so the spec sits below both.
"""

from __future__ import annotations

import dataclasses

__all__ = ["AlgorithmSpec", "Diagnostic", "SAMPLINGS", "RUN_KINDS", "UPDATE_DIAGNOSTICS", "GROUP_DIAGNOSTICS",
           "TEXT_DIAGNOSTICS"]

#: What a group is, per method: ``"group"`` (K candidates or K rollouts per context, compared within the
#: group), ``"single"`` (one behaviour trajectory per context, a batch baseline) or ``"oracle"`` (every action
#: of a state scored: the supervised CE oracle).
SAMPLINGS = ("group", "single", "oracle")
#: The benchmark's run kinds an agent class can declare (``tabular_*`` also need :attr:`AlgorithmSpec.tabular`).
RUN_KINDS = ("token", "mnist", "llm", "tabular_single", "tabular_multi", "gym")

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
#: Logged by the group methods (:func:`~tpo_gym.agents.common.grouping.group_diagnostics`).
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
