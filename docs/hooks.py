"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml): files the site carries from outside docs/.

* **MathJax**, so that the math renders offline: the self-contained ``tex-svg.js`` of the MathJax 3 copy
  that the ``django-static-mathjax`` package ships (installed by the ``docs`` extra; it needs no Django),
  with the TeX extensions it loads on demand and its menu, under ``assets/mathjax/``. mkdocs.yml loads it
  after ``javascripts/mathjax.js`` (its configuration); ``pymdownx.arithmatex`` marks the math.
* **Benchmark figures**: every ``results/<report>/<name>.png`` that a page links to is the committed
  report's ``benchmarks/results/<report>/<name>.png``, so the Benchmarks page shows the reports' own plots
  (nothing is copied into docs/; a link to a missing plot fails the strict build like any broken link).

And the pages that follow from the code, so that a new module or method needs no docs edit:

* **The API reference of tpo_gym.agents**: one page per public module and subpackage of ``tpo_gym/agents/``
  (walked on disk: :func:`agent_modules`), ``reference/agents/<subpackage>/<module>.md``, each
  ``::: <module>`` for mkdocstrings; the nav entry ``tpo_gym.agents`` of mkdocs.yml becomes their section, grouped
  by subpackage (:func:`expand_nav`).
* **The agents' guides**: the built-in methods of the registry
  (:func:`~tpo_gym.agents.common.registry.builtin_algorithms`, in its order) each have a page
  ``agents/<module, _ as ->.md`` in the "Agents" section, right after ``agents/index.md``; a method without a
  written page gets one generated from its class docstring (:func:`method_page`).
* **Markers** in a page's Markdown (:func:`on_page_markdown`): ``<!-- methods -->`` becomes the table of the
  methods (:func:`methods_table`: ``agents/index.md``), ``<!-- method-links -->`` links to their API entries
  (``reference/index.md``), ``<!-- agents-map -->`` the table of the subpackages of tpo_gym.agents, their modules
  and jobs (:func:`agents_map`: ``architecture.md``).

tests/test_docs.py builds the site and also calls these functions directly (a method with no written page).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import posixpath
import re
from functools import cache
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
#: What the site takes of the MathJax distribution (paths under its ``es5/`` folder, and its licence).
MATHJAX_PARTS = ("tex-svg.js", "input/tex/extensions", "ui")
#: A page's link to a committed report's figure: ``results/<report>/<name>.png``, ``../results/...`` from a
#: page in a folder.
FIGURE = re.compile(r"(?<![\w.-])(?:\.\./)*results/((?:[\w.-]+/)+[\w.-]+\.png)")


def mathjax_root() -> Path:
    """The MathJax distribution that ``django-static-mathjax`` installs (its ``es5/`` folder's parent)."""
    import mathjax  # django-static-mathjax

    root = Path(mathjax.__file__).resolve().parent / "static" / "mathjax"
    if not (root / "es5" / "tex-svg.js").is_file():
        raise FileNotFoundError(f"no MathJax under {root}: install the docs extra (pip install -e '.[docs]')")
    return root


def _add(files: Files, config: Any, uri: str, source: Path) -> None:
    files.append(File.generated(config, uri, abs_src_path=str(source)))


#: The package whose API reference is generated, and where its pages go.
AGENTS = "tpo_gym.agents"
AGENTS_DIR = ROOT / "tpo_gym" / "agents"
API_DIR = "reference/agents"
#: The subpackages of tpo_gym.agents in the order the nav lists them (any other one after them, by name).
SUBPACKAGES = ("algorithms", "common", "policies", "lm", "files")
#: The same, top first in the order imports flow (tests/test_layout.py): the map of docs/architecture.md.
LAYERS = ("algorithms", "common", "lm", "policies", "files")
#: The nav section of the agents' guides, the page after which the methods' pages go, and the API nav entry the
#: generated reference replaces.
GUIDES_SECTION, GUIDES_INDEX, API_ENTRY = "Agents", "agents/index.md", AGENTS
#: Markers a page's Markdown may hold, replaced by generated text (:func:`on_page_markdown`).
METHODS_MARKER, METHOD_LINKS_MARKER, MAP_MARKER = "<!-- methods -->", "<!-- method-links -->", "<!-- agents-map -->"


def _is_public(name: str) -> bool:
    return not name.startswith("_")


def agent_modules(package: Path = AGENTS_DIR, name: str = AGENTS, first: tuple[str, ...] = ()) -> list[str]:
    """``name`` (the package in directory ``package``) and every public module and subpackage under it, read from
    the files (griffe reads them, nothing of them is imported here): the package, its modules (those named in
    ``first`` in that order, then by name), then each subpackage with its own (:data:`SUBPACKAGES` order). The
    methods' modules of ``algorithms`` come first, in the registry's order."""
    modules = sorted(p.stem for p in package.glob("*.py") if _is_public(p.stem))
    modules = [m for m in first if m in modules] + [m for m in modules if m not in first]
    subpackages = sorted((p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
                          and _is_public(p.name)), key=lambda n: (SUBPACKAGES.index(n) if n in SUBPACKAGES
                                                                   else len(SUBPACKAGES), n))
    out = [name, *(f"{name}.{m}" for m in modules)]
    for sub in subpackages:
        order = tuple(m.module.rsplit(".", 1)[-1] for m in registered_methods()) if sub == "algorithms" else ()
        out += agent_modules(package / sub, f"{name}.{sub}", order)
    return out


def _is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").is_file()


def api_uri(module: str) -> str:
    """The API page of a module of tpo_gym.agents: ``reference/agents/common/base.md``, a package's ``index.md``."""
    parts = module.removeprefix(AGENTS).strip(".").split(".") if module != AGENTS else []
    if _is_package(module):
        return posixpath.join(API_DIR, *parts, "index.md")
    return posixpath.join(API_DIR, *parts) + ".md"


def api_page(module: str) -> str:
    """The Markdown of a module's API page: its name and the mkdocstrings block that renders it."""
    return f"# `{module}`\n\n::: {module}\n"


def api_nav(modules: list[str]) -> list[Any]:
    """The nav of the API pages of ``modules`` (:func:`agent_modules`' order): the package's page, then a section
    per subpackage (its page, then its modules by their short names)."""
    nav: list[Any] = []
    sections: dict[str, list[Any]] = {}
    for module in modules:
        parent = module.rpartition(".")[0]
        if _is_package(module):
            sections[module] = [api_uri(module)]
            (sections[parent] if parent in sections else nav).append({module: sections[module]})
        else:
            sections[parent].append({module.rsplit(".", 1)[-1]: api_uri(module)})
    return nav[0][AGENTS] if len(nav) == 1 and AGENTS in nav[0] else nav


def agents_map(page: str, modules: list[str] | None = None) -> str:
    """The Markdown table of the subpackages of tpo_gym.agents (:data:`LAYERS` order) on the page ``page``: each
    one's modules, linked to their API pages, and its job (the first line of its docstring)."""
    modules = agent_modules() if modules is None else modules
    subpackages = [m for m in modules if m.count(".") == 2 and _is_package(m)]
    subpackages.sort(key=lambda m: LAYERS.index(m.rsplit(".", 1)[-1]) if m.rsplit(".", 1)[-1] in LAYERS
                     else len(LAYERS))
    here = posixpath.dirname(page) or "."
    rows = ["| subpackage | modules | job |", "|---|---|---|"]
    for sub in subpackages:
        own = [m for m in modules if m.rpartition(".")[0] == sub]
        links = ", ".join(f"[`{m.rsplit('.', 1)[-1]}`]({posixpath.relpath(api_uri(m), here)})" for m in own)
        source = (ROOT / sub.replace(".", "/") / "__init__.py").read_text(encoding="utf-8")
        job = (ast.get_docstring(ast.parse(source)) or "").strip().split("\n")[0]
        rows.append(f"| [`{sub.rsplit('.', 1)[-1]}`]({posixpath.relpath(api_uri(sub), here)}) | {links} | "
                    f"{_rst_to_markdown(job).replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


@dataclasses.dataclass(frozen=True)
class Method:
    """A built-in method of the registry, as the docs show it."""

    name: str
    cls: type
    #: ``agents/<module, _ as ->.md``: the method's guide page.
    guide: str
    #: Whether ``docs/<guide>`` is written (else it is generated from the class docstring).
    written: bool

    @property
    def module(self) -> str:
        return self.cls.__module__

    @property
    def identifier(self) -> str:
        """The class's identifier in the API reference (mkdocs-autorefs)."""
        return f"{self.cls.__module__}.{self.cls.__qualname__}"

    @property
    def summary(self) -> str:
        """The first line of the class docstring, as Markdown."""
        lines = (self.cls.__doc__ or "").strip().splitlines()
        return _rst_to_markdown(lines[0].strip()) if lines else ""


def registered_methods(classes: dict[str, type] | None = None, docs_dir: Path = DOCS) -> list[Method]:
    """The methods of ``classes`` (``{name: class}``; default: the registry's built-in ones, in its order) with
    their guide pages, written under ``docs_dir`` or not."""
    if classes is None:
        classes = _builtin_algorithms()
    out = []
    for name, cls in classes.items():
        guide = f"agents/{cls.__module__.rsplit('.', 1)[-1].replace('_', '-')}.md"
        out.append(Method(name, cls, guide, (docs_dir / guide).is_file()))
    return out


@cache
def _builtin_algorithms() -> dict[str, type]:
    import tpo_gym.agents  # noqa: F401  (registers the built-in methods)
    from tpo_gym.agents.common.registry import builtin_algorithms

    return builtin_algorithms()


@cache
def _rst_to_markdown_function() -> Any:
    spec = importlib.util.spec_from_file_location("tpo_gym_docs_griffe_rst", DOCS / "griffe_rst.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.rst_to_markdown


def _rst_to_markdown(text: str) -> str:
    return _rst_to_markdown_function()(text)


def _code_list(values: tuple[str, ...]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def _levels(method: Method) -> str:
    levels = method.cls.spec.levels  # type: ignore[attr-defined]
    return "—" if levels == ("auto",) else _code_list(levels)


def method_page(method: Method) -> str:
    """The guide page of a method that has none written: the class name as its title, its spec, and its docstring
    as mkdocstrings renders it (no heading and no members: the class's entry, the target of its links, is its API
    page)."""
    spec = method.cls.spec  # type: ignore[attr-defined]
    return (f"# {method.name}\n\n"
            f"Levels: {_levels(method)}; run kinds: {_code_list(spec.run_kinds)}; sampling: `{spec.sampling}`. "
            f"API: [`{method.name}`][{method.identifier}].\n\n"
            f"::: {method.identifier}\n"
            "    options:\n"
            "      show_root_heading: false\n"
            "      show_root_toc_entry: false\n"
            "      members: false\n")


def methods_table(methods: list[Method], page: str) -> str:
    """The Markdown table of ``methods`` on the page ``page`` (its src_uri, for the relative links): each method's
    guide, what it is (its docstring's first line), levels, run kinds and API entry."""
    rows = ["| method | what it is | levels (`level=`) | run kinds | API |", "|---|---|---|---|---|"]
    for m in methods:
        link = posixpath.relpath(m.guide, posixpath.dirname(page) or ".")
        cells = [f"[{m.name}]({link})", m.summary.replace("|", "\\|"), _levels(m),
                 _code_list(m.cls.spec.run_kinds), f"[`{m.name}`][{m.identifier}]"]  # type: ignore[attr-defined]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def method_links(methods: list[Method]) -> str:
    """Links to the API entries of ``methods``: ``[`TPO`][tpo_gym.agents.algorithms.tpo.TPO], ...``."""
    return ", ".join(f"[`{m.name}`][{m.identifier}]" for m in methods)


def generated_pages(methods: list[Method], modules: list[str]) -> dict[str, str]:
    """``{src_uri: Markdown}`` of every generated page: the API pages of ``modules`` and the guide of each method
    in ``methods`` that has none written."""
    pages = {api_uri(module): api_page(module) for module in modules}
    pages.update({m.guide: method_page(m) for m in methods if not m.written})
    return pages


def _nav_uri(entry: Any) -> Any:
    return next(iter(entry.values())) if isinstance(entry, dict) and len(entry) == 1 else entry


def expand_nav(nav: list[Any], methods: list[Method], modules: list[str]) -> list[Any]:
    """``nav`` (mkdocs.yml's) with the methods' guides after ``agents/index.md`` in the "Agents" section and the
    ``tpo_gym.agents`` entry replaced by the API pages of ``modules`` (idempotent: run again, the same nav)."""
    found: list[str] = []

    def walk(entries: list[Any]) -> list[Any]:
        out = []
        for entry in entries:
            if isinstance(entry, dict) and len(entry) == 1:
                (title, value), = entry.items()
                if title == API_ENTRY:
                    entry = {title: api_nav(modules)}
                    found.append(API_ENTRY)
                elif title == GUIDES_SECTION and isinstance(value, list) and GUIDES_INDEX in map(_nav_uri, value):
                    guides = {m.guide for m in methods}
                    kept = [e for e in value if _nav_uri(e) not in guides]
                    at = [_nav_uri(e) for e in kept].index(GUIDES_INDEX) + 1
                    entry = {title: [*kept[:at], *(m.guide for m in methods), *kept[at:]]}
                    found.append(GUIDES_SECTION)
                elif isinstance(value, list):
                    entry = {title: walk(value)}
            out.append(entry)
        return out

    expanded = walk(nav)
    if sorted(found) != sorted([API_ENTRY, GUIDES_SECTION]):
        raise PluginError(f"mkdocs.yml's nav needs one entry '{API_ENTRY}' (the generated API pages) and one section "
                          f"'{GUIDES_SECTION}' holding {GUIDES_INDEX} (the methods' guides go after it)")
    return expanded


def on_config(config: Any, **kwargs: Any) -> Any:
    config["nav"] = expand_nav(config["nav"], registered_methods(), agent_modules())
    return config


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    for uri, content in generated_pages(registered_methods(), agent_modules()).items():
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} is generated (docs/hooks.py): delete the written page")
        files.append(File.generated(config, uri, content=content))
    root = mathjax_root()
    _add(files, config, "assets/mathjax/LICENSE.txt", root / "LICENSE")
    for part in MATHJAX_PARTS:
        path = root / "es5" / part
        for source in sorted(path.rglob("*.js")) if path.is_dir() else [path]:
            _add(files, config, f"assets/mathjax/{source.relative_to(root / 'es5').as_posix()}", source)
    linked = set()
    for page in files.documentation_pages():
        linked.update(FIGURE.findall(page.content_string))
    for figure in sorted(linked):
        if (RESULTS / figure).is_file():  # else the page's link stays broken, and the strict build says so
            _add(files, config, f"results/{figure}", RESULTS / figure)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files, **kwargs: Any) -> str:
    if METHODS_MARKER in markdown or METHOD_LINKS_MARKER in markdown:
        methods = registered_methods()
        markdown = markdown.replace(METHODS_MARKER, methods_table(methods, page.file.src_uri))
        markdown = markdown.replace(METHOD_LINKS_MARKER, method_links(methods))
    if MAP_MARKER in markdown:
        markdown = markdown.replace(MAP_MARKER, agents_map(page.file.src_uri))
    return markdown
