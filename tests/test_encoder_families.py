"""Every encoder family trains and predicts with every task: NER (GP), CWS (CRF), GPLinker relations and CoSENT
sentence vectors, from a randomly initialised ``new:...`` encoder; the saved directory reloads as the same family.
And zhie's own encoders (GAU-α, RoFormerV2) must actually learn a small NER sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zhie
from zhie import demo
from zhie.data import write_ner_jsonl
from zhie.training import TrainConfig

from .tiny_models import write_multitask_data, write_relation_data

SIZES = "layers=2,hidden=32,intermediate=64"
FAMILIES = {
    "albert": (f"new:albert:{SIZES},heads=2,embedding=16", "AlbertModel"),
    "roformer": (f"new:roformer:{SIZES},heads=2,embedding=32", "RoFormerModel"),
    "roformer-v2": (f"new:roformer-v2:{SIZES},heads=2", "RoFormerV2Model"),
    "roformer-v2-deepnorm": (f"new:roformer-v2:{SIZES},heads=2,deepnorm=paper", "RoFormerV2Model"),
    "gau-alpha": (f"new:gau-alpha:{SIZES},key_size=16", "GAUAlphaModel"),
    "flash": (f"new:gau-alpha:{SIZES},key_size=16,attention=flash,normalization=squared_relu,chunk=8",
              "GAUAlphaModel"),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """24 made-up sentences for each of NER, CWS and sentence pairs, 8 for relations and their schema."""
    out = write_multitask_data(tmp_path_factory.mktemp("families"))
    write_relation_data(out, n=8)
    return out


TASKS = {  # task: (data file, options; a file name: in the data)
    "ner": ("ner.json", {"head": "gp"}),
    "cws": ("cws.txt", {"head": "crf"}),
    "re": ("re.jsonl", {"schema": "schema.json"}),
    "sts": ("sim.tsv", {"loss": "cosent"}),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_task_trains_and_predicts_on(family, data, tmp_path):
    spec, cls = FAMILIES[family]
    for task, (file, options) in TASKS.items():
        if "schema" in options:
            options = {**options, "schema": data / options["schema"]}
        out = tmp_path / task
        zhie.fit(task, data / file, data / file, out=out, encoder=spec, max_length=64,
                 config=TrainConfig(epochs=1, batch_size=8, lr=1e-3,
                                    head_lr=1e-3), resume=False, progress=False, **options)
        pipe = zhie.load(out)
        assert type(pipe.model.encoder).__name__ == cls, task
        text = "王芳在北京的远华公司工作。"
        if task == "sts":
            vectors = pipe.encode([text, "今天天气很好"])
            assert vectors.shape == (2, 32) and np.isfinite(vectors).all()
        else:
            (result,) = pipe.predict([text])
            assert all(text[s.start:s.end] == s.text for s in getattr(result, "spans", None) or [])


@pytest.mark.parametrize("spec", [FAMILIES["gau-alpha"][0], FAMILIES["roformer-v2"][0], FAMILIES["flash"][0]])
def test_own_encoders_learn_a_small_ner_sample(spec, tmp_path):
    corpus = demo.make_corpus(48, seed=1)
    write_ner_jsonl(corpus, tmp_path / "train.jsonl")
    zhie.fit("ner", tmp_path / "train.jsonl", tmp_path / "train.jsonl", out=tmp_path / "run", encoder=spec,
             head="crf", config=TrainConfig(epochs=12, batch_size=8, lr=3e-3,
                                            head_lr=3e-3, seed=0), resume=False, progress=False)
    assert zhie.load(tmp_path / "run").evaluate(corpus)["micro"]["f1"] >= 0.9


def test_encoder_layers_cut_every_family():
    from zhie import encoders

    for spec, _ in FAMILIES.values():
        model, tokenizer = encoders.load(spec, texts=["你好世界"])
        full = model.eval()(**tokenizer(["你好世界"], return_tensors="pt"), output_hidden_states=True)
        encoders.truncate_layers(model, 1)
        cut = model(**tokenizer(["你好世界"], return_tensors="pt")).last_hidden_state
        assert model.config.num_hidden_layers == 1
        torch.testing.assert_close(cut, full.hidden_states[1], msg=spec)  # = the first layer of the full encoder
