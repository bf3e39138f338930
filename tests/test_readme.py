"""The README's Python examples run as written and print what they show."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
#: ``print(...)  # prints VALUE``: the example's stated output, checked against what it prints.
PRINTS = re.compile(r"^\s*print\(.*#\s*prints (.+?)\s*$", re.M)


def test_readme_has_the_examples() -> None:
    assert len(BLOCKS) >= 3
    assert any('TPO("TransformerPolicy", "tpo_gym/TokenReversal-v0"' in b for b in BLOCKS)
    assert sum(bool(PRINTS.search(b)) for b in BLOCKS) >= 2, "the gradient check and the shape state their output"


def test_readme_cites_no_file_outside_the_repository() -> None:
    text = README.read_text()
    assert "SPEC" not in text
    for link in re.findall(r"\]\(([^)#:]+)\)", text):
        assert (README.parent / link).exists(), link


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index])
    namespace = runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out
    assert printed.strip(), "every example prints what it shows"
    for expected in PRINTS.findall(BLOCKS[index]):
        assert expected in printed.splitlines(), f"the example says it prints {expected!r}; it printed {printed!r}"
    if "model" in namespace and "TokenReversal" in BLOCKS[index]:  # the agents example: it learned and saved
        assert namespace["model"].history[-1]["error"] < 0.05
        assert "final error:" in printed
        assert (tmp_path / "tpo_reversal.zip").is_file()


def test_readme_is_a_landing_page_that_links_the_guides() -> None:
    """The README keeps what the project is, the two commands, one example per part and links (< 8,000 chars)."""
    text = README.read_text()
    assert len(text) < 8_000, len(text)
    for heading in ("## Quick start", "## Environments", "### Your own task", "## Agents", "### Language models",
                    "### TPO on TRL", "## Benchmark reports", "## Layout"):
        assert re.search(rf"^{re.escape(heading)}\b", text, re.M), heading
    assert "make bench" in text and "make test" in text and "make docs" in text
    for guide in ("docs/getting-started.md", "docs/environments/index.md", "docs/agents/index.md",
                  "docs/language-models.md", "docs/trl.md", "docs/benchmarks.md"):
        assert f"]({guide})" in text, guide
