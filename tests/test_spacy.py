"""The spaCy component (``nlp.add_pipe("zhie", ...)``) with real spaCy and its Chinese segmenters: the spans of
``zhie predict`` on spaCy's tokens, the expansion count, words, relations, vectors, batching, pickling, the entry
point."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

spacy = pytest.importorskip("spacy")

from spacy.tokens import DocBin  # noqa: E402
from spacy.util import filter_spans  # noqa: E402

import zhie  # noqa: E402
from zhie.cli import main  # noqa: E402
from zhie.data import read_ner  # noqa: E402
from zhie.deploy import spacy_component  # noqa: E402, F401  (registers the factory; installed, the entry point does)

from .conftest import DATA  # noqa: E402
from .tiny_models import nested_corpus, relation_corpus, trained, write_segmented_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def predict_cli(model: Path, texts: list[str], tmp_path: Path) -> list[dict]:
    """``zhie predict MODEL --input FILE`` (JSON lines in and out), one output record per text."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
                                       encoding="utf-8")
    assert main(["predict", str(model), "--input", str(tmp_path / "in.jsonl"), "--output",
                 str(tmp_path / "out.jsonl")]) == 0
    return [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]


def covering(doc, start: int, end: int) -> tuple[int, int]:
    """The smallest run of ``doc``'s tokens that holds the characters ``[start, end)`` (token indices)."""
    tokens = [t.i for t in doc if t.idx < end and t.idx + len(t) > start]
    return tokens[0], tokens[-1] + 1


def check_entities(doc, entities: list[dict]) -> int:
    """``doc.spans["zhie"]`` are ``zhie predict``'s ``entities`` (labels, order) on spaCy's tokens, each the smallest
    run of tokens that covers it; ``doc.ents`` the longest non-overlapping ones. Returns how many were expanded."""
    group = doc.spans["zhie"]
    assert [s.label_ for s in group] == [e["label"] for e in entities]
    assert [(s.start, s.end) for s in group] == [covering(doc, e["start"], e["end"]) for e in entities]
    assert group.attrs["scores"] == pytest.approx([e["score"] for e in entities], abs=1e-4)
    assert list(doc.ents) == filter_spans(group)
    return sum((s.start_char, s.end_char) != (e["start"], e["end"]) for s, e in zip(group, entities))


def pkuseg_nlp(tmp_path: Path):
    """``spacy.blank("zh")`` with the pkuseg segmenter, on a pkuseg model trained here on zhie.demo's segmented
    sentences (spacy-pkuseg ships no model, and downloads them from the network)."""
    spacy_pkuseg = pytest.importorskip("spacy_pkuseg")
    corpus = write_segmented_corpus(tmp_path / "seg.txt")
    spacy_pkuseg.train(str(corpus), str(corpus), str(tmp_path / "pkuseg"), train_iter=2)
    nlp = spacy.blank("zh", config={"nlp": {"tokenizer": {"segmenter": "pkuseg"}}})
    nlp.tokenizer.initialize(pkuseg_model=str(tmp_path / "pkuseg"))
    return nlp


def blank(segmenter: str, tmp_path: Path):
    if segmenter == "char":
        return spacy.blank("zh")
    if segmenter == "pkuseg":
        return pkuseg_nlp(tmp_path)
    pytest.importorskip("jieba")
    return spacy.blank("zh", config={"nlp": {"tokenizer": {"segmenter": "jieba"}}})


def test_char_segmenter_gives_zhie_predicts_spans_batched_through_stream(tmp_path, monkeypatch):
    model = trained("ner-gp")
    texts = [ex.text for ex in nested_corpus(12, seed=11)] + ["", "  "]
    expected = predict_cli(model, texts, tmp_path)
    nlp = spacy.blank("zh")
    nlp.add_pipe("zhie", config={"model": str(model)})
    pipeline = nlp.get_pipe("zhie").pipeline
    calls = []
    stream = pipeline.stream
    monkeypatch.setattr(pipeline, "stream", lambda texts, **kw: calls.append(len(texts)) or stream(texts, **kw))
    docs = list(nlp.pipe(texts, batch_size=5))
    assert calls == [5, 5, 4]  # one zhie call per batch of docs, not one per text
    assert [doc.text for doc in docs] == texts
    assert [check_entities(doc, line["entities"]) for doc, line in zip(docs, expected)] == [0] * len(texts)
    assert [doc._.zhie_expanded for doc in docs] == [0] * len(texts)
    nested = [doc for doc in docs if len(doc.ents) < len(doc.spans["zhie"])]
    assert nested and all({"ORG"} <= {e.label_ for e in doc.ents} for doc in nested)  # the ORG, not the LOC inside
    assert sum(len(doc.ents) for doc in docs) > 10
    assert check_entities(nlp(texts[0]), expected[0]["entities"]) == 0  # nlp(text): the same as nlp.pipe

    doc = pickle.loads(pickle.dumps(docs[0]))  # nlp.pipe(n_process=2) pickles docs
    assert [(s.start, s.end, s.label_) for s in doc.spans["zhie"]] == \
        [(s.start, s.end, s.label_) for s in docs[0].spans["zhie"]]
    assert doc.spans["zhie"].attrs == docs[0].spans["zhie"].attrs


@pytest.mark.parametrize("segmenter", ["pkuseg", "jieba"])
def test_coarser_segmenters_expand_spans_to_tokens_and_count_them(tmp_path, segmenter):
    model = trained("ner-gp")
    texts = [ex.text for ex in nested_corpus(20, seed=12)]
    expected = zhie.load(model).predict(texts)  # = zhie predict's (the test above)
    nlp = blank(segmenter, tmp_path)
    nlp.add_pipe("zhie", config={"model": str(model)})
    docs = list(nlp.pipe(texts))
    assert any(len(t) > 1 for doc in docs for t in doc)  # words, not characters
    counts = [check_entities(doc, [s.to_dict() for s in spans]) for doc, spans in zip(docs, expected)]
    assert counts == [doc._.zhie_expanded for doc in docs]
    assert sum(counts) > 0  # e.g. pkuseg's '李明在' holds the PER '李明'


def test_words_vectors_and_members_of_a_multitask_model():
    model = trained("multitask")  # members ner (crf), cws, sim
    nlp = spacy.blank("zh")
    for member in ("ner", "cws", "sim"):
        nlp.add_pipe("zhie", name=f"zhie_{member}", config={"model": str(model), "task": member})
    texts = ["李明在青山市大学工作。", "王芳去了河山镇。"]
    docs = list(nlp.pipe(texts))
    pipe = zhie.load(model)
    for doc, words, vector in zip(docs, pipe.member("cws").predict(texts), pipe.member("sim").encode(texts)):
        assert doc._.zhie_words == [(w.start, w.end) for w in words]
        assert "".join(doc.text[s:e] for s, e in doc._.zhie_words) == doc.text
        np.testing.assert_allclose(doc.vector, vector, atol=1e-6)
        assert doc._.zhie_vector is not None
    assert docs[0].similarity(docs[1]) == pytest.approx(float(docs[0].vector @ docs[1].vector), abs=1e-5)
    assert pickle.loads(pickle.dumps(docs[0])).similarity(docs[1]) == docs[0].similarity(docs[1])
    assert [(e.start_char, e.end_char, e.label_) for e in docs[0].spans["zhie"]] == \
        [(s.start, s.end, s.label) for s in pipe.member("ner").predict(texts[0])[0]]

    with pytest.raises(ValueError, match="name its member in the config"):
        spacy.blank("zh").add_pipe("zhie", config={"model": str(model)})


def test_relations(tmp_path):
    model = trained("re")
    texts = [r["text"] for r in relation_corpus(4, seed=3)]  # its training texts
    expected = predict_cli(model, texts, tmp_path)
    nlp = spacy.blank("zh")
    nlp.add_pipe("zhie", config={"model": str(model)})
    docs = list(nlp.pipe(texts))
    assert sum(len(doc._.zhie_relations) for doc in docs) > 0
    for doc, line in zip(docs, expected):
        for relation in doc._.zhie_relations:
            for role in ("subject", "object"):
                start, end = relation[role].pop("tokens")
                assert doc[start:end].text == relation[role]["text"]
        assert doc._.zhie_relations == line["relations"] and doc._.zhie_expanded == 0
    bin = DocBin(store_user_data=True)
    bin.add(nlp(texts[0]))
    (back,) = DocBin(store_user_data=True).from_bytes(bin.to_bytes()).get_docs(nlp.vocab)
    assert list(back._.zhie_relations) == nlp(texts[0])._.zhie_relations  # msgpack gives tuples for lists


def test_the_entry_point_registers_the_factory_and_zhie_alone_imports_no_spacy(tmp_path):
    """pyproject's ``spacy_factories`` entry point, as an installed zhie declares it (a dist-info written here): spaCy
    finds "zhie" without this module being imported; and zhie's own commands never import spaCy."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    points = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]
    dist = tmp_path / "zhie_spacy_entry-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zhie-spacy-entry\nVersion: 0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text("[spacy_factories]\n" + "".join(
        f"{name} = {target}\n" for name, target in points["spacy_factories"].items()), encoding="utf-8")
    script = f"""
import sys, json
from zhie.cli import main
assert main(["predict", {str(trained("ner-gp"))!r}, "李明在青山市大学工作。"]) == 0
assert "spacy" not in sys.modules, "zhie predict imported spacy"
import spacy
nlp = spacy.blank("zh")
nlp.add_pipe("zhie", config={{"model": {str(trained("ner-gp"))!r}}})
doc = nlp("李明在青山市大学工作。")
print(json.dumps([(s.start_char, s.end_char, s.label_) for s in doc.spans["zhie"]]))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{tmp_path}"})
    assert result.returncode == 0, result.stderr
    predicted = json.loads(result.stdout.splitlines()[0])["entities"]
    assert json.loads(result.stdout.splitlines()[-1]) == [[e["start"], e["end"], e["label"]] for e in predicted]


@pytest.mark.needs_data
@pytest.mark.parametrize("segmenter", ["char", "pkuseg"])
def test_cluener_dev_spans_equal_zhie_predicts(tmp_path, segmenter):
    """CLUENER's dev texts through a tiny model: ``doc.spans["zhie"]`` are ``zhie predict``'s spans (offsets, labels),
    expanded to spaCy's tokens where they must be, and ``doc._.zhie_expanded`` counts those."""
    model = trained("ner-gp")
    texts = [ex.text for ex in read_ner(DATA / "ner/cluener/dev.json")]
    expected = predict_cli(model, texts, tmp_path)
    nlp = blank(segmenter, tmp_path)
    nlp.add_pipe("zhie", config={"model": str(model)})
    docs = list(nlp.pipe(texts, batch_size=256))
    counts = [check_entities(doc, line["entities"]) for doc, line in zip(docs, expected)]
    assert counts == [doc._.zhie_expanded for doc in docs]
    assert sum(len(line["entities"]) for line in expected) > 100
    assert (sum(counts) == 0) == (segmenter == "char")
