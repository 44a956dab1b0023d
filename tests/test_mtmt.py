"""MTMT cross-lingual NER (spec §10): the weights and loss against a transcription of the official code, word-level
tagging on sub-words, the WikiANN and CoNLL-2002/2003 readers, the pair sampler, and tiny teachers and students.

The tiny encoder here has whole-word tokens for the template words and only single-character pieces for the names,
so every name is several sub-words long (what word-level tagging must handle).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from torch import nn

import zhie
from zhie import encoders
from zhie.cli import main
from zhie.core.spans import Span
from zhie.core.words import word_heads, word_ranges, word_spans, word_tags
from zhie.data import DataError, read_ner
from zhie.heads.tagger import IGNORE
from zhie.losses.mtmt import bce, mtmt_loss, mtmt_weights, sample_pairs
from zhie.model import Model
from zhie.tasks.ner import NerTask
from zhie.tasks.ner_heads import NerConfig
from zhie.tasks.xner import word_inputs, word_outputs
from zhie.training import TrainConfig
from zhie.training.mtmt import distill

PER = ["Anna", "Berta", "Carlo", "Dieter", "Emil", "Frieda", "Gustav", "Hanna"]
LOC = ["Berlin", "Paris", "Rom", "Wien", "Oslo", "Prag"]
ORG = ["Siemens", "Bosch", "Lufthansa", "Adidas"]
TEMPLATES = ["{PER} wohnt in {LOC} .", "{PER} arbeitet bei {ORG} in {LOC} .", "{ORG} kauft {ORG} .",
             "heute fährt {PER} {PER} nach {LOC} .", "in {LOC} sitzt {ORG} ."]
WORDS = ["wohnt", "in", "arbeitet", "bei", "kauft", ".", "heute", "fährt", "nach", "sitzt"]


# ------------------------------------------------------------------------------------------------- official formulas
def official_loss(s_logits_1, s_logits_2, s_embeds_1, s_embeds_2, r_logits_1, r_logits_2, evaluator_prediction,
                  loss_alpha=0.5):
    """trainers/mtmt_trainer.py (commit 9357445), ``weight_loss`` mode, line by line on the selected words."""
    softmax, cossim = nn.Softmax(dim=-1), nn.CosineSimilarity(dim=1, eps=1e-6)
    recognizer_logits_1, recognizer_logits_2 = softmax(r_logits_1), softmax(r_logits_2)
    student_logits_1, student_logits_2 = softmax(s_logits_1), softmax(s_logits_2)
    student_similarity = torch.sigmoid(cossim(s_embeds_1, s_embeds_2))
    loss_ner_1 = nn.MSELoss(reduction="none")(student_logits_1.float(), recognizer_logits_1.float())
    loss_ner_2 = nn.MSELoss(reduction="none")(student_logits_2.float(), recognizer_logits_2.float())
    loss_sim = nn.BCELoss(reduction="none")(student_similarity, evaluator_prediction.detach())
    loss_ner_1 = torch.sum(loss_ner_1, dim=-1)
    loss_ner_2 = torch.sum(loss_ner_2, dim=-1)
    weight_alpha_1 = torch.max(recognizer_logits_1.detach(), dim=1).values ** 2
    weight_alpha_2 = torch.max(recognizer_logits_2.detach(), dim=1).values ** 2
    one_like_weight = torch.ones_like(evaluator_prediction.detach())
    weight_beta = (evaluator_prediction.detach() * 2 - one_like_weight) ** 2 + 0.5
    weight_beta = torch.where(weight_beta > 1, one_like_weight, weight_beta)
    prediction_sim = torch.sigmoid(cossim(recognizer_logits_1.detach(), recognizer_logits_2.detach()))
    weight_gamma = one_like_weight - torch.abs(prediction_sim - evaluator_prediction.detach())
    loss_ner_1 = torch.mean(torch.mul(torch.mul(weight_gamma, weight_alpha_1), loss_ner_1))
    loss_ner_2 = torch.mean(torch.mul(torch.mul(weight_gamma, weight_alpha_2), loss_ner_2))
    loss_sim = torch.mean(torch.mul(torch.mul(weight_gamma, weight_beta), loss_sim))
    weights = (weight_alpha_1, weight_alpha_2, weight_beta, weight_gamma)
    return loss_alpha * loss_sim + 1 / 2 * loss_ner_1 + 1 / 2 * loss_ner_2, weights, student_similarity


@pytest.fixture
def fixed():
    g = torch.Generator().manual_seed(0)
    b, c, d = 6, 9, 16
    t = {name: torch.randn(b, n, generator=g) * 3 for name, n in
         [("s1", c), ("s2", c), ("r1", c), ("r2", c), ("h1", d), ("h2", d)]}
    t["sim"] = torch.tensor([0.27, 0.5, 0.6, 0.73, 0.95, 0.02])  # σ(cos)'s range [0.27, 0.73], and past it
    return t


def test_weights_equal_the_official_formulas(fixed):
    _, (a1, a2, beta, gamma), _ = official_loss(fixed["s1"], fixed["s2"], fixed["h1"], fixed["h2"], fixed["r1"],
                                                fixed["r2"], fixed["sim"])
    w = mtmt_weights(fixed["r1"].softmax(-1), fixed["r2"].softmax(-1), fixed["sim"])
    for ours, theirs in zip(w, (a1, a2, beta, gamma)):
        torch.testing.assert_close(ours, theirs)
    assert beta[1] == 0.5 and beta[4] == 1.0 and beta[5] == 1.0  # s = 0.5: 0 + 0.5; s = 0.95, 0.02: clipped


@pytest.mark.parametrize("loss_alpha", [0.5, 1.0])
def test_total_loss_equals_the_official_code(fixed, loss_alpha):
    expected, _, student_sim = official_loss(fixed["s1"], fixed["s2"], fixed["h1"], fixed["h2"], fixed["r1"],
                                             fixed["r2"], fixed["sim"], loss_alpha)
    ours = mtmt_loss(fixed["s1"].softmax(-1), fixed["s2"].softmax(-1), student_sim, fixed["r1"].softmax(-1),
                     fixed["r2"].softmax(-1), fixed["sim"], loss_alpha=loss_alpha)
    torch.testing.assert_close(ours, expected)


def test_switches_replace_a_weight_by_one_and_drop_the_similarity_term(fixed):
    p = {k: fixed[k].softmax(-1) for k in ("s1", "s2", "r1", "r2")}
    s_sim = torch.full((6,), 0.6)
    tsl = mtmt_loss(p["s1"], p["s2"], s_sim, p["r1"], p["r2"], fixed["sim"], alpha=False, beta=False, gamma=False,
                    similarity=False)
    mse = ((p["s1"] - p["r1"]) ** 2).sum(-1).mean() / 2 + ((p["s2"] - p["r2"]) ** 2).sum(-1).mean() / 2
    torch.testing.assert_close(tsl, mse)
    no_beta = mtmt_loss(p["s1"], p["s2"], s_sim, p["r1"], p["r2"], fixed["sim"], beta=False)
    w = mtmt_weights(p["r1"], p["r2"], fixed["sim"])
    ner = (w.gamma * w.alpha_1 * ((p["s1"] - p["r1"]) ** 2).sum(-1)).mean() / 2 + (
        w.gamma * w.alpha_2 * ((p["s2"] - p["r2"]) ** 2).sum(-1)).mean() / 2
    torch.testing.assert_close(no_beta, ner + 0.5 * (w.gamma * bce(s_sim, fixed["sim"])).mean())


def test_bce_is_torchs():
    y, t = torch.tensor([0.27, 0.5, 0.73, 1e-30]), torch.tensor([0.1, 1.0, 0.0, 1.0])
    torch.testing.assert_close(bce(y, t), nn.BCELoss(reduction="none")(y, t))


def test_loss_gradient_reaches_the_student_only(fixed):
    s1, s2 = fixed["s1"].clone().requires_grad_(), fixed["s2"].clone().requires_grad_()
    r1 = fixed["r1"].clone().requires_grad_()
    mtmt_loss(s1.softmax(-1), s2.softmax(-1), torch.full((6,), 0.6), r1.softmax(-1), fixed["r2"].softmax(-1),
              fixed["sim"]).backward()
    assert s1.grad.abs().sum() > 0 and s2.grad.abs().sum() > 0 and r1.grad is None


# ------------------------------------------------------------------------------------------------- pairs
def test_balanced_pairs_are_half_same_and_deterministic():
    tags = [["O", "B-PER", "O", "O"], ["B-LOC", "O", None], ["O", "B-PER"]]
    pairs = sample_pairs(tags, 200, balanced=True, seed=3)
    assert pairs == sample_pairs(tags, 200, balanced=True, seed=3)
    assert sum(same for _, _, same in pairs) == 100
    for (i, w), (j, v), same in pairs:
        assert (i, w) != (j, v) and tags[i][w] is not None and tags[j][v] is not None
        assert same == (tags[i][w] == tags[j][v])
    with pytest.raises(ValueError, match="no pair with different tags"):
        sample_pairs([["O", "O"]], 4)


# ------------------------------------------------------------------------------------------------- readers
def test_wikiann_reader_strips_the_language_and_reads_iob2(tmp_path):
    path = tmp_path / "de.txt"
    path.write_text("de:Anton\tB-PER\nde:Wilhelm\tI-PER\nde:in\tO\nde:Köln\tB-LOC\nde:.\tO\n\nde:Bonn\tB-LOC\n",
                    encoding="utf-8")
    first, second = read_ner(path, "wikiann")
    assert first.text == "Anton Wilhelm in Köln ."
    assert first.spans == [Span(0, 13, "PER", "Anton Wilhelm"), Span(17, 21, "LOC", "Köln")]
    assert second.spans == [Span(0, 4, "LOC", "Bonn")]


def test_conll2003_iob1_to_spans_skipping_docstart(tmp_path):
    path = tmp_path / "eng.train"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n"
                    "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\nJohn NNP I-NP B-PER\n. . O O\n", encoding="utf-8")
    (ex,) = read_ner(path, "conll2003")
    assert ex.text == "EU rejects German Peter Blackburn John ."
    assert [(s.text, s.label) for s in ex.spans] == [("EU", "ORG"), ("German", "MISC"), ("Peter Blackburn", "PER"),
                                                     ("John", "PER")]


def test_conll2002_latin1_is_read_or_refused(tmp_path):
    path = tmp_path / "esp.train"
    path.write_bytes("La O\nCoruña B-LOC\n( O\nEspaña B-LOC\n) O\n".encode("latin-1"))
    (ex,) = read_ner(path, "conll2003")
    assert [s.text for s in ex.spans] == ["Coruña", "España"]
    with pytest.raises(DataError, match=r"esp\.train:2: not valid UTF-8"):
        read_ner(path, "conll")


# ------------------------------------------------------------------------------------------------- word-level tagging
def corpus(n: int, seed: int) -> str:
    """WikiANN-style lines ``xx:word<TAB>TAG`` of template sentences."""
    rng, sentences = random.Random(seed), []
    for _ in range(n):
        lines, previous = [], None
        for token in rng.choice(TEMPLATES).split():
            label = token[1:-1] if token.startswith("{") else None
            word = rng.choice({"PER": PER, "LOC": LOC, "ORG": ORG}[label]) if label else token
            lines.append(f"xx:{word}\t{'O' if label is None else ('I-' if previous == label else 'B-') + label}")
            previous = label
        sentences.append("\n".join(lines))
    return "\n\n".join(sentences) + "\n"


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> Path:
    """A random 1-layer BERT (hidden 32) whose names split into single-character sub-words."""
    from transformers import BertConfig, BertModel

    from zhie.encoders import SPECIAL_TOKENS, wordpiece_tokenizer

    chars = sorted({c for w in PER + LOC + ORG + WORDS for c in w})
    vocab = SPECIAL_TOKENS + WORDS + chars + ["##" + c for c in chars]
    out = tmp_path_factory.mktemp("encoder")
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        BertModel(config, add_pooling_layer=False).save_pretrained(out)
    wordpiece_tokenizer(vocab).save_pretrained(out)
    return out


def test_word_tags_and_spans_round_trip():
    text = "Anna Berta wohnt in Berlin ."
    spans = [Span(0, 10, "PER", "Anna Berta"), Span(20, 26, "LOC", "Berlin")]
    ranges = word_ranges(text)
    tags = word_tags(ranges, spans)
    assert tags == ["B-PER", "I-PER", "O", "O", "B-LOC", "O"]
    assert word_spans(text, ranges, tags) == spans


def test_only_first_subwords_carry_loss(encoder_dir, tmp_path):
    from transformers import AutoTokenizer

    task = NerTask(NerConfig(["LOC", "PER"], head="softmax", mode="subword", words=True, max_length=32),
                   AutoTokenizer.from_pretrained(encoder_dir))
    (tmp_path / "x.txt").write_text("xx:Anna\tB-PER\nxx:wohnt\tO\nxx:in\tO\nxx:Berlin\tB-LOC\n", encoding="utf-8")
    (ex,) = read_ner(tmp_path / "x.txt", "wikiann")
    (window,) = task.encode([ex])
    enc = task.text_tokenizer(ex.text)
    heads = word_heads(enc, word_ranges(ex.text))
    assert heads == [0, 4, 5, 6]  # A ##n ##n ##a | wohnt | in | B ##e ...
    tags = task.config.tags
    assert [tags[t] if t != IGNORE else None for t in window.tags] == (
        ["B-PER", None, None, None, "O", "O", "B-LOC"] + [None] * 5)
    batch = task.collate([window])
    model = Model(encoders.load(str(encoder_dir))[0], task.build_heads(32))
    emissions = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["ner"]
    changed = emissions.clone()
    off_words = [p + 1 for p in range(len(enc)) if p not in heads]
    changed[0, off_words + [0, len(enc) + 1]] += torch.randn(len(off_words) + 2, emissions.shape[-1]) * 5
    head = model.heads["ner"]
    torch.testing.assert_close(head.loss(changed[:, 1:], batch["labels"][:, 1:]),
                               head.loss(emissions[:, 1:], batch["labels"][:, 1:]))


# ------------------------------------------------------------------------------------------------- teachers, student
@pytest.fixture(scope="module")
def teachers(tmp_path_factory, encoder_dir):
    """A word-level recogniser (zhie.fit) and an evaluator (the CLI) on the source sentences."""
    d = tmp_path_factory.mktemp("teachers")
    (d / "src.txt").write_text(corpus(80, 1), encoding="utf-8")
    (d / "dev.txt").write_text(corpus(30, 3), encoding="utf-8")
    (d / "tgt.txt").write_text(corpus(80, 2), encoding="utf-8")
    config = TrainConfig(epochs=6, batch_size=16, lr=5e-3, head_lr=5e-3, warmup=0.05, seed=0, eval_every=10**9)
    zhie.fit("ner", d / "src.txt", d / "dev.txt", out=d / "rec", encoder=str(encoder_dir), format="wikiann",
             mode="word", head="softmax", max_length=32, config=config, resume=False, progress=False)
    assert main(["train", "xner-evaluator", "--train", str(d / "src.txt"), "--dev", str(d / "dev.txt"),
                 "--format", "wikiann", "--encoder", str(encoder_dir), "--out", str(d / "ev"), "--pairs", "256",
                 "--dev-pairs", "64", "--max-length", "32", "--epochs", "2", "--batch-size", "16", "--lr", "3e-3",
                 "--eval-every", "1000", "--seed", "0", "--quiet"]) == 0
    return d


def test_teachers_learn_the_source(teachers):
    rec = zhie.load(teachers / "rec")
    assert rec.evaluate(read_ner(teachers / "dev.txt", "wikiann"))["micro"]["f1"] > 0.8
    ev = zhie.load(teachers / "ev")
    assert ev.evaluate(read_ner(teachers / "dev.txt", "wikiann"))["accuracy"] > 0.7
    vectors = ev.predict(["Anna wohnt in Berlin ."])[0]
    assert vectors.shape == (5, 32)


def tags_of(pipe, texts: list[str]) -> list[int]:
    tt = pipe.task.text_tokenizer
    inputs = [word_inputs(tt, t, 32) for t in texts]
    return [int(x) for rows in word_outputs(pipe.model, pipe.task.head_name, tt, inputs) for x in rows.argmax(-1)]


def test_a_rerun_with_another_setting_or_target_is_refused_not_mixed(teachers, encoder_dir, tmp_path):
    """The MTMT student's run is its teachers, data and every setting: resuming it with another is refused."""
    args = dict(out=tmp_path / "s", format="wikiann", encoder=str(encoder_dir), pairs=32, progress=False,
                config=TrainConfig(epochs=1, batch_size=16, seed=0))
    distill(teachers / "rec", teachers / "ev", teachers / "tgt.txt", **args)
    with pytest.raises(ValueError, match=r"(?s)would mix two runs.*loss_alpha.*--no-resume"):
        distill(teachers / "rec", teachers / "ev", teachers / "tgt.txt", loss_alpha=0.9, **args)
    with pytest.raises(ValueError, match=r"(?s)would mix two runs.*\n  data: "):
        distill(teachers / "rec", teachers / "ev", teachers / "tgt.txt", dev=teachers / "dev.txt", **args)
    distill(teachers / "rec", teachers / "ev", teachers / "tgt.txt", loss_alpha=0.9, resume=False, **args)


def test_a_tiny_student_copies_its_teacher(teachers, encoder_dir, tmp_path):
    distill(teachers / "rec", teachers / "ev", teachers / "tgt.txt", out=tmp_path / "student", format="wikiann",
            encoder=str(encoder_dir), pairs=320, config=TrainConfig(epochs=3, batch_size=16, lr=5e-3,
                                                                    head_lr=5e-3, warmup=0.05,
                                                                  seed=0), resume=False, progress=False)
    texts = [ex.text for ex in read_ner(teachers / "dev.txt", "wikiann")]
    teacher, student = tags_of(zhie.load(teachers / "rec"), texts), tags_of(zhie.load(tmp_path / "student"), texts)
    agreement = sum(a == b for a, b in zip(teacher, student)) / len(teacher)
    assert agreement >= 0.95


def test_distill_cli_writes_an_ordinary_ner_model(teachers, encoder_dir, tmp_path, capsys):
    out = tmp_path / "student"
    assert main(["distill", "--recognizer", str(teachers / "rec"), "--evaluator", str(teachers / "ev"),
                 "--target", str(teachers / "tgt.txt"), "--dev", str(teachers / "dev.txt"), "--format", "wikiann",
                 "--encoder", str(encoder_dir), "--out", str(out), "--pairs", "64", "--epochs", "1",
                 "--batch-size", "16", "--lr", "1e-3", "--no-alpha", "--no-similarity", "--quiet"]) == 0
    assert main(["predict", str(out), "Anna wohnt in Berlin ."]) == 0
    assert main(["eval", str(out), "--data", str(teachers / "dev.txt"), "--format", "wikiann"]) == 0
    assert zhie.load(out).task.name == "ner"
    record = json.loads((out / "best" / "training.json").read_text(encoding="utf-8"))  # the card's record
    assert [f["role"] for f in record["data"]] == ["target", "dev"] and record["options"]["pairs"] == 64
    assert record["options"]["recognizer"] == str(teachers / "rec") and "best" in record
    assert "f1" in record["dev"]["micro"]
    card = (out / "best" / "README.md").read_text(encoding="utf-8")
    assert "## Dev metrics" in card and "Not recorded" not in card
    capsys.readouterr()
    assert main(["distill", "--recognizer", str(teachers / "ev"), "--evaluator", str(teachers / "ev"),
                 "--target", str(teachers / "tgt.txt"), "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert "is not a word-level NER model" in capsys.readouterr().err


def test_word_level_tagging_needs_the_softmax_head():
    with pytest.raises(ValueError, match="needs the softmax head"):
        NerConfig(["PER"], head="gp", mode="subword", words=True)
