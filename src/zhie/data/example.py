"""The example of every span reader (:class:`NerExample`: a text and its spans, exclusive ends) and the checks those
readers share: a record's ``text`` field, integer offsets, a range inside the text.

The NER formats (:mod:`zhie.data.ner`), doccano (:mod:`zhie.data.doccano`), Label Studio (:mod:`zhie.data.label_studio`)
and segmented text (:mod:`zhie.data.cws`) all make their examples here, so none of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from zhie.core.spans import Span
from zhie.data.base import DataError, PathLike, shown

__all__ = ["NerExample", "check_range", "inclusive_span", "is_int", "make_example", "text_field"]


@dataclass
class NerExample:
    """A text and its entity spans, sorted by (start, end, label), with exclusive ends; ``source``, where a reader
    says where the example is (``file:line: task 3``), for errors about it."""

    text: str
    spans: list[Span] = field(default_factory=list)
    source: str | None = field(default=None, compare=False, repr=False)


def make_example(text: str, triples: Iterable[tuple[int, int, str]]) -> NerExample:
    """Deduplicate and sort (start, end_exclusive, label) triples into an example."""
    return NerExample(text, [Span(s, e, label, text[s:e]) for s, e, label in sorted(set(triples))])


def text_field(path: PathLike, lineno: int, record: dict, where: str = "") -> str:
    """The string field ``text`` of a JSON ``record`` read at ``path:lineno`` (``where``: added to an error)."""
    if "text" not in record:
        raise DataError(path, lineno, f"missing field 'text'{where}")
    text = record["text"]
    if not isinstance(text, str):
        raise DataError(path, lineno, f"field 'text' must be a string, got {type(text).__name__}{where}")
    return text


def is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_range(path: PathLike, lineno: int, text: str, start, end, what: str) -> None:
    """Check an exclusive range [start, end) is a non-empty piece of ``text``."""
    if not (is_int(start) and is_int(end)):
        raise DataError(path, lineno, f"{what}: offsets must be integers, got {shown(start)}, {shown(end)}")
    if not 0 <= start < end <= len(text):
        raise DataError(
            path, lineno, f"{what}: range [{shown(start)}, {shown(end)}) is empty or outside the text (length "
                          f"{len(text)})"
        )


def inclusive_span(path: PathLike, lineno: int, text: str, start, end_incl, mention, what: str,
                   key: str = "mention") -> tuple[int, int]:
    """The exclusive range ``(start, end)`` of a span given with an inclusive end (CLUENER's and CMeEE's offsets),
    checked (:func:`check_range`) and against its ``mention``, the text the record's ``key`` says it covers."""
    end = end_incl + 1 if is_int(end_incl) else end_incl
    check_range(path, lineno, text, start, end, what)
    if text[start:end] != mention:
        raise DataError(path, lineno, f"{what}: {key} {shown(mention)} does not match the text at [{start}, "
                                      f"{end_incl}] (end inclusive), which reads {shown(text[start:end])}")
    return start, end
