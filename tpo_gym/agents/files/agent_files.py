"""The containers of an agent: a zip file (``tpo_gym.json`` + ``weights.pt``) or a language-model directory.

Reading and writing them, executing nothing: entries are capped in size before they are read
(:data:`MAX_JSON_BYTES`, :data:`MAX_WEIGHTS_BYTES`), tensors are read with ``torch.load(weights_only=True)``,
links in a directory are refused, and paths are written atomically (:func:`tpo_gym._io.atomic_writer`). What the
JSON must hold is :mod:`tpo_gym.agents.common.persistence`'s business.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pathlib
import shutil
import tempfile
import zipfile
import zlib
from typing import Any

import torch

from tpo_gym._io import DIR_MODE, atomic_writer, make_dirs
from tpo_gym.agents.files.serialization import AgentFileError, check_plain

__all__ = [
    "FORMAT",
    "VERSION",
    "JSON_ENTRY",
    "WEIGHTS_ENTRY",
    "OPTIMIZER_ENTRY",
    "MAX_JSON_BYTES",
    "MAX_WEIGHTS_BYTES",
    "write_agent_file",
    "read_agent_file",
    "write_agent_dir",
    "read_agent_dir",
]

FORMAT = "tpo-gym-agent"
VERSION = 1
JSON_ENTRY = "tpo_gym.json"
WEIGHTS_ENTRY = "weights.pt"
#: Largest uncompressed size of the ``tpo_gym.json`` entry that :func:`read_agent_file` reads (64 MiB).
MAX_JSON_BYTES = 64 * 2**20
#: Largest uncompressed size of the ``weights.pt`` entry that :func:`read_agent_file` reads (16 GiB).
MAX_WEIGHTS_BYTES = 16 * 2**30


# --------------------------------------------------------------------------------------------
# the file
# --------------------------------------------------------------------------------------------
def write_agent_file(path: Any, meta: dict[str, Any], weights: dict[str, Any]) -> None:
    """Write the zip to a file object, or atomically to a path (``.zip`` added when it has no suffix).

    A path is written through :func:`tpo_gym._io.atomic_writer`: an exclusively created temporary
    file next to it, fsynced, then renamed over it; nothing planted at a temporary name is followed.
    """
    payload = json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=1, sort_keys=True)
    buffer = io.BytesIO()
    torch.save(weights, buffer)

    def write(fileobj: Any) -> None:
        with zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(JSON_ENTRY, payload)
            zf.writestr(WEIGHTS_ENTRY, buffer.getvalue())

    if isinstance(path, (str, pathlib.Path)):
        target = pathlib.Path(path)
        if target.suffix != ".zip":
            target = target.with_name(target.name + ".zip") if not target.suffix else target
        with atomic_writer(target) as f:
            write(f)
    else:
        write(path)


def _resolve_path(path: Any) -> Any:
    if isinstance(path, (str, pathlib.Path)):
        p = pathlib.Path(path)
        if not p.exists() and p.suffix != ".zip" and p.with_name(p.name + ".zip").exists():
            return p.with_name(p.name + ".zip")
        if not p.exists():
            raise FileNotFoundError(f"no agent file at {str(p)!r}")
        return p
    return path


def _read_entry(zf: zipfile.ZipFile, name: str, limit: int, where: str) -> bytes:
    """The bytes of the entry ``name``, refused if its header size or its data exceed ``limit`` bytes.

    The size recorded in the archive is checked before anything is decompressed, and the data are
    read through a stream capped at ``limit + 1`` bytes, so a header that lies cannot make the read
    grow past the cap. Corrupt data (a bad deflate stream, a CRC mismatch) names the entry.
    """
    info = zf.getinfo(name)
    too_big = f"{where}: entry {name!r} is larger than its limit of {limit:,} bytes"
    if info.file_size > limit:
        raise AgentFileError(f"{too_big} ({info.file_size:,} bytes uncompressed): not read")
    try:
        with zf.open(info) as stream:
            data = stream.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, RuntimeError, NotImplementedError) as exc:
        raise AgentFileError(f"{where}: entry {name!r} is corrupt ({exc})") from None
    if len(data) > limit:
        raise AgentFileError(too_big)
    return data


def read_agent_file(path: Any, device: torch.device | str = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """Read ``(meta, weights)`` of an agent file, executing nothing from it.

    :raises AgentFileError: naming the part that is wrong (archive, entry, field).
    """
    path = _resolve_path(path)
    where = str(path) if isinstance(path, (str, pathlib.Path)) else "the given file object"
    try:
        zf = zipfile.ZipFile(path, "r")
    except (zipfile.BadZipFile, EOFError, ValueError):
        raise AgentFileError(f"{where} is not a zip archive (truncated or corrupt agent file)") from None
    with zf:
        names = zf.namelist()
        if JSON_ENTRY not in names:
            if "data" in names and "policy.pth" in names:
                raise AgentFileError(
                    f"{where} was written by Stable-Baselines3 (entries {sorted(names)}), not by a tpo-gym agent; "
                    "load it with its own SB3 class"
                )
            raise AgentFileError(
                f"{where} has no {JSON_ENTRY!r} entry (entries: {sorted(names)}): not a tpo-gym agent file"
            )
        if WEIGHTS_ENTRY not in names:
            raise AgentFileError(f"{where} has no {WEIGHTS_ENTRY!r} entry (truncated agent file?)")
        repeated = sorted(name for name, count in collections.Counter(names).items() if count > 1)
        if repeated:
            raise AgentFileError(f"{where} holds the entries {repeated} more than once: an agent file has each entry "
                                 "exactly once")
        raw = _read_entry(zf, JSON_ENTRY, MAX_JSON_BYTES, where)
        weights_bytes = _read_entry(zf, WEIGHTS_ENTRY, MAX_WEIGHTS_BYTES, where)
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer of > 4300 digits, deep nesting
        raise AgentFileError(f"{where}: entry {JSON_ENTRY!r} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise AgentFileError(f"{where}: entry {JSON_ENTRY!r} is not a tpo-gym agent description")
    if type(meta.get("version")) is not int or meta["version"] != VERSION:
        raise AgentFileError(f"{where}: agent file version {meta.get('version')!r} is not supported (this tpo-gym "
                             f"reads version {VERSION})")
    check_plain(meta, JSON_ENTRY)
    try:
        weights = torch.load(io.BytesIO(weights_bytes), map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling refusal or corruption is reported the same way
        raise AgentFileError(f"{where}: entry {WEIGHTS_ENTRY!r} cannot be read as plain tensors ({exc})") from None
    if not isinstance(weights, dict) or "policy" not in weights:
        raise AgentFileError(f"{where}: entry {WEIGHTS_ENTRY!r} does not hold the policy weights")
    return meta, weights


# --------------------------------------------------------------------------------------------
# language-model agents: a directory (Hugging Face save_pretrained + the same JSON)
# --------------------------------------------------------------------------------------------
OPTIMIZER_ENTRY = "optimizer.pt"


def write_agent_dir(path: Any, meta: dict[str, Any], optimizer_state: dict[str, Any], save_model: Any) -> None:
    """Write a language-model agent directory atomically: built in a fresh private temp dir, then renamed into place.

    ``save_model(dir)`` writes the model (``save_pretrained``: safetensors) and the tokenizer. The work
    directory is made by ``tempfile.mkdtemp`` beside the target (a random name, created exclusively), so
    nothing planted at a temporary name is followed or removed; the previous agent at ``path`` is moved
    into it and removed with it only once the new one is in place. Only that work directory is ever
    removed recursively.
    """
    target = pathlib.Path(path)
    if target.suffix == ".zip":
        target = target.with_suffix("")
    make_dirs(target.parent)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        new, old = work / "agent", work / "previous"
        new.mkdir(mode=DIR_MODE)  # readable like a directory made by mkdir (mkdtemp's own is private)
        save_model(new)
        (new / JSON_ENTRY).write_text(json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=1,
                                                 sort_keys=True))
        torch.save(optimizer_state, new / OPTIMIZER_ENTRY)
        if os.path.lexists(target):
            os.replace(target, old)
        try:
            os.replace(new, target)
        except BaseException:
            if os.path.lexists(old):
                os.replace(old, target)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_dir_entries(root: pathlib.Path) -> None:
    """Refuse a symbolic link or anything but regular files and directories anywhere under ``root``."""
    for dirpath, dirnames, filenames in os.walk(root):  # links to directories are listed, never entered
        for name in [*dirnames, *filenames]:
            entry = pathlib.Path(dirpath) / name
            if entry.is_symlink():
                raise AgentFileError(f"{str(entry)!r} is a symbolic link: an agent directory holds only its own "
                                     "files (links are never followed)")
            if name in filenames and not entry.is_file():
                raise AgentFileError(f"{str(entry)!r} is not a regular file")


def read_agent_dir(path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, optimizer_state)`` of a language-model agent directory, executing nothing from it.

    Every entry must be a regular file or directory (a symbolic link anywhere in it is refused);
    ``tpo_gym.json`` (at most :data:`MAX_JSON_BYTES`) and ``optimizer.pt`` (``{"optimizer":
    state_dict}``, read with ``weights_only=True``) must be there. The model, tokenizer and adapter
    are read by :mod:`tpo_gym.agents.lm.files` (``load_agent_model`` / ``load_agent_tokenizer`` /
    ``load_agent_adapter``).

    :raises AgentFileError: naming the entry and what is wrong.
    """
    root = pathlib.Path(path)
    entry = root / JSON_ENTRY
    if not entry.is_file():
        raise AgentFileError(f"{str(root)!r} has no {JSON_ENTRY!r}: not a tpo-gym agent directory")
    _check_dir_entries(root)
    size = entry.stat().st_size
    if size > MAX_JSON_BYTES:
        raise AgentFileError(f"{str(entry)!r} is larger than its limit of {MAX_JSON_BYTES:,} bytes ({size:,} bytes): "
                             "not read")
    try:
        meta = json.loads(entry.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer of > 4300 digits, deep nesting
        raise AgentFileError(f"{str(root)!r}: {JSON_ENTRY!r} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise AgentFileError(f"{str(root)!r}: {JSON_ENTRY!r} is not a tpo-gym agent description (version {VERSION})")
    check_plain(meta, JSON_ENTRY)
    file = root / OPTIMIZER_ENTRY
    if not file.exists():
        raise AgentFileError(f"{str(root)!r} has no {OPTIMIZER_ENTRY!r} (an agent directory holds the optimiser state)")
    if not file.is_file():
        raise AgentFileError(f"{str(file)!r} is not a regular file")
    try:
        optimizer = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise AgentFileError(f"{str(file)!r} cannot be read as plain tensors ({exc})") from None
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("optimizer"), dict):
        raise AgentFileError(f"{str(file)!r} does not hold {{'optimizer': state_dict}}")
    return meta, optimizer
