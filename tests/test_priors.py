"""Prior losses (spec §5.1.3): each derived prior equals the measured loss of a model that predicts the prior, on
real labels."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from zhie import encoders
from zhie.data import read_ner
from zhie.data.cws import read_segmented
from zhie.data.spo import read_spo
from zhie.data.sts import read_pairs
from zhie.heads import CrfTagger, EfficientGlobalPointer, GPLinkerHead, RelationLogits, SoftmaxTagger
from zhie.losses import cosent_loss, global_pointer_loss
from zhie.multitask.priors import cosent_prior, crf_prior, multilabel_prior, softmax_tagging_prior
from zhie.tasks.cws import CwsTask
from zhie.tasks.ner import NerTask
from zhie.tasks.ner_heads import NerConfig
from zhie.tasks.relation import RelationTask

from .conftest import DATA


def cws_batch(n: int = 64):
    examples = read_segmented(DATA / "cws/sxu/train.txt")[:n]
    _, tokenizer = encoders.tiny([ex.text for ex in examples])
    task = CwsTask(CwsTask.configure([], encoder="tiny", head="softmax"), tokenizer)
    items = task.encode(examples)
    return items, task.collate(items)


@pytest.mark.needs_data
def test_softmax_tagging_prior_is_the_loss_of_predicting_the_tag_frequencies():
    items, batch = cws_batch()
    tags = [it.tags for it in items]
    counts = Counter(t for row in tags for t in row)
    tagger = SoftmaxTagger(8, 4)
    torch.nn.init.zeros_(tagger.dense.weight)
    with torch.no_grad():
        tagger.dense.bias.copy_(torch.log(torch.tensor([counts[k] / sum(counts.values()) for k in range(4)])))
    emissions = tagger(torch.randn(*batch["input_ids"].shape, 8))
    measured = tagger.loss(emissions[:, 1:], batch["labels"][:, 1:]).item()
    assert measured == pytest.approx(softmax_tagging_prior(tags), rel=1e-5)


@pytest.mark.needs_data
def test_crf_prior_is_the_loss_of_the_tags_markov_chain():
    items, batch = cws_batch()
    tags = [it.tags for it in items]
    tagger = CrfTagger(8, ["S", "B", "M", "E"], "BMES")
    torch.nn.init.zeros_(tagger.dense.weight)
    torch.nn.init.zeros_(tagger.dense.bias)
    first = Counter(row[0] for row in tags)
    pairs = Counter((a, b) for row in tags for a, b in zip(row, row[1:]))
    with torch.no_grad():
        for i in range(4):
            leaving = sum(pairs[i, j] for j in range(4))
            tagger.crf.start_transitions[i] = math.log(first[i] / len(tags)) if first[i] else -1e9
            for j in range(4):  # a tag never seen leaving would make the chain lose mass: none here
                tagger.crf.transitions[i, j] = math.log(pairs[i, j] / leaving) if pairs[i, j] else -1e9
        tagger.crf.end_transitions.zero_()
    emissions = tagger(torch.randn(*batch["input_ids"].shape, 8))
    measured = tagger.loss(emissions[:, 1:], batch["labels"][:, 1:]).item()
    assert measured == pytest.approx(crf_prior(tags), rel=1e-4)


@pytest.mark.needs_data
def test_multilabel_prior_is_the_loss_of_one_logit_per_type():
    examples = read_ner(DATA / "ner/cluener/train.json")[:48]
    _, tokenizer = encoders.tiny([ex.text for ex in examples])
    labels = sorted({s.label for ex in examples for s in ex.spans})
    task = NerTask(NerConfig(labels, head="egp"), tokenizer)
    items = task.encode(examples)
    batch = task.collate(items)
    instances = []
    for it in items:
        n = len(it.ids)
        positives = Counter(k for _, _, k in set(it.spans))
        instances.append([(n * (n + 1) // 2 - positives[a], positives[a]) for a in range(len(labels))])
    prior, logits = multilabel_prior(instances)

    head = EfficientGlobalPointer(8, len(labels), mask_special=True)
    for p in head.parameters():
        torch.nn.init.zeros_(p)
    with torch.no_grad():  # the type's logit is (bias[2a+1] + bias[2a]) / 2
        head.bias_dense.bias.copy_(torch.tensor(logits).repeat_interleave(2))
    hidden = torch.randn(*batch["input_ids"].shape, 8)

    def measured(shift: float) -> float:
        out = head(hidden, batch["attention_mask"])
        out = torch.where(out > -1e4, out + shift, out)  # shift the valid cells only
        return global_pointer_loss(out, batch["labels"], mask_zero=True, reduction="mean").item()

    assert measured(0.0) == pytest.approx(prior, rel=1e-4)
    assert measured(0.2) > measured(0.0) and measured(-0.2) > measured(0.0)  # the prior logits are the best ones
    _, gplinker = multilabel_prior(instances, reduction="sum_heads_mean_batch")
    assert gplinker == logits


@pytest.mark.needs_data
def test_cosent_prior_is_the_loss_of_a_constant_cosine():
    labels = [p.label for p in read_pairs(DATA / "sts/stsb/train.data")[:320]]
    batches = [labels[i:i + 32] for i in range(0, len(labels), 32)]
    measured = sum(cosent_loss(torch.full((len(b),), 0.3), torch.tensor(b)).item() for b in batches) / len(batches)
    assert measured == pytest.approx(cosent_prior(batches), rel=1e-6)


@pytest.mark.needs_data
def test_gplinker_prior_is_the_loss_of_one_logit_per_head_in_each_module():
    """The three modules' valid cells: n(n+1)/2 for ``entity`` (triangle), n² for the linking modules."""
    examples = read_spo(DATA / "re/cmeie/train.jsonl")[:32]
    _, tokenizer = encoders.tiny([ex.text for ex in examples])
    task = RelationTask(RelationTask.configure(examples, encoder="tiny", max_length=128), tokenizer)
    items = task.encode(examples)
    batch = task.collate(items)
    head = GPLinkerHead(8, len(task.config.predicates), 8, efficient=True)
    for p in head.parameters():
        torch.nn.init.zeros_(p)
    logits = head(torch.randn(*batch["input_ids"].shape, 8), batch["attention_mask"])  # valid cells 0, others masked
    shifted = {}
    for name, triangle in (("entity", True), ("head_head", False), ("tail_tail", False)):
        heads = getattr(logits, name).shape[1]
        instances = []
        for it in items:
            n, positives = len(it.ids), Counter(k for k, _, _ in set(getattr(it, name)))
            cells = n * (n + 1) // 2 if triangle else n * n
            instances.append([(cells - positives[a], positives[a]) for a in range(heads)])
        _, prior_logits = multilabel_prior(instances, reduction="sum_heads_mean_batch")
        out = getattr(logits, name)
        shifted[name] = torch.where(out > -1e4, out + torch.tensor(prior_logits)[None, :, None, None], out)
    measured = task.head_loss(head, RelationLogits(**shifted), batch).item()
    assert measured == pytest.approx(task.prior_loss(items, 8), rel=1e-4)
