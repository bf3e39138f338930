"""Provenance of a benchmark: package versions, the git commit of the code that ran, and where each agent class
came from (so a report in a new shell, or a rerun, finds a class of the user's own again)."""

from __future__ import annotations

import functools
import shlex
import subprocess
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["package_versions", "git_commit", "algorithm_provenance", "restore_algorithms", "distribution_text",
           "environment_prefix"]


def package_versions() -> dict[str, str]:
    """Installed versions of tpo-gym and the libraries that determine its results."""
    out = {}
    for name in ("tpo-gym", "torch", "gymnasium", "stable-baselines3", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_commit() -> str:
    """``HEAD`` of the repository holding this package, or ``unknown``.

    ``+dirty`` is appended when any file of the package (``tpo_gym/``) is modified or untracked, i.e.
    when the code that ran is not exactly the commit.
    """
    here = Path(__file__).resolve().parent
    package = here.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(package)], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    """:func:`importlib.metadata.packages_distributions`, read once (it scans every installed package)."""
    return metadata.packages_distributions()


def algorithm_provenance(reference: str) -> dict[str, Any]:
    """Where the agent class a preset's ``algo`` names comes from: ``{"name", "path", "distribution",
    "version"}``: its registered name, ``module:qualname`` (imports it again anywhere the module is
    importable), and the installed distribution that holds its top-level package with that distribution's
    version (both ``None`` when the module is not part of an installed distribution: a directory on
    ``PYTHONPATH``, a script).

    :raises ~tpo_gym.agents.common.registry.AlgorithmReferenceError: ``reference`` names no agent class.
    """
    from tpo_gym.agents.common.registry import algorithm_path, resolve_algorithm

    cls = resolve_algorithm(reference)
    names = _distributions().get(cls.__module__.partition(".")[0], [])
    distribution = names[0] if names else None
    version = None
    if distribution is not None:
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            distribution = None
    return {"name": cls.__name__, "path": algorithm_path(cls), "distribution": distribution, "version": version}


def restore_algorithms(recorded: Any) -> None:
    """Make the classes a manifest's ``algorithms`` (``{algo: provenance}``, as :func:`algorithm_provenance`
    wrote them) recorded resolvable again: an ``algo`` that resolves as it is stays as it is; a plain name that
    does not (a class named in ``$TPO_GYM_ALGORITHMS`` when the runs were made) is imported from its recorded
    ``module:qualname``. Anything else in ``recorded`` is ignored (an older manifest has no such field).

    :raises ~tpo_gym.agents.common.registry.AlgorithmReferenceError: neither the name nor the recorded path can be
        imported (the message names both and how to make the module importable).
    """
    from tpo_gym.agents.common.registry import AlgorithmReferenceError, resolve_algorithm

    if not isinstance(recorded, dict):
        return
    for algo, source in recorded.items():
        path = source.get("path") if isinstance(source, dict) else None
        if not isinstance(algo, str) or not isinstance(path, str) or ":" in algo:
            continue
        try:
            resolve_algorithm(algo)
        except AlgorithmReferenceError:
            try:
                resolve_algorithm(path)
            except AlgorithmReferenceError as exc:
                raise AlgorithmReferenceError(f"the runs' algorithm {algo!r} came from {path} "
                                              f"({distribution_text(source)}): {exc}") from None


def distribution_text(source: dict[str, Any]) -> str:
    """The distribution of an :func:`algorithm_provenance`: ``"tpo-rloo 0.1.0"``, or ``"not from an installed
    distribution"``."""
    name = source.get("distribution")
    return f"{name} {source.get('version')}" if name else "not from an installed distribution"


def environment_prefix(algos: Iterable[str]) -> str:
    """``TPO_GYM_ALGORITHMS=module:Class,... `` when one of ``algos`` (a preset's) is a plain name found only
    through that variable (or registered by the calling script), so the command a manifest and report record
    finds the class again when rerun in a new shell; ``""`` otherwise (built-in classes, ``module:Class``
    references, names an installed package publishes, classes of a ``__main__`` script).
    """
    from tpo_gym.agents.common.registry import ENTRY_POINT_GROUP, ENV_VAR, algorithm_path, resolve_algorithm

    published = {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    paths = []
    for algo in dict.fromkeys(algos):
        cls = resolve_algorithm(algo)
        if ":" in algo or algo in published or cls.__module__.split(".")[0] in ("tpo_gym", "__main__"):
            continue
        paths.append(algorithm_path(cls))
    return f"{ENV_VAR}={shlex.quote(','.join(paths))} " if paths else ""
