"""Readers and a writer for NER corpora, all producing :class:`NerExample` with exclusive ends.

Formats (see ``../shared/data/README.md``):

- ``cluener``: JSON lines ``{"text", "label": {type: {mention: [[start, end_inclusive], ...]}}}``;
  a record without ``"label"`` (the test split) has no spans.
- ``conll``: one ``token TAG`` per line (space or tab separated), a blank line between sentences.
- ``wikiann``: WikiANN's ``lang:word<TAB>TAG`` lines (IOB2): the language prefix is dropped, words joined by a space.
- ``conll2003``: the CoNLL-2002/2003 shared-task files: ``word [POS [chunk]] TAG`` lines, the tag in the last
  column (IOB1 in CoNLL-2003, IOB2 in CoNLL-2002; one decoder reads both), ``-DOCSTART-`` lines skipped, words
  joined by a space; UTF-8, or else Latin-1 (how the original files are encoded).
- ``cmeee``: one JSON list of ``{"text", "entities": [{"start_idx", "end_idx" (inclusive), "type",
  "entity"}]}``; nested and overlapping entities are kept as they are.
- ``doccano``: doccano's JSON lines, ``{"text", "label": [[start, end, "TYPE"], ...]}`` or ``{"text", "entities":
  [{"id", "start_offset", "end_offset", "label"}], "relations": [...]}`` (:mod:`zhie.data.doccano`).
- ``jsonl``: zhie's own JSON lines ``{"text", "entities": [{"start", "end", "label", "text"}]}``
  with exclusive ends (``"spans"`` is accepted in place of ``"entities"``).

The inclusive ends of CLUENER and CMeEE are converted here, and nowhere else. Every reader checks
what it reads and raises :class:`DataError` (file, 1-based line, reason) on the first problem.
Identical spans (same start, end and label) within one example are kept once; spans that share a
range but differ in label, nest or overlap are all kept, so a "flat" corpus that contains a nested
mention (CLUENER train has one) reads as it is written.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from zhie.core.files import atomic_write_text
from zhie.core.spans import Span, tags_to_spans
from zhie.data.base import DataError, PathLike, iter_json_list, iter_lines, json_line, shown
from zhie.data.doccano import is_doccano, read_doccano
from zhie.data.example import NerExample, check_range, inclusive_span, is_int, make_example, text_field

__all__ = ["FORMATS", "NerExample", "detect_format", "read_cluener", "read_cmeee", "read_conll", "read_ner",
           "read_ner_jsonl", "write_ner_jsonl"]


# ----------------------------------------------------------------------------------------------------
# CLUENER
# ----------------------------------------------------------------------------------------------------


def _cluener_record(path: PathLike, lineno: int, record: dict) -> NerExample:
    text = text_field(path, lineno, record)
    label = record.get("label")
    if label is None:  # the test split has no labels
        return NerExample(text, [])
    if not isinstance(label, dict):
        raise DataError(path, lineno, f"field 'label' must be an object, got {type(label).__name__}")
    triples = []
    for etype, mentions in label.items():
        if not etype:
            raise DataError(path, lineno, "empty entity type in 'label'")
        if not isinstance(mentions, dict):
            raise DataError(path, lineno, f"label[{shown(etype)}] must map mentions to offsets")
        for mention, offsets in mentions.items():
            what = f"label[{shown(etype)}][{shown(mention)}]"
            if not isinstance(offsets, list):
                raise DataError(path, lineno, f"{what} must be a list of [start, end] pairs")
            for pair in offsets:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise DataError(path, lineno, f"{what}: expected a [start, end] pair, got {shown(pair)}")
                triples.append((*inclusive_span(path, lineno, text, *pair, mention, what), etype))
    return make_example(text, triples)


def read_cluener(path: PathLike) -> list[NerExample]:
    """Read CLUENER JSON lines (inclusive ends converted to exclusive)."""
    out = [_cluener_record(path, n, json_line(path, n, line)) for n, line in iter_lines(path) if line.strip()]
    if not out:
        raise DataError(path, 1, "empty file: no records")
    return out


# ----------------------------------------------------------------------------------------------------
# CoNLL / BIO
# ----------------------------------------------------------------------------------------------------

_FIELD_SEP = re.compile(r"[ \t]+")
_LANG_PREFIX = re.compile(r"^[a-z]{2,3}:(?=.)")


def _lines(path: PathLike, encoding: str) -> Iterable[tuple[int, str]]:
    """``iter_lines`` (UTF-8) for ``encoding="utf-8"``; ``"latin-1"`` decodes every byte as Latin-1; ``"auto"`` is
    UTF-8 when the whole file is valid UTF-8, else Latin-1 (which decodes any bytes: the CoNLL-2002/2003 files)."""
    if encoding == "auto":
        try:
            Path(path).read_bytes().decode("utf-8")
            encoding = "utf-8"
        except UnicodeDecodeError:
            encoding = "latin-1"
    if encoding == "utf-8":
        return iter_lines(path)
    if encoding != "latin-1":
        raise ValueError(f"unknown encoding {encoding!r}; use utf-8, latin-1 or auto")
    with open(path, encoding="latin-1", newline="") as f:
        return [(n, line.rstrip("\r\n")) for n, line in enumerate(f, 1)]


def read_conll(
    path: PathLike, *, scheme: str = "BIO", strip_lang_prefix: bool = False, sep: str | None = None,
    tag_column: int | None = None, skip_docstart: bool = False, encoding: str = "utf-8",
) -> list[NerExample]:
    """Read one ``token TAG`` per line (space or tab separated), a blank line between sentences.

    ``tag_column=-1`` reads lines of any number of columns (``word POS chunk TAG``), the token in the first and the
    tag in that column; ``skip_docstart`` drops ``-DOCSTART-`` lines; ``encoding`` is ``"utf-8"``, ``"latin-1"``
    or ``"auto"`` (UTF-8 if the file is valid UTF-8, else Latin-1).

    The text of a sentence is its tokens joined by ``sep``; by default (``sep=None``) that is ""
    when every token in the file is a single character (Chinese character-per-line corpora) and
    " " otherwise (word-per-line corpora such as WikiANN). Span offsets are character offsets
    into that text. ``strip_lang_prefix`` removes a WikiANN-style ``en:`` prefix from each token.
    Tags are decoded with :func:`zhie.core.spans.tags_to_spans` under ``scheme``.
    """
    tags_to_spans([], scheme)  # an unknown scheme is the caller's error (ValueError), not the file's
    sentences: list[list[tuple[int, str, str]]] = []  # (line number, token, tag)
    current: list[tuple[int, str, str]] = []
    for lineno, line in _lines(path, encoding):
        line = line.strip(" \t")
        if not line:
            if current:
                sentences.append(current)
                current = []
            continue
        fields = _FIELD_SEP.split(line)
        if skip_docstart and fields[0] == "-DOCSTART-":
            continue
        if len(fields) < 2 or (tag_column is None and len(fields) != 2):
            raise DataError(path, lineno, f"expected 'token TAG', got {len(fields)} field(s): {shown(line)}")
        token, tag = fields[0], fields[-1 if tag_column is None else tag_column]
        if strip_lang_prefix:
            token = _LANG_PREFIX.sub("", token)
        current.append((lineno, token, tag))
    if current:
        sentences.append(current)
    if not sentences:
        raise DataError(path, 1, "empty file: no sentences")

    if sep is None:
        sep = "" if all(len(tok) == 1 for sent in sentences for _, tok, _ in sent) else " "
    out = []
    for sent in sentences:
        tokens = [tok for _, tok, _ in sent]
        tags = [tag for _, _, tag in sent]
        try:
            tok_spans = tags_to_spans(tags, scheme)
        except ValueError:
            for lineno, _, tag in sent:  # find the offending line
                try:
                    tags_to_spans([tag], scheme)
                except ValueError as e:
                    raise DataError(path, lineno, str(e)) from None
            raise
        starts, pos = [], 0
        for tok in tokens:
            starts.append(pos)
            pos += len(tok) + len(sep)
        text = sep.join(tokens)
        ends = [start + len(tok) for start, tok in zip(starts, tokens)]
        out.append(make_example(text, ((starts[s], ends[e - 1], lab) for s, e, lab in tok_spans)))
    return out


# ----------------------------------------------------------------------------------------------------
# CMeEE
# ----------------------------------------------------------------------------------------------------


def _cmeee_record(path: PathLike, lineno: int, index: int, record: object) -> NerExample:
    where = f" (record {index})"
    if not isinstance(record, dict):
        raise DataError(path, lineno, f"expected a JSON object, got {type(record).__name__}{where}")
    text = text_field(path, lineno, record, where)
    entities = record.get("entities", [])  # a test split has only texts
    if not isinstance(entities, list):
        raise DataError(path, lineno, f"field 'entities' must be a list{where}")
    triples = []
    for j, ent in enumerate(entities):
        what = f"record {index}, entity {j}"
        if not isinstance(ent, dict):
            raise DataError(path, lineno, f"{what}: expected an object, got {type(ent).__name__}")
        for key in ("start_idx", "end_idx", "type", "entity"):
            if key not in ent:
                raise DataError(path, lineno, f"{what}: missing field {key!r}")
        start, end_incl, etype, mention = ent["start_idx"], ent["end_idx"], ent["type"], ent["entity"]
        if not isinstance(etype, str) or not etype:
            raise DataError(path, lineno, f"{what}: 'type' must be a non-empty string, got {shown(etype)}")
        triples.append((*inclusive_span(path, lineno, text, start, end_incl, mention, what, "'entity'"), etype))
    return make_example(text, triples)


def read_cmeee(path: PathLike) -> list[NerExample]:
    """Read a CMeEE JSON list; errors name the line where the offending record starts."""
    out = [_cmeee_record(path, lineno, i, record) for i, (lineno, record) in enumerate(iter_json_list(path))]
    if not out:
        raise DataError(path, 1, "empty list: no records")
    return out


# ----------------------------------------------------------------------------------------------------
# zhie's own JSON lines
# ----------------------------------------------------------------------------------------------------


def _jsonl_record(path: PathLike, lineno: int, record: dict) -> NerExample:
    text = text_field(path, lineno, record)
    key = "entities" if "entities" in record else "spans"
    entities = record.get(key, [])
    if not isinstance(entities, list):
        raise DataError(path, lineno, f"field {key!r} must be a list")
    unique: dict[tuple[int, int, str], Span] = {}  # identical spans kept once, first score wins
    for j, ent in enumerate(entities):
        what = f"{key}[{j}]"
        if not isinstance(ent, dict):
            raise DataError(path, lineno, f"{what}: expected an object, got {type(ent).__name__}")
        for k in ("start", "end", "label"):
            if k not in ent:
                raise DataError(path, lineno, f"{what}: missing field {k!r}")
        start, end, label = ent["start"], ent["end"], ent["label"]
        if not isinstance(label, str) or not label:
            raise DataError(path, lineno, f"{what}: 'label' must be a non-empty string (the type), got {shown(label)}")
        check_range(path, lineno, text, start, end, what)
        if "text" in ent and ent["text"] != text[start:end]:
            raise DataError(
                path,
                lineno,
                f"{what}: 'text' {shown(ent['text'])} does not match text[{start}:{end}] = {shown(text[start:end])}",
            )
        score = ent.get("score")
        if score is not None and not _finite_number(score):
            raise DataError(path, lineno, f"{what}: 'score' must be a finite number, got {shown(score)}")
        span = Span(start, end, label, text[start:end], None if score is None else float(score))
        unique.setdefault((start, end, label), span)
    return NerExample(text, [unique[k] for k in sorted(unique)])


def _finite_number(x: object) -> bool:
    """Whether ``x`` is a number that a float holds (not NaN or infinite; an integer of at most ~1e308)."""
    return (is_int(x) and abs(x) <= sys.float_info.max) or (isinstance(x, float) and math.isfinite(x))


def read_ner_jsonl(path: PathLike) -> list[NerExample]:
    """Read zhie's JSON lines (exclusive ends); the inverse of :func:`write_ner_jsonl`."""
    out = [_jsonl_record(path, n, json_line(path, n, line)) for n, line in iter_lines(path) if line.strip()]
    if not out:
        raise DataError(path, 1, "empty file: no records")
    return out


def write_ner_jsonl(examples: Iterable[NerExample], path: PathLike) -> None:
    """Write examples as zhie JSON lines, atomically (a temporary file, then ``os.replace``)."""
    lines = [json.dumps({"text": ex.text, "entities": [sp.to_dict() for sp in ex.spans]}, ensure_ascii=False) + "\n"
             for ex in examples]
    atomic_write_text(Path(path), "".join(lines))


# ----------------------------------------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------------------------------------

FORMATS = ("cluener", "conll", "cmeee", "jsonl", "wikiann", "conll2003", "doccano", "label-studio")


def detect_format(path: PathLike) -> str:
    """Guess a NER file's format from its content (see :func:`read_ner`)."""
    first = None
    for lineno, line in iter_lines(path):
        stripped = line.strip()
        if not stripped:
            continue
        if first is None:
            first = stripped[0]
            if first == "[":  # Label Studio's module (xml, hashlib: ~30 ms) is imported only for a JSON list
                from zhie.data import label_studio

                return label_studio.FORMAT if label_studio.is_export(path) else "cmeee"
            if first != "{":
                return "conll"
        record = json_line(path, lineno, stripped)
        if is_doccano(record):
            return "doccano"
        if "label" in record:
            return "cluener"
        if "entities" in record or "spans" in record:
            return "jsonl"
        if "text" not in record:
            raise DataError(path, lineno, "cannot tell the format: a JSON object without 'text'")
    if first is None:
        raise DataError(path, 1, "empty file")
    return "cluener"  # JSON lines with texts only (e.g. CLUENER's test split)


def read_ner(path: PathLike, format: str = "auto", *, strip_lang_prefix: bool = False) -> list[NerExample]:
    """Read a NER file in any supported format; ``format="auto"`` detects it from the content.

    Detection: a JSON list of Label Studio tasks (objects with "data" and "annotations") -> "label-studio"
    (:mod:`zhie.data.label_studio`), any other JSON list -> "cmeee"; JSON lines whose first labelled record is
    doccano's (a list under "label", "relations", or entities with "start_offset": :func:`zhie.data.doccano.is_doccano`)
    -> "doccano", has "label" -> "cluener", or "entities"/"spans" -> "jsonl" (texts only -> "cluener", giving no spans);
    anything else -> "conll". ``strip_lang_prefix`` applies to "conll" only.
    """
    if format == "auto":
        format = detect_format(path)
    if format == "cluener":
        return read_cluener(path)
    if format == "conll":
        return read_conll(path, strip_lang_prefix=strip_lang_prefix)
    if format == "wikiann":
        return read_conll(path, strip_lang_prefix=True, sep=" ")
    if format == "conll2003":
        return read_conll(path, scheme="IOB1", sep=" ", tag_column=-1, skip_docstart=True, encoding="auto")
    if format == "cmeee":
        return read_cmeee(path)
    if format == "jsonl":
        return read_ner_jsonl(path)
    if format == "doccano":
        return read_doccano(path)
    if format == "label-studio":
        from zhie.data import label_studio

        return label_studio.read_entities(path)
    raise ValueError(f"unknown NER format {format!r}; expected 'auto' or one of {FORMATS}")
