"""Spans with character offsets, and tag sequences <-> spans.

The one offset convention of zhie: ``Span(start, end, ...)`` has an *exclusive* end, so that
``text[span.start:span.end] == span.text`` always holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, order=True)
class Span:
    start: int
    end: int
    label: str = ""
    text: str = ""
    score: float | None = None

    def to_dict(self) -> dict:
        out = {"start": self.start, "end": self.end, "label": self.label, "text": self.text}
        if self.score is not None:
            out["score"] = round(float(self.score), 4)
        return out


# ----------------------------------------------------------------------------------------------------
# Tag sequences <-> spans over tag positions (start, end_exclusive, label)
# ----------------------------------------------------------------------------------------------------

# Span prefixes each scheme may use. The typed schemes write them "P-TYPE" and also have the
# tag "O" (outside); BMES (word segmentation) uses them bare, and every position is in a word.
_PREFIXES = {"BIO": "BI", "IOB1": "BI", "BIOES": "BIES", "BMES": "BMES"}
_ALIASES = {"IOB2": "BIO"}


def _check_scheme(scheme: str) -> str:
    name = _ALIASES.get(scheme.upper(), scheme.upper())
    if name not in _PREFIXES:
        raise ValueError(f"unknown tagging scheme {scheme!r}; expected one of {sorted(_PREFIXES)}")
    return name


def parse_tag(tag: str, scheme: str) -> tuple[str, str]:
    """Split a tag of ``scheme`` (a name :func:`tags_to_spans` accepts) into ``(prefix, label)``: ``"B-PER"`` ->
    ``("B", "PER")``, ``"O"`` -> ``("O", "")``; BMES's bare tags have label ``""`` and its "M" is read as "I"."""
    scheme = _check_scheme(scheme)
    if scheme == "BMES":
        if tag not in ("B", "M", "E", "S"):
            raise ValueError(f"malformed BMES tag {tag!r}: expected one of 'B', 'M', 'E', 'S'")
        return ("I" if tag == "M" else tag), ""
    if tag == "O":
        return "O", ""
    prefix, sep, label = tag.partition("-")
    if not sep or not label or len(prefix) != 1 or prefix not in _PREFIXES[scheme]:
        allowed = ", ".join(f"'{p}-TYPE'" for p in _PREFIXES[scheme])
        raise ValueError(f"malformed {scheme} tag {tag!r}: expected 'O', {allowed}")
    return prefix, label


def tags_to_spans(tags: Sequence[str], scheme: str = "BIO") -> list[tuple[int, int, str]]:
    """Decode a tag sequence into ``(start, end_exclusive, label)`` spans over tag positions.

    ``scheme`` is one of "BIO" (IOB2; "IOB2" is accepted as an alias), "IOB1", "BIOES" or "BMES"
    (case-insensitive). All schemes share one lenient, conlleval-style decoder, identical to
    seqeval's default ``get_entities`` (which returns inclusive ends; ours are exclusive):
    a tag *continues* the current span only if it is I/E, the previous tag is B/I, and both
    have the same type. Any other non-"O" tag starts a new span, so ill-formed sequences still
    decode: "I-X" after "O" starts an entity, a type change ends one, E/S close one.

    For BMES, tags are bare "B", "M", "E", "S"; "M" is read as "I" and every word has label "".
    Since there is no "O", the words always partition the sequence, also when it is ill-formed:
    an "M" or "E" that does not follow "B"/"M" starts a new word, and a "B"/"M" that is not
    closed by "E" ends its word before the next "B"/"S" (or at the end of the sequence).

    Raises ``ValueError`` for an unknown scheme or a tag the scheme does not allow (e.g. "X-PER",
    "B-" or "E-PER" under BIO, "O" under BMES).
    """
    scheme = _check_scheme(scheme)
    spans: list[tuple[int, int, str]] = []
    start, prev_prefix, prev_label = -1, "O", ""
    for i, tag in enumerate(tags):
        prefix, label = parse_tag(tag, scheme)
        continues = prefix in "IE" and prev_prefix in "BI" and label == prev_label
        if not continues:
            if start >= 0:
                spans.append((start, i, prev_label))
            start = -1 if prefix == "O" else i
        prev_prefix, prev_label = prefix, label
    if start >= 0:
        spans.append((start, len(tags), prev_label))
    return spans


class BatchTagDecoder:
    """:func:`tags_to_spans` for a whole batch of tag-id rows in a few numpy operations (prediction's hot path: a
    Python loop over every token costs ~100 µs a sentence, as much as a GPU's encoder). ``tags`` are the tag names
    of the ids, under ``scheme``; the spans are exactly those of :func:`tags_to_spans` on each row."""

    def __init__(self, tags: Sequence[str], scheme: str = "BIO") -> None:
        parsed = [parse_tag(t, scheme) for t in tags]
        self.labels = sorted({label for _, label in parsed})
        self.prefix = np.array(["OBIES".index(p) for p, _ in parsed], dtype=np.int8)
        self.label = np.array([self.labels.index(label) for _, label in parsed], dtype=np.int64)

    def __call__(self, ids: np.ndarray, lengths: Sequence[int]) -> tuple[np.ndarray, ...]:
        """``ids [b, n]`` (anything past a row's length is ignored) -> ``(row, start, end, label)`` arrays, one entry
        per span, rows in order and spans left to right; ``label`` indexes :attr:`labels`."""
        ids = np.asarray(ids, dtype=np.int64)
        b, n = ids.shape
        valid = np.arange(n)[None, :] < np.asarray(lengths, dtype=np.int64).reshape(b, 1)
        ids = np.where(valid, ids, 0)
        prefix, label = self.prefix[ids], self.label[ids]
        continues = np.zeros((b, n), dtype=bool)  # I/E after B/I of the same type (position 0 never continues)
        inside, opened = np.isin(prefix, (2, 3)), np.isin(prefix, (1, 2))  # I or E; B or I
        continues[:, 1:] = inside[:, 1:] & opened[:, :-1] & (label[:, 1:] == label[:, :-1])
        breaks = np.concatenate([~continues | ~valid, np.ones((b, 1), dtype=bool)], axis=1)
        where = np.where(breaks, np.arange(n + 1)[None, :], n)
        next_break = np.minimum.accumulate(where[:, ::-1], axis=1)[:, ::-1][:, 1:]  # the first break after each i
        rows, starts = np.nonzero(~continues & (prefix != 0) & valid)
        return rows, starts, next_break[rows, starts], label[rows, starts]


def _span_tags(width: int, label: str, scheme: str, follows_same_type: bool) -> list[str]:
    """Tags for one span of ``width`` positions (see :func:`spans_to_tags`)."""
    if scheme == "BIO":
        prefixes = "B" + "I" * (width - 1)
    elif scheme == "IOB1":
        prefixes = ("B" if follows_same_type else "I") + "I" * (width - 1)
    elif width == 1:
        prefixes = "S"
    else:
        prefixes = "B" + ("M" if scheme == "BMES" else "I") * (width - 2) + "E"
    suffix = "" if scheme == "BMES" else "-" + label
    return [p + suffix for p in prefixes]


def spans_to_tags(
    spans: Iterable[tuple[int, int, str] | Span], length: int, scheme: str = "BIO"
) -> list[str]:
    """Encode ``(start, end_exclusive, label)`` spans (or :class:`Span` objects) as ``length`` tags.

    - "BIO": "B-X" on the first position of a span, "I-X" on the rest.
    - "IOB1": "I-X" everywhere, except "B-X" on the first position of a span that directly
      follows a span of the same type.
    - "BIOES": "S-X" for a one-position span, else "B-X", "I-X", ..., "E-X".
    - "BMES": bare "S", or "B", "M", ..., "E"; labels are ignored, and the spans must cover every
      position (a segmentation into words).

    Positions outside spans get "O" in the typed schemes. :func:`tags_to_spans` inverts this.
    Raises ``ValueError`` for an unknown scheme, a span that is empty or outside ``[0, length)``,
    an empty label in a typed scheme, overlapping spans (both are named), or, for BMES,
    a position no span covers.
    """
    scheme = _check_scheme(scheme)
    triples = sorted((s.start, s.end, s.label) if isinstance(s, Span) else tuple(s) for s in spans)
    tags = ["O"] * length
    prev: tuple[int, int, str] | None = None
    for start, end, label in triples:
        if not 0 <= start < end <= length:
            raise ValueError(f"span {(start, end, label)} is empty or outside [0, {length})")
        if scheme != "BMES" and not label:
            raise ValueError(f"span {(start, end, label)} needs a label in the {scheme} scheme")
        if prev is not None and start < prev[1]:
            raise ValueError(f"overlapping spans {prev} and {(start, end, label)} cannot be tagged")
        follows_same_type = prev is not None and prev[1] == start and prev[2] == label
        tags[start:end] = _span_tags(end - start, label, scheme, follows_same_type)
        prev = (start, end, label)
    if scheme == "BMES" and "O" in tags:
        raise ValueError(f"BMES spans must cover every position; position {tags.index('O')} is not")
    return tags
