"""CUDA against the CPU on tiny configurations of every agent family: the same first iterations to float tolerance.

Each check trains two tiny agents of one seed for two iterations, one on the CPU and one on the device
(``--device``), and compares them: iteration 0's training error (the same draws: identical), its loss
(relative difference), and the trained policies' logits on the CPU agent's last batch (the largest
difference relative to the largest change training made to the CPU agent's logits: the function, not
the weights, since Muon turns a parameter's zero gradient, such as an attention key bias's, into a step
of full size in the direction of its rounding noise). Sampling is the one thing that cannot match across devices
(a CUDA generator draws other numbers than a CPU one), so each comparison keeps the draws on one side:

* ``host rollouts``: the device agent rolls out in the numpy envs (``rollouts_on_device=False``: draws
  from a CPU generator on the logits brought back), the CPU agent likewise: every family (token- and
  sequence-level group methods, single-sample methods, MNIST, the reference setup's transformer and
  ReferenceMuon), and a :class:`~tpo_gym.SeedBatch` of three seeds on the device, loop and stacked
  (forward and optimiser), against the same seeds trained alone on the CPU;
* ``on-device rollouts``: the stacked rollout of a SeedBatch against the same seeds trained alone with
  on-device rollouts, both on the device (the batches agree to float rounding).

    python benchmarks/gpu_checks.py --device cuda     # prints the table; exit status 1 if a check fails

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
#: Largest allowed difference: iteration 0's error (the same draws), its loss (relative), the logits after
#: two updates (relative to the CPU agent's largest change; Muon's Newton-Schulz runs in bfloat16).
TOLERANCE = {"error": 1e-6, "loss": 1e-4, "logits": 5e-2}
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
            ok = all(diff[k] <= TOLERANCE[k] for k in TOLERANCE)
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


HEADER = ("| family | path | error diff | loss rel. diff | logits rel. diff | within tolerance | s |\n"
          "|---|---|---|---|---|---|---|")


def format_row(row: dict[str, Any]) -> str:
    """One markdown table row of :func:`run_checks`."""
    if "error_message" in row:
        return f"| {row['family']} | {row['path']} | {row['error_message']} | | | NO | {row['seconds']:.1f} |"
    return (f"| {row['family']} | {row['path']} | {row['error']:.2g} | {row['loss']:.2g} | {row['logits']:.2g} | "
            f"{'yes' if row['ok'] else 'NO'} | {row['seconds']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    """Print the table of every check on ``--device`` (against the CPU); exit status 1 when one fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the device checked against the CPU (default cuda)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.device.startswith("cuda"):
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(args.device)}")
    if use_synthetic_mnist_if_missing():
        print("MNIST data missing here: the MNIST checks use random images of MNIST's shape")
    print(f"tolerance: {TOLERANCE}\n\n{HEADER}", flush=True)
    rows = run_checks(args.device)
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} checks within tolerance"
          + (": FAILED " + "; ".join(f"{r['family']} / {r['path']}" for r in failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
