"""benchmarks/RESULTS.md against its JSON lines: every marked table is what ``benchmarks/report.py`` makes from
``benchmarks/results/*.jsonl`` (nothing is trained or timed here), and the README's links into it resolve."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "benchmarks" / "RESULTS.md"


def load_report():
    spec = importlib.util.spec_from_file_location("benchmarks_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = load_report()


def test_every_marked_table_is_what_its_rows_give():
    doc = DOC.read_text(encoding="utf-8")
    stale = report.stale(doc)
    assert not stale, (f"benchmarks/RESULTS.md: the tables {stale} differ from benchmarks/results/*.jsonl; run "
                       "`python benchmarks/report.py --write` (or fix the rows or report.py, not the table)")
    assert report.render(doc) == doc


def test_a_table_edited_by_hand_is_caught():
    doc = DOC.read_text(encoding="utf-8")
    name, text = report.marked(doc)[0]
    edited = re.sub(r"\d", lambda m: str((int(m[0]) + 1) % 10), text, count=1)  # one digit of the table, changed
    start = doc.index(f"<!-- report:{name} -->\n") + len(f"<!-- report:{name} -->\n")
    assert doc[start:start + len(text)] == text
    forged = doc[:start] + edited + doc[start + len(text):]
    assert report.stale(forged) == [name]
    assert report.render(forged) == report.render(doc)


def test_every_table_of_report_has_its_place_and_markers_are_well_formed():
    doc = DOC.read_text(encoding="utf-8")
    names = [name for name, _ in report.marked(doc)]
    assert len(names) == len(set(names)), "a table is marked twice"
    assert sorted(names) == sorted(report.TABLES), "report.TABLES and the markers of RESULTS.md differ"
    with pytest.raises(ValueError, match="no table of that name"):
        report.marked("<!-- report:no-such-table -->\n| x |\n<!-- /report:no-such-table -->\n")
    with pytest.raises(ValueError, match="closing twin"):
        report.marked("<!-- report:ner -->\n| x |\n")
    with pytest.raises(ValueError, match="closed by"):
        report.marked("<!-- report:ner -->\n| x |\n<!-- /report:cws -->\n")


def test_table_helper():
    assert report.table(["a", "b"], [[1, "x"], [2, "y"]], right=(0,)) == "| a | b |\n|---:|---|\n| 1 | x |\n| 2 | y |"
    wide = report.table([str(i) for i in range(12)], [], right=range(10, 12))  # column 10 is not columns 1 and 0
    assert wide.splitlines()[1] == "|" + "---|" * 10 + "---:|---:|"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters of any script, digits, ``-`` and
    ``_`` kept), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_into_results_resolve():
    """Every ``RESULTS.md#anchor`` of the README and of benchmarks/README.md, and RESULTS.md's own ``(#anchor)``
    links, name a heading of RESULTS.md."""
    doc = DOC.read_text(encoding="utf-8")
    anchors = {anchor(h) for h in re.findall(r"^#+ (.+)$", doc, re.MULTILINE)}
    links = [link for readme in (ROOT / "README.md", ROOT / "benchmarks" / "README.md")
             for link in re.findall(r"RESULTS\.md#([^)\s]+)", readme.read_text(encoding="utf-8"))]
    links += re.findall(r"\]\(#([^)\s]+)\)", doc)
    assert links, "no links found"
    assert not [link for link in links if link not in anchors], sorted(anchors)
