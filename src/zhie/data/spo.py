"""Triple data in the CMeIE/DuIE JSON-lines shape, with mentions located in the text.

Each line: ``{"text", "spo_list": [{"subject", "predicate", "object", "subject_type", "object_type"}]}`` where
``object`` and ``object_type`` may be strings or ``{"@value": ...}``. Mentions are strings, so they are located
here. **Rule**: among every occurrence of the subject and every occurrence of the object, take the pair whose
starts are closest to each other (ties: the earliest subject, then the earliest object). A triple whose subject
or object does not occur in the text keeps no offsets; :func:`read_spo` counts them (``located=False``). A triple
given twice in a line is kept once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zhie.core.spans import Span
from zhie.data.base import DataError, PathLike, iter_lines, json_line, shown


@dataclass(frozen=True)
class Triple:
    subject: Span  # label = subject type; start = end = -1 when the mention is not in the text
    predicate: str
    object: Span
    score: float | None = field(default=None, compare=False)

    @property
    def located(self) -> bool:
        return self.subject.start >= 0 and self.object.start >= 0

    def to_dict(self) -> dict:
        out = {"subject": {"start": self.subject.start, "end": self.subject.end, "text": self.subject.text},
               "predicate": self.predicate,
               "object": {"start": self.object.start, "end": self.object.end, "text": self.object.text}}
        if self.score is not None:
            out["score"] = round(float(self.score), 4)
        return out

    def key(self) -> tuple[str, str, str]:
        """What evaluation compares: (subject text, predicate, object text)."""
        return self.subject.text, self.predicate, self.object.text


@dataclass
class SpoExample:
    text: str
    triples: list[Triple] = field(default_factory=list)


def _value(x):
    return x.get("@value") if isinstance(x, dict) else x


def occurrences(text: str, mention: str) -> list[int]:
    starts, i = [], text.find(mention)
    while mention and i >= 0:
        starts.append(i)
        i = text.find(mention, i + 1)
    return starts


def locate(text: str, subject: str, obj: str) -> tuple[int, int]:
    """Start offsets of the closest (subject, object) occurrence pair, or -1 where a mention is absent."""
    subjects, objects = occurrences(text, subject), occurrences(text, obj)
    if not subjects or not objects:
        return (subjects[0] if subjects else -1), (objects[0] if objects else -1)
    return min(((s, o) for s in subjects for o in objects), key=lambda so: (abs(so[0] - so[1]), so))


def read_spo(path: PathLike) -> list[SpoExample]:
    examples = []
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        record = json_line(path, lineno, line)
        text = record.get("text")
        if not isinstance(text, str):
            raise DataError(path, lineno, "missing or non-string field 'text'")
        triples = []
        spo_list = record.get("spo_list") or []
        if not isinstance(spo_list, list):
            raise DataError(path, lineno, f"'spo_list' must be a list of triples, got {type(spo_list).__name__}")
        for i, spo in enumerate(spo_list):
            try:
                subject, predicate, obj = spo["subject"], spo["predicate"], _value(spo["object"])
            except (KeyError, TypeError):
                raise DataError(path, lineno, f"spo_list[{i}] needs subject, predicate and object") from None
            if not all(isinstance(x, str) and x for x in (subject, predicate, obj)):
                raise DataError(path, lineno, f"spo_list[{i}]: subject, predicate and object must be non-empty strings")
            types = [_value(spo.get(key)) or "" for key in ("subject_type", "object_type")]
            if not all(isinstance(x, str) for x in types):
                raise DataError(path, lineno, f"spo_list[{i}]: subject_type and object_type must be strings, got "
                                              f"{shown(types[0])} and {shown(types[1])}")
            s, o = locate(text, subject, obj)
            triples.append(Triple(Span(s, s + len(subject) if s >= 0 else -1, types[0], subject), predicate,
                                  Span(o, o + len(obj) if o >= 0 else -1, types[1], obj)))
        examples.append(SpoExample(text, list(dict.fromkeys(triples))))
    if not examples:
        raise DataError(path, 1, "empty file: no record")
    return examples


def read_schema(path: PathLike) -> list[str]:
    """Predicates of a schema file (JSON lines with a "predicate" field), in file order, without repeats."""
    predicates = []
    for lineno, line in iter_lines(path):
        if line.strip():
            record = json_line(path, lineno, line)
            if not isinstance(record.get("predicate"), str):
                raise DataError(path, lineno, "a schema line needs a string field 'predicate'")
            predicates.append(record["predicate"])
    return list(dict.fromkeys(predicates))
