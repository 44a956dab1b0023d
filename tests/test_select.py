"""``zhie select``: every kind of model chooses its budget of texts; uncertainty puts the texts a model is unsure of
before those it learnt; diversity never picks two near-duplicates while other texts are left (hypothesis); random is
seeded; the doccano and Label Studio outputs carry the scores and read back; bad pools, budgets and models are one-line
errors with exit status 2."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zhie
from tests.tiny_models import nested_corpus, relation_corpus, train_relation, trained, write_segmented_corpus
from zhie import demo
from zhie.cli import main
from zhie.core import decoding
from zhie.data import label_studio
from zhie.data.doccano import read_doccano, read_doccano_relations
from zhie.deploy.selection import NgramIndex, choose, read_pool, uncertainties

UNSURE = 5  # texts the model has not seen the like of, among its training texts


def write_pool(path, texts) -> str:
    path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    return str(path)


def select(*argv, capsys=None) -> tuple[int, str, str]:
    code = main(["select", *map(str, argv)])
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return code, out, err


def gibberish(texts: list[str], n: int, seed: int = 0) -> list[str]:
    """``n`` strings of the characters of ``texts`` in a random order, as long as one of them: words the model knows,
    in no sentence it has seen."""
    rng = random.Random(seed)
    chars = sorted({c for t in texts for c in t})
    return ["".join(rng.choices(chars, k=len(rng.choice(texts)))) for _ in range(n)]


def segmented_texts(tmp_path) -> list[str]:
    """The texts the cws model learnt (tiny_models' segmented corpus, unsegmented)."""
    lines = write_segmented_corpus(tmp_path / "seg.txt").read_text(encoding="utf-8").split("\n")
    return [line.replace("  ", "") for line in lines if line]


@pytest.fixture(scope="module")
def memorised_re(tmp_path_factory):
    """GPLinker trained until it is sure of its 16 sentences (tiny_models' ``re`` model is still unsure of its own:
    about as uncertain of them as of anything)."""
    return train_relation(tmp_path_factory.mktemp("re16"), n=16, epochs=40)


# ------------------------------------------------------------------------------------------------- every kind
POOL_TEXTS = [ex.text for ex in nested_corpus(12, seed=21)]
KINDS = {  # kind: (the model, extra flags, output format)
    "ner-egp": ("ner-egp", [], "label-studio"),
    "ner-crf": ("ner-crf", [], "doccano"),
    "ner-softmax": ("ner-softmax", [], "text"),
    "re": ("re", [], "doccano"),
    "cws": ("cws", [], "label-studio"),
    "similarity": ("similarity", ["--strategy", "diversity"], "text"),
    "multitask": ("multitask", ["--task", "ner"], "label-studio"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_chooses_its_budget_of_distinct_pool_texts(kind, tmp_path, capsys):
    model, flags, output_format = KINDS[kind]
    pool = write_pool(tmp_path / "pool.txt", POOL_TEXTS + POOL_TEXTS[:3])  # three exact duplicates
    out = tmp_path / "chosen"
    code, _, err = select(trained(model), "--pool", pool, "--budget", 6, "--output", out, "--output-format",
                          output_format, *flags, capsys=capsys)
    assert code == 0, err
    assert f"chose 6 of the {len(POOL_TEXTS)} distinct texts" in err
    text = out.read_text(encoding="utf-8")
    if output_format == "text":
        texts, scores = text.splitlines(), []
    elif output_format == "doccano":
        records = [json.loads(line) for line in text.splitlines()]
        texts, scores = [r["text"] for r in records], [r["score"] for r in records]
    else:
        tasks = json.loads(text)
        texts, scores = [t["data"]["text"] for t in tasks], [t["score"] for t in tasks]
    assert len(texts) == len(set(texts)) == 6 and set(texts) <= set(POOL_TEXTS)
    if kind != "similarity":  # the texts come most uncertain first, each with its uncertainty
        assert len(scores) == 6 or output_format == "text"
        assert scores == sorted(scores, reverse=True) and all(0 <= s < 1 for s in scores)


# ------------------------------------------------------------------------------------------------- uncertainty
def unsure_pool(kind: str, tmp_path) -> tuple[str, list[str], list[str]]:
    """The model of ``kind``, 30 texts it learnt and :data:`UNSURE` texts of their characters in no order."""
    if kind == "re":
        learnt = [r["text"] for r in relation_corpus(16, seed=3)]
    elif kind == "cws":
        learnt = segmented_texts(tmp_path)
    else:
        learnt = [ex.text for ex in nested_corpus(240 if kind == "ner-gp" else 120, seed=1)]
    learnt = list(dict.fromkeys(learnt))[:30]
    return kind, learnt, gibberish(learnt, UNSURE)


def ranked_above(unsure: np.ndarray, learnt: np.ndarray) -> float:
    """How often an unsure text is more uncertain than a learnt one, over every pair (the ROC AUC; ties count half)."""
    above = (unsure[:, None] > learnt[None]).mean() + 0.5 * (unsure[:, None] == learnt[None]).mean()
    return float(above)


@pytest.mark.parametrize("kind", ["ner-gp", "ner-crf", "ner-softmax", "cws", "multitask", "re"])
def test_uncertainty_ranks_texts_the_model_is_unsure_of_above_those_it_learnt(kind, tmp_path, capsys, request):
    """Texts of known characters in no sentence the model has seen against the sentences it was trained on: an unsure
    text is more uncertain than a learnt one in at least 3 pairs of 4, and ``--strategy uncertainty`` writes the
    budget's most uncertain texts, most uncertain first."""
    _, learnt, unsure = unsure_pool(kind, tmp_path)
    model = request.getfixturevalue("memorised_re") if kind == "re" else trained(kind)
    pipe = zhie.load(model)
    pipe = pipe.member("ner") if kind == "multitask" else pipe
    scores = uncertainties(pipe, learnt + unsure)
    assert ranked_above(scores[len(learnt):], scores[:len(learnt)]) >= 0.75, (scores[len(learnt):], scores.max())
    out = tmp_path / "chosen.json"
    code, _, err = select(model, "--pool", write_pool(tmp_path / "pool.txt", learnt + unsure), "--budget", UNSURE,
                          "--strategy", "uncertainty", "--output", out, "--output-format", "label-studio",
                          *(["--task", "ner"] if kind == "multitask" else []), capsys=capsys)
    assert code == 0, err
    tasks = json.loads(out.read_text(encoding="utf-8"))
    top = np.argsort(-scores, kind="stable")[:UNSURE]
    assert [t["data"]["text"] for t in tasks] == [(learnt + unsure)[i] for i in top]
    assert [t["score"] for t in tasks] == pytest.approx(scores[top].tolist(), abs=1e-4)


def test_uncertainty_is_per_token_over_all_of_a_texts_windows(monkeypatch):
    """A model as unsure of every token (a surprise of 0.1 nats per token) is as unsure of a character as of a text of
    several windows (the model's are 64 tokens): the surprise is divided by the tokens, both summed over the
    windows."""
    pipe = zhie.load(trained("ner-crf"))
    monkeypatch.setattr(type(pipe.task), "surprise", lambda self, model, outputs, mask: 0.1 * (mask.sum(1) - 2))
    texts = ["好", POOL_TEXTS[0], "".join(POOL_TEXTS)]
    assert len(pipe.task.text_tokenizer(texts[-1])) > 2 * pipe.task.config.max_length
    assert uncertainties(pipe, texts, batch_size=2) == pytest.approx([1 - np.exp(-0.1)] * 3)


def test_crf_and_span_surprise_are_minus_log_probabilities():
    """The CRF's: ``log Z - best``, by enumerating every path; the span cells': ``-log max(p, 1 - p)`` summed, a masked
    cell adding 0."""
    rng = np.random.default_rng(0)
    em, trans, start, end = (rng.normal(size=s).astype(np.float32) for s in ((2, 4, 3), (3, 3), (3,), (3,)))
    lengths = [4, 2]
    for row, n in enumerate(lengths):
        scores = [start[p[0]] + sum(em[row, t, p[t]] for t in range(n)) + sum(trans[p[t - 1], p[t]]
                                                                              for t in range(1, n)) + end[p[-1]]
                  for p in itertools.product(range(3), repeat=n)]
        log_z = np.logaddexp.reduce(np.array(scores, dtype=np.float64))
        assert decoding.crf_surprise(em, lengths, trans, start, end)[row] == pytest.approx(log_z - max(scores))
    logits = np.array([[[0.0, 1.5], [-1e12, -0.5]]], dtype=np.float32)
    p = 1 / (1 + np.exp(-2 * np.array([0.0, 1.5, -0.5])))
    assert decoding.cell_surprise(logits)[0] == pytest.approx(-np.log(np.maximum(p, 1 - p)).sum())


def test_an_export_measures_what_the_torch_model_measures(tmp_path):
    """An ONNX export runs the same uncertainty on onnxruntime (the CRF's transitions read from its weights file)."""
    pytest.importorskip("onnxruntime", reason="the export extra is not installed")
    pytest.importorskip("onnxscript", reason="torch.onnx.export (dynamo) needs onnxscript")
    from zhie.deploy.export import export

    source = trained("ner-crf")
    out = export(source, tmp_path / "export")
    texts = POOL_TEXTS + gibberish(POOL_TEXTS, 3)
    np.testing.assert_allclose(uncertainties(zhie.load(out), texts), uncertainties(zhie.load(source), texts),
                               rtol=1e-3, atol=1e-5)


# ------------------------------------------------------------------------------------------------- diversity
def far_apart(n: int, length: int, rng: random.Random) -> list[str]:
    """``n`` texts of ``length`` random CJK characters: no two share more than a chance bigram."""
    return ["".join(chr(0x4E00 + rng.randrange(8000)) for _ in range(length)) for _ in range(n)]


@st.composite
def clustered_pools(draw):
    """A pool of clusters: each a text of 40 random characters with exact copies and near-copies (one character
    changed: Jaccard > 0.75 to the text and to each other); the budget at most the number of clusters."""
    rng = random.Random(draw(st.integers(0, 2 ** 32)))
    clusters = [[text] for text in far_apart(draw(st.integers(2, 8)), 40, rng)]
    for cluster in clusters:
        for _ in range(draw(st.integers(0, 4))):
            base = cluster[0]
            if draw(st.booleans()):
                cluster.append(base)
            else:
                k = rng.randrange(len(base))
                cluster.append(base[:k] + chr(0x9FA5 - rng.randrange(50)) + base[k + 1:])
    return clusters, draw(st.integers(1, len(clusters)))


@settings(max_examples=60, deadline=None)
@given(clustered_pools(), st.sampled_from(["diversity", "uncertainty-diversity"]), st.integers(0, 3))
def test_diversity_never_picks_two_near_duplicates_while_others_are_left(pool, strategy, seed):
    """However uncertain a near-copy is, no two texts of one cluster are picked while a cluster is left; exact copies
    count once; and the first picks always form a maximal set: every text left is near one of them."""
    clusters, budget = pool
    texts = list(dict.fromkeys(t for c in clusters for t in c))
    cluster_of = {t: k for k, c in enumerate(clusters) for t in c}
    uncertainty = np.random.default_rng(seed).random(len(texts))
    choice = choose(texts, budget, strategy, uncertainty, diversity=0.3, max_similarity=0.7, seed=seed)
    picked = [texts[i] for i in choice.indices]
    assert len({cluster_of[t] for t in picked}) == budget and choice.relaxed == 0
    index = NgramIndex(texts)
    alike = np.array([index.similarity(i) for i in range(len(texts))])
    every = choose(texts, len(texts), strategy, uncertainty, diversity=0.3, max_similarity=0.7, seed=seed)
    first = every.indices[:len(texts) - every.relaxed]
    assert all(alike[np.ix_([i], first)].max() > 0.7 for i in set(range(len(texts))) - set(first))
    assert all(alike[i, j] <= 0.7 for i, j in itertools.combinations(first, 2))


def test_texts_labelled_before_are_left_out_and_kept_at_a_distance(tmp_path, capsys):
    """--labelled: its texts are not chosen again, and the diversity strategies pick no near-copy of one of them while
    a text unlike them is left."""
    texts = [ex.text for ex in nested_corpus(30, seed=23)]
    near = [t + "。" for t in texts[:5]]  # a near-copy of each of the first five
    labelled, pool = texts[:5], near + texts[5:]
    for strategy in ("diversity", "uncertainty-diversity"):
        uncertainty = np.r_[np.ones(5), np.zeros(len(pool) - 5)]  # the near-copies are the most uncertain
        picked = [pool[i] for i in choose(pool, 5, strategy, uncertainty, labelled=labelled).indices]
        assert not set(picked) & set(near), (strategy, picked)
        assert set(near) & {pool[i] for i in choose(pool, 5, strategy, uncertainty).indices}  # without: picked
    code, out, _ = select(trained("ner-crf"), "--pool", write_pool(tmp_path / "pool.txt", texts), "--budget", 25,
                          "--strategy", "diversity", "--labelled", write_pool(tmp_path / "done.txt", labelled),
                          capsys=capsys)
    assert code == 0 and sorted(out.splitlines()) == sorted(texts[5:])
    code, _, err = select(trained("ner-crf"), "--pool", write_pool(tmp_path / "pool.txt", texts), "--budget", 26,
                          "--labelled", tmp_path / "done.txt", capsys=capsys)
    assert code == 2 and "25 distinct text(s)" in err


def test_exact_duplicates_count_once_and_the_cli_never_writes_one_twice(tmp_path, capsys):
    texts = [ex.text for ex in nested_corpus(6, seed=22)]
    pool = write_pool(tmp_path / "pool.txt", texts * 3 + [" "] + [""])
    assert read_pool(pool).texts == list(dict.fromkeys(texts)) and read_pool(pool).lines == 18
    code, out, _ = select(trained("ner-crf"), "--pool", pool, "--budget", 6, "--strategy", "diversity",
                          capsys=capsys)
    assert code == 0 and sorted(out.splitlines()) == sorted(set(texts))


# ------------------------------------------------------------------------------------------------- random
def test_random_is_reproducible_with_its_seed(tmp_path, capsys):
    texts = [ex.text for ex in demo.make_corpus(60, seed=23)]
    draws = [choose(texts, 10, "random", seed=seed).indices for seed in (7, 7, 8)]
    assert draws[0] == draws[1] != draws[2] and len(set(draws[0])) == 10
    pool, runs = write_pool(tmp_path / "pool.txt", texts), []
    for seed in (7, 7):
        code, out, _ = select(trained("similarity"), "--pool", pool, "--budget", 10, "--strategy", "random",
                              "--seed", seed, capsys=capsys)
        runs.append(out)
    assert code == 0 and runs[0] == runs[1] and set(runs[0].splitlines()) == {texts[i] for i in draws[0]}


# ------------------------------------------------------------------------------------------------- outputs
def test_label_studio_tasks_are_sorted_by_score_and_read_back_as_the_predictions(tmp_path, capsys):
    """The task list comes most uncertain first, each task with its ``score`` and its prediction's (``1 - score``);
    accepted as annotations, zhie's Label Studio reader reads the model's entities back."""
    model = trained("ner-egp")
    pool = write_pool(tmp_path / "pool.txt", POOL_TEXTS)
    out = tmp_path / "tasks.json"
    code, _, err = select(model, "--pool", pool, "--budget", 5, "--output", out, "--output-format", "label-studio",
                          "--ls-model-version", "v1", capsys=capsys)
    assert code == 0, err
    tasks = json.loads(out.read_text(encoding="utf-8"))
    scores = [t["score"] for t in tasks]
    assert scores == sorted(scores, reverse=True) and len(tasks) == 5
    for task in tasks:
        (prediction,) = task["predictions"]
        assert prediction["model_version"] == "v1"
        assert prediction["score"] == pytest.approx(1 - task["score"], abs=1e-4)
    assert label_studio.is_export(out)
    for task in tasks:  # what Label Studio exports once each pre-annotation is accepted as it is
        task["annotations"] = [{"result": task["predictions"][0]["result"], "was_cancelled": False}]
    out.write_text(json.dumps(tasks, ensure_ascii=False), encoding="utf-8")
    texts = [t["data"]["text"] for t in tasks]
    predicted = zhie.load(model).predict(texts)
    assert [(ex.text, [(s.start, s.end, s.label) for s in ex.spans]) for ex in label_studio.read_entities(out)] == \
        [(text, sorted((s.start, s.end, s.label) for s in spans)) for text, spans in zip(texts, predicted)]


def test_doccano_lines_carry_the_predictions_as_labels(tmp_path, capsys):
    pool = write_pool(tmp_path / "pool.txt", [r["text"] for r in relation_corpus(8, seed=24)])
    out = tmp_path / "review.jsonl"
    code, _, err = select(trained("re"), "--pool", pool, "--budget", 4, "--output", out, "--output-format",
                          "doccano", capsys=capsys)
    assert code == 0, err
    examples = read_doccano_relations(out)
    predicted = zhie.load(trained("re")).predict([ex.text for ex in examples])
    assert [sorted((t.subject.start, t.predicate, t.object.start) for t in ex.triples) for ex in examples] == \
        [sorted((t.subject.start, t.predicate, t.object.start) for t in p) for p in predicted]
    ner_out = tmp_path / "ner.jsonl"
    assert select(trained("ner-crf"), "--pool", pool, "--budget", 2, "--output", ner_out, "--output-format",
                  "doccano") == (0, "", "")
    assert len(read_doccano(ner_out)) == 2


def test_settings_print_as_a_config_file_that_runs(tmp_path, capsys):
    pool = write_pool(tmp_path / "pool.txt", POOL_TEXTS)
    model = trained("ner-crf")
    flags = ["--pool", pool, "--budget", 3, "--strategy", "uncertainty", "--seed", 4]
    code, config, _ = select(model, *flags, "--print-config", capsys=capsys)
    assert code == 0 and 'command = "select"' in config and "budget = 3" in config
    (tmp_path / "select.toml").write_text(config, encoding="utf-8")
    _, from_flags, _ = select(model, *flags, capsys=capsys)
    code, from_file, _ = select(model, "--config", tmp_path / "select.toml", capsys=capsys)
    assert code == 0 and from_file == from_flags and len(from_file.splitlines()) == 3


# ------------------------------------------------------------------------------------------------- errors
def cluener_line(text: str) -> str:
    return json.dumps({"text": text, "label": {"name": {text[:2]: [[0, 1]]}}}, ensure_ascii=False)


def test_a_cluener_or_relation_file_is_a_pool_of_its_texts(tmp_path):
    texts = [ex.text for ex in nested_corpus(4, seed=25)]
    cluener = tmp_path / "cluener.json"
    cluener.write_text("".join(cluener_line(t) + "\n" for t in texts), encoding="utf-8")
    assert read_pool(cluener).texts == texts
    records = relation_corpus(3, seed=26)
    cmeie = tmp_path / "cmeie.jsonl"
    cmeie.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    assert read_pool(cmeie).texts == [r["text"] for r in records]


POOL_ERRORS = {  # name: (pool file content, budget, what the message says)
    "empty": ("\n \n\n", 2, "pool.txt:1: no text to choose from: the pool is empty"),
    "too small": ("甲乙丙\n甲乙丙\n丁戊己\n", 3, "--pool {pool}: 2 distinct text(s) (3 non-blank line(s), 1 repeated), "
                                             "fewer than --budget 3: give a larger pool, or a budget of at most 2"),
    "pairs": ("".join(f"句子{i}\t句子{i + 1}\t{i % 2}\n" for i in range(8)), 2,
              "pool.txt:1: sentence pairs with their labels (s1 TAB s2 TAB label)"),
    "json list": ('[{"data": {"text": "甲乙丙"}}]\n', 1, "pool.txt:1: a JSON list (a Label Studio export?)"),
    "no text field": ('{"sentence1": "甲", "sentence2": "乙", "label": 1}\n', 1,
                      "pool.txt:1: a JSON line needs a string field 'text'"),
    "line break": (json.dumps({"text": "甲\n乙"}) + "\n", 1, "pool.txt:1: the text '甲\\n乙' holds a line break"),
}


@pytest.mark.parametrize("name", POOL_ERRORS)
def test_a_bad_pool_is_a_one_line_error(name, tmp_path, capsys):
    content, budget, message = POOL_ERRORS[name]
    pool = tmp_path / "pool.txt"
    pool.write_text(content, encoding="utf-8")
    code, _, err = select(tmp_path / "no-model", "--pool", pool, "--budget", budget, capsys=capsys)
    assert code == 2 and err.startswith("zhie: error: ") and len(err.splitlines()) == 1, err
    assert message.format(pool=pool) in err, err


def test_bad_budgets_models_and_formats_are_one_line_errors(tmp_path, capsys):
    pool = write_pool(tmp_path / "pool.txt", POOL_TEXTS)
    with pytest.raises(SystemExit) as exit:
        select(trained("ner-crf"), "--pool", pool, "--budget", 0)
    assert exit.value.code == 2 and "--budget: must be a positive integer, got 0" in capsys.readouterr().err
    cases = [
        ([tmp_path / "missing.txt", 1], f"--pool {tmp_path / 'missing.txt'}: no such file"),
        ([pool, 2, "--model", "similarity"], "a similarity model gives no uncertainty of a text (its labels are pairs "
                                             "of sentences"),
        ([pool, 2, "--model", "multitask"], "is a multi-task model: name the member to choose for with --task (its "
                                            "members: ner, cws, sim)"),
        ([pool, 2, "--model", "cws", "--output-format", "doccano"], "doccano holds entities and relations"),
        ([pool, 2, "--model", "similarity", "--strategy", "random", "--output-format", "label-studio"],
         "a similarity model's predictions have no Label Studio form"),
        ([pool, 2, "--model", "ner-crf", "--ls-from-name", "x"], "--ls-from-name names the Label Studio output"),
        ([pool, 2, "--model", "ner-crf", "--output", tmp_path / "no" / "out.txt"], "the directory"),
    ]
    for (pool_path, budget, *rest), message in cases:
        model = trained(rest[1]) if rest[:1] == ["--model"] else trained("ner-crf")
        rest = rest[2:] if rest[:1] == ["--model"] else rest
        code, _, err = select(model, "--pool", pool_path, "--budget", budget, *rest, capsys=capsys)
        assert code == 2 and len(err.splitlines()) == 1 and message in err, (rest, err)
