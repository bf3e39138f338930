"""Where a bench's runs execute: local worker processes (crash-isolated, stopped at a deadline) or a Ray cluster.
Re-exported by :mod:`tpo_gym.evaluation.runner`."""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tpo_gym.evaluation.experiments import execute_runs

RAY_HINT = "pip install 'tpo-gym[ray]'"
#: Seconds between a worker's checks that the bench that started it is still its parent.
WATCHDOG_INTERVAL_S = 0.2


class BackendError(RuntimeError):
    """The requested execution backend cannot be used (e.g. Ray is not installed)."""


def require_ray() -> Any:
    """Import Ray or raise :class:`BackendError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise BackendError(f"--backend ray needs Ray, which is not installed: {RAY_HINT}") from exc
    return ray


def _failed(spec: dict[str, Any], message: str) -> dict[str, Any]:
    return {"spec": spec, "status": "failed", "rows": [], "traceback": message, "wall_s": float("nan")}


def _init_worker(parent_pid: int | None = None) -> None:
    """Set up a worker process: one thread, and (``parent_pid``) ended when that bench process is gone."""
    if parent_pid is not None:
        _watch_parent(parent_pid)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def _watch_parent(parent_pid: int, interval: float = WATCHDOG_INTERVAL_S) -> None:
    """End this process as soon as ``parent_pid`` is no longer its parent: the bench that started it died,
    even by ``kill -9``, which gives it no chance to stop its workers (an orphan would finish its run,
    minutes maybe, for nobody). A daemon thread polls ``os.getppid()`` (POSIX and Windows alike)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="tpo-gym-parent-watchdog", daemon=True).start()


def _call(target: str, task: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``task`` run by the function named ``target`` (``"module:qualname"``), imported here in the worker: an
    import error is then the task's own error, recorded with its traceback, not a worker process that dies
    while unpickling the task (its traceback only on stderr)."""
    module, _, qualname = target.partition(":")
    func: Any = importlib.import_module(module)
    for part in qualname.split("."):
        func = getattr(func, part)
    return func(task)


def _death(processes: list[Any]) -> str:
    """How the worker processes of a broken pool ended: a signal (SIGKILL: perhaps the out-of-memory killer)
    or an exit code (an error in the worker process itself, its traceback on stderr)."""
    codes = [p.exitcode for p in processes if p.exitcode]
    if not codes:
        return "it ended without a result"
    code = codes[0]
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return f"killed by {name}" + (", perhaps for lack of memory" if -code == signal.SIGKILL else "")
    return f"it exited with code {code}: an error in the worker process itself, its traceback on stderr"


class _Deadline(Exception):
    """The ``stop_after`` deadline passed: the runs in flight were stopped (they leave no record)."""


def _remaining(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (a ``time.monotonic()`` value; ``None``: no deadline).

    :raises _Deadline: it has passed.
    """
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Deadline
    return left


def _run_local(tasks: list[list[dict[str, Any]]], workers: int,
               run: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] = execute_runs,
               deadline: float | None = None) -> Iterator[dict[str, Any]]:
    """Records of ``tasks`` (each a list of specs, run by ``run`` in a worker process), as they finish.

    With a ``deadline`` (a ``time.monotonic()`` value) the stream ends there: tasks not started are
    cancelled and those in flight are stopped, so they yield no record (:class:`_Deadline` is raised
    to the caller after the workers are gone).

    Crash-isolated: a task that raises only fails itself (``run`` catches what a run raises), and a
    worker process that dies (killed by the kernel when out of memory, say) costs only the task it ran.
    A dead worker breaks the whole pool and every unfinished task with it, so the pool is started again:
    the tasks that may have been running (the first ``workers + 1`` unfinished ones, as tasks start in
    order) go first through a pool of one worker, where the task that kills it again is the one it ran,
    and is recorded as failed; the others go back to a full pool.
    """
    ctx = mp.get_context("spawn")
    pending = list(tasks)
    suspects = 0  # > 0: the first `suspects` pending tasks run one at a time, to find the one that kills
    while pending:
        batch = pending[:suspects] if suspects else pending
        unfinished: list[int] = []
        broken = False
        pool = ProcessPoolExecutor(max_workers=1 if suspects else workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(os.getpid(),))
        processes = getattr(pool, "_processes", None)  # CPython's pool keeps them there (gone after shutdown)
        target = f"{run.__module__}:{run.__qualname__}"
        try:
            futures = {pool.submit(_call, target, t): i for i, t in enumerate(batch)}
            for fut in _as_completed_by(futures, deadline):
                i = futures[fut]
                try:
                    records = fut.result()
                except BrokenProcessPool:
                    broken = True
                    unfinished.append(i)
                    continue
                except Exception:  # noqa: BLE001 - the task could not even be sent or returned
                    message = "worker process failed:\n" + traceback.format_exc()
                    records = [_failed(s, message) for s in batch[i]]
                yield from records
        except BaseException:  # interrupted (Ctrl-C, SIGTERM in the CLI, the caller stopped reading)
            _stop_workers(pool)
            raise
        pool.shutdown(wait=True)
        unfinished.sort()
        if broken and suspects:  # one worker: the first unfinished task is the one whose process died
            dead = batch[unfinished.pop(0)]
            how = _death(list((processes or {}).values()))
            message = f"worker process died while running this run ({how}; the other runs were kept and rerun)"
            yield from (_failed(s, message) for s in dead)
        rest = pending[len(batch):]
        pending = [batch[i] for i in unfinished] + rest
        suspects = 0 if suspects else (min(workers + 1, len(unfinished)) if broken else 0)


def _as_completed_by(futures: dict[Any, int], deadline: float | None) -> Iterator[Any]:
    """``as_completed(futures)``, ending with :class:`_Deadline` when ``deadline`` passes first."""
    try:
        yield from as_completed(futures, timeout=_remaining(deadline))
    except FuturesTimeout:
        raise _Deadline from None


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop a pool at once: cancel what has not started and end the worker processes (left alone, a
    worker would finish its run, minutes maybe, after its parent is gone)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # CPython's pool keeps them there
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)


def _run_ray(tasks: list[list[dict[str, Any]]], workers: int,
             deadline: float | None = None) -> Iterator[dict[str, Any]]:
    ray = require_ray()
    started_here = False
    if not ray.is_initialized():
        from tpo_gym.agents.common.registry import ENV_VAR

        address = os.environ.get("RAY_ADDRESS")
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if os.environ.get(ENV_VAR):  # classes of the user's own, for workers on other machines too
            kwargs["runtime_env"] = {"env_vars": {ENV_VAR: os.environ[ENV_VAR]}}
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=workers, **kwargs)
        started_here = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(execute_runs)
        refs = {remote.remote(t): t for t in tasks}
        pending = list(refs)
        while pending:
            try:
                done, pending = ray.wait(pending, num_returns=1, timeout=_remaining(deadline))
            except _Deadline:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise
            if not done:  # the wait timed out at the deadline
                continue
            for ref in done:
                try:
                    yield from ray.get(ref)
                except Exception:  # noqa: BLE001 - a Ray worker died or the task errored
                    message = "ray task failed:\n" + traceback.format_exc()
                    yield from (_failed(s, message) for s in refs[ref])
    finally:
        if started_here:
            ray.shutdown()
