"""The package's layout rules (docs/architecture.md): module sizes, one-way imports, private members kept home."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tpo_gym"
#: The largest module of ``tpo_gym/agents`` (one job per module; issue "one method, one file").
MAX_AGENT_MODULE_LINES = 500
#: Which subpackages a layer may import (``tpo_gym._io`` / ``_validation`` are shared by all).
LAYERS = {
    "objectives": set(),
    "envs": {"envs"},
    "agents": {"agents", "envs", "objectives"},
    "integrations": {"integrations", "agents", "envs", "objectives"},
}


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported_layers(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "tpo_gym" and len(parts) > 1 and not parts[1].startswith("_"):
                out.add(parts[1])
    return out


@pytest.mark.parametrize("path", _modules(PACKAGE / "agents"), ids=lambda p: p.name)
def test_agent_modules_stay_small(path: Path) -> None:
    n = len(path.read_text().splitlines())
    assert n <= MAX_AGENT_MODULE_LINES, f"{path.name} has {n} lines (at most {MAX_AGENT_MODULE_LINES}): split it by job"


@pytest.mark.parametrize("path", [p for p in _modules(PACKAGE) if _layer(p) in LAYERS],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_flow_one_way(path: Path) -> None:
    layer = _layer(path)
    wrong = _imported_layers(ast.parse(path.read_text())) - LAYERS[layer]
    assert not wrong, f"{path.relative_to(PACKAGE)} ({layer}) imports {sorted(wrong)}: imports flow evaluation -> " \
                      "agents -> envs, objectives at the bottom"


def _private_members(tree: ast.AST) -> set[str]:
    """Private (single-underscore) methods and attributes the classes of one module define."""
    names = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _foreign_private_uses(trees: dict[Path, ast.AST]) -> list[str]:
    defined = {p: _private_members(t) for p, t in trees.items()}
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if node.attr in defined[path]:
                continue
            elsewhere = sorted(q.name for q, names in defined.items() if q != path and node.attr in names)
            if elsewhere:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} reads .{node.attr} of {elsewhere}")
    return found


def test_no_module_uses_a_private_member_of_another_modules_class() -> None:
    trees = {p: ast.parse(p.read_text()) for p in _modules(PACKAGE)}
    found = _foreign_private_uses(trees)
    assert not found, "private members used across modules (make them public, or keep the use in the module):\n" + \
        "\n".join(found)


def test_the_private_member_check_finds_a_use_across_modules() -> None:
    owner = ast.parse("class A:\n"
                      "    def __init__(self):\n        self._state = 1\n"
                      "    def _step(self):\n        pass\n")
    user = ast.parse("def f(a):\n    a._step()\n    return a._state\n"
                     "class B(A):\n    def _step(self):\n        self._x = 1\n")
    found = _foreign_private_uses({PACKAGE / "a.py": owner, PACKAGE / "b.py": user})
    assert found == ["b.py:3 reads ._state of ['a.py']"]  # _step is b.py's own too (B overrides the hook)


def test_package_docstring_names_every_subpackage() -> None:
    """tpo_gym's docstring counts and lists its parts right."""
    import pkgutil

    import tpo_gym

    doc = tpo_gym.__doc__ or ""
    parts = sorted(m.name for m in pkgutil.iter_modules(tpo_gym.__path__) if not m.name.startswith("_"))
    for name in parts:
        assert f":mod:`tpo_gym.{name}`" in doc, name
    words = {3: "Three", 4: "Four", 5: "Five", 6: "Six"}
    assert f"{words[len(parts)]} parts" in doc
