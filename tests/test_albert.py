"""ALBERT with its layer sharing dropped (spec §9.1): the unshared ELECTRA-layout model equals AlbertModel before
training, its layers then learn apart, it reloads as itself, and zhie trains with it."""

from __future__ import annotations

import pytest
import torch
from transformers import AlbertConfig, AlbertModel, ElectraModel

import zhie
from zhie import demo, encoders
from zhie.data import write_ner_jsonl
from zhie.encoders.albert import unshare
from zhie.training import TrainConfig

VOCAB = encoders.SPECIAL_TOKENS + sorted({c for ex in demo.make_corpus(64, seed=0) for c in ex.text})


def albert(groups: int = 1, inner: int = 1, layers: int = 3) -> AlbertModel:
    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=len(VOCAB), embedding_size=16, hidden_size=32, num_hidden_layers=layers,
                          num_attention_heads=2, intermediate_size=64, num_hidden_groups=groups, inner_group_num=inner,
                          pad_token_id=0)
    return AlbertModel(config).eval()


@pytest.mark.parametrize("groups, inner", [(1, 1), (1, 2), (3, 1)])
def test_unshared_equals_albert_before_training(groups, inner):
    model = albert(groups, inner)
    electra = unshare(model).eval()
    assert isinstance(electra, ElectraModel) and len(electra.encoder.layer) == 3 * inner
    ids = torch.randint(5, len(VOCAB), (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding in the batch
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = electra(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_unshared_layers_learn_apart_and_reload(tmp_path):
    electra = unshare(albert())
    layers = electra.encoder.layer
    assert torch.equal(layers[0].attention.self.query.weight, layers[2].attention.self.query.weight)
    assert layers[0].attention.self.query.weight.data_ptr() != layers[2].attention.self.query.weight.data_ptr()
    optimizer = torch.optim.Adam(electra.parameters(), lr=1e-2)
    ids = torch.randint(5, len(VOCAB), (4, 7), generator=torch.Generator().manual_seed(2))
    electra.train()
    electra(input_ids=ids).last_hidden_state.pow(2).mean().backward()
    optimizer.step()
    assert not torch.equal(layers[0].attention.self.query.weight, layers[2].attention.self.query.weight)
    electra.save_pretrained(tmp_path / "unshared")
    encoders.wordpiece_tokenizer(VOCAB).save_pretrained(tmp_path / "unshared")
    reloaded, _ = encoders.load(tmp_path / "unshared")
    assert isinstance(reloaded, ElectraModel)
    electra.eval()
    torch.testing.assert_close(reloaded(input_ids=ids).last_hidden_state, electra(input_ids=ids).last_hidden_state)


def test_ner_trains_on_an_unshared_albert(tmp_path):
    albert().save_pretrained(tmp_path / "albert")
    encoders.wordpiece_tokenizer(VOCAB).save_pretrained(tmp_path / "albert")
    with pytest.raises(ValueError, match="needs an ALBERT"):
        encoders.load("tiny", texts=["北京"], unshare=True)
    write_ner_jsonl(demo.make_corpus(32, seed=0), tmp_path / "train.jsonl")
    zhie.fit("ner", tmp_path / "train.jsonl", tmp_path / "train.jsonl", out=tmp_path / "run",
             encoder=str(tmp_path / "albert"), unshare_layers=True, head="crf",
             config=TrainConfig(epochs=1, batch_size=16, lr=1e-3, head_lr=1e-3), resume=False, progress=False)
    pipe = zhie.load(tmp_path / "run")
    assert isinstance(pipe.model.encoder, ElectraModel) and len(pipe.model.encoder.encoder.layer) == 3
    assert len(pipe.predict([demo.SAMPLES[0]])) == 1
