"""The documentation site builds in strict mode, documents every public name, and its examples run.

The site is MkDocs + Material + mkdocstrings (``mkdocs.yml``, pages under ``docs/``, installed by the
``docs`` extra). As tests/test_readme.py does for the README, every ```` ```python ```` block of the
guides runs as written and prints what its ``# prints VALUE`` comments say; a block that must not run
(a long training, a multi-process launch) is fenced as another language (``bash``, ``text``).

The built HTML is checked as a reader sees it: the math is arithmatex markup that the site's own MathJax
renders (no raw ``.. math::``, no script from another host), every image resolves, the Benchmarks page
shows the committed reports' curves and each environment page a frame of its task, and the docstrings'
Sphinx roles are links (``docs/screenshots.py`` takes screenshots of the pages for a person to look at).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import runpy
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tpo_gym

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The guides: every page but the generated API reference.
GUIDES = sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts)
BLOCKS = [(page, block) for page in GUIDES
          for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)]
#: ``print(...)  # prints VALUE``: the example's stated output, checked against what it prints.
PRINTS = re.compile(r"^\s*print\(.*#\s*prints (.+?)\s*$", re.M)


def public_modules() -> list[str]:
    """``tpo_gym`` and every module under it without a ``_``-prefixed part."""
    names = [m.name for m in pkgutil.walk_packages(tpo_gym.__path__, "tpo_gym.")]
    return ["tpo_gym", *(n for n in names if not any(part.startswith("_") for part in n.split(".")))]


def public_names(module_name: str) -> list[str]:
    """A module's ``__all__``; without one, the public classes and functions it defines."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [name for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == module_name]


def read_inventory(path: Path) -> dict[str, str]:
    """``{name: url}`` of a Sphinx inventory (``objects.inv``, version 2: four header lines, zlib body)."""
    header_end = 0
    data = path.read_bytes()
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    assert data.startswith(b"# Sphinx inventory version 2"), data[:40]
    entries = {}
    for line in zlib.decompress(data[header_end:]).decode().splitlines():
        name, _domain, _priority, url, _title = re.match(r"(\S+)\s+(\S+)\s+(-?\d+)\s+(\S*)\s+(.*)", line).groups()
        entries[name] = url.replace("$", name) if url.endswith("$") else url
    return entries


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once by ``mkdocs build --strict`` (any warning fails: broken links, missing
    references, docstring errors)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    assert "WARNING" not in log, log
    return out


def test_site_builds_in_strict_mode(site: Path) -> None:
    for page in ("index.html", "getting-started/index.html", "agents/tpo/index.html", "trl/index.html",
                 "method/index.html", "architecture/index.html", "reference/objectives/index.html"):
        assert (site / page).is_file(), page
    assert "tpo_gym.objectives.tpo_loss" in (site / "reference/objectives/index.html").read_text()


def test_every_public_name_has_an_api_entry(site: Path) -> None:
    """Every name of every public module's ``__all__`` is documented: an entry of the site's inventory under
    that module or under the module that defines the same object, whose anchor exists on its page."""
    inventory = read_inventory(site / "objects.inv")
    modules = {name: importlib.import_module(name) for name in public_modules()}
    pages: dict[str, str] = {}
    missing = []
    for module_name, module in modules.items():
        for name in public_names(module_name):
            obj = getattr(module, name)
            candidates = [f"{module_name}.{name}"]
            candidates += [f"{other}.{name}" for other, home in modules.items() if getattr(home, name, None) is obj]
            url = next((inventory[c] for c in candidates if c in inventory), None)
            if url is None:
                missing.append(f"{module_name}.{name}")
                continue
            page, _, anchor = url.partition("#")
            if page not in pages:
                pages[page] = (site / page / "index.html" if not page.endswith(".html") else site / page).read_text()
            assert f'id="{anchor}"' in pages[page], f"{module_name}.{name}: no anchor {anchor!r} on {page}"
    assert not missing, f"not in the API reference (add a page under docs/reference/): {missing}"


def test_trl_page_lists_every_refused_grpo_option_with_its_reason() -> None:
    pytest.importorskip("trl")
    from tpo_gym.integrations.trl import GRPO_OPTIONS_TPO_IGNORES

    rows = dict(re.findall(r"^\| `(\w+)` \| refused \| (.+?) \|$", (DOCS / "trl.md").read_text(), re.M))
    assert rows == GRPO_OPTIONS_TPO_IGNORES


def test_guides_have_examples() -> None:
    assert len(BLOCKS) >= 15
    pages = {page.relative_to(DOCS).as_posix() for page, _ in BLOCKS}
    for page in ("getting-started.md", "environments/your-own-task.md", "agents/tpo.md", "trl.md"):
        assert page in pages, page


@pytest.mark.parametrize("index", range(len(BLOCKS)),
                         ids=[f"{p.relative_to(DOCS).as_posix()}-{i}" for i, (p, _) in enumerate(BLOCKS)])
def test_guide_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    page, block = BLOCKS[index]
    monkeypatch.chdir(tmp_path)
    script = tmp_path / f"{page.stem}_{index}.py"
    script.write_text(block)
    runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out
    assert printed.strip(), "every example prints what it shows"
    for expected in PRINTS.findall(block):
        assert expected in printed.splitlines(), f"{page.name}: says it prints {expected!r}; it printed {printed!r}"


def test_docstring_markup_becomes_markdown() -> None:
    sys.path.insert(0, str(DOCS))
    try:
        from griffe_rst import rst_to_markdown
    finally:
        sys.path.remove(str(DOCS))
    text = "See :class:`~tpo_gym.agents.common.base.GroupAlgorithm` and :func:`tpo_gym.envs.check_group_env`::\n\n" \
           "    code\n\n=====  =======\n``a``  first\n       more\n``bb``  second\n=====  =======\n"
    assert rst_to_markdown(text).splitlines() == [
        "See `GroupAlgorithm` and `tpo_gym.envs.check_group_env`:", "", "    code", "",
        "|  |  |", "|---|---|", "| ``a`` | first more |", "| ``bb`` | second |"]


def _html_pages(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}


def _prose(html: str) -> str:
    """A page's text without its code listings (``<pre>``: source shown as written, such as the docstring of the
    example module of docs/contributing-add-a-method.md, RST included)."""
    return re.sub(r"<[^>]+>", "", re.sub(r"<pre\b.*?</pre>", "", html, flags=re.S))


def _autoref_links(html: str) -> int:
    """Links that mkdocs-autorefs resolved (cross-references to documented objects) in the page's content."""
    return len(re.findall(r'<a class="autorefs autorefs-internal"', html))


def test_math_renders_offline(site: Path) -> None:
    """Docstring and guide math reach the page as arithmatex elements, no ``.. math::`` / ``:math:`` text is
    left, and the MathJax that typesets it is the site's own copy (no script from another host)."""
    pages = _html_pages(site)
    objectives = pages["reference/objectives/index.html"]
    assert objectives.count('<div class="arithmatex">') >= 3, "the .. math:: blocks of tpo_gym.objectives"
    assert objectives.count('<span class="arithmatex">') >= 20, "the :math: roles of tpo_gym.objectives"
    for page in ("method/index.html", "agents/tpo/index.html", "reference/agents/policies/reference_setup/index.html"):
        assert '<div class="arithmatex">' in pages[page], page
    for name, html in pages.items():
        text = _prose(html)
        assert ".. math" not in text and ":math:`" not in text, f"{name}: raw RST math"
        scripts = re.findall(r'<script[^>]*\bsrc="([^"]+)"', html)
        assert not [s for s in scripts if re.match(r"(https?:)?//", s)], f"{name}: a script from another host"
        assert "assets/mathjax/tex-svg.js" in " ".join(scripts), f"{name}: MathJax not loaded"
    assert (site / "assets/mathjax/tex-svg.js").stat().st_size > 1_000_000
    assert (site / "assets/mathjax/input/tex/extensions/boldsymbol.js").is_file()  # what MathJax loads on demand


def test_images_resolve_and_pages_show_figures(site: Path) -> None:
    """Every image of every page is a file of the site; the Benchmarks page shows the committed reports'
    curves, each environment family page a frame of its task, the Method page TPO's target."""
    pages = _html_pages(site)
    for name, html in pages.items():
        for src in re.findall(r'<img[^>]*\bsrc="([^"]+)"', html):
            assert not re.match(r"(https?:)?//|data:", src), f"{name}: image from elsewhere: {src}"
            target = (site / name).parent / src.split("#")[0]
            assert target.resolve().is_file(), f"{name}: broken image {src}"

    def figures(page: str) -> list[str]:
        return re.findall(r'<figure>\s*<p>(?:<a [^>]*>)?<img[^>]*\bsrc="([^"]+)"', pages[page])

    bench = figures("benchmarks/index.html")
    assert len(bench) >= 4, bench
    for report in ("table1", "table2", "mnist", "tabular-single"):
        assert any(f"results/{report}/" in src for src in bench), report
    shown = {"environments/bandits": "env-bandits.png", "environments/token-tasks": "env-token-task.png",
             "environments/mnist": "env-mnist.png", "environments/reasoning-gym": "env-reasoning-gym.png",
             "method": "tpo-target.png"}
    for page, image in shown.items():
        assert any(src.endswith(image) for src in figures(f"{page}/index.html")), page


def test_api_reference_cross_references_are_links(site: Path) -> None:
    """The Sphinx roles of the docstrings become links to the objects they name; none is left as RST."""
    pages = _html_pages(site)
    assert _autoref_links(pages["reference/objectives/index.html"]) >= 10
    assert _autoref_links(pages["reference/envs/index.html"]) >= 10
    assert _autoref_links(pages["reference/agents/algorithms/tpo/index.html"]) >= 3
    assert sum(_autoref_links(html) for name, html in pages.items() if name.startswith("reference/")) >= 300
    for name, html in pages.items():
        text = _prose(html)
        assert not re.search(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc):`", text), f"{name}: a raw role"


def test_docstring_lists_keep_their_blocks(site: Path) -> None:
    """A table or a second paragraph inside an RST list item stays in that item: the next item is an item,
    not text run into the paragraph (tpo_gym.envs: the ``reward_credit`` bullet after the score table)."""
    html = (site / "reference/envs/index.html").read_text()
    assert re.search(r"<li>\s*<p><code>reward_credit</code>", html), "reward_credit is a list item"
    assert "* <code>reward_credit</code>" not in html
    registered = html[html.index('registered-ids"'):]
    header = re.search(r"<thead>(.*?)</thead>", registered, re.S).group(1)
    assert re.findall(r"<th>([^<]+)</th>", header), "the registered-ids table has a header row"


def test_docstring_math_links_and_lists_become_markdown() -> None:
    sys.path.insert(0, str(DOCS))
    try:
        from griffe_rst import rst_to_markdown
    finally:
        sys.path.remove(str(DOCS))
    text = ("Uses :math:`q_i` and :func:`~pkg.f`:\n\n.. math::\n    a = b\n\n    c = d\n\nafter\n\n"
            "* first item\n  its text\n\n  ======  ===\n  ``x``   1\n  ======  ===\n\n  more of it\n* second item\n")
    resolve = {("func", "pkg.f"): "pkg.mod.f"}.get
    assert rst_to_markdown(text, lambda role, target: resolve((role, target))).splitlines() == [
        r"Uses \(q_i\) and <autoref identifier=" '"pkg.mod.f" optional>`f`</autoref>:', "",
        "$$", "a = b", "$$", "", "$$", "c = d", "$$", "", "after", "",
        "* first item", "    its text", "", "    |  |  |", "    |---|---|", "    | ``x`` | 1 |", "",
        "    more of it", "", "* second item"]


# --------------------------------------------------------------------------------------------
# the pages that follow from the code (docs/hooks.py): the API reference of tpo_gym.agents, the methods' pages
# --------------------------------------------------------------------------------------------
AGENTS_DIR = ROOT / "tpo_gym" / "agents"


def _docs_hooks() -> Any:
    """docs/hooks.py as a module (mkdocs loads it from its path, as here)."""
    if "tpo_gym_docs_hooks" not in sys.modules:
        spec = importlib.util.spec_from_file_location("tpo_gym_docs_hooks", DOCS / "hooks.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules["tpo_gym_docs_hooks"]


def _agent_module_files(root: Path = AGENTS_DIR) -> dict[str, Path]:
    """``{module name: file}`` of every public module and subpackage of tpo_gym.agents, walked on disk."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if "__pycache__" not in parts and not any(p.startswith("_") for p in parts):
            out[".".join(parts)] = path
    return out


def _public_classes(path: Path) -> list[str]:
    """The public classes a module's source defines at its top level."""
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]


def _api_page(site: Path, module: str) -> Path:
    """The built API page of a module of tpo_gym.agents (``tpo_gym.agents.common.base``:
    ``reference/agents/common/base/index.html``)."""
    return site.joinpath("reference", "agents", *module.split(".")[2:], "index.html")


def _guide_slug(cls: type) -> str:
    return cls.__module__.rsplit(".", 1)[-1].replace("_", "-")


@pytest.fixture(autouse=True)
def _registry_left_as_found() -> Iterator[None]:
    """A guide example that registers a class (docs/contributing-add-a-method.md) leaves the registry, and
    ``$TPO_GYM_ALGORITHMS``, as they were for the tests after it."""
    from tpo_gym.agents.common.registry import algorithm_registry, unregister_algorithm

    before = set(algorithm_registry())
    yield
    for name in [n for n in algorithm_registry() if n not in before]:
        unregister_algorithm(name)


def test_every_module_of_tpo_gym_agents_has_a_generated_api_page(site: Path) -> None:
    """One API page per public module and subpackage of tpo_gym/agents (walked here on its own), none written
    by hand, each rendering the public classes its module defines; the nav lists them all."""
    modules = _agent_module_files()
    assert {"tpo_gym.agents", "tpo_gym.agents.algorithms.tpo", "tpo_gym.agents.common.base",
            "tpo_gym.agents.lm.policy", "tpo_gym.agents.files.serialization"} <= set(modules)
    assert not list((DOCS / "reference" / "agents").rglob("*.md")), "the agents' API pages are generated"
    nav = (site / "index.html").read_text()
    for module, path in modules.items():
        page = _api_page(site, module)
        assert page.is_file(), f"{module}: no API page {page.relative_to(site)}"
        html = page.read_text()
        assert f"<code>{module}</code>" in html, f"{module}: the page is not its module's"
        for name in _public_classes(path):
            assert f'id="{module}.{name}"' in html, f"{module}.{name} is not on its module's API page"
        url = page.parent.relative_to(site).as_posix()
        assert f'href="{url}/"' in nav, f"{module}: not in the nav"


def test_every_builtin_method_has_a_nav_entry_and_a_row_in_the_index(site: Path) -> None:
    """The "Agents" section and the agents' table list every built-in method of the registry, in its order, each
    linking its guide page and its API entry."""
    from tpo_gym.agents.common.registry import builtin_algorithms

    methods = builtin_algorithms()
    assert list(methods)[:7] == ["TPO", "GRPO", "GroupPG", "PPO", "REINFORCE", "DG", "CE"]
    html = (site / "agents/index.html").read_text()
    nav = re.findall(r'<a href="([^"]+)" class="md-nav__link', html)
    guides = [f"{_guide_slug(cls)}/" for cls in methods.values()]
    assert [h for h in nav if h in guides] == guides, "the methods' pages in the registry's order"
    assert nav.index(guides[-1]) < nav.index("your-own-algorithm/") < nav.index("../contributing-add-a-method/")
    table = html[html.index("<table>"):html.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]
    assert len(rows) == len(methods), "one row per method"
    for row, (name, cls) in zip(rows, methods.items(), strict=True):
        assert f'<a href="{_guide_slug(cls)}/">{name}</a>' in row, name
        api = f"../reference/agents/algorithms/{cls.__module__.rsplit('.', 1)[-1]}/#{cls.__module__}.{name}"
        assert f'href="{api}"' in row, f"{name}: no link to its API entry"
        summary = re.split(r"[`:(]", (cls.__doc__ or "").strip().splitlines()[0])[0].strip()
        assert summary and summary in re.sub(r"<[^>]+>", "", row), f"{name}: not its docstring's first line"
        assert (site / f"agents/{_guide_slug(cls)}/index.html").is_file(), name
    reference = (site / "reference/index.html").read_text()
    for name, cls in methods.items():
        assert f'href="agents/algorithms/{cls.__module__.rsplit(".", 1)[-1]}/#{cls.__module__}.{name}"' in reference


def test_a_method_without_a_guide_page_gets_a_generated_one() -> None:
    """A method registered with no docs/agents/<name>.md (here a fake registry entry) gets a page generated from
    its class docstring, a place in the "Agents" nav after the others and a row in the agents' table."""
    import yaml

    from tpo_gym.agents.common.registry import AlgorithmSpec, builtin_algorithms

    hooks = _docs_hooks()
    fake = type("FakeMethod", (), {
        "__module__": "tpo_gym.agents.algorithms.fake_method",
        "__doc__": "A fake method: :func:`~tpo_gym.objectives.tpo_loss` under another name.\n\n    :param x: y.",
        "spec": AlgorithmSpec(sampling="group", run_kinds=("token",), levels=("token", "sequence")),
    })
    methods = hooks.registered_methods({**builtin_algorithms(), "FakeMethod": fake})
    new = methods[-1]
    assert (new.name, new.guide, new.written) == ("FakeMethod", "agents/fake-method.md", False)
    assert all(m.written for m in methods[:-1]), "every built-in method has its written page"

    pages = hooks.generated_pages(methods, hooks.agent_modules())
    page = pages["agents/fake-method.md"]
    assert page.startswith("# FakeMethod\n")
    assert "::: tpo_gym.agents.algorithms.fake_method.FakeMethod\n" in page
    assert "[`FakeMethod`][tpo_gym.agents.algorithms.fake_method.FakeMethod]" in page
    assert not [m.guide for m in methods[:-1] if m.guide in pages], "a written page is never generated over"
    assert pages["reference/agents/algorithms/tpo.md"] == "# `tpo_gym.agents.algorithms.tpo`\n\n" \
                                                           "::: tpo_gym.agents.algorithms.tpo\n"

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    expanded = hooks.expand_nav(nav, methods, hooks.agent_modules())
    assert hooks.expand_nav(expanded, methods, hooks.agent_modules()) == expanded, "idempotent"
    agents = next(entry["Agents"] for entry in expanded if isinstance(entry, dict) and "Agents" in entry)
    uris = [hooks._nav_uri(e) for e in agents]
    assert uris[:len(methods) + 1] == ["agents/index.md", *(m.guide for m in methods)]
    assert uris[len(methods) + 1:] == ["agents/your-own-algorithm.md", "contributing-add-a-method.md"]

    table = hooks.methods_table(methods, "agents/index.md").splitlines()
    assert table[-1] == ("| [FakeMethod](fake-method.md) | A fake method: `tpo_loss` under another "
                         "name. | `token`, `sequence` | `token` | "
                         "[`FakeMethod`][tpo_gym.agents.algorithms.fake_method.FakeMethod] |")
    assert len(table) == 2 + len(methods)


def test_the_api_walk_finds_a_new_module_and_skips_private_ones(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A module added to tpo_gym/agents gets its page and nav entry with no docs edit; ``_`` modules get none."""
    hooks = _docs_hooks()
    agents = tmp_path / "tpo_gym" / "agents"
    for sub, files in {"": ["__init__"], "algorithms": ["__init__", "tpo", "zeta", "alpha"],
                       "common": ["__init__", "base", "_hidden"], "_private": ["__init__", "x"]}.items():
        (agents / sub).mkdir(parents=True, exist_ok=True)
        for name in files:
            (agents / sub / f"{name}.py").write_text('"""A module."""\n')
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    modules = hooks.agent_modules(agents)
    assert modules == ["tpo_gym.agents", "tpo_gym.agents.algorithms", "tpo_gym.agents.algorithms.tpo",
                       "tpo_gym.agents.algorithms.alpha", "tpo_gym.agents.algorithms.zeta", "tpo_gym.agents.common",
                       "tpo_gym.agents.common.base"]
    assert hooks.api_nav(modules) == [
        "reference/agents/index.md",
        {"tpo_gym.agents.algorithms": ["reference/agents/algorithms/index.md",
                                       {"tpo": "reference/agents/algorithms/tpo.md"},
                                       {"alpha": "reference/agents/algorithms/alpha.md"},
                                       {"zeta": "reference/agents/algorithms/zeta.md"}]},
        {"tpo_gym.agents.common": ["reference/agents/common/index.md", {"base": "reference/agents/common/base.md"}]}]
