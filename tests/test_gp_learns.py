"""GlobalPointer always learns (issue 17, item 1).

Before the fix, ``zhie train ner --encoder tiny --head gp --lr 3e-3 --epochs 30 --batch-size 16`` on lines 301-500 of
CLUENER's train.json ended at train-set F1 0.0: the MCE's first gradients push every span logit down, GP has no
per-type offset to do that with, and the encoder made all its token states alike instead (mean cosine between tokens
0.30 -> 0.96 in 20 steps; ``benchmarks/gp_collapse.py``). GP now starts its cells at the prior logit of each type
(:meth:`zhie.heads.GlobalPointer.init_offsets`). Each head must learn that sample at lr 1e-3 and 3e-3, and find
entities in 200 sentences it never trained on (CLUENER's first 200 dev sentences).
"""

import math

import pytest
import torch

import zhie
from zhie.data import read_ner, write_ner_jsonl
from zhie.heads import GlobalPointer
from zhie.multitask.priors import multilabel_prior
from zhie.tasks.base import prepare_encoder
from zhie.tasks.ner import NerTask
from zhie.training import TrainConfig

from .conftest import DATA

# Epochs per head: the fewest that reach train F1 >= 0.9 with a margin at both learning rates, measured with seed 0 on
# this machine's CPU (2026-11-23; final train F1 at lr 1e-3 / 3e-3): gp 15 epochs 0.99 / 1.0 (12: 0.95 / 1.0);
# egp 20 epochs 0.94 / 1.0; crf 20 epochs 1.0 / 1.0; softmax is the slowest: 20 epochs 0.59 / 0.93, and at 1e-3 it
# passes 0.9 only at epoch 22 of a 40-epoch run.
EPOCHS = {"gp": 15, "egp": 25, "crf": 20, "softmax": 30}
# F1 on the 200 held-out sentences at least (a collapsed model finds nothing: 0.0). Measured with those epochs, seed 0,
# on this machine's CPU (2026-11-23; lr 1e-3 / 3e-3): gp 0.25 / 0.24, egp 0.23 / 0.25, crf 0.28 / 0.26; the softmax
# tagger learns the sample (0.98 / 1.0) but generalises least: 0.055 / 0.060.
HELD_OUT_F1 = {"gp": 0.15, "egp": 0.15, "crf": 0.15, "softmax": 0.03}


@pytest.fixture(scope="module")
def sample():
    return read_ner(DATA / "ner/cluener/train.json")[300:500]  # lines 301-500, the sample


@pytest.fixture(scope="module")
def held_out():
    return read_ner(DATA / "ner/cluener/dev.json")[:200]


@pytest.mark.needs_data
@pytest.mark.parametrize("lr", [1e-3, 3e-3])
@pytest.mark.parametrize("head", ["gp", "egp", "crf", "softmax"])
def test_each_head_learns_the_200_sentence_sample(head, lr, sample, held_out, tmp_path):
    write_ner_jsonl(sample, tmp_path / "train.jsonl")
    write_ner_jsonl(held_out, tmp_path / "held_out.jsonl")
    # the command (batch 16, lr for encoder and head alike, the CLI's warm-up 0.1), fewer epochs; the one
    # evaluation, at the end, is on the held-out sentences (it picks nothing)
    config = TrainConfig(epochs=EPOCHS[head], batch_size=16, lr=lr, head_lr=lr, seed=0, eval_every=10**9)
    summary = zhie.fit("ner", tmp_path / "train.jsonl", tmp_path / "held_out.jsonl", out=tmp_path / "run",
                       encoder="tiny", head=head, config=config, resume=False, progress=False)
    metrics = zhie.load(tmp_path / "run").evaluate(sample)
    assert metrics["micro"]["f1"] >= 0.9, metrics["micro"]
    assert summary["best"]["f1"] >= HELD_OUT_F1[head], summary["best"]


@pytest.mark.needs_data
def test_gp_starts_at_the_prior_logit_of_each_type(sample):
    _, tokenizer = prepare_encoder("tiny", texts=NerTask.texts(sample))
    task = NerTask(NerTask.configure(sample, encoder="tiny", head="gp"), tokenizer)
    items = task.encode(sample)
    prior = task.labeling.prior_logits
    assert len(prior) == len(task.config.labels) and all(p < -3 for p in prior)
    instances = [[(len(it.ids) * (len(it.ids) + 1) // 2 - sum(1 for s in set(it.spans) if s[2] == a),
                   sum(1 for s in set(it.spans) if s[2] == a)) for a in range(len(prior))] for it in items]
    assert prior == multilabel_prior(instances)[1]
    head = task.build_heads(128)["ner"]
    assert isinstance(head, GlobalPointer)
    batch = task.collate(items[:32])
    with torch.no_grad():
        hidden = torch.randn(*batch["input_ids"].shape, 128) * 0.5  # LayerNorm-sized states
        logits = head(hidden, batch["attention_mask"])
    valid = logits > -1e4
    for a, p in enumerate(prior):
        assert logits[:, a][valid[:, a]].mean().item() == pytest.approx(p, abs=0.3)
    # a task that has seen no data builds bert4keras's head: zero bias, logits around 0
    fresh = NerTask(task.config, tokenizer).build_heads(128)["ner"]
    assert torch.count_nonzero(fresh.dense.bias) == 0
    # --no-gp-prior-init: bert4keras's head even after seeing the data (reproduces the earlier GP rows of RESULTS.md)
    old = NerTask(NerTask.configure(sample, encoder="tiny", head="gp", gp_prior_init=False), tokenizer)
    old.encode(sample)
    assert torch.count_nonzero(old.build_heads(128)["ner"].dense.bias) == 0


def test_init_offsets_only_moves_the_bias_of_the_slowest_rope_pair():
    d = 64
    head = GlobalPointer(16, heads=3, head_size=d)
    weight = head.dense.weight.clone()
    head.init_offsets([-4.0, 0.5, -1.0])
    assert torch.equal(head.dense.weight, weight)
    bias = head.dense.bias.view(3, 2 * d)
    r = math.sqrt(4.0 * math.sqrt(d))
    assert bias[0, d - 2].item() == pytest.approx(r) and bias[0, 2 * d - 2].item() == pytest.approx(-r)
    assert torch.count_nonzero(bias[1]) == 0  # a non-negative prior keeps the zero bias
    assert torch.count_nonzero(bias) == 4
    # with zero states the logit is the offset times cos((j - i) theta): within 0.1% up to 256 tokens apart
    logits = head(torch.zeros(1, 257, 16))[0, 0]
    upper = torch.ones(257, 257, dtype=torch.bool).triu()
    assert logits[upper].min().item() == pytest.approx(-4.0, rel=1e-3)
    assert logits[upper].max().item() == pytest.approx(-4.0, rel=1e-3)
    with pytest.raises(ValueError, match="one logit per head"):
        head.init_offsets([-1.0])
