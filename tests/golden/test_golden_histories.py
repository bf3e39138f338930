"""The code reproduces the stored golden histories bit for bit on CPU (see :mod:`tests.golden.histories`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.golden.histories import CASES, PATH, hex_to_float, run_case

GOLDEN: dict[str, Any] = json.loads(PATH.read_text())["cases"]


def _first_difference(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> str | None:
    """Where two recorded runs first differ, in words (``None`` when they are identical)."""
    if len(got) != len(want):
        return f"{len(got)} agents, golden {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if len(g["history"]) != len(w["history"]):
            return f"agent {i}: {len(g['history'])} records, golden {len(w['history'])}"
        for j, (rg, rw) in enumerate(zip(g["history"], w["history"], strict=True)):
            if list(rg) != list(rw):
                return f"agent {i} record {j}: keys {list(rg)}, golden {list(rw)}"
            for key, value in rg.items():
                if value != rw[key]:
                    return f"agent {i} record {j} {key}: {hex_to_float(value)!r}, golden {hex_to_float(rw[key])!r}"
        if g["weights"] != w["weights"]:
            return f"agent {i}: final weights {[hex_to_float(v) for v in g['weights']]}, golden " \
                   f"{[hex_to_float(v) for v in w['weights']]}"
    return None


def test_every_golden_case_is_still_run() -> None:
    assert sorted(GOLDEN) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_reproduces_the_golden_history_bit_for_bit(case: str) -> None:
    difference = _first_difference(run_case(case), GOLDEN[case])
    assert difference is None, (f"{case}: {difference}. If this change of behaviour is intended, regenerate with "
                                "`.venv/bin/python -m tests.golden.histories` and say why in the commit")
