"""Segmented text (SIGHAN, SXU): one sentence per line, words separated by whitespace.

A sentence becomes a :class:`NerExample` whose spans are its words (label ``""``, exclusive ends) over the
concatenated text; full-width characters are kept as they are. Blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from zhie.core.files import atomic_write_text
from zhie.core.spans import Span
from zhie.data.base import DataError, PathLike, iter_lines
from zhie.data.example import NerExample


def words_to_example(words: list[str]) -> NerExample:
    spans, start = [], 0
    for word in words:
        spans.append(Span(start, start + len(word), "", word))
        start += len(word)
    return NerExample("".join(words), spans)


def read_segmented(path: PathLike) -> list[NerExample]:
    examples = []
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        if line.lstrip().startswith("{") and _is_json_object(line):
            raise DataError(path, lineno, "a JSON object, where segmented text (words separated by spaces) was "
                            "expected; is this a file of another task (NER, relations)?")
        examples.append(words_to_example(line.split()))
    if not examples:
        raise DataError(path, 1, "empty file: no segmented sentence")
    return examples


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def write_segmented(examples: Iterable[NerExample], path: PathLike, sep: str = "  ") -> None:
    """Write examples as segmented text (words joined by ``sep``), atomically."""
    atomic_write_text(Path(path), "".join(sep.join(s.text for s in ex.spans) + "\n" for ex in examples))
