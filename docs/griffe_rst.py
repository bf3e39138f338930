r"""Griffe extension for the API reference: the reStructuredText markup of tpo_gym's docstrings as Markdown.

The docstrings are Sphinx style (``:param x:`` fields, which mkdocstrings' Sphinx parser reads), with
Sphinx roles, math, simple tables and RST lists in their text, which Markdown would show verbatim or
misread. Before rendering, every docstring's text is rewritten, nothing else (the sources keep their RST):

* cross-reference roles become links: ``:class:`~tpo_gym.agents.common.base.GroupAlgorithm``` -> a link titled
  ```GroupAlgorithm``` to that class's entry, ``:func:`check_group_env``` -> a link to the function that the
  name means where the docstring is (its object, class, module and their imports, as Python resolves it).
  The link is an mkdocs-autorefs ``<autoref optional>``: a target the site does not document (a private
  helper, another package's object) stays plain code, never a broken link. Without a resolver
  (:func:`rst_to_markdown` alone) every role becomes code;
* math becomes pymdownx.arithmatex markup, which MathJax renders: ``:math:`q``` -> ``\(q\)`` and a
  ``.. math::`` directive -> a displayed ``$$ ... $$`` block per equation (blank-line separated);
* simple tables (columns framed by ``=====  ====`` lines) become Markdown tables;
* a paragraph ending in ``::`` (the indented literal block after it is a Markdown code block) ends in ``:``;
* the blocks inside an RST list item (a table, an equation, a second paragraph, a nested list, all
  indented to the item's text) are indented two spaces more per level, as Markdown's four-space list
  indentation needs, so they stay inside the item instead of swallowing the next one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj|const|ref|term):`(~?)([^`]+)`")
MATH_ROLE = re.compile(r":math:`([^`]+)`")
MATH_BLOCK = re.compile(r"^( *)\.\. math::\s*(\S.*)?$")
BORDER = re.compile(r"^( *)(=+(?: +=+)+) *$")
BULLET = re.compile(r"^( *)(?:[*+-]|\d+[.)]) +(?=\S)")
#: The roles that name a Python object, and so become links.
LINK_ROLES = frozenset({"class", "func", "meth", "mod", "data", "attr", "exc", "obj", "const"})
#: ``role target`` -> the identifier of the documented object it names, or None (see :class:`RstToMarkdown`).
Resolver = Callable[[str, str], "str | None"]


def _roles(text: str, resolve: Resolver | None) -> str:
    """``text`` with its cross-reference roles as code, linked where ``resolve`` names a target."""
    def role(match: re.Match[str]) -> str:
        kind, short, target = match.groups()
        code = f"`{target.rsplit('.', 1)[-1] if short else target}`"
        identifier = resolve(kind, target.lstrip(".")) if resolve and kind in LINK_ROLES else None
        if identifier is None:
            return code
        return f'<autoref identifier="{identifier}" optional>{code}</autoref>'

    return ROLE.sub(role, text)


def _math(lines: list[str]) -> list[str]:
    """``lines`` with each ``.. math::`` directive as displayed-math blocks, one per equation."""
    out, i = [], 0
    while i < len(lines):
        match = MATH_BLOCK.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        indent, first = match.group(1), match.group(2)
        body, i = ([first] if first else []), i + 1
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            body.append(lines[i].strip())
            i += 1
        while body and not body[-1]:
            body.pop()
        equations = [eq.strip().splitlines() for eq in "\n".join(body).split("\n\n") if eq.strip()]
        if out and out[-1].strip():
            out.append("")
        for equation in equations:
            out += [f"{indent}$$", *(f"{indent}{line}" for line in equation), f"{indent}$$", ""]
        if i < len(lines) and not lines[i].strip():
            i += 1  # the blank line after the directive: one is already there
    return out


def _nest_lists(lines: list[str]) -> list[str]:
    """``lines`` with the blocks nested in RST list items indented two spaces more per list level (RST
    indents an item's blocks to its text, two spaces after ``*``; Markdown needs four)."""
    out: list[str] = []
    items: list[int] = []  # the text indent of each open item, outermost first
    literal = fence = nested = False  # nested: the open item holds a block after its first paragraph
    literal_indent = 0
    for line in lines:
        if not line.strip():
            out.append(line)
            nested = bool(items)
            continue
        indent = len(line) - len(line.lstrip())
        fence ^= line.strip() == "$$"
        in_literal = literal and indent > literal_indent
        if not in_literal:
            literal = False
            while items and indent < items[-1]:
                items.pop()
        bullet = None if in_literal or fence else BULLET.match(line)
        if bullet and nested and out and out[-1].strip():
            out.append("")  # RST needs no blank line before the next item; after a nested block Markdown does
        out.append(" " * (2 * len(items)) + line)
        if bullet:
            items.append(bullet.end())
            nested = False
        if line.endswith("::") and not in_literal:
            literal, literal_indent = True, indent
    return out


def _cells(line: str, cols: list[tuple[int, int]]) -> list[str]:
    """A row's cells: each column ends at the first space from its border's end on (a cell may overflow)."""
    cells, pos = [], cols[0][0]
    for _, end in cols[:-1]:
        cut = line.find(" ", max(end, pos))
        cut = len(line) if cut < 0 else cut
        cells.append(line[pos:cut].strip())
        pos = cut
    return [*cells, line[pos:].strip()]


def _table(lines: list[str], start: int) -> tuple[list[str], int] | None:
    """The Markdown of the simple table whose top border is ``lines[start]``, and the index after it."""
    indent, border = BORDER.match(lines[start]).groups()
    cols = [(m.start() + len(indent), m.end() + len(indent)) for m in re.finditer(r"=+", border)]
    borders, rows, i = [start], [], start + 1
    end = start + 1
    while i < len(lines) and len(borders) < 3:
        line = lines[i]
        if BORDER.match(line) and BORDER.match(line).group(1) == indent:
            borders.append(i)
            end = i + 1
            if i + 1 >= len(lines) or not lines[i + 1].strip():
                break
        elif line.strip():
            cells = _cells(line, cols)
            if rows and not cells[0] and len(borders) == len(rows[-1][0]):  # continuation of the row above
                rows[-1][1][:] = [f"{old} {new}".strip() for old, new in zip(rows[-1][1], cells, strict=True)]
            else:
                rows.append(([None] * len(borders), cells))
        else:
            return None
        i += 1
    if len(borders) < 2:
        return None
    header_rows = [cells for seen, cells in rows if len(seen) == 1] if len(borders) == 3 else []
    body = [cells for seen, cells in rows if len(seen) == len(borders) - 1 or len(borders) == 2]
    header = header_rows[0] if header_rows else [""] * len(cols)
    out = [indent + "| " + " | ".join(header) + " |", indent + "|" + "---|" * len(cols)]
    out += [indent + "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
    return out, end


def rst_to_markdown(text: str, resolve: Resolver | None = None) -> str:
    """``text`` with its Sphinx roles, math, simple tables, ``::`` paragraph ends and list items written as
    Markdown; ``resolve(role, target)`` gives the identifier a cross-reference role links to (None: code)."""
    text = MATH_ROLE.sub(lambda m: f"\\({m.group(1)}\\)", _roles(text, resolve))
    lines, out, i = _math(text.splitlines()), [], 0
    while i < len(lines):
        table = _table(lines, i) if BORDER.match(lines[i]) else None
        if table is None:
            out.append(lines[i])
            i += 1
        else:
            if out and out[-1].strip():
                out.append("")
            out.extend(table[0])
            i = table[1]
            if i < len(lines) and lines[i].strip():
                out.append("")
    return "\n".join(line[:-1] if line.endswith("::") and line.strip() != "::" else line for line in _nest_lists(out))


def _public(path: str) -> bool:
    return not any(part.startswith("_") for part in path.split("."))


def _lazy_export(obj: Any, path: str) -> str:
    """``package.name`` that a package exports lazily (a module ``__getattr__``, which griffe does not see):
    the ``name`` defined in one of the package's modules; else ``path`` as it is."""
    package, _, name = path.rpartition(".")
    try:
        modules = obj.modules_collection[package].modules.values()
    except (KeyError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return path
    defined = [module.members[name].path for module in modules
               if name in module.members and not module.members[name].is_alias]
    return defined[0] if len(defined) == 1 else path


def object_identifier(obj: Any, target: str) -> str | None:
    """The identifier of the tpo_gym object that ``target`` names in ``obj``'s docstring, as Python would
    resolve the name there (``obj``'s members, its parents', their imports; else an absolute path), at its
    defining module where that module is public; None for another package's object or an unknown name."""
    head, _, rest = target.partition(".")
    try:
        path = obj.resolve(head)
    except (griffe.NameResolutionError, AttributeError, KeyError):
        path = head
    path = f"{path}.{rest}" if rest else path
    if path.split(".", 1)[0] != "tpo_gym":
        return None
    try:
        found = obj.modules_collection[path]
    except (KeyError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return _lazy_export(obj, path)
    if found.is_alias:
        try:
            canonical = found.final_target.path
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return path
        return canonical if _public(canonical) else path
    return path


class RstToMarkdown(griffe.Extension):
    """Rewrite every docstring of the loaded package with :func:`rst_to_markdown`, its roles resolved by
    :func:`object_identifier` in the scope of the object the docstring documents."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[Any] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.is_alias or id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                def resolve(_role: str, target: str, obj: Any = obj) -> str | None:
                    return object_identifier(obj, target)

                obj.docstring.value = rst_to_markdown(obj.docstring.value, resolve)
            stack.extend(obj.members.values())
