"""Generated tables inside a Markdown page: a table stands between ``<!-- KIND:NAME -->`` and ``<!-- /KIND:NAME -->``,
each on a line of its own, and ``tables[NAME]()`` makes it. ``benchmarks/report.py`` keeps RESULTS.md's (and the docs'
result tables, KIND ``report``) this way, ``docs/cli_reference.py`` the docs' flag tables (KIND ``cli``)."""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

Tables = dict[str, Callable[[], str]]


def _patterns(kind: str) -> tuple[re.Pattern, re.Pattern]:
    marked = re.compile(rf"^(<!-- {kind}:([\w-]+) -->\n)(.*?)^(<!-- /{kind}:([\w-]+) -->)$", re.DOTALL | re.MULTILINE)
    return marked, re.compile(rf"^<!-- {kind}:([\w-]+) -->$", re.MULTILINE)


def marked(doc: str, kind: str, tables: Tables) -> list[tuple[str, str]]:
    """(name, text between the markers) of every marked table of ``doc``, in order; a marker without its closing
    twin, or a name ``tables`` lacks, is an error."""
    pattern, opening = _patterns(kind)
    found = []
    for m in pattern.finditer(doc):
        if m[2] != m[5]:
            raise ValueError(f"<!-- {kind}:{m[2]} --> is closed by <!-- /{kind}:{m[5]} -->")
        if m[2] not in tables:
            raise ValueError(f"<!-- {kind}:{m[2]} -->: no table of that name")
        found.append((m[2], m[3]))
    opened = opening.findall(doc)
    if len(opened) != len(found):
        raise ValueError(f"markers without their closing twin among {sorted(set(opened) - {n for n, _ in found})}")
    return found


def render(doc: str, kind: str, tables: Tables) -> str:
    """``doc`` with every marked table made afresh."""
    marked(doc, kind, tables)
    return _patterns(kind)[0].sub(lambda m: f"{m[1]}{tables[m[2]]()}\n{m[4]}", doc)


def stale(doc: str, kind: str, tables: Tables) -> list[str]:
    """The names of the marked tables of ``doc`` that differ from what their functions make."""
    return [name for name, text in marked(doc, kind, tables) if text != tables[name]() + "\n"]


def update(path: Path, kind: str, tables: Tables, check: bool, how: str) -> int:
    """``--check`` (``check``): name each stale table of the page ``path`` and show the difference, 1 if there is
    any; else rewrite the stale tables in place. ``how``: the command that rewrites them."""
    doc = path.read_text(encoding="utf-8")
    names, new = stale(doc, kind, tables), render(doc, kind, tables)
    if check:
        for name in names:
            print(f"{path}: table {name!r} is out of date ({how})")
        sys.stdout.writelines(difflib.unified_diff(doc.splitlines(True), new.splitlines(True), "as written", "made"))
        return int(new != doc)
    if new != doc:
        path.write_text(new, encoding="utf-8")
        print(f"{path}: rewrote {', '.join(names)}")
    return 0
