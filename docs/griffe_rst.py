"""Griffe extension for the API reference: the reStructuredText markup of tpo_gym's docstrings as Markdown.

The docstrings are Sphinx style (``:param x:`` fields, which mkdocstrings' Sphinx parser reads), with
Sphinx roles and simple tables in their text, which Markdown would show verbatim. Before rendering,
every docstring's text is rewritten, nothing else:

* roles become code: ``:class:`~tpo_gym.agents.base.GroupAlgorithm``` -> ```GroupAlgorithm```,
  ``:func:`tpo_gym.envs.check_group_env``` -> ```tpo_gym.envs.check_group_env```, ``:math:`q``` -> ```q```;
* simple tables (columns framed by ``=====  ====`` lines) become Markdown tables;
* a paragraph ending in ``::`` (the indented literal block after it is a Markdown code block) ends in ``:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|math|ref|term):`(~?)([^`]+)`")
BORDER = re.compile(r"^( *)(=+(?: +=+)+) *$")


def _role(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


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


def rst_to_markdown(text: str) -> str:
    """``text`` with its Sphinx roles, simple tables and ``::`` paragraph ends written as Markdown."""
    text = ROLE.sub(_role, text)
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        table = _table(lines, i) if BORDER.match(lines[i]) else None
        if table is None:
            line = lines[i]
            out.append(line[:-1] if line.endswith("::") and not line.strip() == "::" else line)
            i += 1
        else:
            if out and out[-1].strip():
                out.append("")
            out.extend(table[0])
            out.append("")
            i = table[1]
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrite every docstring of the loaded package with :func:`rst_to_markdown`."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[Any] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.is_alias or id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = rst_to_markdown(obj.docstring.value)
            stack.extend(obj.members.values())
