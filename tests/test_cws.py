"""Word segmentation: BMES round trips on real sentences, constraints, learning, lossless segmentation."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zhie
from zhie import encoders
from zhie.cli import main
from zhie.core.spans import Span, spans_to_tags, tags_to_spans
from zhie.data.cws import read_segmented, words_to_example, write_segmented
from zhie.heads import bmes_allowed_transitions
from zhie.model import Model
from zhie.tasks.cws import CwsTask, partition
from zhie.training import TrainConfig

from .conftest import DATA
from .tiny_models import trained

SXU = DATA / "cws/sxu"


@pytest.mark.needs_data
def test_reader_and_bmes_round_trip_on_real_sentences(tmp_path):
    examples = read_segmented(SXU / "train.txt")
    assert len(examples) == 17115
    first = examples[0]
    assert first.text.startswith("上海推“迎奥运”三大任务２００７－")  # full-width characters kept
    assert [s.text for s in first.spans][:6] == ["上海", "推", "“", "迎", "奥运", "”"]
    for ex in examples[:2000]:
        tags = spans_to_tags(ex.spans, len(ex.text), "BMES")
        assert [(s, e) for s, e, _ in tags_to_spans(tags, "BMES")] == [(s.start, s.end) for s in ex.spans]
        assert all(ex.text[s.start:s.end] == s.text for s in ex.spans)
    write_segmented(examples[:50], tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == \
        (SXU / "train.txt").read_text(encoding="utf-8").splitlines()[:50]


def test_long_sentences_are_cut_at_word_boundaries():
    _, tokenizer = encoders.tiny(["我们今天去北京天安门广场"])
    task = CwsTask(CwsTask.configure([], encoder="tiny", head="crf", max_length=8), tokenizer)
    ex = words_to_example(["我们", "今天", "去", "北京", "天安门广场", "我们今天去北京天安门"])
    pieces = task.split_long([ex])
    assert "".join(p.text for p in pieces) == ex.text
    assert all(len(p.text) <= 6 for p in pieces)
    assert [s.text for p in pieces for s in p.spans] == ["我们", "今天", "去", "北京", "天安门广场", "我们今天去北",
                                                         "京天安门"]  # an overlong word is cut too
    items = task.encode([ex])
    assert all(len(it.ids) == len(it.tags) <= 6 for it in items)


@pytest.fixture(scope="module")
def crf_segmenter():
    encoder, tokenizer = encoders.tiny(["北京"])
    task = CwsTask(CwsTask.configure([], encoder="tiny"), tokenizer)
    model = Model(encoder, task.build_heads(encoder.config.hidden_size))
    torch.manual_seed(0)
    # strong random transitions fight the constraints
    torch.nn.init.normal_(model.heads["cws"].crf.transitions, std=3.0)
    return task, model


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(emissions=st.lists(st.lists(st.floats(-5, 5), min_size=4, max_size=4), min_size=1, max_size=12))
def test_constrained_viterbi_never_outputs_a_forbidden_transition(crf_segmenter, emissions):
    task, model = crf_segmenter
    n = len(emissions)
    logits = torch.zeros(1, n + 2, 4)
    logits[0, 1:-1] = torch.tensor(emissions)
    (row,) = task.decode(model, {"cws": logits.numpy()}, np.ones((1, n + 2), dtype=np.int64))
    # the decoded words tile the sequence exactly: every position is in exactly one word
    covered = [t for hit in sorted(row, key=lambda h: h.start) for t in range(hit.start, hit.end)]
    assert covered == list(range(n))
    allowed, start, end = bmes_allowed_transitions(["S", "B", "M", "E"])
    paths, _ = model.heads["cws"].crf.viterbi(logits[:, 1:-1], allowed=allowed, allowed_start=start, allowed_end=end)
    path = paths[0].tolist()
    assert start[path[0]] and end[path[-1]] and all(allowed[a, b] for a, b in zip(path, path[1:]))


def test_partition_is_lossless():
    text = "我们 去  北京\t了"
    spans = [Span(0, 2, "", "我们"), Span(3, 4, "", "去"), Span(1, 4, "", "们 去"), Span(6, 8, "", "北京")]
    parts = partition(text, spans)
    assert "".join(p.text for p in parts) == text
    assert [p.text for p in parts] == ["我们", " ", "去", "  ", "北京", "\t了"]


@pytest.fixture(scope="module")
def sxu_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("cws")
    sample = read_segmented(SXU / "train.txt")[:200]
    write_segmented(sample, out / "train.txt")
    config = TrainConfig(epochs=8, batch_size=16, lr=3e-3, head_lr=3e-3, warmup=0.05, seed=0, eval_every=10**9)
    zhie.fit("cws", out / "train.txt", out / "train.txt", out=out / "run", encoder="tiny", head="crf", max_length=128,
              config=config, resume=False, progress=False)
    return out


@pytest.mark.needs_data
def test_tiny_model_learns_200_sxu_sentences(sxu_model):
    seg = zhie.load(sxu_model / "run")
    metrics = seg.evaluate(read_segmented(sxu_model / "train.txt"))
    assert metrics["f1"] >= 0.95, metrics
    assert set(metrics) >= {"precision", "recall", "f1", "oov_recall", "iv_recall"}
    assert metrics["n_oov"] == 0  # evaluated on its own training data: every word is in the vocabulary


def test_segment_then_join_gives_the_input_back(capsys):
    model = trained("cws")  # on made-up sentences
    seg = zhie.load(model)
    texts = ["上海市体育局召开体育宣传工作会议。", "  有 空格\t和\n换行的 text ＡＢＣ 😀 ", "", "龘" * 700]
    for text, words in zip(texts, seg.segment(texts)):
        assert "".join(words) == text
    assert main(["segment", str(model), texts[0], "--json"]) == 0
    out = capsys.readouterr().out
    assert '"words"' in out and '"start": 0' in out
    assert main(["eval", str(model), "--data", str(model.parents[1] / "train.txt")]) == 0
    assert '"oov_recall"' in capsys.readouterr().out


def test_a_json_lines_file_is_not_read_as_segmented_text(tmp_path):
    """A NER or relation file given as CWS data (zhie train/eval cws) is an error, not sentences of JSON 'words'."""
    from zhie.data import DataError

    path = tmp_path / "dev.jsonl"
    path.write_text("上海  市\n" + '{"text": "北京", "entities": []}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"dev\.jsonl:2: a JSON object, where segmented text .* was expected"):
        read_segmented(path)
    path.write_text("{  }  是  一  个  括号\n", encoding="utf-8")  # braces as words are still text
    assert [s.text for s in read_segmented(path)[0].spans][:2] == ["{", "}"]
