"""CUDA against the CPU: every agent family's first update to float tolerance, and whole runs as distributions.

Two kinds of check, because only one thing is defined across devices bit for bit-ish: the first update.

**First update** (per family). Two tiny agents of one seed, one on the CPU and one on the device (``--device``),
each trained for two iterations: iteration 0's training error (the same draws: identical) and its loss (the same
parameters on the same batch: relative difference) must agree to float tolerance. After that the runs part ways
by design, not by bug: where a group carries no signal the true gradient is 0, and Muon / Adam normalise the
rounding noise left into a full step (docs/method.md, "Rounding noise and what it means for comparisons"). The
trained logits' difference is printed for information only.

**Whole runs as distributions** (:func:`distribution_checks`). The same seeds of a short token task run to the
end on the CPU and on the device (a SeedBatch there); their per-seed steps to 1% and final errors are compared by a
two-sided Mann-Whitney test (:mod:`tpo_gym.evaluation.distributions`) at alpha = 0.01, whose power is printed (12
seeds a side: a shift of 1.3 s.d. is found with 80% power at that level). A p below alpha fails the check.

Sampling is the one thing that cannot match across devices in the first-update checks
(a CUDA generator draws other numbers than a CPU one), so each comparison keeps the draws on one side:

* ``host rollouts``: the device agent rolls out in the numpy envs (``rollouts_on_device=False``: draws
  from a CPU generator on the logits brought back), the CPU agent likewise: every family (token- and
  sequence-level group methods, single-sample methods, MNIST, the reference setup's transformer and
  ReferenceMuon), and a :class:`~tpo_gym.SeedBatch` of three seeds on the device, loop and stacked
  (forward and optimiser), against the same seeds trained alone on the CPU;
* ``on-device rollouts``: the stacked rollout of a SeedBatch against the same seeds trained alone with
  on-device rollouts, both on the device (the batches agree to float rounding).

    python benchmarks/gpu_checks.py --device cuda     # prints the tables; exit status 1 if a check fails
    python benchmarks/gpu_checks.py --device cuda --distribution-seeds 0   # first updates only

On the CPU (``--device cpu``) the same comparisons run CPU against CPU (the test suite's dry run). MNIST
uses random images of MNIST's shape where the real data is missing (a bare GPU machine): the check
compares devices, not accuracy.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing tpo-gym

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import tpo_gym  # noqa: E402, F401  (registers the envs)
from tpo_gym import DG, GRPO, PPO, TPO, SeedBatch  # noqa: E402

TINY = {"d_model": 16, "d_ff": 32, "n_layers": 1}
TOKEN_ENV = {"target": "reverse_copy", "reward": "bag", "vocab_size": 2, "length": 4}
#: Largest allowed difference: iteration 0's error (the same draws) and its loss (relative). The logits after two
#: updates are printed (relative to the CPU agent's largest change), not checked: see the module docstring.
TOLERANCE = {"error": 1e-6, "loss": 1e-4}
#: The distribution check: a short token task of the quick preset, per method, seeds 0..N-1 on both sides.
DISTRIBUTION = {"preset": "quick", "setting": "rev. copy V=2 H=5 (reference)", "methods": ("TPO", "GRPO")}
#: Level of the distribution check's two-sample test (a p below it fails the check).
ALPHA = 0.01
ITERATIONS = 2
SEEDS = (0, 1, 2)


def use_synthetic_mnist_if_missing() -> bool:
    """Random images of MNIST's shape (train 512, test 128) in place of missing MNIST data: whether used."""
    from tpo_gym.envs import mnist_data

    root = mnist_data.resolve_root(None)
    if not mnist_data.verify(root):
        return False
    rng = np.random.default_rng(0)
    for split, n in (("train", 512), ("test", 128)):
        images = rng.random((n, 784), dtype=np.float32)
        labels = rng.integers(10, size=n).astype(np.int64)
        images.setflags(write=False)
        labels.setflags(write=False)
        mnist_data._CACHE[(split, str(root))] = (images, labels)
    return True


def _token(cls: type, **kw: Any) -> Callable[[int, str, bool], Any]:
    policy_kwargs = {**TINY, **kw.pop("policy_kwargs", {})}

    def make(seed: int, device: str, on_device: bool) -> Any:
        return cls("TransformerPolicy", gym.make("tpo_gym/TokenTask-v0", **TOKEN_ENV), batch_size=16, group_size=4,
                   seed=seed, device=device, rollouts_on_device=on_device, policy_kwargs=policy_kwargs, **kw)

    return make


def _mnist(cls: type, **kw: Any) -> Callable[[int, str, bool], Any]:
    def make(seed: int, device: str, on_device: bool) -> Any:
        return cls("MlpPolicy", gym.make("tpo_gym/MNISTBandit-v0"), batch_size=32, group_size=4, seed=seed,
                   device=device, rollouts_on_device=on_device, policy_kwargs={"net_arch": [32]}, **kw)

    return make


#: The agent families: name -> builder ``(seed, device, rollouts_on_device) -> agent``.
FAMILIES: dict[str, Callable[[int, str, bool], Any]] = {
    "token: TPO_token": _token(TPO, level="token"),
    "token: GRPO_token": _token(GRPO, level="token"),
    "token: TPO_token, reference setup": _token(TPO, level="token", policy_kwargs={"setup": "reference"}),
    "sequence: TPO": _token(TPO, level="sequence"),
    "sequence: GRPO": _token(GRPO, level="sequence"),
    "single: PPO": _token(PPO),
    "single: DG": _token(DG),
    "MNIST: TPO": _mnist(TPO),
    "MNIST: DG": _mnist(DG),
}
#: Families whose SeedBatch (loop, stacked) is checked too.
BATCHED = ("token: TPO_token", "token: TPO_token, reference setup", "single: PPO", "MNIST: TPO")


@torch.no_grad()
def _logits(agent: Any, obs: torch.Tensor) -> torch.Tensor:
    return agent.policy.step_logits(obs.to(agent.policy.device)).float().cpu()


def _train(agents: list[Any], mode: str | None) -> None:
    """Two iterations of each agent alone (``mode`` None) or of all in one SeedBatch (forward, optimiser and
    rollout ``mode``, except a host rollout for ``"stacked"`` on host envs)."""
    steps = ITERATIONS * agents[0].steps_per_iteration
    if mode is None:
        for agent in agents:
            agent.learn(steps)
        return
    rollout = "stacked" if agents[0].get_rollout_env().on_device and mode == "stacked" else "loop"
    SeedBatch(agents, forward=mode, optimizer=mode, rollout=rollout).learn(steps)


def compare(reference: list[Any], starts: list[Any], candidate: list[Any]) -> dict[str, float]:
    """The largest differences of ``candidate`` from ``reference`` (trained agents of the same seeds; ``starts``:
    untrained ones)."""
    out = {"error": 0.0, "loss": 0.0, "logits": 0.0}
    for ref, start, cand in zip(reference, starts, candidate, strict=True):
        r0, c0 = ref.history[0], cand.history[0]
        out["error"] = max(out["error"], abs(r0["error"] - c0["error"]))
        if "loss" in r0:
            out["loss"] = max(out["loss"], abs(r0["loss"] - c0["loss"]) / max(abs(r0["loss"]), 1e-8))
        obs = ref.rollout_batch.obs
        trained = _logits(ref, obs)
        change = float((trained - _logits(start, obs)).abs().max())
        out["logits"] = max(out["logits"], float((trained - _logits(cand, obs)).abs().max()) / max(change, 1e-12))
    return {k: v if math.isfinite(v) else math.inf for k, v in out.items()}


def run_checks(device: str) -> list[dict[str, Any]]:
    """Every check on ``device``: one row per (family, path) with the differences and whether they are within
    :data:`TOLERANCE`."""
    rows = []

    def check(family: str, path: str, reference: list[Any], starts: list[Any], candidate: list[Any],
              mode: str | None, t0: float) -> None:
        try:
            _train(candidate, mode)
            diff = compare(reference, starts, candidate)
            ok = all(diff[k] <= limit for k, limit in TOLERANCE.items())
            rows.append({"family": family, "path": path, **diff, "ok": ok, "seconds": time.perf_counter() - t0})
        except Exception as exc:  # noqa: BLE001 - a check that raises is a failed check, with its message
            rows.append({"family": family, "path": path, "ok": False, "seconds": time.perf_counter() - t0,
                         "error_message": f"{type(exc).__name__}: {exc}"})
        print(format_row(rows[-1]), flush=True)

    for family, make in FAMILIES.items():
        seeds = SEEDS if family in BATCHED else SEEDS[:1]
        cpu, starts = [make(s, "cpu", False) for s in seeds], [make(s, "cpu", False) for s in seeds]
        _train(cpu, None)
        t0 = time.perf_counter()
        check(family, "alone, host rollouts", cpu[:1], starts[:1], [make(seeds[0], device, False)], None, t0)
        if family in BATCHED:
            for mode in ("loop", "stacked"):
                t0 = time.perf_counter()
                check(family, f"SeedBatch {mode}, host rollouts", cpu, starts,
                      [make(s, device, False) for s in seeds], mode, t0)
            t0 = time.perf_counter()
            alone = [make(s, device, True) for s in seeds]
            try:
                _train(alone, None)
            except Exception as exc:  # noqa: BLE001
                rows.append({"family": family, "path": "alone, on-device rollouts", "ok": False, "seconds": 0.0,
                             "error_message": f"{type(exc).__name__}: {exc}"})
                print(format_row(rows[-1]), flush=True)
                continue
            check(family, "SeedBatch stacked, on-device rollouts vs alone on-device", alone, starts,
                  [make(s, device, True) for s in seeds], "stacked", t0)
    return rows


def per_seed_outcomes(records: list[dict[str, Any]], threshold: float = 0.01) -> dict[str, list[float]]:
    """Per-seed steps to ``threshold`` error (``inf``: never) and final error of finished run records."""
    from tpo_gym.evaluation.metrics import final_value, per_seed_steps_to_threshold

    failed = [r["spec"]["seed"] for r in records if r["status"] != "ok"]
    if failed:
        raise RuntimeError(f"runs of seeds {failed} failed: {records[0].get('traceback')}")
    length = max(len(r["rows"]) for r in records)
    curves = np.full((len(records), length), np.nan)
    for i, r in enumerate(records):
        curves[i, :len(r["rows"])] = [row["error"] for row in r["rows"]]
    return {"steps to 1%": per_seed_steps_to_threshold(curves, threshold).tolist(),
            "final error": final_value(curves).tolist()}


def distribution_checks(device: str, seeds: int, cpu_device: str = "cpu") -> list[dict[str, Any]]:
    """Whole runs of :data:`DISTRIBUTION` on ``cpu_device`` (one by one) and on ``device`` (one SeedBatch per
    method): one row per method and outcome with the two-sample test's verdict."""
    from tpo_gym.evaluation.distributions import compare_samples
    from tpo_gym.evaluation.experiments import execute_run, execute_runs
    from tpo_gym.evaluation.presets import load_preset

    preset = load_preset(DISTRIBUTION["preset"]).subset(settings=[DISTRIBUTION["setting"]],
                                                        methods=list(DISTRIBUTION["methods"]))
    rows = []
    for method in DISTRIBUTION["methods"]:
        t0 = time.perf_counter()
        specs = [r.to_dict() for r in preset.runs(seeds) if r.method == method]
        try:
            cpu = per_seed_outcomes([execute_run({**s, "device": cpu_device}) for s in specs])
            dev = per_seed_outcomes(execute_runs([{**s, "device": device} for s in specs]))
        except Exception as exc:  # noqa: BLE001 - a check that raises is a failed check, with its message
            rows.append({"family": f"distribution: {method}", "path": "whole runs", "ok": False,
                         "seconds": time.perf_counter() - t0, "error_message": f"{type(exc).__name__}: {exc}"})
            print(format_row(rows[-1]), flush=True)
            continue
        for outcome in cpu:
            result = compare_samples(outcome, cpu[outcome], dev[outcome], alpha=ALPHA)
            rows.append({"family": f"distribution: {method}", "path": outcome, "ok": result.same,
                         "seconds": time.perf_counter() - t0, "test": result.describe()})
            print(f"- {method}, {result.describe()}", flush=True)
    return rows


HEADER = ("| family | path | error diff | loss rel. diff | logits rel. diff | within tolerance | s |\n"
          "|---|---|---|---|---|---|---|")


def format_row(row: dict[str, Any]) -> str:
    """One markdown table row of :func:`run_checks`."""
    if "test" in row:
        return f"| {row['family']} | {row['path']} | {row['test']} | | | {'yes' if row['ok'] else 'NO'} | " \
               f"{row['seconds']:.1f} |"
    if "error_message" in row:
        return f"| {row['family']} | {row['path']} | {row['error_message']} | | | NO | {row['seconds']:.1f} |"
    return (f"| {row['family']} | {row['path']} | {row['error']:.2g} | {row['loss']:.2g} | {row['logits']:.2g} | "
            f"{'yes' if row['ok'] else 'NO'} | {row['seconds']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    """Print the table of every check on ``--device`` (against the CPU); exit status 1 when one fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the device checked against the CPU (default cuda)")
    parser.add_argument("--distribution-seeds", type=int, default=12,
                        help="seeds a side of the distribution check (default 12; 0 skips it)")
    parser.add_argument("--first-updates", action=argparse.BooleanOptionalAction, default=True,
                        help="run the first-update checks (default: yes)")
    args = parser.parse_args(argv)
    if args.distribution_seeds != 0 and args.distribution_seeds < 2:
        parser.error(f"--distribution-seeds must be 0 (skip) or >= 2, got {args.distribution_seeds}")
    torch.set_num_threads(1)
    if args.device.startswith("cuda"):
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(args.device)}")
    if use_synthetic_mnist_if_missing():
        print("MNIST data missing here: the MNIST checks use random images of MNIST's shape")
    rows = []
    if args.first_updates:
        print(f"tolerance: {TOLERANCE}\n\n{HEADER}", flush=True)
        rows += run_checks(args.device)
    if args.distribution_seeds:
        print(f"\nwhole runs as distributions ({DISTRIBUTION['preset']}: {DISTRIBUTION['setting']}, "
              f"{args.distribution_seeds} seeds a side, CPU vs {args.device}):", flush=True)
        rows += distribution_checks(args.device, args.distribution_seeds)
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} checks within tolerance"
          + (": FAILED " + "; ".join(f"{r['family']} / {r['path']}" for r in failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
