"""Word-level labels on a sub-word encoder (spec §10.2: the ``is_heads`` mask of the MTMT recogniser).

Word-level corpora (WikiANN, CoNLL-2002/2003) are read as their words joined by one space; a *word* is a maximal
run of non-whitespace characters of the text (:func:`word_ranges`). Each word is labelled once, on its **first
sub-word** (its *head* token, :func:`word_heads`); the other sub-words and the special tokens carry no label, no
loss and no prediction. A word's BIO tag comes from the character spans it overlaps (:func:`word_tags`), and
predicted word tags go back to character spans of the original text (:func:`word_spans`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from zhie.core.spans import Span, tags_to_spans
from zhie.core.text import Encoding

_WORD = re.compile(r"\S+")


def word_ranges(text: str) -> list[tuple[int, int]]:
    """The character range ``[start, end)`` of each word (maximal non-whitespace run) of ``text``."""
    return [m.span() for m in _WORD.finditer(text)]


def word_heads(encoding: Encoding, ranges: Sequence[tuple[int, int]]) -> list[int]:
    """For each word, the content token index of its first sub-word, or -1 when no token of its own starts it
    (its first character produces no token, or the token also covers the previous word)."""
    heads, previous = [], -1
    for start, _ in ranges:
        token = encoding.char_to_token[start]
        ok = token >= 0 and token != previous and encoding.starts[token] == start
        heads.append(token if ok else -1)
        previous = token if token >= 0 else previous
    return heads


def word_tags(ranges: Sequence[tuple[int, int]], spans: Sequence[Span]) -> list[str]:
    """BIO tags of the words: the words a span overlaps get ``B-label`` (the first) and ``I-label``; others ``O``.

    Raises ``ValueError`` when two spans overlap the same word (word-level tagging cannot represent that)."""
    tags = ["O"] * len(ranges)
    starts = [s for s, _ in ranges]
    for span in spans:
        first = max(0, bisect.bisect_right(starts, span.start) - 1)
        last = bisect.bisect_left(starts, span.end)
        inside = [w for w in range(first, last) if span.start < ranges[w][1]]
        for k, w in enumerate(inside):
            if tags[w] != "O":
                raise ValueError(f"entities overlap on the word {w} ({span}); word-level tags need flat entities")
            tags[w] = ("B-" if k == 0 else "I-") + span.label
    return tags


def word_spans(text: str, ranges: Sequence[tuple[int, int]], tags: Sequence[str],
               scores: Sequence[float] | None = None) -> list[Span]:
    """Character spans of the entities in the words' BIO ``tags`` (from the first word's start to the last word's
    end); ``scores`` (per word) gives each span the mean over its words."""
    out = []
    for s, e, label in tags_to_spans(list(tags), "BIO"):
        start, end = ranges[s][0], ranges[e - 1][1]
        score = sum(scores[s:e]) / (e - s) if scores is not None else None
        out.append(Span(start, end, label, text[start:end], score))
    return out
