"""How far apart the float64 golden histories come out across CPU kernels and thread counts, and how far a 1%
change of the learning rate or of eta moves them (issue 45).

Records every case of :mod:`tests.golden.histories` in child processes with ``ATEN_CPU_CAPABILITY`` set to each
ISA this CPU supports (``default``, ``avx2``, ``avx512``; MKL / oneDNN capped alike) and ``OMP_NUM_THREADS`` 1
and 2, then prints the largest relative difference (numbers below ``--abs-floor`` in magnitude counted
absolutely) between any two recordings, and the smallest difference that a 1% change of the learning rate or of
eta makes in TPO's token and sequence cases. Run from the repository root::

    .venv/bin/python benchmarks/golden_spread.py

The ratio of the two is the margin the golden test's tolerance sits in (``tests/golden/histories.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
ISAS = {"default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                     "ONEDNN_MAX_CPU_ISA": "SSE41"},
        "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
        "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "ALL"}}


def _numbers(runs: list[dict[str, Any]]) -> list[float]:
    """Every float of a recorded case, in order (history values and weight fingerprints)."""
    out = []
    for run in runs:
        for rec in run["history"]:
            out += [float.fromhex(v) for v in rec.values() if isinstance(v, str)]
        out += [float.fromhex(v) for v in run["weights"]]
    return out


def largest_difference(a: dict[str, Any], b: dict[str, Any], floor: float) -> tuple[float, str]:
    """Largest |x - y| / max(|x|, |y|, floor) over every number of every case, and the case it is in."""
    worst, where = 0.0, ""
    for case in a:
        for x, y in zip(_numbers(a[case]), _numbers(b[case]), strict=True):
            d = abs(x - y) / max(abs(x), abs(y), floor)
            if d > worst:
                worst, where = d, case
    return worst, where


def _record(env: dict[str, str], out: pathlib.Path) -> dict[str, Any]:
    subprocess.run([sys.executable, "-m", "tests.golden.histories", "--out", str(out)], check=True, cwd=ROOT,
                   env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    cases: dict[str, Any] = json.loads(out.read_text())["cases"]
    return cases


def _changed(kwarg: str, factor: float) -> dict[str, Any]:
    """TPO's token and sequence cases with ``kwarg`` scaled by ``factor`` (run here, float64)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from tests.golden import histories as h
    from tpo_gym import TPO

    out = {}
    for level in ("token", "sequence"):
        base = getattr(TPO("TransformerPolicy", h.TOKEN, level=level, **h._TOKEN_GROUP), kwarg)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            out[f"TPO_{level}"] = h.record([h._train(TPO, "TransformerPolicy", h.TOKEN, level=level,
                                                     **{kwarg: base * factor}, **h._TOKEN_GROUP)])
        finally:
            torch.set_default_dtype(previous)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isas", default=",".join(ISAS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--threads", default="1,2", help="OMP_NUM_THREADS values (default: %(default)s)")
    parser.add_argument("--abs-floor", type=float, default=1e-3,
                        help="numbers below this in magnitude are compared absolutely (default: %(default)s)")
    args = parser.parse_args()
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for isa, threads in itertools.product(args.isas.split(","), args.threads.split(",")):
            name = f"{isa}/{threads}t"
            runs[name] = _record({**ISAS[isa], "OMP_NUM_THREADS": threads}, pathlib.Path(tmp, "set.json"))
            print(f"recorded {name}", flush=True)
    spread, where = max(largest_difference(runs[a], runs[b], args.abs_floor) + (f"{a} vs {b}",)[:0]
                        for a, b in itertools.combinations(runs, 2))
    print(f"spread across {len(runs)} recordings: {spread:.2e} (largest, in {where})")
    first = next(iter(runs.values()))
    for kwarg in ("learning_rate", "eta"):
        changed = _changed(kwarg, 1.01)
        effect = min(largest_difference({c: changed[c]}, {c: first[c]}, args.abs_floor)[0] for c in changed)
        print(f"a 1% change of {kwarg}: moves TPO's token and sequence cases by >= {effect:.2e}; "
              f"ratio to the spread {effect / max(spread, 1e-300):.1e}")


if __name__ == "__main__":
    main()
