"""Golden histories: tiny training runs of every agent family, run in float64, every logged number stored.

``histories.json`` holds, per case, the agent's ``history`` (every record, floats as :meth:`float.hex`) and a
fingerprint of its final weights; :mod:`tests.golden.test_golden_histories` checks that the code reproduces them.

**Why float64.** A float32 run depends on the CPU kernels as well as on the code: the torch build, the vector ISA,
the thread count, even the CPU model within one ISA (MKL / oneDNN pick other kernels), and a difference in the 7th
digit grows through training. Worse, where the true gradient is 0 (an all-fail group), rounding noise of ~1e-7 is
all that is left and Adam / Muon normalise it into a full step. In float64 the rounding is ~1e-16 and below Adam's
epsilon, so every case depends on the code alone to about 1e-12 (measured: ``ATEN_CPU_CAPABILITY`` ``default`` /
``avx2`` / ``avx512`` x 1 / 2 threads agree to :data:`MEASURED_SPREAD`), and the test compares at
:data:`TOLERANCE`, a few orders above that spread and far below what a 1% change of the learning rate or of eta
moves (~1e-4 and more). So **one set holds on every machine**. Bit-exactness is checked only where it is defined:
the same run twice in one process, and save / load / continue (tests/agents).

Regenerate the file **only when behaviour is meant to change** (and say why in the commit), from the repository
root::

    .venv/bin/python -m tests.golden.histories

A new method's cases come from its spec (:func:`method_cases`); record only those, leaving every stored case as
it is::

    .venv/bin/python -m tests.golden.histories --only NAME

Cases: every family (TPO, GRPO, GroupPG, PPO, REINFORCE, DG, CE) on a token task at token and sequence level,
the single-sample variants (``candidates="single"``, ``baseline="expected"``), a tiny random language model on a
toy text env, a fake MNIST (random images: no data download), the reference setup, CartPole (same-seed groups of a
plain Gymnasium env), ``SeedBatch`` with looped and stacked forward / optimiser, and save, load and resume.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import platform
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import tpo_gym
from tpo_gym import CE, DG, GRPO, PPO, REINFORCE, TPO, GroupPG, train_seeds
from tpo_gym.agents import GroupAlgorithm
from tpo_gym.agents.common.registry import builtin_algorithms

PATH = pathlib.Path(__file__).with_name("histories.json")
TOKEN = "tpo_gym/TokenReversal-v0"
SMALL = {"policy_kwargs": {"d_model": 8, "d_ff": 16, "n_layers": 1}}
MLP = {"policy_kwargs": {"net_arch": [16]}}
ITERATIONS = 2


def _token_env() -> gym.Env[Any, Any]:
    return gym.make("tpo_gym/TokenTask-v0", target="reverse_copy", reward="bag", vocab_size=2, length=3)


@contextlib.contextmanager
def fake_mnist(n: int = 64) -> Iterator[None]:
    """Make ``tpo_gym/MNISTBandit-v0`` read ``n`` random images with random labels (seeded; no data files)."""
    from tpo_gym.envs import mnist_bandit

    rng = np.random.default_rng(0)
    images = rng.random((n, 784), dtype=np.float32)
    labels = rng.integers(0, 10, n).astype(np.int64)
    original = mnist_bandit.load_mnist
    mnist_bandit.load_mnist = lambda split, root=None: (images, labels)  # type: ignore[assignment]
    try:
        yield
    finally:
        mnist_bandit.load_mnist = original  # type: ignore[assignment]


def _mnist() -> gym.Env[Any, Any]:
    return gym.make("tpo_gym/MNISTBandit-v0")


def _train(cls: type[GroupAlgorithm], policy: str, env: Any, iterations: int = ITERATIONS,
           total_timesteps: int | None = None, **kwargs: Any) -> GroupAlgorithm:
    agent = cls(policy, env() if callable(env) else env, seed=0, **kwargs)
    agent.learn(iterations * agent.steps_per_iteration if total_timesteps is None else total_timesteps)
    return agent


def _text(cls: type[GroupAlgorithm], **kwargs: Any) -> GroupAlgorithm:
    from tests.agents.lm_toys import lm_kwargs, say_letter_env

    agent = cls("CausalLMPolicy", say_letter_env(), seed=0, batch_size=2, group_size=3, n_epochs=2,
                policy_kwargs=lm_kwargs(dtype="float64"), **kwargs)
    agent.learn(ITERATIONS * agent.steps_per_iteration)
    return agent


def _seed_batch(mode: str) -> list[GroupAlgorithm]:
    kwargs = {"level": "token", "batch_size": 6, "group_size": 3, **SMALL}
    steps = TPO("TransformerPolicy", TOKEN, **kwargs).steps_per_iteration
    return train_seeds(TPO, "TransformerPolicy", TOKEN, [0, 1], ITERATIONS * steps, forward=mode, optimizer=mode,
                       **kwargs)


def _save_load_resume() -> GroupAlgorithm:
    agent = _train(GRPO, "TransformerPolicy", TOKEN, level="token", batch_size=6, group_size=3, **SMALL)
    buffer = io.BytesIO()
    agent.save(buffer)
    buffer.seek(0)
    loaded = GroupAlgorithm.load(buffer, env=TOKEN)
    loaded.learn(ITERATIONS * loaded.steps_per_iteration, reset_num_timesteps=False)
    return loaded


_TOKEN_GROUP = {"batch_size": 6, "group_size": 3, "n_epochs": 2, **SMALL}
_TOKEN_SINGLE = {"batch_size": 8, "n_epochs": 2, **SMALL}
_MNIST = {"batch_size": 16, **MLP}
_REFERENCE = {**_TOKEN_GROUP, "policy_kwargs": {**SMALL["policy_kwargs"], "setup": "reference"}}

def method_cases(algorithms: dict[str, type[GroupAlgorithm]]) -> dict[str, Callable[[], list[GroupAlgorithm]]]:
    """Each method's own cases, read from its spec (no list to edit when a method is added): a group method at each
    of its levels on the token task (``TPO_token``, ``TPO_sequence``), a single-sample method once
    (``PPO_token``), the oracle on a small MLP (``CE_token``), and a method that runs language models on a tiny
    random one (``TPO_text``)."""
    cases: dict[str, Callable[[], list[GroupAlgorithm]]] = {}
    for name, cls in algorithms.items():
        spec = cls.spec  # type: ignore[attr-defined]
        if spec.sampling == "group":
            for level in [lv for lv in ("token", "sequence") if lv in spec.levels] or ["token"]:
                kwargs = {"level": level} if level in spec.levels else {}
                cases[f"{name}_{level}"] = lambda cls=cls, kwargs=kwargs: [
                    _train(cls, "TransformerPolicy", TOKEN, **kwargs, **_TOKEN_GROUP)]
        elif spec.sampling == "single":
            cases[f"{name}_token"] = lambda cls=cls: [_train(cls, "TransformerPolicy", TOKEN, **_TOKEN_SINGLE)]
        else:
            cases[f"{name}_token"] = lambda cls=cls: [_train(cls, "MlpPolicy", _token_env, batch_size=8, **MLP)]
        if "llm" in spec.run_kinds:
            cases[f"{name}_text"] = lambda cls=cls: [_text(cls)]
    return cases


#: The variants beyond each method's own cases: options, env kinds, the reference setup, ``SeedBatch``, resume.
VARIANTS: dict[str, Callable[[], list[GroupAlgorithm]]] = {
    "TPO_no_anchor_token": lambda: [_train(TPO, "TransformerPolicy", TOKEN, level="token", anchor=False,
                                           **_TOKEN_GROUP)],
    "GRPO_zv_masked_sequence": lambda: [_train(GRPO, "TransformerPolicy", TOKEN, level="sequence",
                                               mask_zero_variance=True, **_TOKEN_GROUP)],
    # the reference code's setup (ReferenceMuon, Flax initialisation): the setup of the committed paper tables
    "TPO_token_reference": lambda: [_train(TPO, "TransformerPolicy", TOKEN, level="token", **_REFERENCE)],
    "GRPO_sequence_reference": lambda: [_train(GRPO, "TransformerPolicy", TOKEN, level="sequence", **_REFERENCE)],
    "PPO_interaction": lambda: [_train(PPO, "TransformerPolicy", TOKEN, budget="interaction", group_size=2,
                                       **_TOKEN_SINGLE)],
    "REINFORCE_standardized": lambda: [_train(REINFORCE, "MlpPolicy", _token_env, baseline="standardized",
                                              batch_size=8, **MLP)],
    "TPO_single_bandit": lambda: [_train(TPO, "MlpPolicy", "tpo_gym/Bandit-v0", candidates="single", batch_size=8,
                                         **MLP)],
    "TPO_single_mnist": lambda: [_train(TPO, "MlpPolicy", _mnist, candidates="single", **_MNIST)],
    "GroupPG_single_mnist": lambda: [_train(GroupPG, "MlpPolicy", _mnist, candidates="single", **_MNIST)],
    "REINFORCE_expected_mnist": lambda: [_train(REINFORCE, "MlpPolicy", _mnist, baseline="expected", **_MNIST)],
    "DG_expected_mnist": lambda: [_train(DG, "MlpPolicy", _mnist, baseline="expected", **_MNIST)],
    "CE_mnist": lambda: [_train(CE, "MlpPolicy", _mnist, **_MNIST)],
    "TPO_token_mnist": lambda: [_train(TPO, "MlpPolicy", _mnist, group_size=3, **_MNIST)],
    # CartPole's episodes vary in length, so it has no steps_per_iteration before an iteration: the env steps these
    # cases were recorded with (2 x rollouts x 500: the upper bound the property returned before issue 34)
    "TPO_cartpole": lambda: [_train(TPO, "MlpPolicy", "CartPole-v1", batch_size=2, group_size=3,
                                    total_timesteps=6000, **MLP)],
    "GRPO_cartpole": lambda: [_train(GRPO, "MlpPolicy", "CartPole-v1", batch_size=2, group_size=3,
                                     total_timesteps=6000, **MLP)],
    "PPO_cartpole": lambda: [_train(PPO, "MlpPolicy", "CartPole-v1", batch_size=3, total_timesteps=3000, **MLP)],
    "TPO_text_kl": lambda: [_text(TPO, beta=0.1)],
    "SeedBatch_loop": lambda: _seed_batch("loop"),
    "SeedBatch_stacked": lambda: _seed_batch("stacked"),
    "save_load_resume": lambda: [_save_load_resume()],
}
#: Which method each variant runs (the logged-keys test reads it).
VARIANT_METHODS = {name: "TPO" if name.startswith("SeedBatch") else "GRPO" if name == "save_load_resume"
                   else name.split("_")[0] for name in VARIANTS}

#: name -> zero-argument function returning the trained agents of the case: every built-in method's own cases
#: (:func:`method_cases`, from the registry), then the variants.
CASES: dict[str, Callable[[], list[GroupAlgorithm]]] = {**method_cases(builtin_algorithms()), **VARIANTS}


def case_method(case: str) -> str:
    """The method a case trains."""
    return VARIANT_METHODS.get(case) or case.rsplit("_", 1)[0]


def _exact(value: Any) -> Any:
    """A history value as JSON that keeps it exactly: ints as ints, floats as :meth:`float.hex`."""
    if isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value.hex()
    raise TypeError(f"history value {value!r} of type {type(value).__name__} is not a number")


def weights_fingerprint(agent: GroupAlgorithm) -> list[str]:
    """Sum and sum of squares of every trained parameter, in float64, as hex (a cheap exact weight check)."""
    flat = torch.cat([p.detach().double().reshape(-1) for p in agent.policy.parameters() if p.requires_grad])
    return [float(flat.sum()).hex(), float(flat.pow(2).sum()).hex()]


def record(agents: list[GroupAlgorithm]) -> list[dict[str, Any]]:
    """Every history record of every agent, exactly, with the weights' fingerprint."""
    return [{"history": [{k: _exact(v) for k, v in r.items()} for r in a.history],
             "weights": weights_fingerprint(a)} for a in agents]


@contextlib.contextmanager
def muon_in_working_dtype() -> Iterator[None]:
    """Let Muon's Newton-Schulz run in the gradient's dtype (float64 here) instead of bfloat16.

    ``torch.optim.Muon`` (and :func:`~tpo_gym.agents.policies.stacked_optim.stacked_newton_schulz`, its seed-stacked
    twin) orthogonalise in bfloat16, whose matmuls round differently on CPUs with and without AVX512-BF16 / AMX: one
    flipped bfloat16 rounding moved a golden history by 3e-4. That is torch's kernel, not this library's code, so
    the golden runs orthogonalise with the same iteration in float64 (the same function, ``dtype=None``).
    """
    from torch.optim import _muon

    from tpo_gym.agents import stacked_optim

    if not hasattr(_muon, "_zeropower_via_newtonschulz"):
        raise RuntimeError("torch.optim._muon._zeropower_via_newtonschulz is gone: update "
                           "tests.golden.histories.muon_in_working_dtype for this torch")
    originals = _muon._zeropower_via_newtonschulz, stacked_optim.stacked_newton_schulz

    def single(grad: torch.Tensor, coefficients: Any, steps: int, eps: float) -> torch.Tensor:
        return originals[1](grad[None], coefficients, steps, eps, dtype=None)[0]

    def stacked(g: torch.Tensor, coefficients: Any, steps: int, eps: float, dtype: Any = None) -> torch.Tensor:
        return originals[1](g, coefficients, steps, eps, dtype=None)

    _muon._zeropower_via_newtonschulz, stacked_optim.stacked_newton_schulz = single, stacked
    try:
        yield
    finally:
        _muon._zeropower_via_newtonschulz, stacked_optim.stacked_newton_schulz = originals


def run_case(name: str) -> list[dict[str, Any]]:
    """Run one case on CPU in float64 (the default dtype while it runs, Muon included: :func:`muon_in_working_dtype`)
    and return what :func:`record` stores."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with fake_mnist(), muon_in_working_dtype():
            return record(CASES[name]())
    finally:
        torch.set_default_dtype(previous)


def hex_to_float(value: Any) -> Any:
    """The inverse of :func:`_exact` (for readable failure messages)."""
    return float.fromhex(value) if isinstance(value, str) else value


#: The largest relative difference between any two of six recordings of every case (``ATEN_CPU_CAPABILITY``
#: ``default``, ``avx2``, ``avx512``, each with 1 and 2 threads, on an AMD EPYC with AVX-512), numbers near 0
#: counted absolutely (see ``benchmarks/golden_spread.py``, which measures it again)
MEASURED_SPREAD = 5e-12
#: math.isclose's tolerances of the comparison: far above :data:`MEASURED_SPREAD`, far below a 1% change of the
#: learning rate or of eta (the golden tests' own sensitivity test shows both fail)
TOLERANCE = {"rel_tol": 1e-8, "abs_tol": 1e-10}


def machine() -> str:
    """Where a set was recorded (for the file's record only: the comparison does not depend on it)."""
    return f"torch {torch.__version__} {platform.machine()} {torch.backends.cpu.get_cpu_capability()}"


def load_cases(path: pathlib.Path = PATH) -> dict[str, Any]:
    """The stored golden cases: case name -> what :func:`record` stored."""
    cases: dict[str, Any] = json.loads(path.read_text())["cases"]
    return cases


def record_all() -> dict[str, Any]:
    """Every case, recorded on this machine."""
    return {name: run_case(name) for name in sorted(CASES)}


def main(argv: list[str] | None = None) -> None:
    """Regenerate ``histories.json`` from the code as it stands (only when behaviour is meant to change)."""
    parser = argparse.ArgumentParser(prog="python -m tests.golden.histories", description=main.__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=PATH, help="where to write (default: %(default)s)")
    parser.add_argument("--only", metavar="NAME", action="append", default=[],
                        help="record only the cases of this method (e.g. LPO: LPO_token, LPO_sequence, ...) or this "
                             "case, keeping every other stored case as it is (a new method's cases; repeatable)")
    args = parser.parse_args(argv)
    if args.only:
        chosen = sorted(c for c in CASES if c in args.only or case_method(c) in args.only)
        if not chosen:
            parser.error(f"--only {args.only}: no such method or case; cases: {', '.join(sorted(CASES))}")
        cases = {**load_cases(args.out), **{name: run_case(name) for name in chosen}}
        cases = {name: cases[name] for name in sorted(cases)}
    else:
        cases = record_all()
    args.out.write_text(json.dumps({"tpo_gym": tpo_gym.__version__, "recorded_on": machine(), "dtype": "float64",
                                    "cases": cases}, indent=1) + "\n")
    n = sum(len(r["history"]) for runs in cases.values() for r in runs)
    print(f"wrote {args.out}: {len(cases)} cases, {n} records (float64, recorded on {machine()})")


if __name__ == "__main__":
    main()
