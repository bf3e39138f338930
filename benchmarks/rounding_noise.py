"""Rounding noise in the all-fail plateau, measured (issue 45; docs/method.md, "Rounding noise and what it means
for comparisons").

At iteration 0 of a Table 3 run (terminal exact-match reward, reverse copy, V=2, reference setup) nearly every
group fails, so a group method's true gradient is 0 where no group succeeds. This script runs that first iteration
for TPO, GRPO (beta 0.04) and GRPO without KL on seeds whose first batch has no success at all, and prints the
all-fail fraction, the first epoch's gradient norm (what is left is rounding: the rollout's and the update's
log-probs differ in the last bits) and how far the optimiser moved the parameters (largest absolute change). Then
it trains the same seed twice in child processes whose CPU kernels differ only in their vector ISA
(``ATEN_CPU_CAPABILITY=default`` and ``avx2``) and prints how far the two runs' attention key biases (whose gradient
is 0 in every update: softmax is invariant to them) and their errors are apart after N iterations. Run from the
repository root::

    .venv/bin/python benchmarks/rounding_noise.py --horizon 10 --iterations 12
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tpo_gym.evaluation.experiments import _make_env, make_agent  # noqa: E402
from tpo_gym.evaluation.presets import load_preset  # noqa: E402

METHODS = {"TPO": "TPO", "GRPO": "GRPO", "GRPO (no KL)": "GRPO (no KL)"}


def _agent(method: str, horizon: int, seed: int) -> Any:
    preset = load_preset("table3").subset(settings=[f"P H={horizon}"], methods=[method], setups=["reference"])
    spec = next(r for r in preset.runs(seed + 1) if r.seed == seed)
    p = spec.params
    return make_agent(spec.algo, _make_env(p["env_id"], p.get("env_kwargs", {})), seed, p, spec.method_kwargs)


def _flat(agent: Any) -> torch.Tensor:
    return torch.cat([q.detach().double().reshape(-1) for q in agent.policy.parameters()])


def _key_biases(agent: Any) -> torch.Tensor:
    return torch.cat([q.detach().double().reshape(-1) for name, q in agent.policy.named_parameters()
                      if name.endswith(".k.bias")] or [torch.zeros(0)])


def first_iteration(method: str, horizon: int, seed: int) -> dict[str, float]:
    agent = _agent(method, horizon, seed)
    before = _flat(agent)
    agent.learn(agent.steps_per_iteration)
    record = agent.history[0]
    return {"all_fail_fraction": float(record.get("all_fail_fraction", float("nan"))),
            "grad_norm": float(record["grad_norm"]), "moved": float((_flat(agent) - before).abs().max())}


def _train_and_dump(method: str, horizon: int, seed: int, iterations: int, path: str) -> None:
    agent = _agent(method, horizon, seed)
    agent.learn(iterations * agent.steps_per_iteration)
    Path(path).write_text(json.dumps({"biases": _key_biases(agent).tolist(),
                                      "errors": [r["error"] for r in agent.history]}))


def isa_drift(method: str, horizon: int, seed: int, iterations: int) -> tuple[float, float]:
    """Largest key-bias difference and largest error difference of two runs that differ only in the ISA."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for isa in ("default", "avx2"):
            path = str(Path(tmp, f"{isa}.json"))
            subprocess.run([sys.executable, __file__, "--dump", method, str(horizon), str(seed), str(iterations),
                            path], check=True, env={**os.environ, "ATEN_CPU_CAPABILITY": isa})
            runs.append(json.loads(Path(path).read_text()))
    biases = [torch.tensor(r["biases"]) for r in runs]
    errors = [torch.tensor(r["errors"]) for r in runs]
    return float((biases[0] - biases[1]).abs().max()), float((errors[0] - errors[1]).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3, help="seeds whose first iteration is measured")
    parser.add_argument("--iterations", type=int, default=12, help="iterations of the ISA drift")
    parser.add_argument("--dump", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.dump:
        method, horizon, seed, iterations, path = args.dump
        _train_and_dump(method, int(horizon), int(seed), int(iterations), path)
        return
    print(f"Table 3 P H={args.horizon}, reference setup, iteration 0 (largest |change| of any parameter):")
    for method in METHODS:
        for seed in range(args.seeds):
            r = first_iteration(method, args.horizon, seed)
            print(f"  {method:13s} seed {seed}: all-fail fraction {r['all_fail_fraction']:.2f}, "
                  f"first-epoch grad-norm {r['grad_norm']:.2g}, parameters moved by {r['moved']:.2g}", flush=True)
    print(f"the same seed with ATEN_CPU_CAPABILITY default vs avx2, after {args.iterations} iterations:")
    for method in METHODS:
        bias, error = isa_drift(method, args.horizon, 0, args.iterations)
        print(f"  {method:13s} key biases (zero true gradient) apart by {bias:.3g}, training error curves by "
              f"{error:.3g}", flush=True)


if __name__ == "__main__":
    main()
