"""What a preset holds and a rough estimate of what it costs to run, before running it.

The estimate is a work model per run kind times a seconds-per-unit constant measured on the
project's 2-core benchmark machine, from the committed reports in ``benchmarks/results/`` (their
"compute time", the sum of the runs' own wall times, one thread per run):

=================  =========================================================  ======================
kind               work units of one run                                      measured on
=================  =========================================================  ======================
``tabular_single``  steps                                                      ``tabular-single``
``tabular_multi``   steps                                                      ``tabular-multi``
``token``           episodes x rollouts per episode x H x (1 + epochs)         ``table1`` + ``table3``
``mnist``           steps x B x (1 + epochs)                                   ``mnist``
``llm``             steps x B x K x max_new_tokens x (1 + 2 epochs), plus a     SmolLM2 timings (§9),
                   fixed per-run cost (model load, held-out evaluations)      ``llm-smoke`` runs
``gym``             env steps (x 15 for a Stable-Baselines3 algorithm)         ``continuous`` (short)
=================  =========================================================  ======================

Rollouts per episode: B, or B*K for sequence-level grouped methods and for single-sample methods
under the interaction budget. The ``1 + epochs`` factor counts the rollout forward pass plus one
forward-backward per epoch. Against the reports it was fitted on, the token constant is within
1.3x of ``table1`` and ``table3`` (and of ``quick``), the MNIST constant within 1.6x of every MNIST
method's mean run time: read the estimate as "within a factor of 2". Wall time assumes the runs
pack evenly over the workers, bounded below by the longest run.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

from tpo_gym.evaluation.presets import Preset, RunSpec

__all__ = ["GYM_SB3_FACTOR", "LLM_RUN_OVERHEAD_S", "SECONDS_PER_UNIT", "CostEstimate", "estimate_preset", "run_seconds",
           "run_units", "format_seconds"]

#: Seconds per work unit of each run kind (see the module docstring), with where it was measured.
SECONDS_PER_UNIT: dict[str, tuple[float, str]] = {
    "tabular_single": (4.45e-4, "tabular-single report: 33.4 s over 500 runs x 150 steps"),
    "tabular_multi": (1.76e-4, "tabular-multi report: 70.4 s over 400 runs x 1000 steps"),
    "token": (2.27e-5, "table1 + table3 reports: 11,940 s over 5.27e8 units"),
    "mnist": (2.61e-5, "mnist report: 2,735 s over 1.05e8 units"),
    "gym": (2.0e-4, "continuous preset, 51,200 Pendulum-v1 steps: TPO / GRPO / PPO (ours) 8.6-16.9 s"),
    "llm": (6.4e-3, "SmolLM2-135M on 2 threads (docs/method.md section 9): 4 x 8 x 64 tokens generate in ~10 s, "
                    "forward + backward ~22 s"),
}

#: How many times slower a Stable-Baselines3 algorithm's env step is than a tpo-gym agent's in a ``gym`` run.
#: Measured on ``continuous``: SB3's PPO (rl-zoo Pendulum settings) took 158 s over 51,200 Pendulum-v1 steps.
GYM_SB3_FACTOR = 15.0

#: Fixed seconds of one ``llm`` run besides its training steps: loading the model and tokenizer and
#: scoring the held-out prompts before, during and after training. Measured on the 2-core machine:
#: the two ``llm-smoke`` runs took 58 s and 71 s of wall time against ~11 s of modelled step work each.
LLM_RUN_OVERHEAD_S = 50.0

_FALLBACK = {"batch_size": 100, "group_size": 8, "n_epochs": 4, "level": "auto", "budget": "prompt"}


def _default(algo: str, name: str) -> Any:
    """The agent class's default for constructor argument ``name`` (read from its signature)."""
    try:
        from tpo_gym.agents.common.registry import resolve_algorithm

        param = inspect.signature(resolve_algorithm(algo)).parameters.get(name)
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default
    except (ImportError, AttributeError, TypeError, ValueError):
        pass
    return _FALLBACK[name]


def _arg(spec: RunSpec, name: str) -> Any:
    if name in spec.method_kwargs:
        return spec.method_kwargs[name]
    shared = spec.params.get("agent_kwargs", {})
    return shared[name] if name in shared else _default(spec.algo, name)


def run_units(spec: RunSpec) -> float:
    """Work units of one run (see the module docstring)."""
    p = spec.params
    if spec.kind == "tabular_single":
        return float(p.get("steps", 150))
    if spec.kind == "tabular_multi":
        return float(p.get("steps", 1000))
    if spec.kind == "gym":  # env steps (x GYM_SB3_FACTOR for an SB3 algorithm: its critic, its minibatches)
        from tpo_gym.agents.common.registry import is_sb3_algorithm, resolve_algorithm

        return float(p.get("steps", 100_000)) * (GYM_SB3_FACTOR if is_sb3_algorithm(resolve_algorithm(spec.algo))
                                                     else 1.0)
    batch, epochs = int(_arg(spec, "batch_size")), int(_arg(spec, "n_epochs"))
    if spec.kind == "llm":  # generated tokens x (generate + old log-probs + forward/backward per epoch)
        tokens = int(p.get("policy_kwargs", {}).get("max_new_tokens", 64))
        return float(p.get("steps", 100)) * batch * int(_arg(spec, "group_size")) * tokens * (1 + 2 * epochs)
    if spec.kind == "mnist":
        return float(p.get("steps", 10_000)) * batch * (1 + epochs)
    from tpo_gym.agents.common.registry import method_spec, resolve_algorithm

    rollouts = method_spec(resolve_algorithm(spec.algo)).rollouts_per_iteration(
        batch, int(_arg(spec, "group_size")), _arg(spec, "level"), _arg(spec, "budget"))
    horizon = int(p.get("env_kwargs", {}).get("length", 10))
    return float(p.get("episodes", 1000)) * rollouts * horizon * (1 + epochs)


def run_seconds(spec: RunSpec) -> float:
    """Estimated single-threaded seconds of one run on the benchmark machine."""
    fixed = LLM_RUN_OVERHEAD_S if spec.kind == "llm" else 0.0
    return fixed + SECONDS_PER_UNIT[spec.kind][0] * run_units(spec)


@dataclass
class CostEstimate:
    """Estimated cost of a preset's runs."""

    runs: int
    compute_s: float
    longest_s: float
    per_setting: dict[str, float]

    def wall_s(self, workers: int) -> float:
        """Wall time with ``workers`` parallel runs: even packing, bounded below by the longest run."""
        return max(self.compute_s / max(1, min(workers, self.runs)), self.longest_s)


def estimate_preset(preset: Preset, seeds: int | None = None) -> CostEstimate:
    """Estimate every run of ``preset`` with ``seeds`` seeds (default: the preset's)."""
    runs = preset.runs(seeds)
    per_setting: dict[str, float] = {}
    longest = 0.0
    for spec in runs:
        sec = run_seconds(spec)
        per_setting[spec.setting] = per_setting.get(spec.setting, 0.0) + sec
        longest = max(longest, sec)
    return CostEstimate(runs=len(runs), compute_s=sum(per_setting.values()), longest_s=longest,
                        per_setting=per_setting)


def format_seconds(seconds: float) -> str:
    """``42 s``, ``12 min``, ``3.4 h``, ``2.1 days``."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
