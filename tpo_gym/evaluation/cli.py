"""``tpo-gym``: run the paper's benchmark presets and build their reports.

Usage::

    tpo-gym bench --preset quick --workers 2              # -> runs/quick/report.md
    tpo-gym bench --preset table1 --seeds 5 --out DIR     # resumable: rerun to continue
    tpo-gym bench --preset my_preset.json                 # a preset file of your own
    tpo-gym bench --preset mnist --backend ray            # runs on a Ray cluster (RAY_ADDRESS)
    tpo-gym report DIR                                    # rebuild DIR/report.md from stored runs
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from tpo_gym.evaluation.presets import PresetError, available_presets, load_preset

__all__ = ["main", "build_parser"]


def _positive_int(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer >= 1, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse


def _names(text: str | None) -> list[str] | None:
    """``"a, b"`` -> ``["a", "b"]``; ``None`` stays ``None`` (no filter)."""
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def _presets_epilog() -> str:
    lines = ["presets (name: description [paper reference]):"]
    for name, path in available_presets().items():
        try:
            data = json.loads(path.read_text())
            lines.append(f"  {name:<19} {data['description']}")
            lines.append(f"  {'':<19} [{data['paper_ref']}; {data['seeds']} seeds by default]")
        except (OSError, ValueError, KeyError) as exc:  # a broken file must not break --help
            lines.append(f"  {name:<19} (unreadable preset: {exc})")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``tpo-gym`` argument parser (``bench`` and ``report`` sub-commands)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="tpo-gym", description=__doc__, formatter_class=fmt,
                                     epilog=_presets_epilog())
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark preset and write its report", formatter_class=fmt,
                           description="Run every method x setting x seed of a preset as independent processes, "
                                       "store each finished run atomically (a rerun resumes) and write the report.",
                           epilog=_presets_epilog())
    bench.add_argument("--preset", default="quick",
                       help="preset name (see below) or path to a preset .json file (default: quick)")
    bench.add_argument("--seeds", type=_positive_int("--seeds"), default=None,
                       help="number of seeds, 0..N-1 (default: the preset's)")
    bench.add_argument("--workers", type=_positive_int("--workers"), default=1,
                       help="runs in parallel (default: 1)")
    bench.add_argument("--settings", default=None, metavar="A,B",
                       help="run only these settings (comma-separated names of the preset's columns)")
    bench.add_argument("--methods", default=None, metavar="X,Y",
                       help="run only these methods (comma-separated names of the preset's rows)")
    bench.add_argument("--out", default=None, help="output directory (default: runs/<preset>)")
    bench.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="local worker processes, or a Ray cluster (pip install 'tpo-gym[ray]'; "
                            "connects to RAY_ADDRESS if set, else starts a local Ray with --workers CPUs)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    report = sub.add_parser("report", help="rebuild the report of a bench output directory from its stored runs")
    report.add_argument("dir", help="a directory written by `tpo-gym bench`")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tpo-gym`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from tpo_gym.evaluation.report import build_report

    if args.command == "report":
        try:
            written = build_report(args.dir)
        except (FileNotFoundError, PresetError) as exc:
            parser.error(str(exc))
        print(f"wrote {', '.join(sorted(written))} in {args.dir}")
        return 0

    from tpo_gym.evaluation.runner import BackendError, bench, require_ray

    try:
        preset = load_preset(args.preset)
        if args.settings or args.methods:
            preset = preset.subset(_names(args.settings), _names(args.methods))
        if args.backend == "ray":
            require_ray()
    except (PresetError, BackendError) as exc:
        parser.error(str(exc))
    out = Path(args.out) if args.out else Path("runs") / preset.name
    argv_list = sys.argv[1:] if argv is None else argv
    command = "tpo-gym " + " ".join(shlex.quote(a) for a in argv_list)
    t0 = time.perf_counter()
    summary = bench(preset, out, seeds=args.seeds, workers=args.workers, backend=args.backend,
                    command=command, progress=not args.no_progress)
    build_report(out)
    print(f"{preset.name}: {summary.total} runs ({summary.executed} executed, {summary.skipped} resumed, "
          f"{summary.failed} failed) in {time.perf_counter() - t0:.1f} s -> {out / 'report.md'}")
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
