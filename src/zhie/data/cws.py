"""Segmented text (SIGHAN, SXU): one sentence per line, words separated by whitespace.

A sentence becomes a :class:`NerExample` whose spans are its words (label ``""``, exclusive ends) over the
concatenated text; full-width characters are kept as they are. Blank lines are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from zhie.core.files import atomic_write_text
from zhie.core.spans import Span
from zhie.data.base import DataError, PathLike, iter_lines
from zhie.data.ner import NerExample


def words_to_example(words: list[str]) -> NerExample:
    text, spans = "", []
    for word in words:
        spans.append(Span(len(text), len(text) + len(word), "", word))
        text += word
    return NerExample(text, spans)


def read_segmented(path: PathLike) -> list[NerExample]:
    examples = [words_to_example(line.split()) for _, line in iter_lines(path) if line.strip()]
    if not examples:
        raise DataError(path, 1, "empty file: no segmented sentence")
    return examples


def write_segmented(examples: Iterable[NerExample], path: PathLike, sep: str = "  ") -> None:
    """Write examples as segmented text (words joined by ``sep``), atomically."""
    atomic_write_text(Path(path), "".join(sep.join(s.text for s in ex.spans) + "\n" for ex in examples))
