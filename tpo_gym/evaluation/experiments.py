"""Run kinds: the one place that maps a run spec to the experiment function that executes it.

A run spec (:class:`tpo_gym.evaluation.presets.RunSpec`, as a dict) names a ``kind``, an ``algo``
(an agent class: a registered name, ``module:Class`` or a name published by an installed package), a
``seed``, the setting's ``params`` and the method's ``method_kwargs``.
:func:`execute_run` runs it and returns a *run record*; it never raises: a crash becomes a
``"failed"`` record holding the traceback.

Kinds
-----
``tabular_single`` / ``tabular_multi``
    :func:`tpo_gym.evaluation.tabular.single_context_bandit` / ``multi_context_bandit``;
    ``params`` are that function's keyword arguments; logged rows ``step, error, misalignment``.
``token``
    an agent on a token task: ``params = {"env_id", "env_kwargs", "episodes", "policy"?,
    "agent_kwargs", "setup"?}``; ``learn(episodes * model.steps_per_iteration)``; rows are
    ``model.history`` (``step`` = 0-indexed iteration = paper episode, ``error`` = 1 - mean
    training reward, and the agent's diagnostics).
``mnist``
    an agent on ``tpo_gym/MNISTBandit-v0``: ``params = {"steps", "eval_every", "agent_kwargs",
    "policy"?}``; rows every ``eval_every`` steps with ``test_error`` (greedy argmax on the 10k test
    set) and ``error`` (training error, mean over the last ``eval_every`` iterations).
``gym``
    an agent (or a Stable-Baselines3 algorithm) on a plain Gymnasium env, e.g. ``Pendulum-v1`` with Box actions:
    ``params = {"env_id", "env_kwargs"?, "steps", "window", "agent_kwargs"?, "policy"?}``: ``steps`` env steps;
    rows every ``window`` env steps with ``return``, the mean training return (:mod:`~tpo_gym.evaluation.gym_runs`).
"""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from collections.abc import Callable
from typing import Any

from tpo_gym.evaluation._run_envs import greedy_error, make_env

__all__ = ["RUN_KINDS", "methods_for_kind", "execute_run", "make_agent", "held_out_scores"]



def methods_for_kind(kind: str) -> tuple[str, ...]:
    """The ``algo`` names a run kind accepts: the registered algorithms that declare it
    (:attr:`~tpo_gym.agents.common.registry.AlgorithmSpec.run_kinds`)."""
    from tpo_gym.agents.common.registry import algorithm_registry

    if kind not in RUN_KINDS:
        raise KeyError(f"unknown run kind {kind!r}")
    return tuple(name for name, spec in algorithm_registry().items() if kind in spec.run_kinds)


def __getattr__(name: str) -> Any:
    """``AGENT_ALGOS``: every registered algorithm's name (read from the registry when asked)."""
    if name == "AGENT_ALGOS":
        from tpo_gym.agents.common.registry import algorithm_registry

        return tuple(algorithm_registry())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tabular_name(algo: str) -> str:
    from tpo_gym.agents.common.registry import resolve_algorithm

    name = resolve_algorithm(algo).spec.tabular
    if name is None:
        raise ValueError(f"{algo} has no tabular version")
    return name


def _limit_threads() -> None:
    """One thread per run: runs are the unit of parallelism."""
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def _run_tabular_single(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from tpo_gym.evaluation.tabular import single_context_bandit

    return single_context_bandit(_tabular_name(spec["algo"]), spec["seed"], **spec["params"],
                                 **spec["method_kwargs"])


def _run_tabular_multi(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from tpo_gym.evaluation.tabular import multi_context_bandit

    return multi_context_bandit(_tabular_name(spec["algo"]), spec["seed"], **spec["params"],
                                **spec["method_kwargs"])


#: Policy of each agent run kind unless the setting's ``params["policy"]`` names another.
DEFAULT_POLICY = {"token": "TransformerPolicy", "mnist": "MlpPolicy", "llm": "CausalLMPolicy", "gym": "MlpPolicy"}


def make_agent(
    algo: str, env: Any, seed: int, params: dict[str, Any], method_kwargs: dict[str, Any], kind: str = "token",
    device: str = "cpu",
) -> Any:
    """Build the agent of one run: the single mapping from preset data to agent arguments.

    ``params["agent_kwargs"]`` (the setting's shared arguments: batch size, group size, budget,
    learning rate ...) are updated with the method's ``method_kwargs`` and passed to the agent
    class ``algo`` names (:func:`~tpo_gym.agents.common.registry.resolve_algorithm`: a registered name,
    ``module:Class``, a name in ``$TPO_GYM_ALGORITHMS`` or an installed package's entry point); ``params["policy"]``
    (default :data:`DEFAULT_POLICY` of the kind) is
    its policy argument. ``env`` is a Gymnasium env instance. ``policy_kwargs`` of the two are merged
    key by key (a method can add ``{"setup": "reference"}`` to the setting's policy settings).
    ``params["setup"]`` (the key the tabular kinds take, so one preset setup can name it for every kind)
    is the policy's ``setup`` unless ``policy_kwargs`` name one.
    """
    from tpo_gym.agents.common.registry import resolve_algorithm

    cls = resolve_algorithm(algo)
    shared = params.get("agent_kwargs", {})
    kwargs = {**shared, **method_kwargs}
    if "policy_kwargs" in shared and "policy_kwargs" in method_kwargs:
        kwargs["policy_kwargs"] = {**shared["policy_kwargs"], **method_kwargs["policy_kwargs"]}
    if "setup" in params:
        kwargs["policy_kwargs"] = {"setup": params["setup"], **kwargs.get("policy_kwargs", {})}
    return cls(params.get("policy", DEFAULT_POLICY[kind]), env, seed=seed, device=device, **kwargs)


def _history_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for h in history:
        row: dict[str, Any] = {"step": int(h["iteration"])}
        for k, v in h.items():
            if k != "iteration" and isinstance(v, int | float) and not isinstance(v, bool):
                row[k] = v if isinstance(v, int) else float(v)
        rows.append(row)
    return rows


def _learn_together(models: list[Any], total_timesteps: int, reset_num_timesteps: bool = True) -> None:
    """``learn`` of one agent, or of S seeds of one method x setting in a :class:`~tpo_gym.agents.SeedBatch`."""
    if len(models) == 1:
        models[0].learn(total_timesteps, reset_num_timesteps=reset_num_timesteps)
        return
    from tpo_gym.agents.common.seed_batch import SeedBatch

    SeedBatch(models).learn(total_timesteps, reset_num_timesteps=reset_num_timesteps)


def _run_token_seeds(specs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    p = specs[0]["params"]
    models = [make_agent(s["algo"], make_env(p["env_id"], p.get("env_kwargs", {})), s["seed"], p,
                         s["method_kwargs"], kind="token", device=s.get("device", "cpu")) for s in specs]
    _learn_together(models, int(p["episodes"]) * int(models[0].steps_per_iteration))
    return [_history_rows(m.history) for m in models]


def _run_token(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return _run_token_seeds([spec])[0]


def _run_gym(spec: dict[str, Any], sb3_class: type | None) -> list[dict[str, Any]]:
    from tpo_gym.evaluation.gym_runs import run_gym

    return run_gym(spec, sb3_class, make_agent)


def _run_mnist_seeds(specs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    import numpy as np

    from tpo_gym.envs.mnist_data import load_mnist

    p = specs[0]["params"]
    steps, every = int(p["steps"]), int(p.get("eval_every", 200))
    test_x, test_y = load_mnist("test")
    models = [make_agent(s["algo"], make_env("tpo_gym/MNISTBandit-v0", {"split": "train", **p.get("env_kwargs", {})}),
                         s["seed"], p, s["method_kwargs"], kind="mnist", device=s.get("device", "cpu"))
              for s in specs]
    rows = [[{"step": 0, "test_error": greedy_error(m, test_x, test_y)}] for m in models]
    done = 0
    while done < steps:
        chunk = min(every, steps - done)
        _learn_together(models, chunk * int(models[0].steps_per_iteration), reset_num_timesteps=False)
        done += chunk
        for model, seed_rows in zip(models, rows, strict=True):
            train = [h["error"] for h in model.history[-chunk:]]
            seed_rows.append({"step": done, "test_error": greedy_error(model, test_x, test_y),
                              "error": float(np.mean(train))})
    return rows


def _run_mnist(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return _run_mnist_seeds([spec])[0]


def held_out_scores(model: Any, env: Any, n: int) -> dict[str, float]:
    """Greedy completions of the first ``n`` entries of the held-out env: mean score and exact (= 1) rate.

    ``model`` is a language-model agent (``CausalLMPolicy``), ``env`` a ``ReasoningGym-v0``-like env whose
    ``reset(options={"index": i})`` shows entry ``i``; each completion is scored by ``env.unwrapped.score_candidates``.
    Returns ``{"test_score": mean score, "test_accuracy": fraction of scores >= 1}``.
    """
    import numpy as np

    items, scores = [], []
    for i in range(n):
        _, info = env.reset(options={"index": i})
        items.append({"question": info["question"], "system_prompt": info["system_prompt"]})
    completions, _ = model.predict(items, deterministic=True)
    for i, completion in enumerate(completions):
        env.reset(options={"index": i})
        scores.append(float(env.unwrapped.score_candidates([str(completion)])[0]))
    return {"test_score": float(np.mean(scores)), "test_accuracy": float(np.mean(np.asarray(scores) >= 1.0))}


def _run_llm(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A language-model agent on ``tpo_gym/ReasoningGym-v0``; checkpointed, resumes where it stopped.

    ``params``: ``env_kwargs`` (dataset, size, seed, dataset config), ``steps`` (iterations),
    ``eval_every`` and ``eval_size`` (held-out questions: the same dataset with seed ``test_seed``),
    ``agent_kwargs``, ``policy_kwargs`` (model, prompt format, ...), ``checkpoint_every``. Rows: one per
    iteration (``step``, ``error`` = 1 - train mean score, ``mean_score``, diagnostics), plus
    ``test_score`` / ``test_accuracy`` every ``eval_every`` iterations (step 0 = the base model).
    With ``spec["checkpoint_dir"]`` (set by the runner) the agent and its rows are saved there every
    ``checkpoint_every`` iterations and a rerun of the same command continues from the last one.
    """
    from pathlib import Path

    import gymnasium as gym

    import tpo_gym  # noqa: F401
    from tpo_gym.agents.common.registry import resolve_algorithm
    from tpo_gym.evaluation._io import atomic_write_json, read_json

    p = spec["params"]
    steps, every = int(p["steps"]), int(p.get("eval_every", 10))
    save_every = int(p.get("checkpoint_every", every))
    env_kwargs = dict(p.get("env_kwargs", {}))
    env = gym.make("tpo_gym/ReasoningGym-v0", **env_kwargs)
    test_kwargs = {**env_kwargs, "seed": int(p.get("test_seed", int(env_kwargs.get("seed", 0)) + 10_007)),
                   "size": int(p.get("eval_size", 32))}
    test_env = gym.make("tpo_gym/ReasoningGym-v0", **test_kwargs)
    eval_size = int(p.get("eval_size", 32))
    ckpt = Path(spec["checkpoint_dir"]) if spec.get("checkpoint_dir") else None
    cls = resolve_algorithm(spec["algo"])
    if ckpt is not None and (ckpt / "rows.json").is_file() and (ckpt / "agent").is_dir():
        pk = p.get("policy_kwargs", {})
        base = {"policy_kwargs": {"model": pk["model"]}} if pk.get("lora") is not None else {}  # LoRA: adapter only
        model = cls.load(ckpt / "agent", env=env, device=spec.get("device", "cpu"), **base)
        rows = read_json(ckpt / "rows.json")["rows"]
    else:
        params = {**p, "policy": "CausalLMPolicy",
                  "agent_kwargs": {**p.get("agent_kwargs", {}), "policy_kwargs": p.get("policy_kwargs", {})}}
        model = make_agent(spec["algo"], env, spec["seed"], params, spec["method_kwargs"], kind="llm",
                           device=spec.get("device", "cpu"))
        rows = [{"step": 0, **held_out_scores(model, test_env, eval_size)}]
    by_step = {r["step"]: r for r in rows}
    done = len(model.history)
    while done < steps:
        chunk = min(every - done % every, steps - done)
        model.learn(chunk * model.steps_per_iteration, reset_num_timesteps=False)
        # iteration i's rollouts come from the weights after i updates: the same row as an eval at step i
        for r in _history_rows(model.history[done:done + chunk]):
            by_step.setdefault(r["step"], {"step": r["step"]}).update(r)
        done += chunk
        if done % every == 0 or done == steps:
            by_step.setdefault(done, {"step": done}).update(held_out_scores(model, test_env, eval_size))
        rows = [by_step[k] for k in sorted(by_step)]
        if ckpt is not None and (done % save_every == 0 or done == steps):
            model.save(ckpt / "agent")
            atomic_write_json(ckpt / "rows.json", {"rows": rows})
    return rows


_KIND_FUNCS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "tabular_single": _run_tabular_single,
    "tabular_multi": _run_tabular_multi,
    "token": _run_token,
    "mnist": _run_mnist,
    "llm": _run_llm,
    "gym": lambda spec: _run_gym(spec, None),
}
#: Every run kind a preset setting may name.
RUN_KINDS: tuple[str, ...] = tuple(_KIND_FUNCS)


def _execute(specs: list[dict[str, Any]], run: Callable[[], list[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Records of ``specs`` from ``run()`` (their rows, in order), never raising: a ``run`` that raises fails
    every spec with its traceback; the wall time is shared equally by the specs."""
    _limit_threads()
    start = time.perf_counter()
    base: dict[str, Any] = {"host": platform.node(), "pid": os.getpid()}
    if len(specs) > 1:
        base["seed_batch"] = len(specs)
    try:
        all_rows = run()
        records = [{"spec": spec, **base, "status": "ok", "rows": rows, "traceback": None}
                   for spec, rows in zip(specs, all_rows, strict=True)]
    except Exception:  # noqa: BLE001 - a crashed run is data, not a reason to stop the others
        tb = traceback.format_exc()
        records = [{"spec": spec, **base, "status": "failed", "rows": [], "traceback": tb} for spec in specs]
    wall = time.perf_counter() - start
    for record in records:
        record["wall_s"] = wall / len(specs)
    return records


def execute_run(spec: dict[str, Any]) -> dict[str, Any]:
    """Execute one run spec in this process and return its record (never raises).

    :return: ``{"status": "ok" | "failed", "spec", "rows", "wall_s", "traceback", "host", "pid"}``.
    """
    return _execute([spec], lambda: [_run_one(spec)])[0]


def _run_one(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one run: a Stable-Baselines3 algorithm through :func:`~tpo_gym.evaluation.sb3_runs.run_sb3`,
    anything else through its kind's function."""
    cls = _sb3_class(spec)
    if spec["kind"] == "gym":  # tpo-gym agents and SB3 algorithms alike
        return _run_gym(spec, cls)
    if cls is not None:
        from tpo_gym.evaluation.sb3_runs import run_sb3

        return run_sb3(spec, cls)
    return _KIND_FUNCS[spec["kind"]](spec)


def _sb3_class(spec: dict[str, Any]) -> type | None:
    """The Stable-Baselines3 class ``spec["algo"]`` names, or ``None`` for tpo-gym's own agents."""
    from tpo_gym.agents.common.registry import AlgorithmReferenceError, is_sb3_algorithm, resolve_algorithm

    if spec.get("kind") not in ("token", "mnist", "gym") or not isinstance(spec.get("algo"), str):
        return None
    try:
        cls = resolve_algorithm(spec["algo"])
    except AlgorithmReferenceError:  # the run itself says so, in its record
        return None
    return cls if is_sb3_algorithm(cls) else None


#: Run kinds whose seeds :func:`execute_runs` trains together in one :class:`~tpo_gym.agents.SeedBatch`.
_SEED_BATCH_FUNCS: dict[str, Callable[[list[dict[str, Any]]], list[list[dict[str, Any]]]]] = {
    "token": _run_token_seeds,
    "mnist": _run_mnist_seeds,
}


def seed_batch_key(spec: dict[str, Any]) -> str | None:
    """What the specs of one seed batch share (all but the seed), or ``None`` for kinds run one by one."""
    if spec["kind"] not in _SEED_BATCH_FUNCS or _sb3_class(spec) is not None:
        return None
    return json.dumps({k: v for k, v in spec.items() if k not in ("seed", "checkpoint_dir")}, sort_keys=True,
                      default=str)


def execute_runs(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Execute specs that differ only in their seed together (one :class:`~tpo_gym.agents.SeedBatch`);
    one record per spec, as :func:`execute_run`'s, plus ``seed_batch`` (S); a single spec is
    :func:`execute_run`. Crash-isolated per seed: when the batch raises, each of its seeds runs again
    alone, so a seed that fails (diverges, say) fails alone with its own traceback and the others finish;
    those records carry ``seed_batch_error``, the last line of the batch's traceback."""
    if len(specs) == 1:
        return [execute_run(specs[0])]
    keys = {seed_batch_key(s) for s in specs}
    if None in keys or len(keys) != 1:
        raise ValueError("execute_runs batches specs of one seed-batchable kind that differ only in their seed")
    records = _execute(specs, lambda: _SEED_BATCH_FUNCS[specs[0]["kind"]](specs))
    if all(r["status"] == "ok" for r in records):
        return records
    lines = (records[0].get("traceback") or "").strip().splitlines()
    alone = [execute_run(spec) for spec in specs]
    for record in alone:
        record["seed_batch_error"] = lines[-1] if lines else "unknown error"
    return alone
