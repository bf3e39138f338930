"""The package's layout rules (docs/architecture.md): module sizes, one-way imports, no import cycle, private members
kept home."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tpo_gym"
#: The largest module of ``tpo_gym`` (one job per module; issue "one method, one file").
MAX_MODULE_LINES = 500
#: Which subpackages a layer may import (``tpo_gym._io`` / ``_validation`` are shared by all).
LAYERS = {
    "objectives": {"objectives"},
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


@pytest.mark.parametrize("path", _modules(PACKAGE), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_stay_small(path: Path) -> None:
    n = len(path.read_text().splitlines())
    where = path.relative_to(PACKAGE)
    assert n <= MAX_MODULE_LINES, f"{where} has {n} lines (at most {MAX_MODULE_LINES}): split it by job"


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


# --------------------------------------------------------------------------------------------
# the import graph: no cycle anywhere, and the agents' subpackages in one order
# --------------------------------------------------------------------------------------------
#: The subpackages of ``tpo_gym.agents``, bottom first: a module imports its own subpackage or those below it.
AGENT_LAYERS = ("files", "policies", "lm", "common", "algorithms")


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST, modules: set[str], package: str = "") -> set[str]:
    """The modules of ``modules`` an ast imports, at module level or inside functions (``if TYPE_CHECKING:``
    blocks left out: they never run). ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``;
    a relative import is resolved against ``package`` (the importing module's package)."""
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for stmt in node.body for n in ast.walk(stmt)}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules else owner(base))
        elif isinstance(node, ast.Import):
            out.update(owner(a.name) for a in node.names)
    out.discard(None)
    return out  # type: ignore[return-value]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: the modules of the package it imports}`` over every module under ``root``."""
    paths = {_module_name(p, root): p for p in _modules(root)}
    names = set(paths)
    return {m: _runtime_imports(ast.parse(p.read_text()), names,
                                m if p.name == "__init__.py" else m.rpartition(".")[0]) - {m}
            for m, p in paths.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_in_the_package() -> None:
    graph = import_graph()
    cycles = import_cycles(graph)
    described = ["\n".join(f"  {m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles]
    assert not cycles, "import cycles (break each by moving what both sides need below them):\n" + "\n".join(described)


def test_the_cycle_check_finds_a_cycle_through_a_deferred_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("from .e import g\n")
    (pkg / "sub" / "e.py").write_text("from ..d import pkg\nfrom . import f\n")
    (pkg / "sub" / "f.py").write_text("from pkg.sub import e\n")
    graph = import_graph(pkg)
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == set() and graph["pkg.d"] == {"pkg.c"}
    assert graph["pkg.sub"] == {"pkg.sub.e"} and graph["pkg.sub.e"] == {"pkg.d", "pkg.sub.f"}
    assert import_cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.sub.e", "pkg.sub.f"]]


def test_agents_subpackages_import_downward_only() -> None:
    graph = import_graph()
    prefix = "tpo_gym.agents."
    wrong = []
    for module, imports in graph.items():
        if not module.startswith(prefix):
            continue
        layer = module[len(prefix):].split(".")[0]
        assert layer in AGENT_LAYERS, f"{module}: a module of tpo_gym.agents belongs to one of {AGENT_LAYERS}"
        for target in imports:
            if target.startswith(prefix):
                other = target[len(prefix):].split(".")[0]
                if AGENT_LAYERS.index(other) > AGENT_LAYERS.index(layer):
                    wrong.append(f"{module} ({layer}) imports {target} ({other})")
    assert not wrong, f"imports flow {' -> '.join(reversed(AGENT_LAYERS))} within tpo_gym.agents:\n" + "\n".join(wrong)
