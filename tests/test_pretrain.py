"""``zhie pretrain``: masking rates and whole-word grouping on real Chinese text, packing, the MLM heads against
transformers' ``*ForMaskedLM``, exact resume, bad input, and pre-trained directories that zhie tasks train on.

The masking and packing tests read 300 lines of the shared wiki corpus; the runs pre-train on 300 made-up lines."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

import zhie
from zhie import demo, encoders
from zhie.cli import main
from zhie.core.text import TextTokenizer
from zhie.data import DataError, write_ner_jsonl
from zhie.encoders.mlm import HEAD_FILE, IGNORE, load_head, mask_tokens
from zhie.training import TrainConfig
from zhie.training.pretrain import PretrainConfig, collate, encode_lines, make_segmenter, pack, pretrain
from zhie.training.report import read_metrics

from .conftest import DATA
from .tiny_models import paragraphs, write_segmented_corpus

BERT = "new:bert:layers=1,hidden=32,heads=2,intermediate=64"
GAU = "new:gau-alpha:layers=2,hidden=32,intermediate=64,key_size=16"
TINY = {"batch_size": 4, "max_length": 64, "heldout": 20, "shuffle_buffer": 16, "lr": 1e-3, "eval_every": 3,
        "save_every": 4}


@pytest.fixture(scope="module")
def lines():
    with open(DATA / "corpus" / "wiki.txt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, 300)]


@pytest.fixture(scope="module")
def made_up():
    return paragraphs(300, seed=6)


@pytest.fixture(scope="module")
def corpus(made_up, tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "made_up300.txt"
    path.write_text("\n".join(made_up) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer(lines):
    return encoders.wordpiece_tokenizer(encoders.char_vocab(lines))


@pytest.fixture(scope="module")
def encoded(lines, tokenizer):
    return encode_lines(lines, TextTokenizer(tokenizer, "char"), make_segmenter("rjieba"))


def _mask_batch(encoded, tokenizer, seed, capacity=126):
    ids = {"cls_id": tokenizer.cls_token_id, "sep_id": tokenizer.sep_token_id, "pad_id": tokenizer.pad_token_id}
    batch = collate(list(pack(encoded, capacity)), **ids)
    special = set(tokenizer.all_special_ids)
    random_ids = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    inputs, labels = mask_tokens(batch["input_ids"], batch["word_starts"], batch["special"],
                                 mask_id=tokenizer.mask_token_id, random_ids=random_ids,
                                 generator=torch.Generator().manual_seed(seed))
    return batch, inputs, labels


# ------------------------------------------------------------------------------------------------------ masking
@pytest.mark.needs_data
def test_masking_rates_15_percent_then_80_10_10(encoded, tokenizer):
    chosen = total = masked = replaced = kept = 0
    for seed in range(8):
        batch, inputs, labels = _mask_batch(encoded, tokenizer, seed)
        content = ~batch["special"]
        picked = labels != IGNORE
        assert not (picked & batch["special"]).any(), "special tokens or padding were chosen"
        assert torch.equal(inputs[batch["special"]], batch["input_ids"][batch["special"]])
        assert torch.equal(inputs[~picked], batch["input_ids"][~picked]), "a token changed without being predicted"
        assert torch.equal(labels[picked], batch["input_ids"][picked])
        total += int(content.sum())
        chosen += int(picked.sum())
        masked += int((inputs[picked] == tokenizer.mask_token_id).sum())
        same = inputs[picked] == labels[picked]
        kept += int(same.sum())
        replaced += int((~same & (inputs[picked] != tokenizer.mask_token_id)).sum())
        assert not set(inputs[picked & (inputs != labels)].tolist()) - {tokenizer.mask_token_id} & \
            set(tokenizer.all_special_ids), "a random replacement was a special token"
    assert total > 200_000
    assert chosen / total == pytest.approx(0.15, abs=0.01)
    assert masked / chosen == pytest.approx(0.8, abs=0.015)
    assert replaced / chosen == pytest.approx(0.1, abs=0.01)
    assert kept / chosen == pytest.approx(0.1, abs=0.01)


@pytest.mark.needs_data
def test_word_starts_are_rjieba_words_on_real_text(lines, tokenizer, encoded):
    import rjieba

    tt = TextTokenizer(tokenizer, "char")
    for text, (ids, starts) in zip(lines[:100], encoded):
        enc = tt(text)
        assert ids.tolist() == enc.ids
        bounds = [*np.flatnonzero(starts).tolist(), len(ids)]
        ours = ["".join(text[enc.starts[t]] for t in range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]
        theirs = ["".join(c for c in word if tt.char_id(c) is not None) for word in rjieba.cut(text)]
        assert ours == [w for w in theirs if w]


@pytest.mark.needs_data
def test_whole_words_are_masked_together_on_real_text(encoded, tokenizer):
    batch, _, labels = _mask_batch(encoded, tokenizer, seed=3)
    picked = (labels != IGNORE).numpy()
    starts, content = batch["word_starts"].numpy(), ~batch["special"].numpy()
    masked_long_words = 0
    for row in range(len(picked)):
        bounds = [*np.flatnonzero(starts[row] & content[row]).tolist(), int(content[row].sum()) + 1]
        for a, b in zip(bounds[:-1], bounds[1:]):
            assert len(set(picked[row, a:b])) == 1, f"word {a}:{b} of row {row} partly masked"
            masked_long_words += bool(picked[row, a]) and b - a > 1
    assert masked_long_words > 100


@pytest.mark.needs_data
def test_char_masking_masks_single_tokens(lines, tokenizer):
    encoded = encode_lines(lines[:50], TextTokenizer(tokenizer, "char"), None)
    assert all(starts.all() for _, starts in encoded)


# ------------------------------------------------------------------------------------------------------ packing
@pytest.mark.needs_data
def test_packing_keeps_every_token_in_sequences_cut_at_word_starts(encoded):
    capacity = 62
    sequences = list(pack(encoded, capacity))
    assert all(0 < len(ids) <= capacity for ids, _ in sequences)
    assert np.array_equal(np.concatenate([ids for ids, _ in sequences]), np.concatenate([ids for ids, _ in encoded]))
    stream_starts = np.concatenate([np.r_[True, s[1:]] for _, s in encoded])
    cuts = np.cumsum([len(ids) for ids, _ in sequences])[:-1]
    assert stream_starts[cuts].all(), "a sequence starts inside a word"
    assert np.mean([len(ids) for ids, _ in sequences[:-1]]) > capacity - 3  # (nearly) full-length sequences
    batch = collate(sequences[:4], cls_id=2, sep_id=3, pad_id=0)
    for row, (ids, _) in enumerate(sequences[:4]):
        assert batch["input_ids"][row, 0] == 2 and batch["input_ids"][row, len(ids) + 1] == 3
        assert batch["attention_mask"][row].sum() == len(ids) + 2 <= capacity + 2


def test_a_word_longer_than_a_sequence_is_cut():
    ids = np.arange(10, dtype=np.int32)
    starts = np.zeros(10, dtype=bool)
    sequences = list(pack([(ids, starts)], 4))
    assert [s.tolist() for s, _ in sequences] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


# --------------------------------------------------------------------------------------------------------- heads
@pytest.mark.parametrize("family", ["bert", "albert"])
def test_mlm_head_equals_transformers_masked_lm(family, tmp_path):
    import transformers

    config_class = {"bert": transformers.BertConfig, "albert": transformers.AlbertConfig}[family]
    masked_lm = {"bert": transformers.BertForMaskedLM, "albert": transformers.AlbertForMaskedLM}[family]
    extra = {"embedding_size": 16} if family == "albert" else {}
    config = config_class(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, **extra)
    torch.manual_seed(0)
    reference = masked_lm(config).eval()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if "bias" in name:
                p.normal_(std=0.1)  # non-zero biases, so that the comparison covers them
    reference.save_pretrained(tmp_path)
    encoder, _ = encoders.load_pretrained(tmp_path)
    head, source = load_head(encoder, tmp_path)
    assert "pre-training head" in source
    head.eval()
    input_ids = torch.randint(5, 50, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        ours = head(hidden, encoder.get_input_embeddings().weight)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_gau_alpha_head_is_a_bias_free_decoder_tied_to_the_embeddings(made_up):
    encoder, _ = encoders.load(GAU, texts=made_up[:20])
    head, source = load_head(encoder, None)
    assert source is None and head.kind == "decoder" and not list(head.parameters())
    hidden = torch.randn(3, 32)
    torch.testing.assert_close(head.eval()(hidden, encoder.get_input_embeddings().weight),
                               hidden @ encoder.get_input_embeddings().weight.T)


# ------------------------------------------------------------------------------------------------ pre-training
def _run(corpus, out, encoder=BERT, **kwargs):
    settings = {**TINY, **{k: v for k, v in kwargs.items() if k in PretrainConfig.__dataclass_fields__}}
    rest = {k: v for k, v in kwargs.items() if k not in PretrainConfig.__dataclass_fields__}
    return pretrain([corpus], encoder, out, config=PretrainConfig(**settings), progress=False, **rest)


def _stable(history):
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in history]


@pytest.mark.parametrize("encoder, optimizer", [(BERT, "adamw"), (GAU, "lamb")])
def test_resume_gives_the_uninterrupted_run(encoder, optimizer, corpus, tmp_path):
    whole = _run(corpus, tmp_path / "whole", encoder, steps=8, optimizer=optimizer, log_every=3)
    first = _run(corpus, tmp_path / "cut", encoder, steps=8, optimizer=optimizer, log_every=3, stop_after=5)
    assert first["step"] == 5
    with pytest.raises(ValueError, match="(?s)different run.*lr.*--no-resume"):
        _run(corpus, tmp_path / "cut", encoder, steps=8, optimizer=optimizer, lr=2e-3)
    resumed = _run(corpus, tmp_path / "cut", encoder, steps=8, optimizer=optimizer, log_every=3)  # the same call
    assert resumed["step"] == 8 and resumed["tokens"] == whole["tokens"]
    assert _stable(resumed["history"]) == _stable(whole["history"])
    records = [_stable(read_metrics(tmp_path / d / "metrics.jsonl", kind=None)) for d in ("whole", "cut")]
    assert records[1] == records[0]  # the step record at 6 spans the stop after 5
    assert [(r["kind"], r["step"]) for r in records[0] if r["kind"] == "step"] == [("step", 3), ("step", 6),
                                                                                 ("step", 8)]
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_time_limit_ends_the_session_with_a_snapshot_that_resumes(corpus, tmp_path):
    logged = []
    first = _run(corpus, tmp_path / "run", steps=3, time_limit_s=0, log=logged.append)
    summary = json.loads((tmp_path / "run" / "pretrain.json").read_text(encoding="utf-8"))
    assert first["step"] == summary["step"] == 1 and not summary["finished"]
    assert "stopped at step 1 of 3; the same command continues it" in logged
    resumed = _run(corpus, tmp_path / "run", steps=3, log=logged.append)
    assert resumed["step"] == 3 and json.loads((tmp_path / "run" / "pretrain.json").read_text())["finished"]
    assert f"resuming {tmp_path / 'run'} at step 1 of 3" in logged


def test_output_is_an_encoder_directory_and_continues_with_its_head(corpus, tmp_path):
    result = _run(corpus, tmp_path / "run", steps=4)
    out = tmp_path / "run"
    for name in ("config.json", "model.safetensors", "tokenizer.json", HEAD_FILE, "checkpoint.pt", "metrics.jsonl",
                 "pretraining.png", "pretrain.json"):
        assert (out / name).exists(), name
    summary = json.loads((out / "pretrain.json").read_text(encoding="utf-8"))
    assert summary["finished"] and summary["head"] == "transform" and "new MLM head" in summary["head_source"]
    assert set(result["heldout"]) == {"loss", "accuracy", "predicted"} and result["heldout"]["predicted"] > 0
    left = [p.name for p in tmp_path.glob(".run.*") if p.name != ".run.lock"]  # the lock file stays, empty
    assert not left, f"a temporary directory was left behind: {left}"

    logged = []
    again = _run(corpus, tmp_path / "more", str(out), steps=2, log=logged.append)
    assert str(out / HEAD_FILE) in again["head"] and any(HEAD_FILE in line for line in logged)
    encoder, tokenizer = encoders.load(out)
    head, _ = load_head(encoder, out)
    trained = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    assert torch.equal(head.dense.weight, trained["head.dense.weight"])

    plain = tmp_path / "plain"  # an encoder directory without an MLM head (as e5-small's)
    encoder.save_pretrained(plain)
    tokenizer.save_pretrained(plain)
    logged.clear()
    _run(corpus, tmp_path / "from-plain", str(plain), steps=1, log=logged.append)
    assert any("stores no MLM head" in line and "tied to the input embeddings" in line for line in logged)


def test_the_cli_logs_steps_and_the_trackers_write_beside_the_snapshot(corpus, tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--encoder", BERT, "--out", str(out), "--steps", "3",
                 "--batch-size", "4", "--max-length", "64", "--heldout", "20", "--shuffle-buffer", "16",
                 "--log-every", "2", "--report-to", "tensorboard", "--quiet"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", kind="step")] == [2, 3]
    assert list((tmp_path / "run-logs" / "tensorboard").glob("events.out.tfevents.*"))
    assert not (out / "tensorboard").exists()  # out is replaced at every save


@pytest.mark.parametrize("encoder, cls", [(BERT, "BertModel"), (GAU, "GAUAlphaModel")])
def test_a_pretrained_directory_trains_a_zhie_task(encoder, cls, corpus, tmp_path):
    _run(corpus, tmp_path / "encoder", encoder, steps=2)
    ner = tmp_path / "ner.jsonl"
    write_ner_jsonl(demo.make_corpus(12, seed=0), ner)
    zhie.fit("ner", ner, ner, out=tmp_path / "ner", encoder=str(tmp_path / "encoder"), head="gp", max_length=64,
             config=TrainConfig(epochs=1, batch_size=8, lr=1e-3, head_lr=1e-3), resume=False, progress=False)
    pipe = zhie.load(tmp_path / "ner")
    assert type(pipe.model.encoder).__name__ == cls
    text = "王芳在北京的远华公司工作。"
    (spans,) = pipe.predict([text])
    assert all(text[s.start:s.end] == s.text for s in spans)


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("content, line, reason", [
    (b"", 1, "empty"),
    (b"\n  \n\n", 1, "empty"),
    ("第一行文字\n第二行文字\n".encode() + b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 5, "binary"),
    ("第一行文字\n".encode() + b"\x00\x01\x02\x03abc\n", 2, "binary"),
    ("第一行文字\n第二行\n".encode() + "第三行".encode("gb18030") + b"\n", 3, "UTF-8"),
])
def test_bad_corpus_is_an_error_with_file_and_line_and_nothing_written(content, line, reason, tmp_path, capsys):
    good = tmp_path / "good.txt"
    good.write_text("\n".join(f"第{i}行是一段足够长的中文文字。" for i in range(30)) + "\n", encoding="utf-8")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    out = tmp_path / "out"
    with pytest.raises(DataError, match=reason) as err:
        pretrain([good, bad], BERT, out, config=PretrainConfig(heldout=2), progress=False)
    assert (err.value.path, err.value.line) == (str(bad), line)
    capsys.readouterr()
    assert main(["pretrain", "--corpus", str(good), str(bad), "--encoder", BERT, "--out", str(out), "--heldout", "2",
                 "--quiet"]) == 2
    assert f"{bad}:{line}:" in capsys.readouterr().err
    # no out, no temporary: only the empty lock file beside out, which a lock never removes (training/checkpoint.py)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "bad.txt", "good.txt"]


def test_other_input_errors(tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("一段中文。\n另一段中文。\n", encoding="utf-8")
    with pytest.raises(ValueError, match="held out"):
        pretrain([small], BERT, tmp_path / "out", config=PretrainConfig(heldout=2), progress=False)
    with pytest.raises(FileNotFoundError, match="no such corpus file"):
        pretrain([tmp_path / "missing.txt"], BERT, tmp_path / "out", progress=False)
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("not a run", encoding="utf-8")
    with pytest.raises(ValueError, match="not a zhie pretrain run"):
        pretrain([small], BERT, other, config=PretrainConfig(heldout=0), progress=False)
    assert (other / "keep.txt").read_text(encoding="utf-8") == "not a run"
    assert not (tmp_path / "out").exists()


def test_continued_pretraining_prunes_the_vocabulary_and_the_head_bias_with_it(made_up, tmp_path):
    import transformers

    vocab = encoders.char_vocab(made_up)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64)
    torch.manual_seed(0)
    reference = transformers.BertForMaskedLM(config)
    with torch.no_grad():
        reference.cls.predictions.bias.normal_()
    reference.save_pretrained(tmp_path / "hf")
    encoders.wordpiece_tokenizer(vocab).save_pretrained(tmp_path / "hf")
    small = tmp_path / "small.txt"
    small.write_text("\n".join(made_up[:30]) + "\n", encoding="utf-8")
    _run(small, tmp_path / "out", str(tmp_path / "hf"), steps=1, lr=0.0, weight_decay=0.0, keep_tokens="data",
         heldout=5)
    encoder, tokenizer = encoders.load(tmp_path / "out")
    head, _ = load_head(encoder, tmp_path / "out")
    assert len(tokenizer) < len(vocab)
    old = {token: reference.cls.predictions.bias[i].item() for i, token in enumerate(vocab)}
    for token, i in tokenizer.get_vocab().items():
        assert head.bias[i].item() == pytest.approx(old[token]), token


def test_a_zhie_cws_model_is_a_segmenter_and_other_models_are_refused(made_up, tmp_path):
    write_segmented_corpus(tmp_path / "cws.txt")
    zhie.fit("cws", tmp_path / "cws.txt", tmp_path / "cws.txt", out=tmp_path / "cws", encoder="tiny",
             config=TrainConfig(epochs=2, batch_size=16, lr=3e-3, head_lr=3e-3), resume=False, progress=False)
    segment = make_segmenter(str(tmp_path / "cws/best"))
    texts = made_up[:5]
    words = segment(texts)
    assert ["".join(w) for w in words] == texts and sum(map(len, words)) > len(texts)  # a partition of each text
    char_tokens = TextTokenizer(encoders.wordpiece_tokenizer(encoders.char_vocab(texts)), "char")
    for text, text_words, (_ids, starts) in zip(texts, words, encode_lines(texts, char_tokens, segment)):
        word_of_char = [w for w, word in enumerate(text_words) for _ in word]
        token_words = [word_of_char[c] for c in char_tokens(text).starts]
        assert starts.tolist() == [True] + [a != b for a, b in zip(token_words[1:], token_words[:-1])]

    train, dev = demo.write_corpus(tmp_path / "ner", 32, 8)
    zhie.fit("ner", train, dev, out=tmp_path / "ner", encoder="tiny", config=TrainConfig(epochs=1),
             resume=False, progress=False)
    with pytest.raises(ValueError, match="a 'ner' model; a segmenter is a cws model"):
        make_segmenter(str(tmp_path / "ner/best"))
    with pytest.raises(ValueError, match="unknown segmenter 'nltk'"):
        make_segmenter("nltk")
