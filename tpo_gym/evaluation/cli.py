"""The ``tpo-gym`` command: list the benchmark presets, run one, rebuild its report.

Examples (see ``tpo-gym --help``)::

    tpo-gym presets                                       # every preset: runs, seeds, estimated cost
    tpo-gym presets table1                                # one preset's settings, methods and cost
    tpo-gym bench --preset quick --workers 2              # -> runs/quick/report.md
    tpo-gym bench --preset table1 --seeds 5 --list        # what would run, without running it
    tpo-gym bench --preset table1 --seeds 5 --out DIR     # resumable: rerun to continue
    tpo-gym bench --preset my_preset.json                 # a preset file of your own
    tpo-gym bench --preset mnist --backend ray            # runs on a Ray cluster (RAY_ADDRESS)
    tpo-gym report DIR                                    # rebuild DIR/report.md from stored runs
    tpo-gym report DIR --preset quick                     # ... of another preset whose runs DIR keeps
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from tpo_gym.evaluation._cli_checks import (
    _check_out,
    _check_path_text,
    _check_run_count,
    _check_selection,
    _default_out,
    _fail,
    _names,
    _positive_int,
    _preset_error,
    _warn,
)
from tpo_gym.evaluation._cli_derived import add_budget_arguments, add_export_arguments, say_pruned
from tpo_gym.evaluation._provenance import environment_prefix
from tpo_gym.evaluation.importer import add_import_command
from tpo_gym.evaluation.presets import Preset, PresetError, available_presets, load_preset
from tpo_gym.evaluation.runner import MAX_STOP_AFTER_MINUTES, MAX_WORKERS

__all__ = ["main", "build_parser"]

_DESCRIPTION = """\
Benchmarks of Target Policy Optimization (TPO) and its baselines: run the paper's experiments as
presets and write reports that set our numbers beside the paper's.

commands:
  tpo-gym presets [NAME]        what each preset holds: settings, methods, seeds, runs, estimated cost
  tpo-gym bench --preset NAME   run a preset (every method x setting x seed) and write its report
  tpo-gym report DIR            rebuild DIR/report.md, figures and summary.csv from the stored runs
  tpo-gym import FILES --out DIR  add run records written by a script (RunLogger) to DIR's report

examples:
  tpo-gym bench --preset quick --workers 2
  tpo-gym bench --preset table1 --seeds 5 --settings V=2,V=4 --list
  tpo-gym bench --preset table1 --seeds 5 --settings V=2,V=4 --out runs/table1
  tpo-gym report runs/table1

Methods, tasks and the paper's numbers: docs/method.md in the tpo-gym repository."""

_ESTIMATE_NOTE = ("estimate: a work model per run kind times seconds per unit measured on the project's 2-core "
                  "benchmark machine (the compute times of the committed reports in benchmarks/results/); "
                  "read it as within a factor of 2 (tpo_gym/evaluation/cost.py)")


def _positive_minutes(text: str) -> float:
    """``--stop-after``: a positive number of minutes, at most :data:`~.runner.MAX_STOP_AFTER_MINUTES`."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or not 0 < value <= MAX_STOP_AFTER_MINUTES:
        raise argparse.ArgumentTypeError(f"--stop-after takes a positive number of minutes, got {text!r:.40}; "
                                         f"at most {MAX_STOP_AFTER_MINUTES} (about 1.9 years)")
    return value


def _presets_epilog() -> str:
    lines = ["presets (name: description [paper reference]; details: tpo-gym presets NAME):"]
    for name, path in available_presets().items():
        try:
            data = json.loads(path.read_text())
            lines.append(f"  {name:<19} {data['description']}")
            lines.append(f"  {'':<19} [{data['paper_ref']}; {data['seeds']} seeds by default]")
        except (OSError, ValueError, KeyError) as exc:  # a broken file must not break --help
            lines.append(f"  {name:<19} (unreadable preset: {exc})")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``tpo-gym`` argument parser (``presets``, ``bench`` and ``report`` sub-commands)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="tpo-gym", description=_DESCRIPTION, formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", metavar="{presets,bench,report,import}")

    presets = sub.add_parser("presets", help="list the presets, or show one, with an estimate of its cost",
                             formatter_class=fmt,
                             description=textwrap.fill(
                                 "Without NAME: one line per packaged preset. With NAME (a preset name or a .json "
                                 "file): its settings, methods, seeds, number of runs and estimated cost.", 100)
                             + "\n\n" + textwrap.fill(_ESTIMATE_NOTE[0].upper() + _ESTIMATE_NOTE[1:] + ".", 100))
    presets.add_argument("name", nargs="?", help="a preset name or path to a preset .json file")
    presets.add_argument("--seeds", type=_positive_int("--seeds"), default=None,
                         help="number of seeds to estimate for (default: the preset's)")
    presets.add_argument("--workers", type=_positive_int("--workers", MAX_WORKERS), default=2,
                         help="parallel runs for the wall-time estimate (default: 2)")
    add_export_arguments(presets)

    bench = sub.add_parser("bench", help="run a benchmark preset and write its report", formatter_class=fmt,
                           description=textwrap.fill(
                               "Run every method x setting x seed of a preset as independent processes, store each "
                               "finished run atomically (a rerun resumes) and write the report. --list shows what "
                               "would run, and its estimated cost, without running it.", 100),
                           epilog=_presets_epilog())
    bench.add_argument("--preset", default="quick",
                       help="preset name (see below) or path to a preset .json file (default: quick)")
    bench.add_argument("--seeds", type=_positive_int("--seeds"), default=None,
                       help="number of seeds, 0..N-1 (default: the preset's)")
    bench.add_argument("--workers", type=_positive_int("--workers", MAX_WORKERS), default=1,
                       help=f"runs in parallel (default: 1, at most {MAX_WORKERS})")
    bench.add_argument("--settings", default=None, metavar="A,B",
                       help="run only these settings (comma-separated names of the preset's columns; any case)")
    bench.add_argument("--methods", default=None, metavar="X,Y",
                       help="run only these methods (comma-separated names of the preset's rows; any case)")
    bench.add_argument("--setups", default=None, metavar="A,B",
                       help="run only these setups of a preset with setups (reference, tuned: docs/method.md "
                            "section 4b; default: all, side by side)")
    add_budget_arguments(bench, _positive_int)
    bench.add_argument("--out", default=None, help="output directory (default: runs/<preset>)")
    bench.add_argument("--replace-preset", action="store_true",
                       help="when --out holds another preset's report: write this preset's report there instead "
                            "(the other's runs are kept; tpo-gym report DIR --preset OTHER brings its report back). "
                            "Without it that is an error")
    bench.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="local worker processes, or a Ray cluster (pip install 'tpo-gym[ray]'; "
                            "connects to RAY_ADDRESS if set, else starts a local Ray with --workers CPUs)")
    bench.add_argument("--list", action="store_true",
                       help="print the selected settings, methods, runs and estimated cost, and how many of "
                            "the runs are already stored in --out (a bench would skip them), then exit")
    bench.add_argument("--stop-after", type=_positive_minutes, default=None, metavar="MINUTES",
                       help="stop cleanly after MINUTES: no run starts after the deadline and the runs in "
                            "flight are stopped, leaving no record; everything finished is stored and the "
                            "report is written. The same command goes on from there")
    compress = bench.add_mutually_exclusive_group()
    compress.add_argument("--compress", dest="compress", action="store_true", default=None,
                          help="store run records gzip-compressed (runs/<run_id>.json.gz, about 8x smaller: "
                               "the form to commit). Default: as the last bench in --out did, else plain JSON")
    compress.add_argument("--no-compress", dest="compress", action="store_false",
                          help="store new run records as plain JSON (runs/<run_id>.json)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("--device", default="cpu",
                       help="torch device of the agents: cpu (default), cuda, cuda:N or auto")
    bench.add_argument("--seed-batch", type=_positive_int("--seed-batch"), default=1, metavar="S",
                       help="train up to S seeds of one method x setting together in one process (token and "
                            "MNIST runs; still one record per seed; default: 1, each seed alone)")

    report = sub.add_parser("report", help="rebuild the report of a bench output directory from its stored runs",
                            formatter_class=fmt,
                            description=textwrap.fill(
                                "Rebuild report.md, the figures, summary.csv and results.jsonl of a directory "
                                "written by tpo-gym bench, from its manifest.json and stored runs (runs/*.json or "
                                "*.json.gz, or the rows of results.jsonl for runs without a record).", 100))
    report.add_argument("dir", help="a directory written by tpo-gym bench")
    report.add_argument("--preset", default=None,
                        help="report another preset whose runs DIR keeps (one that bench --replace-preset "
                             "replaced there: its selection and seeds as they were; else the preset as a whole)")
    report.add_argument("--settings", default=None, metavar="A,B",
                        help="report these settings of the preset (default: those of the last bench run there)")
    report.add_argument("--methods", default=None, metavar="X,Y", help="report these methods")
    report.add_argument("--setups", default=None, metavar="A,B", help="report these setups")
    report.add_argument("--seeds", type=_positive_int("--seeds"), default=None,
                        help="report seeds 0..N-1 (runs not stored show as not run yet); nothing is run")
    add_import_command(sub)
    parser._tpo_sub = {"presets": presets, "bench": bench, "report": report}  # type: ignore[attr-defined]
    return parser


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM handler of ``bench``: raise as Ctrl-C does, so the worker processes are stopped too."""
    raise KeyboardInterrupt


# ---------------------------------------------------------------------------------------------
# preset listing
# ---------------------------------------------------------------------------------------------
def _budget(setting: dict) -> str:
    p = setting.get("params", {})
    if setting["kind"] == "token":
        return f"{p.get('episodes', '?')} episodes"
    return f"{p.get('steps', '?')} steps"


def _method_text(method: dict) -> str:
    args = ", ".join(f"{k}={v}" for k, v in method.get("kwargs", {}).items())
    inner = method["algo"] + (f", {args}" if args else "")
    return method["name"] if inner == method["name"] else f"{method['name']} ({inner})"


def _table(rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, row in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def describe_preset(preset: Preset, seeds: int | None = None, workers: int = 2) -> str:
    """What ``preset`` runs with ``seeds`` seeds, and its estimated cost with ``workers`` parallel runs."""
    from tpo_gym.evaluation.cost import estimate_preset, format_seconds

    n = preset.seeds if seeds is None else seeds
    est = estimate_preset(preset, n)
    lines = [f"{preset.name}: {preset.data['description']}",
             f"paper:   {preset.data['paper_ref']}",
             f"seeds:   {n} (0..{n - 1}){'' if seeds is None else f'; the preset default is {preset.seeds}'}",
             f"runs:    {est.runs} (method x setting x seed), each one process with one thread",
             "methods: " + "; ".join(_method_text(m) for m in preset.methods)]
    if preset.setups:
        lines.append("setups:  " + ", ".join(preset.setups) + " (each setting runs once per setup: docs/method.md "
                     "section 4b; --setups selects)")
    lines.append("")
    rows = [["setting", "kind", "budget", "methods", "runs", "est. compute"]]
    for s in preset.settings:
        methods = [m["name"] for m in preset.setting_methods(s)]
        rows.append([s["name"], s["kind"], _budget(s), ", ".join(methods), str(len(methods) * n),
                     format_seconds(est.per_setting.get(s["name"], 0.0))])
    lines += _table(rows, right={4, 5})
    lines += ["", f"estimated cost: {format_seconds(est.compute_s)} of compute; about "
                  f"{format_seconds(est.wall_s(workers))} wall with --workers {workers} "
                  f"(the longest run alone: {format_seconds(est.longest_s)})",
              textwrap.fill(f"({_ESTIMATE_NOTE})", 100)]
    return "\n".join(lines)


def presets_overview(workers: int = 2) -> str:
    """One line per packaged preset: settings, methods, default seeds, runs and estimated cost."""
    from tpo_gym.evaluation.cost import estimate_preset, format_seconds

    rows = [["preset", "settings", "methods", "seeds", "runs", "est. compute", f"est. wall ({workers} workers)"]]
    broken = []
    for name in available_presets():
        try:
            preset = load_preset(name)
        except PresetError as exc:
            broken.append(f"{name}: {exc}")
            continue
        est = estimate_preset(preset)
        rows.append([name, str(len(preset.settings)), str(len(preset.methods)), str(preset.seeds), str(est.runs),
                     format_seconds(est.compute_s), format_seconds(est.wall_s(workers))])
    lines = _table(rows, right={1, 2, 3, 4, 5, 6})
    lines += [f"invalid preset {b}" for b in broken]
    lines += ["", "details: tpo-gym presets NAME; a selection: tpo-gym bench --preset NAME --seeds N "
                  "--settings A,B --methods X,Y --list", textwrap.fill(f"({_ESTIMATE_NOTE})", 100)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tpo-gym`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is not None:
        return args.handler(args)
    subs = parser._tpo_sub  # type: ignore[attr-defined]
    if args.command is None:
        parser.print_help()
        return 0

    if args.command == "presets":
        if args.name is None:
            if args.export is not None:
                subs["presets"].error("--export FILE needs NAME: the preset to write (tpo-gym presets NAME --export "
                                      "FILE)")
            print(presets_overview(args.workers))
            return 0
        try:
            if args.export is not None:
                from tpo_gym.evaluation.derived import export_preset

                print(f"wrote preset {args.name} to {export_preset(args.name, args.export, args.force)}")
                return 0
            preset = load_preset(args.name)
        except PresetError as exc:
            _preset_error(subs["presets"], "presets", exc)
        say_pruned("presets", preset)
        _check_run_count("presets", preset, args.seeds, args.seeds)
        print(describe_preset(preset, args.seeds, args.workers))
        return 0

    from tpo_gym.evaluation.report import BadManifest, NoStoredRuns, build_report, select_report

    if args.command == "report":
        _check_path_text("report", "DIR", args.dir)
        target = Path(args.dir)
        if target.exists() and not target.is_dir():
            _fail("report", f"{target} is not a directory")
        _check_selection("report", args)
        if args.preset is not None and not args.preset.strip():
            _fail("report", "--preset '' names no preset: give a preset name or file, or leave --preset out")
        flags = {"preset": args.preset, "settings": args.settings, "methods": args.methods, "setups": args.setups}
        try:
            manifest = None
            if any(v is not None for v in flags.values()) or args.seeds is not None:
                try:
                    manifest = select_report(target, _names(args.settings), _names(args.methods),
                                             _names(args.setups), args.seeds, args.preset)
                except PresetError as exc:
                    given = ", ".join(f"--{k} {v}" for k, v in flags.items() if v is not None)
                    subs["report"].error(f"{given}: {exc}" if given else str(exc))
                _check_run_count("report", Preset(data=manifest["preset"], source=str(target)), manifest["seeds"],
                                 args.seeds)
            refused: list[str] = []
            written = build_report(target, manifest, refused)
            _warn("report", refused)
        except NoStoredRuns as exc:
            _fail("report", str(exc), code=1)
        except FileNotFoundError as exc:
            _fail("report", str(exc))
        except BadManifest as exc:
            _fail("report", str(exc))
        except OSError as exc:
            _fail("report", f"cannot write the report in {target}: {exc.strerror or exc}", code=1)
        print(f"wrote {', '.join(sorted(written))} in {target}")
        return 0

    from tpo_gym._validation import check_device
    from tpo_gym.evaluation.runner import BackendError, BenchLocked, PresetMismatch, bench, require_ray

    try:
        check_device(args.device)
    except ValueError as exc:
        subs["bench"].error(f"--device: {exc}")
    _check_selection("bench", args)
    if args.out is not None and not args.out.strip():
        _fail("bench", f"--out {args.out!r} names no directory: give one, or leave --out out for runs/<preset>")
    if args.out is not None:
        _check_path_text("bench", "--out", args.out)
    try:
        preset = load_preset(args.preset)
        say_pruned("bench", preset)
        from tpo_gym.evaluation.derived import add_methods, method_name, override_budget

        methods = _names(args.methods)
        preset, added = add_methods(preset, methods)
        if added:
            print(f"note: --methods adds {', '.join(added)} (not in preset {preset.name!r}) with default arguments",
                  file=sys.stderr)
            methods = [method_name(m) if m in added else m for m in methods or []]
        if args.settings is not None or args.methods is not None or args.setups is not None:
            preset = preset.subset(_names(args.settings), methods, _names(args.setups))

        preset = override_budget(preset, args.episodes, args.steps)
        if args.backend == "ray" and not args.list:
            require_ray()
    except PresetError as exc:
        _preset_error(subs["bench"], "bench", exc)
    except BackendError as exc:
        subs["bench"].error(str(exc))
    _check_run_count("bench", preset, args.seeds, args.seeds)
    out = Path(args.out) if args.out is not None else _default_out(preset)
    if args.list:
        print(describe_preset(preset, args.seeds, args.workers))
        print(_stored_line(preset, out, args.seeds))
        return 0
    problem = _check_out(out)
    if problem:
        _fail("bench", problem)
    argv_list = sys.argv[1:] if argv is None else argv
    algos = [m["algo"] for s in preset.settings for m in preset.setting_methods(s)]
    command = environment_prefix(algos) + "tpo-gym " + " ".join(shlex.quote(a) for a in argv_list)
    t0 = time.perf_counter()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill`: stop the workers too, as Ctrl-C does
    try:
        summary = bench(preset, out, seeds=args.seeds, workers=args.workers, backend=args.backend,
                        command=command, progress=not args.no_progress, device=args.device,
                        seed_batch=args.seed_batch, replace_preset=args.replace_preset,
                        compress=args.compress, stop_after=args.stop_after)
        _warn("bench", summary.refused, "; it was run again")
        refused: list[str] = []
        build_report(out, refused=refused)
        _warn("bench", [r for r in refused if r not in summary.refused])
    except BenchLocked as exc:
        _fail("bench", str(exc))
    except KeyboardInterrupt:
        _fail("bench", f"interrupted; the finished runs are stored in {out}: the same command resumes", code=130)
    except OSError as exc:
        _fail("bench", f"cannot write under {out}: {exc.strerror or exc}", code=1)
    except PresetMismatch as exc:
        fix = ("use another --out" if args.replace_preset else
               f"use another --out, or --replace-preset to write {exc.wanted!r}'s report there (the runs of "
               f"{exc.stored!r} are kept: tpo-gym report {shlex.quote(str(out))} --preset "
               f"{shlex.quote(exc.stored)} rebuilds its report)")
        _fail("bench", f"{exc}: {fix}")
    except ValueError as exc:  # a damaged manifest.json in --out
        _fail("bench", str(exc))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"{preset.name}: {summary.total} runs ({summary.executed} executed, {summary.skipped} resumed, "
          f"{summary.failed} failed) in {time.perf_counter() - t0:.1f} s -> {out / 'report.md'}")
    if summary.stopped:
        print(f"stopped at the --stop-after deadline ({args.stop_after:g} min): {summary.left} of "
              f"{summary.total} runs left (runs in flight were stopped and left no record); continue with: "
              f"{command}")
    return 1 if summary.failed else 0


def _stored_line(preset: Preset, out: Path, seeds: int | None) -> str:
    """``--list``'s last line: how many of the selected runs ``out`` already stores."""
    from tpo_gym.evaluation.runner import stored_runs

    runs = preset.runs(preset.seeds if seeds is None else seeds)
    stored = len(stored_runs(out, runs, preset.metric_keys)) if (out / "runs").is_dir() else 0
    if stored == len(runs):
        return f"stored: all {len(runs)} runs in {out} (a bench there runs nothing new)"
    return f"stored: {stored} of {len(runs)} runs in {out}; a bench there runs the other {len(runs) - stored}"


if __name__ == "__main__":
    sys.exit(main())
