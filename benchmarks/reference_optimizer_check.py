"""Check ReferenceMuon against optax.contrib.muon itself, on a transformer-shaped parameter tree.

tpo-gym's tests check :class:`tpo_gym.agents.policies.reference_setup.ReferenceMuon` against values computed
by hand from optax's formulas; this script compares it with the real ``optax.contrib.muon`` where
JAX and optax are installed (they are not tpo-gym dependencies). Two steps, two environments:

    # 1. in any Python with jax + optax (e.g. python -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install jax optax)
    /tmp/jaxenv/bin/python benchmarks/reference_optimizer_check.py jax /tmp/muon.npz
    # 2. in tpo-gym's environment
    .venv/bin/python benchmarks/reference_optimizer_check.py torch /tmp/muon.npz

Step 1 draws Flax-layout parameters (embeddings [n, d]; attention kernels [d, heads, d/heads] and
[heads, d/heads, d]; per-head biases [heads, d/heads]; dense kernels [in, out]; LayerNorm vectors) and
``--steps`` random gradients, runs ``optax.contrib.muon(learning_rate=1e-3)`` in float64 and saves
everything. Step 2 maps each parameter to its PyTorch layout (a dense kernel is a ``Linear`` weight
transposed, a per-head bias a flat vector), runs ReferenceMuon on the same gradients and prints the
largest difference per parameter after mapping back.
"""

from __future__ import annotations

import sys

import numpy as np

D, HEADS, VOCAB, LENGTH, FF = 8, 2, 3, 6, 32
#: name -> (Flax shape, layout in tpo-gym: "dense" / "embedding" / "heads" for Muon, "adam")
PARAMS: dict[str, tuple[tuple[int, ...], str]] = {
    "tok_emb": ((VOCAB, D), "embedding"),
    "pos_emb": ((LENGTH, D), "embedding"),
    "q_kernel": ((D, HEADS, D // HEADS), "adam"),
    "q_bias": ((HEADS, D // HEADS), "heads"),
    "out_kernel": ((HEADS, D // HEADS, D), "adam"),
    "out_bias": ((D,), "adam"),
    "ff1_kernel": ((D, FF), "dense"),
    "ff1_bias": ((FF,), "adam"),
    "ff2_kernel": ((FF, D), "dense"),
    "ln_scale": ((D,), "adam"),
    "head_kernel": ((D, VOCAB), "dense"),
}


def run_jax(path: str, steps: int = 3) -> None:
    import jax
    import optax

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    params = {k: rng.normal(size=shape) for k, (shape, _) in PARAMS.items()}
    grads = [{k: rng.normal(size=shape) for k, (shape, _) in PARAMS.items()} for _ in range(steps)]
    opt = optax.contrib.muon(learning_rate=1e-3)
    p = jax.tree.map(jax.numpy.asarray, params)
    state = opt.init(p)
    for g in grads:
        updates, state = opt.update(jax.tree.map(jax.numpy.asarray, g), state, p)
        p = optax.apply_updates(p, updates)
    out = {f"init/{k}": v for k, v in params.items()}
    out.update({f"final/{k}": np.asarray(v) for k, v in p.items()})
    for i, g in enumerate(grads):
        out.update({f"grad{i}/{k}": v for k, v in g.items()})
    out["steps"] = np.array(steps)
    np.savez(path, **out)
    print(f"optax {optax.__version__}, jax {jax.__version__}: wrote {path}")


def _to_torch(x: np.ndarray, layout: str, name: str) -> np.ndarray:
    if layout == "dense":
        return x.T
    if layout == "heads":
        return x.reshape(-1)
    if name.endswith("_kernel") and x.ndim == 3:  # attention kernels: any fixed layout (Adam is elementwise)
        return x.reshape(-1, x.shape[-1]) if name.startswith("out") else x.reshape(x.shape[0], -1)
    return x


def _from_torch(x: np.ndarray, layout: str, shape: tuple[int, ...]) -> np.ndarray:
    return x.T if layout == "dense" else x.reshape(shape)


def run_torch(path: str) -> float:
    import torch

    from tpo_gym.agents.policies.reference_setup import ReferenceMuon

    data = np.load(path)
    steps = int(data["steps"])
    tensors = {k: torch.nn.Parameter(torch.tensor(_to_torch(data[f"init/{k}"], lay, k).copy()))
               for k, (_, lay) in PARAMS.items()}
    muon = [k for k, (_, lay) in PARAMS.items() if lay != "adam"]
    adam = [k for k, (_, lay) in PARAMS.items() if lay == "adam"]
    layouts = [{"heads": f"heads:{HEADS}"}.get(PARAMS[k][1], PARAMS[k][1]) for k in muon]
    opt = ReferenceMuon([{"params": [tensors[k] for k in muon], "muon": True, "layouts": layouts},
                         {"params": [tensors[k] for k in adam], "muon": False}], lr=1e-3)
    for i in range(steps):
        for k, (_, lay) in PARAMS.items():
            tensors[k].grad = torch.tensor(_to_torch(data[f"grad{i}/{k}"], lay, k).copy())
        opt.step()
    worst = 0.0
    print(f"ReferenceMuon vs optax.contrib.muon after {steps} steps (float64), max |difference| per parameter:")
    for k, (shape, lay) in PARAMS.items():
        got = _from_torch(tensors[k].detach().numpy(), lay, shape)
        want = data[f"final/{k}"]
        moved = np.abs(want - data[f"init/{k}"]).max()
        diff = float(np.abs(got - want).max())
        worst = max(worst, diff)
        print(f"  {k:12s} {str(shape):12s} {lay:9s} diff {diff:.2e}  (moved {moved:.2e})")
    print(f"largest difference {worst:.2e}")
    return worst


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("jax", "torch"):
        raise SystemExit(__doc__)
    run_jax(sys.argv[2]) if sys.argv[1] == "jax" else run_torch(sys.argv[2])
