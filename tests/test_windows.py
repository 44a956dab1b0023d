"""Windows never lose or cut an entity: for every offset of an entity of every length up to the overlap, in a text
several windows long, decoding gold-scored outputs through the tasks' own prediction path returns exactly the gold
spans, for GP, EGP, CRF, softmax and GPLinker."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zhie import encoders
from zhie.core.spans import Span
from zhie.heads import RelationLogits
from zhie.model import Model
from zhie.tasks.ner import NerTask
from zhie.tasks.ner_heads import NerConfig
from zhie.tasks.relation import RelationConfig, RelationTask

N, MAX_LENGTH, OVERLAP = 50, 18, 6  # windows of 16 content tokens: [0, 16), [10, 26), [20, 36), [30, 46), [40, 50)
TEXT = "".join(chr(0x4E00 + i) for i in range(N))  # distinct characters: a token id tells its position
SCORE = 10.0


class GoldModel(Model):
    """Stands in for encoder + head: scores the gold spans of the text in whatever window it is shown.

    ``gold(positions) -> output`` gets the text position of every input token (-1 for special tokens and padding);
    the task's real head is kept (the CRF tagger decodes with its own transitions and constraints), and the
    model's :meth:`~zhie.model.Model.arrays` hands the outputs to the task's numpy decoder as for a real model.
    """

    def __init__(self, task, gold) -> None:
        super().__init__(nn.Identity(), task.build_heads(8))
        self.gold = gold
        ids = task.text_tokenizer(TEXT).ids
        self.register_buffer("position", torch.full((max(ids) + 1,), -1, dtype=torch.long).index_put_(
            (torch.tensor(ids),), torch.arange(N)))

    def forward(self, input_ids, attention_mask, heads=None):
        positions = self.position[input_ids].masked_fill(attention_mask == 0, -1)
        positions[:, 0] = -1  # [CLS] (the tiny vocabulary's [CLS] id is below the text's ids anyway)
        return {name: self.gold(positions) for name in self.heads}


def cells(positions: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row: is token i the first token of [start, end), is token j the last (both must be in the row)."""
    return positions == start, positions == end - 1


def span_logits(start: int, end: int):
    def gold(positions):
        first, last = cells(positions, start, end)
        logits = torch.full((positions.shape[0], 1, positions.shape[1], positions.shape[1]), -SCORE)
        return logits.masked_fill((first[:, :, None] & last[:, None, :])[:, None], SCORE)
    return gold


def emissions(start: int, end: int):
    def gold(positions):
        tags = torch.zeros_like(positions)  # O
        tags[positions == start] = 1  # B-X
        tags[(positions > start) & (positions < end)] = 2  # I-X
        return torch.nn.functional.one_hot(tags, 3).float() * SCORE
    return gold


def relation_logits(subject: tuple[int, int], obj: tuple[int, int]):
    def gold(positions):
        b, n = positions.shape

        def grid(rows, cols):
            return torch.full((b, 1, n, n), -SCORE).masked_fill((rows[:, :, None] & cols[:, None, :])[:, None], SCORE)

        (s0, s1), (o0, o1) = cells(positions, *subject), cells(positions, *obj)
        return RelationLogits(torch.cat([grid(s0, s1), grid(o0, o1)], 1), grid(s0, o0), grid(s1, o1))
    return gold


@pytest.fixture(scope="module")
def tokenizer():
    return encoders.tiny([TEXT])[1]


@pytest.mark.parametrize("head", ["gp", "egp", "crf", "softmax"])
def test_every_entity_up_to_the_overlap_is_found_once_and_whole(head, tokenizer):
    task = NerTask(NerConfig(["X"], head=head, max_length=MAX_LENGTH, overlap=OVERLAP), tokenizer)
    assert len(task.text_tokenizer(TEXT)) == N and task.window == (MAX_LENGTH - 2, OVERLAP)
    for length in range(1, OVERLAP + 1):
        for start in range(N - length + 1):
            model = GoldModel(task, (span_logits if head in ("gp", "egp") else emissions)(start, start + length))
            (found,) = task.predict(model, [TEXT], batch_size=3)
            assert [(s.start, s.end, s.label) for s in found] == [(start, start + length, "X")], (start, length)


def test_every_triple_up_to_the_overlap_is_found_once(tokenizer):
    task = RelationTask(RelationConfig(["p"], max_length=MAX_LENGTH, overlap=OVERLAP), tokenizer)
    for length in range(2, OVERLAP + 1):
        for start in range(N - length + 1):
            subject, obj = (start, start + length // 2), (start + length // 2, start + length)
            (found,) = task.predict(GoldModel(task, relation_logits(subject, obj)), [TEXT], batch_size=3)
            assert [((t.subject.start, t.subject.end), t.predicate, (t.object.start, t.object.end))
                    for t in found] == [(subject, "p", obj)], (start, length)


@pytest.mark.parametrize("head", ["gp", "crf"])
def test_an_entity_in_no_window_whole(head, tokenizer):
    """Longer than the overlap and across a cut: the span heads cannot see it; a tagger reports the part in the later
    window (what the README and ``zhie.core.text.reporting_window`` say)."""
    task = NerTask(NerConfig(["X"], head=head, max_length=MAX_LENGTH, overlap=OVERLAP), tokenizer)
    start, end = 8, 18  # windows [0, 16) and [10, 26) each see part of it
    model = GoldModel(task, (span_logits if head == "gp" else emissions)(start, end))
    (found,) = task.predict(model, [TEXT])
    assert found == ([] if head == "gp" else [Span(10, 18, "X", TEXT[10:18], found[0].score)])
