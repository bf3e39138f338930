"""Two Stable-Baselines3 conventions the agents keep: full signatures with their ``:param:`` lines, and a progress
bar over env steps.

SB3's algorithm classes spell out every constructor argument; tpo-gym's subclasses take their own arguments and
forward the rest, so :func:`complete_signature` gives each class the full signature and appends the ``:param:``
lines of the arguments it inherits. SB3's ``ProgressBarCallback`` advances once per env step; tpo-gym's agents
call ``on_step`` once per iteration, so :func:`count_progress_by_steps` makes the bar advance by the env steps
each iteration took.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ProgressBarCallback

__all__ = ["IterationProgressBar", "count_progress_by_steps", "param_blocks", "complete_signature"]


class IterationProgressBar(ProgressBarCallback):
    """SB3's progress bar counting env steps per iteration (``on_step`` runs once per iteration here)."""

    def _on_training_start(self) -> None:
        self._start = self.model.num_timesteps
        self._total = max(int(self.locals["total_timesteps"]) - self._start, 0)
        super()._on_training_start()

    def _on_step(self) -> bool:
        done = min(self.model.num_timesteps - self._start, self._total)
        self.pbar.update(done - self.pbar.n)
        return True


def count_progress_by_steps(callback: BaseCallback) -> None:
    """Make SB3 ``ProgressBarCallback`` instances (also inside lists) count env steps per iteration.

    The instance keeps its identity (its class becomes :class:`IterationProgressBar`, which only
    changes how ``_on_step`` advances the bar), so a caller holding it can still read ``pbar``.
    """
    if type(callback) is ProgressBarCallback:
        callback.__class__ = IterationProgressBar
    elif isinstance(callback, CallbackList):
        for inner in callback.callbacks:
            count_progress_by_steps(inner)


def param_blocks(doc: str) -> dict[str, str]:
    """The ``:param name: text`` blocks of a docstring, by name."""
    text = inspect.cleandoc(doc or "")
    return {name: block.strip() for block, name in re.findall(r"(:param (\w+):.*?)(?=\n:param |\n\n|\Z)", text,
                                                              flags=re.S)}


def complete_signature(cls: type, base_init: Callable[..., Any], base_doc: str, fixed: dict[str, Any]) -> None:
    """Give ``cls.__init__`` its full signature (its own arguments, then the base's it forwards, keyword-only ones
    sorted with ``_init_setup_model`` last) and append to ``cls.__doc__`` the ``:param:`` lines of the inherited
    arguments it does not document. Arguments in ``fixed`` (fixed by the method) are left out."""
    own = inspect.signature(cls.__init__)  # type: ignore[misc]
    base = inspect.signature(base_init)
    params = [p for p in own.parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    names = {p.name for p in params}
    for p in base.parameters.values():
        if p.name not in names and p.name not in fixed:
            params.append(p)
    head = [p for p in params if p.kind is not p.KEYWORD_ONLY]
    tail = sorted((p for p in params if p.kind is p.KEYWORD_ONLY), key=lambda p: p.name == "_init_setup_model")
    cls.__init__.__signature__ = own.replace(parameters=head + tail)  # type: ignore[misc]
    documented = param_blocks(cls.__doc__ or "")
    inherited = param_blocks(base_doc)
    extra = [inherited[p.name] for p in head + tail if p.name in inherited and p.name not in documented]
    if extra:
        cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + "\n".join("    " + b.replace("\n", "\n    ")
                                                                       for b in extra) + "\n"
