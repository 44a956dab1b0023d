"""Spans with character offsets, and tag sequences <-> spans.

The one offset convention of zhie: ``Span(start, end, ...)`` has an *exclusive* end, so that
``text[span.start:span.end] == span.text`` always holds.
"""

from __future__ import annotations

from dataclasses import dataclass


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
