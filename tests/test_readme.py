"""The README's Python examples run as written."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_the_examples() -> None:
    assert len(BLOCKS) >= 3
    assert any('TPO("TransformerPolicy", "tpo_gym/TokenReversal-v0"' in b for b in BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index])
    namespace = runpy.run_path(str(script), run_name="__main__")
    if "model" in namespace:  # the agents example: it learned and saved
        assert namespace["model"].history[-1]["error"] < 0.05
        assert (tmp_path / "tpo_reversal.zip").is_file()
