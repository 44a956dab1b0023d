"""RoFormer (v1) through transformers: a RoFormer tokenizer built from a small local vocabulary keeps exact offsets
in char mode, its vocabulary can be pruned, its layers cut, and zhie trains and predicts with it."""

from __future__ import annotations

import pytest
import torch

import zhie
from zhie import demo, encoders
from zhie.core.text import TextTokenizer
from zhie.data import write_ner_jsonl
from zhie.training import TrainConfig

pytest.importorskip("rjieba")

CORPUS = demo.make_corpus(32, seed=0)


@pytest.fixture(scope="module")
def roformer_dir(tmp_path_factory):
    from transformers import RoFormerConfig, RoFormerModel, RoFormerTokenizer, RoFormerTokenizerFast

    out = tmp_path_factory.mktemp("roformer")
    chars = sorted({c for ex in CORPUS for c in ex.text})
    vocab = encoders.SPECIAL_TOKENS + chars + ["北京", "公司"]  # two words: a word-level vocabulary
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    RoFormerTokenizer(str(out / "vocab.txt")).save_pretrained(out)
    tokenizer = RoFormerTokenizerFast.from_pretrained(out)
    config = RoFormerConfig(vocab_size=len(tokenizer), embedding_size=32, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, pad_token_id=0)
    torch.manual_seed(0)
    RoFormerModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_char_mode_offsets_with_a_word_level_roformer_vocabulary(roformer_dir):
    model, tokenizer = encoders.load(roformer_dir)
    assert type(model).__name__ == "RoFormerModel"
    assert "北京" in tokenizer.tokenize("我在北京")  # word-level pieces in the tokenizer's own mode
    tt = TextTokenizer(tokenizer, "char")
    text = "王芳在北京 的\t远华公司ＡＢ工作。"
    enc = tt(text)
    assert [text[s:e] for s, e in zip(enc.starts, enc.ends)] == [c for c in text if not c.isspace()]
    assert all(i == tokenizer.convert_tokens_to_ids(tokenizer.backend_tokenizer.normalizer.normalize_str(c))
               or i == tokenizer.unk_token_id for i, c in zip(enc.ids, (text[s] for s in enc.starts)))


def test_ner_trains_on_a_pruned_and_cut_roformer(roformer_dir, tmp_path):
    write_ner_jsonl(CORPUS, tmp_path / "train.jsonl")
    zhie.fit("ner", tmp_path / "train.jsonl", tmp_path / "train.jsonl", out=tmp_path / "run",
             encoder=str(roformer_dir), keep_tokens="data", encoder_layers=1, head="egp",
             config=TrainConfig(epochs=1, batch_size=16, lr=1e-3, head_lr=1e-3), resume=False, progress=False)
    pipe = zhie.load(tmp_path / "run")
    assert type(pipe.model.encoder).__name__ == "RoFormerModel" and pipe.model.encoder.config.num_hidden_layers == 1
    assert len(pipe.task.tokenizer) < encoders.load(roformer_dir)[0].config.vocab_size
    (spans,) = pipe.predict([CORPUS[0].text])
    assert all(CORPUS[0].text[s.start:s.end] == s.text for s in spans)
