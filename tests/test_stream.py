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


# ------------------------------------------------------------------------------------------------- streaming
def test_predict_streams_chunks_in_input_order(tmp_path, capsys):
    model = str(trained("ner-gp"))
    lines = [json.dumps({"text": t, "id": i}, ensure_ascii=False) if i % 2 else t for i, t in enumerate(TEXTS)]
    path = write(tmp_path / "in.txt", lines[:5] + [""] + lines[5:])  # a blank line is skipped, as before
    expected = as_json(zhie.load(model).predict(TEXTS))
    assert main(["predict", model, "--input", path, "--chunk-lines", "3", "--batch-size", "2"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["text"] for row in out] == TEXTS and [row["entities"] for row in out] == expected
    assert main(["predict", model, "--input", path, "--chunk-lines", "4", "--max-tokens", "300",
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    assert capsys.readouterr().out == ""
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == out


def test_a_bad_line_names_file_and_line_and_leaves_no_output(tmp_path, capsys):
    model = str(trained("ner-gp"))
    out = tmp_path / "out.jsonl"
    out.write_text("old results\n")
    for bad, what in [(b'{"id": 3}', "a JSON line needs a string field 'text'"), (b"\xff\xfe bad", "not valid UTF-8"),
                      (b'{"text": ', "malformed JSON")]:
        path = tmp_path / "in.txt"
        path.write_bytes("\n".join(TEXTS[:3]).encode() + b"\n" + bad + b"\n" + TEXTS[3].encode() + b"\n")
        code = main(["predict", model, "--input", str(path), "--chunk-lines", "2", "--output", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and f"{path}:4: {what}" in err and "--skip-bad-lines" in err
        assert out.read_text() == "old results\n"  # the earlier file is kept whole
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_skip_bad_lines_goes_on_and_counts(tmp_path, capsys):
    model = str(trained("cws"))
    path = tmp_path / "in.txt"
    path.write_bytes(b"\n".join([TEXTS[0].encode(), b"\xff", b'{"text": 1}', TEXTS[1].encode(), b"[]"]) + b"\n")
    assert main(["segment", model, "--input", str(path), "--skip-bad-lines", "--chunk-lines", "1"]) == 0
    captured = capsys.readouterr()
    words = [line.split("  ") for line in captured.out.splitlines()]
    assert ["".join(w) for w in words] == [TEXTS[0], TEXTS[1], "[]"]  # "[]" is a text line, not JSON
    assert f"skipped 2 bad line(s) of {path}" in captured.err
    path.write_bytes(b"\xff\n")
    assert main(["segment", model, "--input", str(path), "--skip-bad-lines"]) == 2
    assert "nothing to segment" in capsys.readouterr().err


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
        stream.write_npy(str(tmp_path / "missing" / "v.npy"), [np.zeros((1, 2))])
