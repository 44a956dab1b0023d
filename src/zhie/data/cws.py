"""Segmented text (SIGHAN, SXU): one sentence per line, words separated by whitespace.

A sentence becomes a :class:`NerExample` whose spans are its words (label ``""``, exclusive ends) over the
concatenated text; full-width characters are kept as they are. Blank lines are skipped.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from zhie.data.base import DataError, PathLike, iter_lines
from zhie.data.ner import NerExample
from zhie.spans import Span


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
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for ex in examples:
                f.write(sep.join(ex.text[s.start:s.end] for s in ex.spans) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
