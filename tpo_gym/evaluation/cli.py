"""``tpo-gym`` command line (interim: a demonstration run until the full harness lands)."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from tpo_gym.evaluation.tabular import SINGLE_CONTEXT_METHODS, single_context_bandit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpo-gym", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark preset")
    bench.add_argument("--preset", default="quick")
    bench.add_argument("--seeds", type=int, default=10)
    bench.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    print(f"single-context bandit (K=100, B=100, 150 normalised steps), {args.seeds} seeds: error 1 - pi(y*)")
    print(f"{'method':>10} {'step 50':>9} {'step 100':>9} {'step 150':>9}")
    for method in SINGLE_CONTEXT_METHODS:
        curves = np.array([[r["error"] for r in single_context_bandit(method, s)] for s in range(args.seeds)])
        m = curves.mean(0)
        print(f"{method:>10} {m[50]:9.3f} {m[100]:9.3f} {m[150]:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
