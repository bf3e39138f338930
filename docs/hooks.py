"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml): files the site carries from outside docs/.

* **MathJax**, so that the math renders offline: the self-contained ``tex-svg.js`` of the MathJax 3 copy
  that the ``django-static-mathjax`` package ships (installed by the ``docs`` extra; it needs no Django),
  with the TeX extensions it loads on demand and its menu, under ``assets/mathjax/``. mkdocs.yml loads it
  after ``javascripts/mathjax.js`` (its configuration); ``pymdownx.arithmatex`` marks the math.
* **Benchmark figures**: every ``results/<report>/<name>.png`` that a page links to is the committed
  report's ``benchmarks/results/<report>/<name>.png``, so the Benchmarks page shows the reports' own plots
  (nothing is copied into docs/; a link to a missing plot fails the strict build like any broken link).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
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


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    root = mathjax_root()
    _add(files, config, "assets/mathjax/LICENSE.txt", root / "LICENSE")
    for part in MATHJAX_PARTS:
        path = root / "es5" / part
        for source in sorted(path.rglob("*.js")) if path.is_dir() else [path]:
            _add(files, config, f"assets/mathjax/{source.relative_to(root / 'es5').as_posix()}", source)
    linked = set()
    for page in files.documentation_pages():
        linked.update(FIGURE.findall(Path(page.abs_src_path).read_text(encoding="utf-8")))
    for figure in sorted(linked):
        if (RESULTS / figure).is_file():  # else the page's link stays broken, and the strict build says so
            _add(files, config, f"results/{figure}", RESULTS / figure)
    return files
