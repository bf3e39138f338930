"""The ``tpo-gym`` flags of presets you derive: ``presets NAME --export FILE [--force]`` and ``bench --episodes N``
/ ``--steps N``, and the lines that say what loading a derived preset file cut from it
(:mod:`tpo_gym.evaluation.derived`)."""

from __future__ import annotations

import argparse
import sys

from tpo_gym.evaluation.presets import Preset


def add_export_arguments(presets: argparse.ArgumentParser) -> None:
    """``--export FILE`` and ``--force`` of ``tpo-gym presets``."""
    presets.add_argument("--export", default=None, metavar="FILE",
                         help="write preset NAME to FILE as pretty-printed JSON, to edit into a preset of your own "
                              "(load it with --preset FILE; docs/presets.md describes its fields)")
    presets.add_argument("--force", action="store_true", help="with --export: overwrite FILE if it exists")


def add_budget_arguments(bench: argparse.ArgumentParser, positive_int) -> None:
    """``--episodes N`` and ``--steps N`` of ``tpo-gym bench``; ``positive_int``: the CLI's integer type."""
    bench.add_argument("--episodes", type=positive_int("--episodes"), default=None, metavar="N",
                       help="run every selected token setting for N episodes instead of its budget (other runs: "
                            "the report marks their cells 'not comparable' with the paper's numbers)")
    bench.add_argument("--steps", type=positive_int("--steps"), default=None, metavar="N",
                       help="run every selected MNIST, tabular and llm setting for N steps instead of its budget "
                            "(as --episodes)")


def say_pruned(command: str, preset: Preset) -> None:
    """One stderr line per thing loading ``preset``'s file cut because the file no longer has what it names."""
    for line in preset.pruned:
        print(f"tpo-gym {command}: note: {preset.source}: {line}", file=sys.stderr)
    if preset.pruned:
        print(f"tpo-gym {command}: note: {len(preset.pruned)} item(s) of {preset.source} named a setting, method "
              "or metric it no longer has and were left out", file=sys.stderr)
