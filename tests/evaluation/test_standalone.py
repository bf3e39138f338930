"""The project stands on its own: its method notes, its licence, and no citation of files outside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_method_notes_keep_the_section_numbers() -> None:
    text = (ROOT / "docs" / "method.md").read_text()
    sections = re.findall(r"^## (\d+)\. (.+)$", text, re.M)
    assert [int(n) for n, _ in sections][:6] == [1, 2, 3, 4, 5, 6]
    titles = dict(sections)
    assert titles["1"] == "TPO" and titles["2"] == "Baselines" and titles["3"] == "Tasks"
    assert titles["5"] == "Metrics" and titles["6"] == "Published numbers"
    assert re.search(r"^### 4b\. ", text, re.M), "4b: the reference code's setup"
    for step in ("1.1.", "1.2.", "1.3.", "1.4."):
        assert re.search(rf"^{re.escape(step)} ", text, re.M), step
    for needle in ("GRPO (no KL)", "GRPO_token", "zv-masked", "critic-free", "REINFORCE", "Group PG",
                   "Delightful Policy Gradient", "CE oracle", "**Table 1**", "**Table 2**", "**Table 3**",
                   "**Table 5**", "| TPO_token | 58 | 74 | 103 | 102 |"):
        assert needle in text, needle


def test_no_citation_of_the_external_spec() -> None:
    paths = [ROOT / "README.md", ROOT / "benchmarks" / "results" / "README.md",
             *(ROOT / "tpo_gym").rglob("*.py"), *(ROOT / "tpo_gym").rglob("*.json"), *(ROOT / "examples").rglob("*.py"),
             *(ROOT / "tests" / "evaluation").glob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in paths
                 if p.name != "test_standalone.py" and re.search(r"\bSPEC\b", p.read_text())]
    assert not offenders, offenders


def test_licence_matches_the_package_metadata() -> None:
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "Copyright (c) 2026 tpo-gym developers" in licence
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^license = "MIT"$', pyproject, re.M), "an SPDX string (PEP 639)"
    requires = re.search(r"^requires = \[(.*)\]$", pyproject, re.M).group(1)
    minimum = re.search(r'"setuptools>=(\d+)', requires)
    assert minimum and int(minimum.group(1)) >= 77, "PEP 639 license strings need setuptools >= 77"
