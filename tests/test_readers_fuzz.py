"""Every reader under bad bytes (issue 51): each input format zhie reads, given invalid UTF-8, a byte-order mark, CRLF
line ends, NUL bytes, truncation, wrong JSON types, offsets out of range and duplicate spans, either reads correctly or
raises an error that names ``file:line: reason`` (a :class:`~zhie.data.DataError`; the configuration files: a
``ValueError`` naming the file, and the line of a syntax error, or else the task and key); never a bare
``KeyError``, ``TypeError`` or ``UnicodeDecodeError``. The command exits 2 with that line, no traceback, and leaves no
output behind.

The properties run on the readers themselves (hypothesis, derandomized); a few command-line tests run one bad input
of each format through ``zhie train``, ``eval``, ``predict``; one test reads a 100 MB line.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zhie import tasks
from zhie.core import config_file
from zhie.data import DataError, NerExample, label_studio, read_ner, write_ner_jsonl
from zhie.data.base import read_texts
from zhie.data.cws import read_segmented
from zhie.data.doccano import read_doccano, read_doccano_relations, write_doccano
from zhie.data.example import make_example
from zhie.data.ner import read_cluener, read_cmeee, read_conll, read_ner_jsonl
from zhie.data.spo import SpoExample, read_schema, read_spo
from zhie.data.sts import Pair, read_pairs
from zhie.deploy.stream import TextReader
from zhie.multitask import config as mtconfig

# ZHIE_FUZZ_EXAMPLES=600: a longer search, from a random seed
FUZZ = settings(max_examples=int(os.environ.get("ZHIE_FUZZ_EXAMPLES", 40)),
                derandomize="ZHIE_FUZZ_EXAMPLES" not in os.environ, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
BOM = b"\xef\xbb\xbf"
MAX_MESSAGE = 600  # characters of an error's reason: a bad value is shown cut short, never a whole long line


# ------------------------------------------------------------------------------------------------ the formats
def ls_task(i: int, text: str, regions: list[tuple[str, int, int, str]], relations=()) -> dict:
    result = [{"id": rid, "from_name": "label", "to_name": "text", "type": "labels",
               "value": {"start": s, "end": e, "text": text[s:e], "labels": [label]}} for rid, s, e, label in regions]
    result += [{"type": "relation", "from_id": a, "to_id": b, "direction": "right", "labels": [p]}
               for a, b, p in relations]
    return {"id": i, "data": {"text": text}, "annotations": [{"id": 10 + i, "was_cancelled": False, "result": result}]}


CLUENER = [{"text": "浙商银行叶老桂博士", "label": {"company": {"浙商银行": [[0, 3]]}, "name": {"叶老桂": [[4, 6]]}}},
           {"text": "北京和北京", "label": {"address": {"北京": [[0, 1], [3, 4]]}}},
           {"text": "没有标注"}]
JSONL = [{"text": "头痛发热", "entities": [{"start": 0, "end": 2, "label": "sym", "text": "头痛", "score": 0.9},
                                          {"start": 0, "end": 4, "label": "dis"}]},
         {"text": "咳嗽", "spans": []}]
CMEEE = [{"text": "头痛发热", "entities": [{"start_idx": 0, "end_idx": 1, "type": "sym", "entity": "头痛"},
                                          {"start_idx": 2, "end_idx": 3, "type": "sym", "entity": "发热"}]},
         {"text": "咳嗽"}]
DOCCANO = [{"text": "王伟在北京", "label": [[0, 2, "PER"], [3, 5, "LOC"]]}, {"text": "无", "label": []}]
DOCCANO_RE = [{"text": "王伟在北京", "entities": [{"id": 1, "start_offset": 0, "end_offset": 2, "label": "PER"},
                                                {"id": 2, "start_offset": 3, "end_offset": 5, "label": "LOC"}],
               "relations": [{"from_id": 1, "to_id": 2, "type": "住在"}]}]
SPO = [{"text": "王伟在北京", "spo_list": [{"subject": "王伟", "predicate": "住在", "object": {"@value": "北京"},
                                           "subject_type": "人物", "object_type": {"@value": "地点"}}]},
       {"text": "无", "spo_list": []}]
SCHEMA = [{"predicate": "住在", "subject_type": "人物", "object_type": "地点"}]
TEXTS_JSONL = [{"text": "浙商银行"}, {"text": "北京", "id": 2}]
LABEL_STUDIO = [ls_task(1, "王伟在北京", [("a", 0, 2, "PER"), ("b", 3, 5, "LOC")], [("a", "b", "住在")]),
                ls_task(2, "今天 天气", [("w1", 0, 2, "WORD"), ("w2", 3, 5, "WORD")]),
                {"id": 3, "data": {"text": "未标注"}, "annotations": []}]
LABEL_STUDIO_WORDS = [ls_task(1, "今天 天气", [("w1", 0, 2, "WORD"), ("w2", 3, 5, "WORD")])]
MULTITASK = {"weighting": {"scheme": "equal"},
             "tasks": [{"name": "ner", "task": "ner", "train": "ner.json", "dev": "ner.json",
                        "options": {"head": "gp", "max_length": 64}},
                       {"name": "seg", "task": "cws", "train": "cws.txt", "dev": "cws.txt", "batch_size": 8}]}
JOB = {"command": "train ner", "encoder": "tiny", "head": "gp", "training": {"epochs": 2, "lr": 5e-5}}


def json_lines(records: list) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def json_list(records: list) -> bytes:
    return json.dumps(records, ensure_ascii=False, indent=1).encode()


def toml(table: dict) -> bytes:
    return tomli_w.dumps(table).encode()


@dataclass(frozen=True)
class Format:
    """A file format: its reader (path -> what it reads), how a document is written (``dump``: a JSON document or
    TOML table -> bytes; None for a text format), a valid document (or the bytes of one) and the file's suffix."""

    read: Callable[[Path], object]
    sample: object
    dump: Callable[[object], bytes] | None = None
    suffix: str = ".txt"

    def bytes(self) -> bytes:
        return self.sample if self.dump is None else self.dump(self.sample)


def read_multitask(path: Path):
    return mtconfig.read(path, tasks.get)


def predict_input(path: Path, format: str = "auto") -> list[str]:
    """What ``zhie predict --input FILE`` reads (``format``: its ``--input-format``)."""
    return [line.text for line in TextReader([], [str(path)], input_format=format)]


FORMATS = {
    "cluener": Format(read_cluener, CLUENER, json_lines, ".json"),
    "ner-auto": Format(read_ner, CLUENER, json_lines, ".json"),
    "conll": Format(read_conll, "浙 B-ORG\n商 I-ORG\n叶 B-PER\n\n北\tB-LOC\n京\tI-LOC\n".encode()),
    "conll2003": Format(lambda p: read_ner(p, "conll2003"),
                        b"-DOCSTART- -X- O O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP I-MISC\n"),
    "cmeee": Format(read_cmeee, CMEEE, json_list, ".json"),
    "jsonl": Format(read_ner_jsonl, JSONL, json_lines, ".jsonl"),
    "doccano": Format(read_doccano, DOCCANO, json_lines, ".jsonl"),
    "doccano-relations": Format(read_doccano_relations, DOCCANO_RE, json_lines, ".jsonl"),
    "cmeie": Format(read_spo, SPO, json_lines, ".json"),
    "schema": Format(read_schema, SCHEMA, json_lines, ".json"),
    "sts": Format(read_pairs, "今天天气好\t天气不错\t1\n我饿了\t吃饭吧\t0.5\n".encode()),
    "cws": Format(read_segmented, "浙商  银行  叶老桂\n北京 是　首都\n".encode()),
    "texts": Format(lambda p: read_texts(p, "text"), "浙商银行叶老桂博士\n\n北京\n".encode()),
    "predict-input": Format(predict_input, TEXTS_JSONL, json_lines, ".jsonl"),
    "label-studio": Format(label_studio.read_entities, LABEL_STUDIO, json_list, ".json"),
    "label-studio-auto": Format(read_ner, LABEL_STUDIO, json_list, ".json"),
    "label-studio-words": Format(label_studio.read_words, LABEL_STUDIO_WORDS, json_list, ".json"),
    "label-studio-triples": Format(label_studio.read_triples, LABEL_STUDIO, json_list, ".json"),
    "multitask-toml": Format(read_multitask, MULTITASK, toml, ".toml"),
    "config-toml": Format(config_file.read, JOB, toml, ".toml"),
}
CONFIGS = ("multitask-toml", "config-toml")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder with the data files the multi-task config names; each example is a new file in it."""
    out = tmp_path_factory.mktemp("fuzz")
    (out / "ner.json").write_bytes(json_lines(CLUENER))
    (out / "cws.txt").write_bytes(FORMATS["cws"].bytes())
    return out


_written = itertools.count()


def written(folder: Path, name: str, content: bytes) -> Path:
    """``content`` in a new file of ``folder`` (a new name each time: the multi-task config is read once per file)."""
    path = folder / f"{name}-{next(_written)}{FORMATS[name].suffix}"
    path.write_bytes(content)
    return path


# ------------------------------------------------------------------------------------------------ what must hold
def check_result(result: object) -> None:
    """What a reader returns is well formed: exact, ordered, distinct spans inside their text."""
    items = result if isinstance(result, list) else [result]
    for item in items:
        if isinstance(item, NerExample):
            assert item.spans == sorted(set(item.spans)), item
            for s in item.spans:
                assert 0 <= s.start < s.end <= len(item.text) and item.text[s.start:s.end] == s.text, item
        elif isinstance(item, SpoExample):
            assert len(set(item.triples)) == len(item.triples)
            for t in item.triples:
                for m in (t.subject, t.object):
                    assert (m.start, m.end) == (-1, -1) or item.text[m.start:m.end] == m.text, item
        elif isinstance(item, Pair):
            assert item.text_a.strip() and item.text_b.strip() and abs(item.label) < float("inf")


def outcome(name: str, path: Path) -> object:
    """The reader's result (checked), or the error it raised (checked: it names the file and where in it)."""
    try:
        result = FORMATS[name].read(path)
    except DataError as err:
        assert err.path == str(path) and isinstance(err.line, int) and err.line >= 1, repr(err)
        assert str(err) == f"{path}:{err.line}: {err.reason}"
        assert "\n" not in str(err) and len(err.reason) < MAX_MESSAGE, str(err)[:2000]
        if path.stat().st_size < 2**20:  # not the 100 MB line's file, whose counting would take its size again
            assert err.line <= path.read_bytes().count(b"\n") + 1, str(err)
        return err
    except ValueError as err:  # the configuration files' errors: ConfigError, ValueError
        assert name in CONFIGS, f"{type(err).__name__} without file:line: {err}"
        message = str(err)
        assert re.match(rf"{re.escape(str(path))}(:\d+)?: ", message), message
        assert "\n" not in message and len(message) < len(str(path)) + MAX_MESSAGE, message[:2000]
        return err
    check_result(result)
    return result


# ------------------------------------------------------------------------------------------------ mutations
INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3", b"\xe4\xb8", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80"]
SPECIAL = [b"\x00", b"\r", b"\r\n", b"\n", b"\n\n", BOM, b"\t", b" ", b"{", b"}", b"[", b"]", b'"', b",", b":",
           b"\\", b"=", b"#", b"-1", b"99", b"\xe3\x80\x80", b"\xc2\x85", b"\xe2\x80\xa8", *INVALID_UTF8]
NUMBERS = [b"-1", b"0", b"-0", b"99", b"1e400", b"9" * 400, b"9" * 5000, b"[" * 5000, b"1.5", b"NaN", b"Infinity",
           b"null", b"true", b'"1"', b"[1]", b"{}", b""]


@st.composite
def mutated(draw, content: bytes) -> bytes:
    """``content`` with one to three changes at byte level: bytes inserted (NUL, invalid UTF-8, a BOM, structure),
    bytes deleted, the file truncated, a BOM put first, LF made CRLF, a number swapped for another value, a line
    doubled."""
    data = bytearray(content)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["insert", "insert", "delete", "truncate", "bom", "crlf", "number", "line"]))
        at = draw(st.integers(0, len(data)))
        if kind == "insert":
            data[at:at] = draw(st.sampled_from(SPECIAL) | st.binary(min_size=1, max_size=3))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 6))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "bom":
            data[0:0] = BOM
        elif kind == "crlf":
            data = bytearray(bytes(data).replace(b"\n", b"\r\n"))
        elif kind == "number" and (numbers := list(re.finditer(rb"-?\d+(\.\d+)?", data))):
            m = draw(st.sampled_from(numbers))
            data[m.start():m.end()] = draw(st.sampled_from(NUMBERS))
        elif kind == "line" and (lines := bytes(data).splitlines(keepends=True)):
            i = draw(st.integers(0, len(lines) - 1))
            data = bytearray(b"".join(lines[:i + 1] + lines[i:]))
    return bytes(data)


LONG_TEXT = "长" * 3000
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.just(10**30), st.just(-(10**30)),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.just(LONG_TEXT),
                   st.lists(st.integers(-1, 6), max_size=3), st.builds(lambda: list(range(2000))),
                   st.dictionaries(st.text(max_size=3), st.integers(-1, 3), max_size=2))


def places(doc: object, at: tuple = ()) -> list[tuple]:
    """The path of every value in a JSON document (the root too)."""
    out = [at]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += places(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += places(value, (*at, i))
    return out


@st.composite
def changed(draw, doc: object, values=VALUES) -> object:
    """``doc`` with one or two of its values (the root too: the wrong top-level type) replaced by a value of any
    type, removed (a missing key), or, in a list, doubled (a duplicate record or span)."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.sampled_from(places(doc)))
        if not at:
            doc = draw(values)
            continue
        *up, last = at
        parent = doc
        for key in up:
            parent = parent[key]
        kind = draw(st.sampled_from(["replace", "replace", "remove", "double"]))
        if kind == "replace":
            parent[last] = draw(values)
        elif kind == "remove":
            del parent[last]
        elif isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
    return doc


# ------------------------------------------------------------------------------------------------ the properties
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_valid_file_reads_and_reads_the_same_with_a_bom_and_crlf_line_ends(name, folder):
    content = FORMATS[name].bytes()
    plain = outcome(name, written(folder, name, content))
    assert not isinstance(plain, Exception), plain
    windows = outcome(name, written(folder, name, BOM + content.replace(b"\n", b"\r\n")))
    if name == "multitask-toml":  # its own path in the result
        plain, windows = plain.members, windows.members
    assert windows == plain


@pytest.mark.parametrize("name", sorted(FORMATS))
@FUZZ
@given(data=st.data())
def test_bytes_changed_anyhow_read_or_raise_file_line_reason(name, folder, data):
    outcome(name, written(folder, name, data.draw(mutated(FORMATS[name].bytes()))))


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.dump is not None))
@FUZZ
@given(data=st.data())
def test_values_of_the_wrong_type_missing_or_doubled_read_or_raise_file_line_reason(name, folder, data):
    """Labels and offsets that are numbers, lists, null, negative, reversed, past the end; keys missing; records and
    spans doubled; a top level of the wrong type."""
    fmt = FORMATS[name]
    values = VALUES.filter(lambda v: v is not None) if fmt.dump is toml else VALUES  # TOML has no null
    doc = data.draw(changed(fmt.sample, values))
    if fmt.dump is json_lines and not isinstance(doc, list):
        content = (json.dumps(doc, ensure_ascii=False) + "\n").encode()
    else:
        content = fmt.dump(doc if fmt.dump is not toml or isinstance(doc, dict) else {"value": doc})
    outcome(name, written(folder, name, content))


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=12)


@FUZZ
@given(texts=st.lists(TEXT, min_size=1, max_size=6), crlf=st.booleans(), bom=st.booleans())
def test_any_line_of_text_reads_back_as_it_was_written(folder, texts, crlf, bom):
    """Lines of any characters (NUL, CR, U+2028, U+0085 inside a line are kept: a line ends at LF only; an ending CR is
    a CRLF's); a BOM at the start is dropped."""
    content = ("\r\n" if crlf else "\n").join(texts) + "\n"
    path = written(folder, "texts", (BOM if bom else b"") + content.encode())
    expected = [t.rstrip("\r") for t in texts]  # CRs that end a line are its line end's
    if not bom:
        expected[0] = expected[0].removeprefix("\ufeff")  # a BOM that starts the file is the file's
    assert read_texts(path, "text") == [t for t in expected if t.strip()]
    assert predict_input(path, "text") == [t if t.strip() else "" for t in expected]


SPAN_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=10)


@st.composite
def ner_examples(draw) -> list[NerExample]:
    out = []
    for text in draw(st.lists(SPAN_TEXT, min_size=1, max_size=4)):
        ranges = draw(st.lists(st.tuples(st.integers(0, len(text) - 1), st.integers(1, len(text))), max_size=4))
        labels = draw(st.lists(st.sampled_from(["PER", "LOC", "类型"]), min_size=len(ranges), max_size=len(ranges)))
        out.append(make_example(text, [(s, e, lab) for (s, e), lab in zip(ranges, labels) if s < e]))
    return out


@FUZZ
@given(examples=ner_examples(), crlf=st.booleans())
def test_written_ner_files_read_back_equal_with_a_bom_and_crlf(folder, examples, crlf):
    """Any texts (control characters, CR, U+2028...) and nested or overlapping spans: zhie's JSON lines and doccano's
    read back as written, also from a file given a BOM and CRLF line ends by another tool."""
    for name, write in (("jsonl", write_ner_jsonl), ("doccano", write_doccano)):
        path = written(folder, name, b"")
        write(examples, path)
        content = path.read_bytes()
        path.write_bytes(BOM + (content.replace(b"\n", b"\r\n") if crlf else content))
        assert FORMATS[name].read(path) == examples


# duplicate spans: kept once, in every format that lists spans (doccano's entity ids excepted: an id names one entity)
DUPLICATES = {
    "cluener": ([{"text": "北京", "label": {"LOC": {"北京": [[0, 1]]}}}],
                [{"text": "北京", "label": {"LOC": {"北京": [[0, 1], [0, 1]]}}}]),
    "cmeee": ([{"text": "头痛", "entities": [{"start_idx": 0, "end_idx": 1, "type": "sym", "entity": "头痛"}]}],
              [{"text": "头痛", "entities": [{"start_idx": 0, "end_idx": 1, "type": "sym", "entity": "头痛"}] * 2}]),
    "jsonl": ([{"text": "头痛", "entities": [{"start": 0, "end": 2, "label": "sym"}]}],
              [{"text": "头痛", "entities": [{"start": 0, "end": 2, "label": "sym"}] * 2}]),
    "doccano": ([{"text": "北京", "label": [[0, 2, "LOC"]]}], [{"text": "北京", "label": [[0, 2, "LOC"]] * 2}]),
    "doccano-relations": (DOCCANO_RE, [{**DOCCANO_RE[0], "relations": DOCCANO_RE[0]["relations"] * 2}]),
    "cmeie": (SPO, [{**SPO[0], "spo_list": SPO[0]["spo_list"] * 2}, SPO[1]]),
    "label-studio": ([ls_task(1, "北京", [("a", 0, 2, "LOC")])],
                     [ls_task(1, "北京", [("a", 0, 2, "LOC"), ("b", 0, 2, "LOC")])]),
    "label-studio-triples": (LABEL_STUDIO, [ls_task(1, "王伟在北京", [("a", 0, 2, "PER"), ("b", 3, 5, "LOC")],
                                                    [("a", "b", "住在"), ("a", "b", "住在")]), *LABEL_STUDIO[1:]]),
}


@pytest.mark.parametrize("name", sorted(DUPLICATES))
def test_a_span_given_twice_is_kept_once(name, folder):
    once, twice = DUPLICATES[name]
    dump = FORMATS[name].dump
    assert outcome(name, written(folder, name, dump(twice))) == outcome(name, written(folder, name, dump(once)))


def test_doccano_entities_sharing_an_id_are_refused(folder):
    twice = [{**DOCCANO_RE[0], "entities": DOCCANO_RE[0]["entities"] + DOCCANO_RE[0]["entities"][:1]}]
    err = outcome("doccano-relations", written(folder, "doccano-relations", json_lines(twice)))
    assert isinstance(err, DataError) and err.line == 1 and "id 1 is given to two entities" in err.reason


# ------------------------------------------------------------------------------------------------ found by fuzzing
FOUND = [  # (format, content, line, reason): each raised something else than file:line: reason before issue 51
    ("cluener", b"[" * 100_000 + b"\n", 1, "nested too deeply"),
    ("cmeee", b"[" * 100_000, 1, "nested too deeply"),
    ("label-studio-auto", b"[" * 100_000, 1, "nested too deeply"),
    ("jsonl", b'{"text": "ab"}\n{"text": "ab", "entities": [{"start": 0, "end": 1, "label": "X", "score": 1'
     + b"0" * 400 + b"}]}\n", 2, "'score' must be a finite number"),
    ("jsonl", b'{"text": "ab", "entities": [{"start": 0, "end": 1, "label": "X", "score": NaN}]}\n', 1,
     "'score' must be a finite number"),
    ("cluener", b'{"text": "ab", "label": {"X": {"ab": [[0, 1' + b"9" * 5000 + b"]]}}}\n", 1, "a number too long"),
    ("cmeee", b'[\n{"text": "ab", "entities": [{"start_idx": 0, "end_idx": ' + b"9" * 5000 + b"}]}]", 2,
     "a number too long"),
    ("cmeie", b'{"text": "ab", "spo_list": 5}\n', 1, "'spo_list' must be a list"),
    ("cmeie", b'{"text": "ab", "spo_list": {"subject": "a"}}\n', 1, "'spo_list' must be a list"),
    ("conll", b"\x00" * 10_000 + b"\n", 1, "expected 'token TAG', got 1 field(s)"),
    ("config-toml", BOM + b"encoder = 'x'\nepochs = 1\n", 0, ""),
    ("config-toml", b"encoder = 'x'\nepochs = '\xff'\n", 2, "not valid UTF-8"),
    ("config-toml", b"encoder = 'x'\nepochs = \n", 2, "not valid TOML: Invalid value"),
    ("config-toml", b"epochs = " + b"[" * 100_000, None, "not valid TOML: arrays or tables nested too deeply"),
    ("config-toml", b"epochs = 1" + b"0" * 5000, 1, "not valid TOML: a number too long to read"),
    ("multitask-toml", BOM + toml(MULTITASK), 0, ""),
    ("multitask-toml", b"\n# \xe9\n" + toml(MULTITASK), 2, "not valid UTF-8"),
]


@pytest.mark.parametrize("name, content, line, reason", FOUND)
def test_inputs_that_once_broke_a_reader(name, content, line, reason, folder):
    path = written(folder, name, content)
    result = outcome(name, path)
    if line == 0:  # reads
        assert not isinstance(result, Exception), result
        return
    assert isinstance(result, ValueError), result
    where = f"{path}: " if line is None else f"{path}:{line}: "  # None: no line to name (a TOML file's nesting)
    assert str(result).startswith(where) and reason in str(result), str(result)


# ------------------------------------------------------------------------------------------------ a 100 MB line
LONG = 100 * 2**20
LONG_READERS = ["cluener", "conll", "cmeee", "sts", "cws", "texts", "predict-input", "label-studio", "multitask-toml",
                "config-toml"]


def test_a_100_mb_line_reads_in_a_few_times_its_size_and_an_error_quotes_it_cut_short(folder):
    """One line of 100 MB (sparse: NUL bytes between an ``x`` and `` O X``): each reader reads it whole, at a peak of
    under 4x its size (the bytes, their text and the text without its line end, at once), or
    stops at line 1 with an error that quotes it cut short (CoNLL: three fields)."""
    for suffix in {FORMATS[name].suffix for name in LONG_READERS}:
        with open(folder / f"long{suffix}", "wb") as f:
            f.write(b"x")
            f.seek(LONG)
            f.write(b" O X\n")
    for name in LONG_READERS:
        path = folder / f"long{FORMATS[name].suffix}"
        tracemalloc.start()
        try:
            result = outcome(name, path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * LONG, f"{name}: {peak / LONG:.1f}x the line"
        if name in ("cws", "texts"):
            assert not isinstance(result, Exception) and len(result) == 1, name
        else:
            assert isinstance(result, ValueError) and str(result).startswith(f"{path}:1: "), (name, str(result)[:300])
        del result
    os.unlink(folder / "long.txt")


# ------------------------------------------------------------------------------------------------ the command
@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny NER model (one step) for ``zhie eval`` and ``zhie predict``."""
    import zhie
    from tests.tiny_models import nested_corpus
    from zhie.training import TrainConfig

    out = tmp_path_factory.mktemp("model")
    write_ner_jsonl(nested_corpus(8, seed=1), out / "train.jsonl")
    zhie.fit("ner", out / "train.jsonl", out / "train.jsonl", out=out / "run", encoder="tiny", head="gp",
             max_length=32, config=TrainConfig(max_steps=1, batch_size=8), resume=False, progress=False)
    return out / "run" / "best"


BAD_FILES = [  # (command, file name, content, line, reason): one bad input of each format, each command reading it
    ("train ner", "cluener.json", json_lines([CLUENER[0], {"text": "北京", "label": {"LOC": {"北京": [[1, 0]]}}}]), 2,
     "range [1, 1) is empty or outside the text"),
    ("train ner", "people.bio", b"\xef\xbb\xbf\xe5\x8c\x97 B-LOC\r\n\xe4\xba\xac X-LOC\r\n", 2, "malformed BIO tag"),
    ("train ner", "cmeee.json", json_list([CMEEE[0], {"text": "咳嗽", "entities": [{"start_idx": 1}]}])[:-1], 19,
     "entity 0: missing field 'end_idx'"),
    ("train ner", "doccano.jsonl", json_lines([DOCCANO[0], {"text": "王伟", "label": [[0, 2, None]]}]), 2,
     "label[0]: the label must be a non-empty string"),
    ("train ner", "export.json", json_list(LABEL_STUDIO)[:-40], 98, "malformed JSON: Unterminated string"),
    ("train re", "cmeie.json", json_lines([SPO[0], {"text": "王伟", "spo_list": 5}]), 2, "'spo_list' must be a list"),
    ("train re", "doccano.jsonl", json_lines([{**DOCCANO_RE[0], "relations": [{"from_id": 1, "to_id": 7,
                                                                               "type": "住在"}]}]), 1,
     "to_id 7 names no entity"),
    ("train similarity", "pairs.tsv", "今天天气好\t天气不错\t1\n我饿了\t吃饭吧\tnull\n".encode(), 2,
     "label 'null' is not a"),
    ("train cws", "seg.txt", "浙商  银行\n北京 ".encode() + b"\xff\n", 2, "not valid UTF-8"),
    ("train multitask", "mt.toml", toml(MULTITASK).replace(b"scheme =", b"scheme ="[:-1]), 2, "not valid TOML"),
    ("config", "job.toml", BOM + b'command = "train ner"\n[training]\nepochs = 1.5\n', 0, "epochs = 1.5: invalid"),
    ("eval", "dev.jsonl", json_lines([JSONL[0], {"text": "头痛", "entities": [{"start": -1, "end": 2, "label": "X"}]}]),
     2, "range [-1, 2) is empty or outside the text"),
    ("predict", "texts.jsonl", json_lines(TEXTS_JSONL) + b'{"text": 5}\n', 3, "a JSON line needs a string field"),
    ("predict", "texts.txt", "北京\n上海\n".encode() + b"\x00\xc3(\n", 3, "not valid UTF-8"),
]


@pytest.mark.parametrize("command, name, content, line, reason", BAD_FILES, ids=[f"{c}-{n}" for c, n, *_ in BAD_FILES])
def test_the_command_exits_2_with_file_line_reason_and_writes_nothing(command, name, content, line, reason, tmp_path,
                                                                      capsys, request):
    from zhie.cli import main

    path = tmp_path / name
    path.write_bytes(content)
    if name == "mt.toml":
        (tmp_path / "ner.json").write_bytes(json_lines(CLUENER))
        (tmp_path / "cws.txt").write_bytes(FORMATS["cws"].bytes())
    out, old = tmp_path / "out", tmp_path / "old.json"
    old.write_text("the last run's output\n")
    argv = {"train multitask": ["train", "multitask", "--tasks", str(path), "--out", str(out), "--encoder", "tiny"],
            "config": ["train", "ner", "--config", str(path), "--train", str(path), "--dev", str(path), "--out",
                       str(out)],
            "eval": ["eval", "MODEL", "--data", str(path), "--json", str(old), "--errors", str(out)],
            "predict": ["predict", "MODEL", "--input", str(path), "--output", str(old)]}.get(
        command, [*command.split(), "--train", str(path), "--dev", str(path), "--out", str(out), "--encoder", "tiny"])
    if "MODEL" in argv:
        argv[argv.index("MODEL")] = str(request.getfixturevalue("model"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    message = [m for m in err.splitlines() if m.startswith("zhie: error: ")]
    assert len(message) == 1 and "Traceback" not in err, err
    where = str(path) if not line else f"{path}:{line}: "
    assert message[0].startswith(f"zhie: error: {where}") and reason in message[0], message[0]
    assert not out.exists() and old.read_text() == "the last run's output\n"
