import json

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

import zhie
from zhie import encoders
from zhie.cli import main
from zhie.core.metrics import spearman
from zhie.data import DataError
from zhie.data.sts import read_pairs
from zhie.heads import Pooling
from zhie.losses import SbertObjective, cosent_loss
from zhie.model import Model
from zhie.tasks.similarity import SimilarityConfig, SimilarityTask
from zhie.training import TrainConfig

from .conftest import DATA

STSB = DATA / "sts" / "stsb"


@pytest.mark.needs_data
def test_read_pairs_stsb_and_atec():
    pairs = read_pairs(STSB / "train.data")
    assert len(pairs) == 5231 and pairs[0].text_a == "一架飞机要起飞了。" and pairs[0].label == 5.0
    assert {p.label for p in read_pairs(DATA / "sts" / "atec" / "valid.data")} == {0.0, 1.0}


def test_read_pairs_errors(tmp_path):
    for content, reason in [("a\tb\n", "3 tab-separated"), ("a\tb\tx\n", "not a number"), ("", "empty file"),
                            ("\tb\t1\n", "empty sentence"), ("a\tb\t1\na\tb\tnan\n", "p.data:2: label 'nan' is not a "
                                                                      "finite number"),
                            ("a\tb\t-inf\n", "not a finite number")]:
        (tmp_path / "p.data").write_text(content, encoding="utf-8")
        with pytest.raises(DataError, match=reason):
            read_pairs(tmp_path / "p.data")


def test_cosent_equals_sentence_transformers():
    from sentence_transformers.sentence_transformer.losses import CoSENTLoss

    st = CoSENTLoss.__new__(CoSENTLoss)  # no model needed for compute_loss_from_embeddings
    torch.nn.Module.__init__(st)
    st.scale, st.similarity_fct = 20.0, lambda a, b: torch.nn.functional.cosine_similarity(a, b)
    g = torch.Generator().manual_seed(0)
    for labels in (torch.randint(0, 2, (16,), generator=g), torch.randint(0, 6, (32,), generator=g),
                   torch.rand(8, generator=g)):
        a, b = torch.randn(len(labels), 24, generator=g), torch.randn(len(labels), 24, generator=g)
        cos = torch.nn.functional.cosine_similarity(a, b)
        expected = st.compute_loss_from_embeddings([a, b], labels.float())
        torch.testing.assert_close(cosent_loss(cos, labels), expected, rtol=1e-5, atol=1e-5)
    # only the order of the labels matters; no pair of pairs with different labels: log(1) = 0
    torch.testing.assert_close(cosent_loss(cos, labels * 5 + 1), cosent_loss(cos, labels))
    assert cosent_loss(cos, torch.ones(8)).item() == 0.0


def test_spearman_is_scipys_with_ties():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=200), rng.integers(0, 6, size=200)
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    x = rng.integers(0, 4, size=50)  # ties on both sides
    assert spearman(x, y[:50]) == pytest.approx(spearmanr(x, y[:50]).statistic, abs=1e-12)
    assert spearman([3, 1, 2, 2], [1, 3, 2, 2]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [4, 4, 4]) == 0.0  # undefined (constant labels) -> 0, not NaN


def test_pooling_ignores_padding_and_first_last_avg_uses_the_first_layer():
    texts = ["北京大学", "今天天气很好啊"]
    encoder, tokenizer = encoders.tiny(texts)
    for pooling in ("cls", "mean", "first-last-avg"):
        task = SimilarityTask(SimilarityConfig(pooling=pooling), tokenizer)
        model = Model(encoder, task.build_heads(encoder.config.hidden_size)).eval()
        together = task.embed(model, texts, normalize=False)
        alone = np.concatenate([task.embed(model, [t], normalize=False) for t in texts])
        np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5)
    enc = tokenizer(texts[:1], return_tensors="pt")
    out = encoder(**enc, output_hidden_states=True)
    expected = ((out.hidden_states[1] + out.hidden_states[-1]) / 2).mean(1)
    model = Model(encoder, {"v": Pooling("first-last-avg")}).eval()
    torch.testing.assert_close(model(enc["input_ids"], enc["attention_mask"])["v"], expected)


def test_sbert_and_cosine_mse_losses():
    texts = ["北京大学", "今天天气很好啊", "北京", "天气"]
    encoder, tokenizer = encoders.tiny(texts)
    pairs = [zhie.data.sts.Pair("北京大学", "北京", 2.0), zhie.data.sts.Pair("今天天气很好啊", "天气", 0.0)]
    task = SimilarityTask(SimilarityConfig(loss="sbert", pooling="mean", num_classes=3), tokenizer)
    model = Model(encoder, task.build_heads(encoder.config.hidden_size)).eval()  # eval: no dropout
    objective = task.objective(encoder.config.hidden_size)
    assert isinstance(objective, SbertObjective) and not any(k.startswith("heads") for k, _ in
                                                             model.named_parameters())  # the loss owns the classifier
    batch = task.collate(task.encode(pairs))
    u = model(batch["input_ids"], batch["attention_mask"])["similarity"]
    classifier = objective.softmax_loss.classifier
    logits = classifier(torch.cat([u[0::2], u[1::2], (u[0::2] - u[1::2]).abs()], -1))
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([2, 0]))
    torch.testing.assert_close(objective(model, batch), expected)
    task.config = SimilarityConfig(loss="cosine-mse", pooling="mean", label_min=0.0, label_max=4.0)
    cos = torch.nn.functional.cosine_similarity(u[0::2], u[1::2])
    torch.testing.assert_close(task.loss(model, batch), ((cos - torch.tensor([0.5, 0.0])) ** 2).mean())


@pytest.fixture(scope="module")
def stsb_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("sts")
    lines = (STSB / "train.data").read_text(encoding="utf-8").splitlines()[:300]
    (out / "train.data").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = TrainConfig(epochs=15, batch_size=32, lr=1e-3, head_lr=1e-3, warmup=0.05, seed=0, eval_every=10**9)
    zhie.fit("sts", out / "train.data", out / "train.data", out=out / "run", encoder="tiny", loss="cosent",
             pooling="mean", config=config, resume=False, progress=False)
    return out


@pytest.mark.needs_data
def test_tiny_cosent_model_learns_300_stsb_pairs(stsb_model):
    pipe = zhie.load(stsb_model / "run")
    assert pipe.evaluate(read_pairs(stsb_model / "train.data"))["spearman"] >= 0.8


@pytest.mark.needs_data
def test_encode_similarity_and_cli(stsb_model, tmp_path, capsys):
    pipe = zhie.load(stsb_model / "run")
    vectors = pipe.encode(["一架飞机要起飞了。", "一个人在吹长笛。"])
    assert vectors.shape == (2, 128) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    same = pipe.similarity("一架飞机要起飞了。", "一架飞机要起飞了。")
    assert same.shape == (1,) and same[0] == pytest.approx(1.0, abs=1e-5)
    cos = pipe.similarity(["一架飞机要起飞了。", "一个人"], ["一架飞机正在起飞。", "一个人"])
    assert cos.shape == (2,) and cos[1] == pytest.approx(1.0, abs=1e-5)

    assert main(["eval", str(stsb_model / "run"), "--data", str(stsb_model / "train.data"),
                 "--json", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["spearman"] >= 0.8
    capsys.readouterr()
    assert main(["embed", str(stsb_model / "run"), "一架飞机要起飞了。", "一个人"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["一架飞机要起飞了。", "一个人"]
    np.testing.assert_allclose(np.array(rows[0]["embedding"]), vectors[0], atol=1e-5)
    assert main(["embed", str(stsb_model / "run"), "一个人", "--output", str(tmp_path / "v.npy")]) == 0
    assert np.load(tmp_path / "v.npy").shape == (1, 128)
    assert main(["predict", str(stsb_model / "run"), "一个人"]) == 0  # zhie predict prints the same vectors
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    np.testing.assert_allclose(np.array(row["embedding"]), pipe.encode("一个人")[0], atol=1e-5)


def test_cli_trains_sts(tmp_path):
    data = tmp_path / "pairs.data"
    data.write_text("今天天气很好\t今天天气不错\t1\n我要吃饭\t今天天气不错\t0\n", encoding="utf-8")
    assert main(["train", "sts", "--train", str(data), "--dev", str(data), "--encoder", "tiny", "--out",
                 str(tmp_path / "run"), "--loss", "sbert", "--pooling", "first-last-avg", "--epochs", "1",
                 "--quiet"]) == 0
    meta = json.loads((tmp_path / "run" / "best" / "zhie.json").read_text())
    assert meta["task"] == "similarity" and meta["loss"] == "sbert" and meta["num_classes"] == 2
    assert meta["max_length"] == 64 and zhie.load(tmp_path / "run").task.name == "similarity"
