"""doccano's JSON lines, read and written: its sequence-labelling (NER) export and its relation-extraction export.

- NER: ``{"text", "label": [[start, end, "TYPE"], ...]}`` (what a sequence-labelling project exports and imports);
- relations: ``{"text", "entities": [{"id", "start_offset", "end_offset", "label"}], "relations": [{"from_id",
  "to_id", "type"}]}`` (a project with relation labelling; ``from_id`` is the subject, ``to_id`` the object).

doccano's ends are exclusive, as zhie's. Identical spans (and triples) in a line are kept once; two entities of a line
with one ``id`` are refused, as a relation could not tell them apart. Other fields (``id``, ``Comments``, ``meta``,
...) are ignored. Either shape reads as NER (:func:`read_doccano`: the entities, the relations left aside); the
relation shape also reads as triples (:func:`read_doccano_relations`). Writers: :func:`write_doccano` (NER, the
``label`` shape) and :func:`write_doccano_relations`; :func:`records` makes the lines of ``zhie predict
--output-format doccano``. An entity without a type (a GPLinker prediction: the relation task predicts mentions, not
their types) is written with the label :data:`UNTYPED`, as doccano needs a label for every entity.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from zhie.core.files import atomic_write_text
from zhie.core.spans import Span
from zhie.data.base import DataError, PathLike, iter_lines, json_line, shown
from zhie.data.example import NerExample, check_range, make_example, text_field
from zhie.data.spo import SpoExample, Triple

UNTYPED = "ENTITY"  # the doccano label of an entity that has no type (a relation model's mentions)


def is_doccano(record: dict) -> bool:
    """Whether a JSON-lines record is doccano's: a list under "label", or "relations", or entities with
    "start_offset" (zhie's own JSON lines have "start"; CLUENER's "label" is an object)."""
    entities = record.get("entities")
    return isinstance(record.get("label"), list) or "relations" in record or (
        isinstance(entities, list) and any(isinstance(e, dict) and "start_offset" in e for e in entities))


def _entities(path: PathLike, lineno: int, record: dict, text: str) -> dict[object, Span]:
    """The record's entities by id (the ``label`` shape: by position), in file order, checked."""
    if "label" in record and "entities" in record:
        raise DataError(path, lineno, "both 'label' and 'entities': a doccano line has one of them (NER: 'label', a "
                                      "relation project: 'entities' and 'relations'); keep one")
    if "label" in record:
        label = record["label"]
        if not isinstance(label, list):
            raise DataError(path, lineno, f"'label' must be a list of [start, end, \"TYPE\"], got "
                                          f"{type(label).__name__}")
        out = {}
        for j, item in enumerate(label):
            if not (isinstance(item, list) and len(item) == 3):
                hint = ("; a list of strings is a doccano text-classification export, which zhie does not read"
                        if isinstance(item, str) else "")
                raise DataError(path, lineno, f"label[{j}]: expected [start, end, \"TYPE\"], got {shown(item)}{hint}")
            out[j] = _span(path, lineno, text, *item, f"label[{j}]")
        return out
    entities = record.get("entities", [])
    if not isinstance(entities, list):
        raise DataError(path, lineno, f"'entities' must be a list, got {type(entities).__name__}")
    out = {}
    for j, ent in enumerate(entities):
        what = f"entities[{j}]"
        if not isinstance(ent, dict):
            raise DataError(path, lineno, f"{what}: expected an object, got {type(ent).__name__}")
        for key in ("id", "start_offset", "end_offset", "label"):
            if key not in ent:
                raise DataError(path, lineno, f"{what}: missing field {key!r} (doccano's entities have id, "
                                              "start_offset, end_offset, label)")
        if not isinstance(ent["id"], (int, str)) or isinstance(ent["id"], bool):
            raise DataError(path, lineno, f"{what}: 'id' must be an integer or a string, got {shown(ent['id'])}")
        if ent["id"] in out:
            raise DataError(path, lineno, f"{what}: id {shown(ent['id'])} is given to two entities of this line; give "
                                          "each entity its own id")
        out[ent["id"]] = _span(path, lineno, text, ent["start_offset"], ent["end_offset"], ent["label"], what)
    return out


def _span(path: PathLike, lineno: int, text: str, start, end, label, what: str) -> Span:
    if not isinstance(label, str) or not label:
        raise DataError(path, lineno, f"{what}: the label must be a non-empty string (the type), got {shown(label)}")
    check_range(path, lineno, text, start, end, what)
    return Span(start, end, label, text[start:end])


def _relations(path: PathLike, lineno: int, record: dict, entities: dict[object, Span]) -> list[Triple]:
    relations = record.get("relations", [])
    if not isinstance(relations, list):
        raise DataError(path, lineno, f"'relations' must be a list, got {type(relations).__name__}")
    triples = []
    for j, rel in enumerate(relations):
        what = f"relations[{j}]"
        if not isinstance(rel, dict):
            raise DataError(path, lineno, f"{what}: expected an object, got {type(rel).__name__}")
        for key in ("from_id", "to_id", "type"):
            if key not in rel:
                raise DataError(path, lineno, f"{what}: missing field {key!r} (doccano's relations have from_id, "
                                              "to_id, type)")
        for key in ("from_id", "to_id"):
            if not isinstance(rel[key], (int, str)) or isinstance(rel[key], bool) or rel[key] not in entities:
                known = shown(list(entities))[1:-1] or "none"
                raise DataError(path, lineno, f"{what}: {key} {shown(rel[key])} names no entity of this line (its "
                                              f"entities' ids: {known})")
        if not isinstance(rel["type"], str) or not rel["type"]:
            raise DataError(path, lineno, f"{what}: 'type' must be a non-empty string (the predicate), got "
                                          f"{shown(rel['type'])}")
        triples.append(Triple(entities[rel["from_id"]], rel["type"], entities[rel["to_id"]]))
    return list(dict.fromkeys(triples))


def _records(path: PathLike) -> Iterator[tuple[int, dict, str]]:
    """(line number, record, text) of each non-blank line; an empty file is an error."""
    empty = True
    for lineno, line in iter_lines(path):
        if line.strip():
            empty = False
            record = json_line(path, lineno, line)
            yield lineno, record, text_field(path, lineno, record)
    if empty:
        raise DataError(path, 1, "empty file: no records")


def read_doccano(path: PathLike) -> list[NerExample]:
    """doccano JSON lines as NER examples: the spans under "label", or the "entities" (their relations are checked and
    left aside); identical spans kept once, sorted."""
    out = []
    for lineno, record, text in _records(path):
        entities = _entities(path, lineno, record, text)
        _relations(path, lineno, record, entities)
        out.append(make_example(text, ((s.start, s.end, s.label) for s in entities.values())))
    return out


def read_doccano_relations(path: PathLike) -> list[SpoExample]:
    """doccano's relation export as triples (``from_id``: the subject, ``to_id``: the object, ``type``: the
    predicate; an entity's label is its mention's type), in file order, identical triples kept once. Entities that
    take part in no relation are not kept (triples only)."""
    out = []
    for lineno, record, text in _records(path):
        if "label" in record:
            raise DataError(path, lineno, "'label' (doccano's NER shape) has no relations: a relation file has "
                                          "'entities' and 'relations' on each line; export the relation project, "
                                          "or train the ner task on this file")
        out.append(SpoExample(text, _relations(path, lineno, record, _entities(path, lineno, record, text))))
    return out


# ------------------------------------------------------------------------------------------------- writing
def ner_record(text: str, spans: Iterable[Span]) -> dict:
    """One text's doccano NER line: ``{"text", "label": [[start, end, TYPE], ...]}``."""
    return {"text": text, "label": [[s.start, s.end, s.label] for s in spans]}


def relation_record(text: str, triples: Iterable[Triple], ids: Iterator[int]) -> dict:
    """One text's doccano relation line: its triples' mentions as ``entities`` (one per range and type, numbered by
    ``ids``) and the triples as ``relations``."""
    entities: dict[tuple[int, int, str], int] = {}
    relations = []
    for t in triples:
        if not t.located:
            raise ValueError(f"{text[:40]!r}: the triple ({t.subject.text}, {t.predicate}, {t.object.text}) has a "
                             "mention that is not in the text; doccano needs the offsets of both")
        ends = [entities.setdefault((m.start, m.end, m.label or UNTYPED), next(ids)) for m in (t.subject, t.object)]
        relations.append({"from_id": ends[0], "to_id": ends[1], "type": t.predicate})
    return {"text": text,
            "entities": [{"id": i, "start_offset": s, "end_offset": e, "label": label}
                         for (s, e, label), i in entities.items()],
            "relations": relations}


def records(output_key: str) -> Callable[[str, list], dict]:
    """The doccano line of one prediction of a task whose predictions go under ``output_key`` (``zhie predict
    --output-format doccano``): NER spans (``entities``) in the ``label`` shape, triples (``relations``) in the
    relation shape, entity ids running through the whole output."""
    if output_key == "entities":
        return ner_record
    if output_key == "relations":
        ids = itertools.count(1)
        return lambda text, triples: relation_record(text, triples, ids)
    raise ValueError(f"doccano holds entities and relations: the predictions of this model ({output_key!r}) have "
                     "no doccano form; leave out --output-format doccano (or use a ner or re model)")


def _write(lines: Iterable[dict], path: PathLike) -> None:
    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines))


def write_doccano(examples: Iterable[NerExample], path: PathLike) -> None:
    """NER examples as doccano's NER JSON lines, atomically; :func:`read_doccano` reads them back (scores are not
    written)."""
    _write((ner_record(ex.text, ex.spans) for ex in examples), path)


def write_doccano_relations(examples: Iterable[SpoExample], path: PathLike) -> None:
    """Triples as doccano's relation JSON lines, atomically, entity ids numbered through the file;
    :func:`read_doccano_relations` reads them back."""
    ids = itertools.count(1)
    _write((relation_record(ex.text, ex.triples, ids) for ex in examples), path)

