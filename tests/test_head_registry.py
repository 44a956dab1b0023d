"""NER heads are found by name in a registry (:func:`zhie.tasks.ner.register_head`): a plug-in adds one, by a call or
through the ``zhie.ner_heads`` entry points, and ``zhie train ner --head NAME`` trains and predicts with it, with no
edit to the task."""

from __future__ import annotations

import importlib.metadata

import pytest

import zhie
from tests.tiny_models import nested_corpus
from zhie.cli import build_parser, main
from zhie.core.spans import Span
from zhie.data import write_ner_jsonl
from zhie.tasks import ner_heads
from zhie.tasks.ner_heads import HEADS, NER_HEADS, SPAN_HEADS, TAGGER_HEADS, NerConfig, register_head


@pytest.fixture
def toy_head():
    """``toy-softmax``, a copy of the softmax tagger under another name; yields the names of the configs it built
    heads for."""
    built = []

    def build(config: NerConfig, hidden_size: int):
        from zhie.heads import SoftmaxTagger

        built.append(config.head)
        return SoftmaxTagger(hidden_size, len(config.tags), dropout=config.dropout)

    register_head("toy-softmax", "tag", build)
    yield built
    del NER_HEADS["toy-softmax"]


def test_a_registered_head_trains_and_predicts(toy_head, tmp_path, capsys):
    assert "toy-softmax" in HEADS and "toy-softmax" in TAGGER_HEADS and "toy-softmax" not in SPAN_HEADS
    write_ner_jsonl(nested_corpus(16, seed=1), tmp_path / "train.jsonl")
    data = ["--train", str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "train.jsonl")]
    assert main(["train", "ner", *data, "--out", str(tmp_path / "run"), "--encoder", "tiny", "--head", "toy-softmax",
                 "--flatten", "--max-length", "32", "--max-steps", "2", "--batch-size", "8", "--quiet"]) == 0
    assert toy_head == ["toy-softmax"]
    pipe = zhie.load(tmp_path / "run")
    assert toy_head == ["toy-softmax", "toy-softmax"] and pipe.task.config.head == "toy-softmax"
    (spans,) = pipe.predict(["张三去了青山市。"])
    assert all(isinstance(s, Span) for s in spans)


def test_an_unknown_head_is_refused_with_the_registered_ones(toy_head):
    with pytest.raises(ValueError, match="unknown head 'nope'; choose one of softmax, crf, gp, egp, toy-softmax"):
        NerConfig(["PER"], head="nope")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "ner", "--train", "a", "--dev", "b", "--out", "c", "--head", "nope"])
    with pytest.raises(ValueError, match="'gp' is taken"):
        register_head("gp", "tag", lambda config, hidden_size: None)


def test_a_package_s_heads_come_through_the_entry_points(monkeypatch):
    class Entry:
        def load(self):
            register_head("plugged", "span", NER_HEADS["egp"].build)

    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [Entry()] if group == ner_heads.HEAD_GROUP else [])
    monkeypatch.setattr(ner_heads, "_heads_discovered", False)
    try:
        assert NerConfig(["PER"], head="plugged").head == "plugged" and "plugged" in SPAN_HEADS
    finally:
        NER_HEADS.pop("plugged", None)
