"""NER readers: the real corpora in ../shared/data, offsets, nesting, errors with file:line, round trip."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from zhie.core.spans import Span
from zhie.data import (
    DataError,
    NerExample,
    detect_format,
    read_cluener,
    read_cmeee,
    read_conll,
    read_ner,
    read_ner_jsonl,
    write_ner_jsonl,
)

from .conftest import DATA

_cache: dict[tuple[str, bool], list[NerExample]] = {}


def load(rel: str, strip_lang_prefix: bool = False) -> list[NerExample]:
    key = (rel, strip_lang_prefix)
    if key not in _cache:
        _cache[key] = read_ner(DATA / rel, strip_lang_prefix=strip_lang_prefix)
    return _cache[key]


def has_overlap(spans: list[Span]) -> bool:
    return any(a.start < b.end and b.start < a.end for i, a in enumerate(spans) for b in spans[i + 1 :])


def has_strict_nesting(spans: list[Span]) -> bool:
    """One span inside another with different boundaries (same-range, different-type pairs excluded)."""
    return any(
        (a.start, a.end) != (b.start, b.end)
        and (a.start <= b.start and b.end <= a.end or b.start <= a.start and a.end <= b.end)
        for i, a in enumerate(spans)
        for b in spans[i + 1 :]
    )


# ----------------------------------------------------------------------------------------------------
# Real data
# ----------------------------------------------------------------------------------------------------

REAL = [
    ("ner/cluener/train.json", "cluener", 10748, 23971),
    ("ner/cluener/dev.json", "cluener", 1343, 3072),
    ("ner/cluener/test.json", "cluener", 1345, 0),
    ("ner/peoples_daily/example.dev", "conll", 2318, 3819),
    ("ner/cmeee/train.json", "cmeee", 4000, 16470),
    ("ner/cmeee/dev.json", "cmeee", 1000, 3830),
]


@pytest.mark.needs_data
@pytest.mark.parametrize("rel,fmt,n_examples,n_spans", REAL)
def test_real_counts_and_offsets(rel, fmt, n_examples, n_spans):
    assert detect_format(DATA / rel) == fmt
    examples = load(rel)
    assert len(examples) == n_examples
    assert sum(len(ex.spans) for ex in examples) == n_spans
    for ex in examples:
        keys = [(s.start, s.end, s.label) for s in ex.spans]
        assert keys == sorted(set(keys)), "spans sorted and unique"
        for s in ex.spans:
            assert 0 <= s.start < s.end <= len(ex.text)
            assert ex.text[s.start : s.end] == s.text
            assert s.label and s.score is None


@pytest.mark.needs_data
def test_cluener_first_train_line():
    ex = load("ner/cluener/train.json")[0]
    assert ex.text.startswith("浙商银行企业信贷部叶老桂博士")
    # {"name": {"叶老桂": [[9, 11]]}, "company": {"浙商银行": [[0, 3]]}} with inclusive ends
    assert ex.spans == [Span(0, 4, "company", "浙商银行"), Span(9, 12, "name", "叶老桂")]


@pytest.mark.needs_data
def test_cluener_nested_mention_is_kept():
    # CLUENER is flat except for this one train record (line 1507): a book title containing two companies.
    examples = load("ner/cluener/train.json")
    assert [i for i, ex in enumerate(examples) if has_overlap(ex.spans)] == [1506]
    assert [(s.start, s.end, s.label) for s in examples[1506].spans] == [
        (15, 35, "book"),
        (16, 20, "company"),
        (23, 27, "company"),
    ]
    assert not any(has_overlap(ex.spans) for ex in load("ner/cluener/dev.json"))


@pytest.mark.needs_data
def test_cluener_types():
    labels = {s.label for ex in load("ner/cluener/train.json") for s in ex.spans}
    assert labels == {
        "address", "book", "company", "game", "government",
        "movie", "name", "organization", "position", "scene",
    }  # fmt: skip


@pytest.mark.needs_data
def test_peoples_daily():
    examples = load("ner/peoples_daily/example.dev")
    counts = Counter(s.label for ex in examples for s in ex.spans)
    assert counts == {"LOC": 1951, "ORG": 984, "PER": 884}  # = the B- tag counts of the file
    assert sum(len(ex.text) for ex in examples) == 109870  # one character per tag line
    ex = examples[1]
    assert ex.text.startswith("相比之下，青岛海牛队和广州松日队")
    assert ex.spans == [Span(5, 10, "ORG", "青岛海牛队"), Span(11, 16, "ORG", "广州松日队")]


@pytest.mark.needs_data
def test_cmeee_nesting_preserved():
    train, dev = load("ner/cmeee/train.json"), load("ner/cmeee/dev.json")
    # strictly nested records: 427 + 84 = 511, the README's count for the 5,000 original dev records
    assert sum(has_strict_nesting(ex.spans) for ex in train) == 427
    assert sum(has_strict_nesting(ex.spans) for ex in dev) == 84
    # any overlap, also counting same-range spans with different types (e.g. bod and sym)
    assert sum(has_overlap(ex.spans) for ex in train) == 439
    assert sum(has_overlap(ex.spans) for ex in dev) == 85
    # second record: 肺 (bod) inside 肺内病变 (sym), and again inside 肺内炎性病变
    assert [(s.start, s.end, s.label, s.text) for s in train[1].spans] == [
        (10, 11, "bod", "肺"),
        (10, 14, "sym", "肺内病变"),
        (17, 18, "bod", "肺"),
        (17, 23, "sym", "肺内炎性病变"),
    ]
    # same range, two types
    assert [(s.start, s.end, s.label) for s in train[229].spans if s.start == 3] == [
        (3, 10, "bod"),
        (3, 10, "sym"),
    ]
    assert {s.label for ex in train for s in ex.spans} == {
        "bod", "dep", "dis", "dru", "equ", "ite", "mic", "pro", "sym",
    }  # fmt: skip


@pytest.mark.needs_data
def test_wikiann_words_joined_with_spaces():
    examples = load("xner/wikiann/en/dev", strip_lang_prefix=True)
    assert len(examples) == 10000
    ex = examples[0]
    assert ex.text.startswith("Sioux Falls Arena ( Sioux Falls , South Dakota")
    assert ex.spans[:2] == [
        Span(0, 17, "ORG", "Sioux Falls Arena"),
        Span(20, 46, "LOC", "Sioux Falls , South Dakota"),
    ]
    assert all(ex.text[s.start : s.end] == s.text for ex in examples for s in ex.spans)
    assert not any(s.text.startswith("en:") or s.text != s.text.strip() for ex in examples for s in ex.spans)


# ----------------------------------------------------------------------------------------------------
# Small files
# ----------------------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_cluener_dedup_test_split_and_multiple_offsets(tmp_path):
    lines = [
        {"text": "张三和张三", "label": {"name": {"张三": [[0, 1], [3, 4], [0, 1]]}}},
        {"id": 7, "text": "无标注"},
        {"text": "空", "label": {}},
    ]
    path = write(tmp_path, "c.json", "\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n\n")
    examples = read_cluener(path)
    assert examples[0].spans == [Span(0, 2, "name", "张三"), Span(3, 5, "name", "张三")]
    assert examples[1] == NerExample("无标注", [])
    assert examples[2] == NerExample("空", [])


def test_conll_tab_words_and_prefix(tmp_path):
    content = "en:New\tB-LOC\nen:York\tI-LOC\nen:is\tO\n\nen:Bob\tB-PER\n"
    path = write(tmp_path, "w.txt", content)
    kept, stripped = read_conll(path), read_conll(path, strip_lang_prefix=True)
    assert kept[0].text == "en:New en:York en:is"
    assert kept[0].spans == [Span(0, 14, "LOC", "en:New en:York")]
    assert stripped[0].text == "New York is"
    assert stripped[0].spans == [Span(0, 8, "LOC", "New York")]
    assert stripped[1].spans == [Span(0, 3, "PER", "Bob")]
    assert read_conll(path, sep="_")[0].spans == [Span(0, 14, "LOC", "en:New_en:York")]
    with pytest.raises(ValueError, match="unknown tagging scheme"):
        read_conll(path, scheme="XYZ")


def test_conll_characters_and_lenient_decoding(tmp_path):
    # trailing whitespace, CRLF, several blank lines, a full-width space as a token, an I- after O
    content = "北 B-LOC \r\n京 I-LOC\r\n\u3000 O\n是 O\n\n\n\n张 I-PER\n三 I-PER\n"
    examples = read_ner(write(tmp_path, "c.bio", content))
    assert [ex.text for ex in examples] == ["北京\u3000是", "张三"]
    assert examples[0].spans == [Span(0, 2, "LOC", "北京")]
    assert examples[1].spans == [Span(0, 2, "PER", "张三")]  # conlleval/seqeval: I- after O starts one


def test_cmeee_empty_entities_and_missing_entities(tmp_path):
    records = [{"text": "发热", "entities": [{"start_idx": 0, "end_idx": 1, "type": "sym", "entity": "发热"}]}]
    records += [{"text": "无", "entities": []}, {"text": "测试集"}]
    examples = read_cmeee(write(tmp_path, "m.json", json.dumps(records, ensure_ascii=False)))
    assert examples == [
        NerExample("发热", [Span(0, 2, "sym", "发热")]),
        NerExample("无", []),
        NerExample("测试集", []),
    ]


CMEEE_BAD_ENTITY = """[
{
"text": "头痛",
"entities": []
},
{
"text": "发热咳嗽",
"entities": [
{"start_idx": 0, "end_idx": 1, "type": "sym", "entity": "发热"},
{"start_idx": 2, "end_idx": 3, "type": "sym", "entity": "咳痰"}
]
}
]
"""

BAD = [
    # (name, content, line, reason fragment)
    ("bad.json", '{"text": "a", "label": {}}\n{"text": "b", "label": {\n', 2, "malformed JSON"),
    ("bad.json", '{"text": "a", "label": {}}\n\n["a"]\n', 3, "expected a JSON object"),
    ("bad.json", '{"label": {}}\n', 1, "missing field 'text'"),
    ("bad.json", '{"text": 5}\n', 1, "'text' must be a string"),
    ("bad.json", '{"text": "ab", "label": "x"}\n', 1, "'label' must be an object"),  # a list: doccano's
    ("bad.json", '{"text": "ab", "label": {"name": {"ab": [[0, 2]]}}}\n', 1, "outside the text"),
    ("bad.json", '{"text": "ab", "label": {"name": {"ab": [[1, 0]]}}}\n', 1, "empty or outside"),
    ("bad.json", '{"text": "ab", "label": {"name": {"ab": [[0]]}}}\n', 1, "expected a [start, end] pair"),
    ("bad.json", '{"text": "ab", "label": {"name": {"ab": [["0", 1]]}}}\n', 1, "must be integers"),
    ("bad.json", '{"text": "abc", "label": {"name": {"ab": [[1, 2]]}}}\n', 1, "does not match the text"),
    ("bad.bio", "北 B-LOC\n京 I-LOC\n\n是 X-LOC\n", 4, "malformed BIO tag 'X-LOC'"),
    ("bad.bio", "北 B-LOC\n京 B-\n", 2, "malformed BIO tag 'B-'"),
    ("bad.bio", "北 B-LOC\n京 E-LOC\n", 2, "malformed BIO tag 'E-LOC'"),
    ("bad.bio", "北 B-LOC\n京 I-LOC NN\n", 2, "expected 'token TAG', got 3 field(s)"),
    ("bad.bio", "北\n", 1, "expected 'token TAG', got 1 field(s)"),
    ("bad.txt", "", 1, "empty file"),
    ("bad.txt", "\n  \n\n", 1, "empty file"),
    ("bad.json", "[]", 1, "empty list"),
    ("bad.json", "[\n{}\n]", 2, "missing field 'text' (record 0)"),
    ("bad.json", '[\n{"text": "a"},\n{"text": "b"} {"text": "c"}]', 3, "expected ',' or ']'"),
    ("bad.json", '[\n{"text": "a"},\n{"text": "b",\n}]', 4, "malformed JSON"),
    ("bad.json", '[{"text": "a"}] x', 1, "extra data after the list"),
    ("bad.json", '[{"text": "a", "entities": [{"start_idx": 0}]}]', 1, "entity 0: missing field 'end_idx'"),
    ("bad.json", CMEEE_BAD_ENTITY, 6, "record 1, entity 1: 'entity' '咳痰' does not match"),
    (
        "bad.json",
        '[{"text": "ab", "entities": [{"start_idx": 1, "end_idx": 2, "type": "sym", "entity": "b"}]}]',
        1,
        "outside the text",
    ),
    ("bad.jsonl", '{"text": "ab", "entities": [{"start": 0, "end": 1}]}\n', 1, "missing field 'label'"),
    ("bad.jsonl", '{"text": "ab", "entities": [{"start": 0, "end": 1, "label": ""}]}\n', 1,
     "'label' must be a non-empty string"),  # a tagger would train on the tag "B-" and stop without a file:line
    (
        "bad.jsonl",
        '{"text": "ab", "spans": []}\n{"text": "ab", "spans": [{"start": 0, "end": 1, "label": "X", "text": "b"}]}',
        2,
        "'text' 'b' does not match text[0:1]",
    ),
    (
        "bad.jsonl",
        '{"text": "ab", "entities": [{"start": 1, "end": 3, "label": "X"}]}\n',
        1,
        "outside the text",
    ),
    ("bad.bio", "北 O\n".encode() + b"\xff\xfe O\n", 2, "not valid UTF-8"),
]


@pytest.mark.parametrize("name,content,line,reason", BAD)
def test_errors_name_file_line_and_reason(tmp_path, name, content, line, reason):
    path = write(tmp_path, name, content)
    with pytest.raises(DataError) as info:
        read_ner(path)
    err = info.value
    assert (err.path, err.line) == (str(path), line)
    assert reason in err.reason
    assert str(err) == f"{path}:{line}: {err.reason}"
    assert isinstance(err, ValueError)


def test_explicit_format_and_unknown_format(tmp_path):
    path = write(tmp_path, "c.json", '{"text": "ab", "label": {"name": {"ab": [[0, 1]]}}}\n')
    assert read_ner(path, format="cluener") == read_ner(path) == [NerExample("ab", [Span(0, 2, "name", "ab")])]
    with pytest.raises(DataError, match=r"c\.json:1: expected 'token TAG'"):
        read_ner(path, format="conll")
    with pytest.raises(ValueError, match="unknown NER format"):
        read_ner(path, format="xml")


def test_detect_format_scans_past_unlabelled_lines(tmp_path):
    path = write(tmp_path, "z.jsonl", '{"text": "a"}\n{"text": "b", "entities": []}\n')
    assert detect_format(path) == "jsonl"
    assert detect_format(write(tmp_path, "t.json", '{"text": "a"}\n')) == "cluener"


# ----------------------------------------------------------------------------------------------------
# zhie JSON lines
# ----------------------------------------------------------------------------------------------------


@pytest.mark.needs_data
def test_jsonl_round_trip_real(tmp_path):
    for rel in ("ner/cmeee/dev.json", "ner/peoples_daily/example.dev"):
        examples = load(rel)
        out = tmp_path / "out.jsonl"
        write_ner_jsonl(examples, out)
        assert detect_format(out) == "jsonl"
        assert read_ner(out) == examples
    first = json.loads(out.read_text(encoding="utf-8").splitlines()[1])
    assert first["entities"][0] == {"start": 5, "end": 10, "label": "ORG", "text": "青岛海牛队"}


def test_jsonl_round_trip_scores_and_atomic_write(tmp_path):
    examples = [
        NerExample("北京欢迎你", [Span(0, 2, "LOC", "北京", 0.9), Span(0, 5, "X", "北京欢迎你")]),
        NerExample("", []),
    ]
    out = tmp_path / "pred.jsonl"
    out.write_text("old content\n", encoding="utf-8")
    write_ner_jsonl(examples, out)
    assert read_ner_jsonl(out) == examples

    def failing():
        yield examples[0]
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_ner_jsonl(failing(), out)
    assert read_ner_jsonl(out) == examples  # the previous file is intact
    assert os.listdir(tmp_path) == ["pred.jsonl"]  # and no temporary file is left behind
