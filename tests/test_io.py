"""tpo_gym._io: one atomic-write helper, shared by the agents and the harness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_one_atomic_write_helper_shared_by_the_harness(tmp_path: Path) -> None:
    import tpo_gym._io as io_helper
    import tpo_gym.evaluation._io as harness_io

    for name in harness_io.__all__:
        assert getattr(harness_io, name) is getattr(io_helper, name)
    target = tmp_path / "a" / "b.json"
    io_helper.atomic_write_json(target, {"x": 1})
    with pytest.raises(RuntimeError), io_helper.atomic_writer(target) as fh:
        fh.write(b"half")
        raise RuntimeError("interrupted")
    assert json.loads(target.read_text()) == {"x": 1}  # the old file stays whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["b.json"]  # the temp file is removed
