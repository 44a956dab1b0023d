"""Streaming prediction (zhie predict/segment/embed --input read in chunks, results in input order), bad lines with
FILE:LINE, --skip-bad-lines, all-or-nothing --output files; token-budget batching (--max-tokens)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import zhie
from tests.tiny_models import nested_corpus, trained
from zhie.cli import main
from zhie.deploy import stream
from zhie.tasks.base import input_arrays, pad_array, sorted_batches

# texts of different lengths (so that sorting inside a chunk reorders them), one longer than a 64-token window
TEXTS = [ex.text for ex in nested_corpus(11, seed=3)] + ["短句。", "".join(ex.text for ex in nested_corpus(6, seed=4))]


def write(path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def as_json(predictions) -> list:
    return [[s.to_dict() for s in row] for row in predictions]


# ------------------------------------------------------------------------------------------------- --max-tokens
@given(st.lists(st.integers(1, 300), max_size=60), st.integers(1, 2000))
def test_token_budget_batches_hold_every_index_once_within_the_budget(lengths, max_tokens):
    batches = list(sorted_batches(lengths, 32, max_tokens))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= max_tokens
    # greedy: a batch stops only when the next row would break the budget
    for b, nxt in zip(batches, batches[1:]):
        assert (len(b) + 1) * max(lengths[i] for i in b) > max_tokens, (b, nxt)


@given(st.lists(st.lists(st.integers(-5, 10**6), max_size=9), max_size=7), st.integers(-100, 3), st.integers(0, 4))
def test_padding_puts_each_row_left_aligned_and_fills_the_rest(rows, value, extra):
    """input_arrays / pad_array (one scatter of all the rows) against padding each row in Python; a padded length
    shorter than a row is an error."""
    width = max(map(len, rows), default=0)
    want = [row + [value] * (width + extra - len(row)) for row in rows]
    assert pad_array(rows, value, width + extra).tolist() == want
    assert pad_array(rows, value).tolist() == [row[:width] for row in want]
    batch = input_arrays(rows, value)
    assert batch["input_ids"].dtype == batch["attention_mask"].dtype == np.int64
    assert batch["input_ids"].tolist() == [row[:width] for row in want]
    assert batch["attention_mask"].tolist() == [[1] * len(row) + [0] * (width - len(row)) for row in rows]
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (len(rows), width)
    if width:
        with pytest.raises(ValueError):
            pad_array(rows, value, width - 1)


def test_max_tokens_predicts_what_fixed_batches_predict():
    pipe = zhie.load(trained("ner-gp"))
    fixed = as_json(pipe.predict(TEXTS, batch_size=4))
    for max_tokens in (1, 100, 700, 10**6):
        assert as_json(pipe.predict(TEXTS, max_tokens=max_tokens)) == fixed
    sim = zhie.load(trained("similarity"))
    assert np.allclose(sim.encode(TEXTS, max_tokens=64), sim.encode(TEXTS, batch_size=3), atol=1e-5)


def test_max_tokens_budget_is_held_by_the_model_calls():
    pipe = zhie.load(trained("ner-gp"))
    shapes = []
    handle = pipe.model.encoder.register_forward_hook(lambda m, a, kw, out: shapes.append(kw["input_ids"].shape),
                                                      with_kwargs=True)
    try:
        pipe.predict(TEXTS, max_tokens=200)
    finally:
        handle.remove()
    assert len(shapes) > 1 and all(rows * length <= 200 for rows, length in shapes)


def test_the_collector_is_paused_by_the_command_only_never_by_a_library_call(monkeypatch, capsys):
    """``zhie predict`` (one process, nothing else running) streams with the cyclic garbage collector off (its passes
    over the predictions' small objects cost time); ``Pipeline.predict`` and ``evaluate``, which the service's model
    thread calls beside its event loop, leave it on; the pause leaves the collector as it found it: on, off, or
    after an error inside."""
    import gc

    from zhie.deploy.stream import collector_paused
    from zhie.tasks.pipeline import Pipeline

    pipe = zhie.load(trained("ner-gp"))
    seen = []
    handle = pipe.model.encoder.register_forward_hook(lambda m, a, out: seen.append(gc.isenabled()))
    try:
        pipe.predict(TEXTS[:3])
        pipe.evaluate(nested_corpus(2, seed=5))
        assert seen and all(seen)
    finally:
        handle.remove()
    during = []
    predict = Pipeline.predict
    monkeypatch.setattr(Pipeline, "predict", lambda self, *a, **k: during.append(gc.isenabled()) or predict(
        self, *a, **k))
    assert main(["predict", str(trained("ner-gp")), TEXTS[0]]) == 0 and during == [False] and gc.isenabled()
    capsys.readouterr()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(TypeError), collector_paused():
        raise TypeError("inside")
    assert gc.isenabled()


# ------------------------------------------------------------------------------------------------- streaming
def test_predict_streams_chunks_in_input_order(tmp_path, capsys):
    model = str(trained("ner-gp"))
    lines = [json.dumps({"text": t, "id": i}, ensure_ascii=False) for i, t in enumerate(TEXTS)]
    path = write(tmp_path / "in.jsonl", lines[:5] + [""] + lines[5:])  # a blank line: an empty text
    expected = as_json(zhie.load(model).predict(TEXTS[:5] + [""] + TEXTS[5:]))
    assert main(["predict", model, "--input", path, "--chunk-lines", "3", "--batch-size", "2"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["text"] for row in out] == TEXTS[:5] + [""] + TEXTS[5:] and [row["entities"] for row in out] == expected
    assert out[5]["entities"] == []
    assert main(["predict", model, "--input", path, "--chunk-lines", "4", "--max-tokens", "300",
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    assert capsys.readouterr().out == ""
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no .partial left


# an input file of 7 lines: texts, a blank line, a line of spaces, a line that is not UTF-8, a JSON-looking text
MIXED = [TEXTS[0].encode(), b"", b"   ", b"\xff\xfe bad", '{"text":"不是JSON行"}'.encode(), TEXTS[1].encode(),
         "{张三".encode()]
MIXED_TEXTS = [TEXTS[0], "", "", "", '{"text":"不是JSON行"}', TEXTS[1], "{张三"]  # what each line reads as
BAD = 3  # the index of the bad line


def test_every_input_line_has_one_output_line_in_order(tmp_path, capsys):
    """Blank lines give an empty result and a skipped bad line a record that says why, so that output line i is always
    input line i: zhie predict (JSON lines), zhie segment (plain and --json) and zhie embed (JSON lines)."""
    path = tmp_path / "in.txt"
    path.write_bytes(b"\n".join(MIXED) + b"\n")
    error = {"file": str(path), "line": BAD + 1, "error": "not valid UTF-8 (invalid start byte at byte 0)"}
    ner, cws, sim = (str(trained(kind)) for kind in ("ner-gp", "cws", "similarity"))
    args = ["--input", str(path), "--skip-bad-lines", "--chunk-lines", "2"]

    assert main(["predict", ner, *args]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert rows[BAD] == error and f"skipped 1 bad line(s) of {path}" in captured.err
    assert f"{path}:4: not valid" in captured.err
    expected = as_json(zhie.load(ner).predict(MIXED_TEXTS))
    assert [r for i, r in enumerate(rows) if i != BAD] == [
        {"text": t, "entities": e} for i, (t, e) in enumerate(zip(MIXED_TEXTS, expected)) if i != BAD]
    assert rows[1]["entities"] == rows[2]["entities"] == []

    assert main(["segment", cws, *args]) == 0
    plain = capsys.readouterr().out.split("\n")
    assert len(plain) == len(MIXED) + 1 and plain[-1] == ""  # one line per input line
    assert ["".join(line.split("  ")) for line in plain[:-1]] == [t if i != BAD else ""
                                                                  for i, t in enumerate(MIXED_TEXTS)]
    assert main(["segment", cws, *args, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[BAD] == error and [r["text"] for i, r in enumerate(rows) if i != BAD] == [
        t for i, t in enumerate(MIXED_TEXTS) if i != BAD]
    assert rows[1]["words"] == rows[2]["words"] == []  # a line of spaces has no word

    assert main(["embed", sim, *args]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == len(MIXED) and rows[BAD] == error
    assert not any(rows[1]["embedding"]) and not any(rows[2]["embedding"]) and any(rows[0]["embedding"])
    empty = write(tmp_path / "empty.txt", [])  # no line at all: nothing to do
    assert main(["segment", cws, "--input", empty]) == 2
    assert "nothing to segment" in capsys.readouterr().err


def test_embed_output_npy_has_a_row_per_input_line_and_a_mask(tmp_path, capsys):
    """zhie embed --output v.npy: one row per input line, zeros for a blank or skipped line, and v.mask.npy saying
    which rows hold a text's vector."""
    path = tmp_path / "in.txt"
    path.write_bytes(b"\n".join(MIXED) + b"\n")
    sim = str(trained("similarity"))
    assert main(["embed", sim, "--input", str(path), "--skip-bad-lines", "--chunk-lines", "3", "--output",
                 str(tmp_path / "v.npy")]) == 0
    assert f"{tmp_path / 'v.npy'}: {len(MIXED)} x" in capsys.readouterr().err
    vectors, mask = np.load(tmp_path / "v.npy"), np.load(tmp_path / "v.mask.npy")
    assert vectors.shape[0] == len(MIXED) and vectors.dtype == np.float32
    assert mask.tolist() == [True, False, False, False, True, True, True]
    assert not vectors[~mask].any()
    texts = [t for t, holds in zip(MIXED_TEXTS, mask) if holds]
    assert np.allclose(vectors[mask], zhie.load(sim).encode(texts), atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "v.mask.npy", "v.npy"]


def test_a_text_file_is_read_as_text_whatever_its_lines_start_with(tmp_path, capsys, monkeypatch):
    """Whether lines are JSON is decided once per file (--input-format, or auto: the name, else the first non-blank
    line), never per line: in a text file a line starting with "{" is a text."""
    model = str(trained("ner-gp"))

    def texts(*args) -> list[str]:
        assert main(["predict", model, *args]) == 0
        return [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]

    path = write(tmp_path / "in.txt", [TEXTS[0], "{不是JSON}", '{"text": "一"}'])
    assert texts("--input", path) == [TEXTS[0], "{不是JSON}", '{"text": "一"}']
    first = write(tmp_path / "first.txt", ["", '{"text": "一"}', "{二"])  # auto: JSON lines, by its first text line
    assert main(["predict", model, "--input", first]) == 2
    assert f"{first}:3: malformed JSON" in capsys.readouterr().err
    assert texts("--input", first, "--input-format", "text") == ["", '{"text": "一"}', "{二"]
    named = write(tmp_path / "in.jsonl", ['{"text": "一"}', ""])
    assert texts("--input", named) == ["一", ""]
    assert main(["predict", model, "--input", path, "--input-format", "jsonl"]) == 2
    assert f"{path}:1: malformed JSON" in capsys.readouterr().err
    with open(first, "rb") as stdin:  # stdin: the blank lines before the first text line are read, then given back
        monkeypatch.setattr("sys.stdin", stdin)
        assert main(["predict", model, "--input", "-", "--skip-bad-lines"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[:2] == [{"text": "", "entities": []}, {"text": "一", "entities": []}]
    assert rows[2] == {"file": "<stdin>", "line": 3, "error": rows[2]["error"]} and "malformed JSON" in rows[2]["error"]


def test_files_of_texts_read_elsewhere_decide_their_format_once(tmp_path):
    """The unlabelled texts of zhie distill (read_texts) and zhie export --calibrate read a file as text or as JSON
    lines as a whole."""
    from zhie.data.base import read_texts
    from zhie.deploy.export import calibration_texts

    path = write(tmp_path / "in.txt", [TEXTS[0], "", "{不是JSON}"])
    assert read_texts(path) == calibration_texts(path, 5) == [TEXTS[0], "{不是JSON}"]
    lines = write(tmp_path / "in.data", ["", '{"text": "一"}'])
    assert read_texts(lines) == ["一"] and read_texts(lines, "text") == ['{"text": "一"}']


def test_a_failure_keeps_the_lines_done_in_a_partial_file(tmp_path, capsys):
    """A bad line late in an --output run: FILE keeps its old content, FILE.partial the output of the lines before the
    failing chunk, and stderr says how many; the .npy of zhie embed the same, each .partial a whole array."""
    model = str(trained("ner-gp"))
    out = tmp_path / "out.jsonl"
    out.write_text("old results\n")
    for bad, what in [(b'{"id": 3}', "a JSON line needs a string field 'text'"), (b"\xff\xfe bad", "not valid UTF-8"),
                      (b'{"text": ', "malformed JSON")]:
        path = tmp_path / "in.jsonl"
        path.write_bytes(b"".join(json.dumps({"text": t}, ensure_ascii=False).encode() + b"\n" for t in TEXTS[:4])
                         + bad + b"\n" + json.dumps({"text": TEXTS[4]}).encode() + b"\n")
        code = main(["predict", model, "--input", str(path), "--chunk-lines", "2", "--output", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and f"{path}:5: {what}" in err and "--skip-bad-lines" in err
        assert out.read_text() == "old results\n"  # the earlier file is kept whole
        assert f"stopped after 4 input line(s); their output is kept in {out}.partial" in err
        done = [json.loads(line) for line in (tmp_path / "out.jsonl.partial").read_text(encoding="utf-8").splitlines()]
        entities = as_json(zhie.load(model).predict(TEXTS[:4]))
        assert done == [{"text": t, "entities": e} for t, e in zip(TEXTS[:4], entities)]
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no hidden temporary file
    sim = str(trained("similarity"))
    assert main(["embed", sim, "--input", str(path), "--chunk-lines", "3", "--output", str(tmp_path / "v.npy")]) == 2
    assert "stopped after 3 input line(s)" in capsys.readouterr().err and not (tmp_path / "v.npy").exists()
    vectors, mask = np.load(tmp_path / "v.npy.partial"), np.load(tmp_path / "v.mask.npy.partial")
    assert vectors.shape[0] == 3 and mask.tolist() == [True] * 3
    assert np.allclose(vectors, zhie.load(sim).encode(TEXTS[:3]), atol=1e-5)
    assert main(["predict", model, "--input", str(path), "--skip-bad-lines", "--output", str(out)]) == 0
    capsys.readouterr()
    assert len(out.read_text().splitlines()) == 6 and not (tmp_path / "out.jsonl.partial").exists()


# ------------------------------------------------------------------------------------------------- Pipeline.stream
def test_pipeline_stream_yields_one_prediction_per_text_in_order_reading_a_chunk_at_a_time():
    pipe = zhie.load(trained("ner-gp"))
    texts = TEXTS[:5] + ["", "  "] + TEXTS[5:]
    pulled = []

    def source():
        for i, text in enumerate(texts):
            pulled.append(i)
            yield text

    predictions = pipe.stream(source(), batch_size=2, chunk_size=4)
    first = next(predictions)
    assert len(pulled) == 4  # one chunk read, not the whole input
    rest = list(predictions)
    assert as_json([first, *rest]) == as_json(pipe.predict(texts)) and rest[4] == rest[5] == []
    assert as_json(pipe.stream(texts, max_tokens=200)) == as_json(pipe.predict(texts))
    with pytest.raises(TypeError, match="predicts texts"):
        list(pipe.stream(["一", None]))


def test_pipeline_stream_gives_blank_texts_the_empty_result():
    """A blank text (empty or whitespace): no words for a segmenter (not a word of spaces), a vector of zeros for a
    sentence encoder (encode and stream agree)."""
    cws = zhie.load(trained("cws"))
    assert list(cws.stream(["", " \t", TEXTS[0]]))[:2] == [[], []]
    sim = zhie.load(trained("similarity"))
    vectors = np.stack(list(sim.stream(["", TEXTS[0], "  ", TEXTS[1]], chunk_size=3)))
    assert not vectors[[0, 2]].any() and np.allclose(vectors[[1, 3]], sim.encode([TEXTS[0], TEXTS[1]]), atol=1e-5)
    assert np.allclose(sim.encode(["", TEXTS[0]]), vectors[:2], atol=1e-5)
    raw = np.stack(list(sim.stream([TEXTS[0], ""], normalize=False)))
    assert np.allclose(raw[0], sim.encode(TEXTS[0], normalize=False)[0], atol=1e-5) and not raw[1].any()


def test_the_cli_streams_through_pipeline_stream(tmp_path, capsys, monkeypatch):
    """zhie predict, segment and embed predict through the pipeline's stream (one implementation), with
    --chunk-lines as its chunk size."""
    from zhie.tasks.base import Pipeline
    from zhie.tasks.similarity import SentencePipeline

    calls = []
    for cls in (Pipeline, SentencePipeline):
        def spy(self, texts, *args, original=cls.stream, **kwargs):
            calls.append(kwargs["chunk_size"])
            return original(self, texts, *args, **kwargs)
        monkeypatch.setattr(cls, "stream", spy)
    path = write(tmp_path / "in.txt", TEXTS[:3])
    for command, kind in (("predict", "ner-gp"), ("segment", "cws"), ("embed", "similarity")):
        assert main([command, str(trained(kind)), "--input", path, "--chunk-lines", "2"]) == 0
    assert main(["embed", str(trained("similarity")), "--input", path, "--output", str(tmp_path / "v.npy")]) == 0
    capsys.readouterr()
    assert calls == [2, 2, 2, 4096]


def test_segment_and_embed_stream_to_output_files(tmp_path, capsys):
    path = write(tmp_path / "in.txt", TEXTS)
    cws = str(trained("cws"))
    assert main(["segment", cws, "--input", path, "--json", "--chunk-lines", "5", "--output",
                 str(tmp_path / "words.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "words.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in rows] == TEXTS
    sim = str(trained("similarity"))
    assert main(["embed", sim, "--input", path, "--chunk-lines", "5", "--output", str(tmp_path / "v.npy")]) == 0
    assert f"{len(TEXTS)} x" in capsys.readouterr().err
    assert np.allclose(np.load(tmp_path / "v.npy"), zhie.load(sim).encode(TEXTS), atol=1e-5)
    assert main(["embed", sim, "--input", path, "--chunk-lines", "4"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == TEXTS
    assert np.allclose(np.array([r["embedding"] for r in rows]), np.load(tmp_path / "v.npy"), atol=1e-5)


@pytest.mark.parametrize("command", ["predict", "segment", "embed", "eval"])
def test_an_output_file_that_cannot_be_written_is_refused_before_the_model_loads(command, tmp_path, capsys):
    """--output (--json, --errors) in a directory that does not exist, or naming a directory: one clear message
    (not the temporary file's name), before any work: the model path here is not even a model."""
    flag = "--json" if command == "eval" else "--output"
    args = ["--data", "x.jsonl"] if command == "eval" else ["一句话"]
    for target, message in ((tmp_path / "missing" / "out.txt", f"the directory {tmp_path / 'missing'} does not exist"),
                            (tmp_path, "is a directory; give the name of a file")):
        assert main([command, str(tmp_path / "no-model"), *args, flag, str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"zhie: error: {target}: {message}") and ".tmp" not in err, err
    assert not (tmp_path / "missing").exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        stream.write_npy(str(tmp_path / "missing" / "v.npy"), [(np.zeros(2), True)], 4)
