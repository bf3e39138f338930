"""Golden histories: tiny training runs of every agent family whose every logged number is stored exactly.

``histories.json`` holds, per case, the agent's ``history`` (every record, floats as :meth:`float.hex`) and a
fingerprint of its final weights; :mod:`tests.golden.test_golden_histories` checks that the code reproduces
them bit for bit on CPU. The last bits of a float32 run depend on the CPU kernels as well as on the code: the torch
build, the architecture and the widest vector ISA that ATen, MKL and oneDNN use (an AVX-512 and an AVX2 machine
differ from the 7th significant digit on). So the file holds one **set per kernel signature**
(:func:`kernel_signature`, e.g. ``torch 2.14.1+cu130 x86_64 AVX512``), and the test compares bit for bit against
the set of the machine it runs on. Regenerate the file **only when behaviour is meant to change** (and say why in
the commit), from the repository root::

    .venv/bin/python -m tests.golden.histories

which records this machine's set and, on x86_64, the set of every narrower ISA it can emulate
(:data:`NARROWER_ISAS`: an AVX-512 machine records AVX2 too), and drops sets it cannot re-record (stale once
behaviour changed). ``--keep-others`` keeps them instead, to add this machine's set to a file recorded elsewhere
from the same code.

Cases: every family (TPO, GRPO, GroupPG, PPO, REINFORCE, DG, CE) on a token task at token and sequence level,
the single-sample variants (``candidates="single"``, ``baseline="expected"``), a tiny random language model on a
toy text env, a fake MNIST (random images: no data download), CartPole (same-seed groups of a plain Gymnasium
env), ``SeedBatch`` with looped and stacked forward / optimiser, and save, load and resume.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import tpo_gym
from tpo_gym import CE, DG, GRPO, PPO, REINFORCE, TPO, GroupPG, train_seeds
from tpo_gym.agents import GroupAlgorithm

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
                policy_kwargs=lm_kwargs(), **kwargs)
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

#: name -> zero-argument function returning the trained agents of the case.
CASES: dict[str, Callable[[], list[GroupAlgorithm]]] = {
    **{f"{cls.__name__}_{level}": (lambda cls=cls, level=level: [
        _train(cls, "TransformerPolicy", TOKEN, level=level, **_TOKEN_GROUP)])
       for cls in (TPO, GRPO, GroupPG) for level in ("token", "sequence")},
    "TPO_no_anchor_token": lambda: [_train(TPO, "TransformerPolicy", TOKEN, level="token", anchor=False,
                                           **_TOKEN_GROUP)],
    "GRPO_zv_masked_sequence": lambda: [_train(GRPO, "TransformerPolicy", TOKEN, level="sequence",
                                               mask_zero_variance=True, **_TOKEN_GROUP)],
    "PPO_token": lambda: [_train(PPO, "TransformerPolicy", TOKEN, **_TOKEN_SINGLE)],
    "PPO_interaction": lambda: [_train(PPO, "TransformerPolicy", TOKEN, budget="interaction", group_size=2,
                                       **_TOKEN_SINGLE)],
    "REINFORCE_token": lambda: [_train(REINFORCE, "TransformerPolicy", TOKEN, **_TOKEN_SINGLE)],
    "REINFORCE_standardized": lambda: [_train(REINFORCE, "MlpPolicy", _token_env, baseline="standardized",
                                              batch_size=8, **MLP)],
    "DG_token": lambda: [_train(DG, "TransformerPolicy", TOKEN, **_TOKEN_SINGLE)],
    "CE_token": lambda: [_train(CE, "MlpPolicy", _token_env, batch_size=8, **MLP)],
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
    "TPO_text": lambda: [_text(TPO)],
    "TPO_text_kl": lambda: [_text(TPO, beta=0.1)],
    "GRPO_text": lambda: [_text(GRPO)],
    "GroupPG_text": lambda: [_text(GroupPG)],
    "SeedBatch_loop": lambda: _seed_batch("loop"),
    "SeedBatch_stacked": lambda: _seed_batch("stacked"),
    "save_load_resume": lambda: [_save_load_resume()],
}


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


def run_case(name: str) -> list[dict[str, Any]]:
    """Run one case on CPU, one thread, and return what :func:`record` stores for it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with fake_mnist():
            return record(CASES[name]())
    finally:
        torch.set_num_threads(previous)


def hex_to_float(value: Any) -> Any:
    """The inverse of :func:`_exact` (for readable failure messages)."""
    return float.fromhex(value) if isinstance(value, str) else value


#: Environment variables that cap ATen's, MKL's and oneDNN's kernels at a narrower vector ISA, so that a machine
#: with a wider one records the golden set of a machine without it (x86_64; the AVX2 set recorded this way on an
#: AVX-512 machine matched a real AVX2 machine's failing CI values digit for digit).
NARROWER_ISAS: dict[str, dict[str, str]] = {
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
_ISA_ORDER = ["DEFAULT", "AVX2", "AVX512"]


def kernel_signature() -> str:
    """What the exact bits of a CPU run depend on besides the code: torch build, architecture, vector ISA in use."""
    return f"torch {torch.__version__} {platform.machine()} {torch.backends.cpu.get_cpu_capability()}"


def load_sets(path: pathlib.Path = PATH) -> dict[str, dict[str, Any]]:
    """The stored golden sets: kernel signature -> case name -> what :func:`record` stored."""
    return {signature: entry["cases"] for signature, entry in json.loads(path.read_text())["sets"].items()}


def _this_machines_set() -> dict[str, Any]:
    return {"tpo_gym": tpo_gym.__version__, "cases": {name: run_case(name) for name in sorted(CASES)}}


def _emulated_set(isa: str) -> tuple[str, dict[str, Any]]:
    """Record the set of a narrower ISA in a child process whose kernels are capped at it."""
    env = {**os.environ, **NARROWER_ISAS[isa], "PYTHONPATH": os.pathsep.join(
        filter(None, [str(PATH.parents[2]), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp, "set.json")
        subprocess.run([sys.executable, "-m", "tests.golden.histories", "--write-set", str(out)], env=env,
                       check=True, cwd=PATH.parents[2])
        entry = json.loads(out.read_text())
    return entry.pop("signature"), entry


def main(argv: list[str] | None = None) -> None:
    """Regenerate ``histories.json`` from the code as it stands (only when behaviour is meant to change)."""
    parser = argparse.ArgumentParser(prog="python -m tests.golden.histories", description=main.__doc__)
    parser.add_argument("--keep-others", action="store_true",
                        help="keep the stored sets of kernel signatures this machine cannot record")
    parser.add_argument("--write-set", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write_set is not None:
        args.write_set.write_text(json.dumps({"signature": kernel_signature(), **_this_machines_set()}))
        return
    sets = json.loads(PATH.read_text())["sets"] if args.keep_others and PATH.exists() else {}
    sets[kernel_signature()] = _this_machines_set()
    native = torch.backends.cpu.get_cpu_capability()
    if platform.machine() in ("x86_64", "AMD64") and native in _ISA_ORDER:
        for isa in NARROWER_ISAS:
            if _ISA_ORDER.index(isa) < _ISA_ORDER.index(native):
                signature, entry = _emulated_set(isa)
                sets[signature] = entry
    PATH.write_text(json.dumps({"sets": dict(sorted(sets.items()))}, indent=1) + "\n")
    n = sum(len(r["history"]) for runs in sets[kernel_signature()]["cases"].values() for r in runs)
    print(f"wrote {PATH}: {len(CASES)} cases, {n} records, for {', '.join(sorted(sets))}")


if __name__ == "__main__":
    main()
