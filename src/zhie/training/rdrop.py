"""R-Drop (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"; Su's write-up kexue.fm/archives/8496).

Every item of a batch goes through the model twice (the batch is concatenated with itself, so one forward pass with
independent dropout masks for the two copies); the two outputs ``P1``, ``P2`` are pulled together:

    L = (L1 + L2) / 2 + alpha * (KL(P1 || P2) + KL(P2 || P1)) / 2

``L1``, ``L2``: the task's own loss of each copy; the KL terms are averaged over the labelled tokens (the positions
whose tag is not ``-100``). This is the paper's ``L1 + L2 + alpha/2 (KL + KL)`` divided by 2, so that ``alpha = 0``
gives exactly the plain loss (with the same learning rate) and ``alpha`` means what it means in the paper.

Which heads: those whose output is a probability distribution per token, the taggers (:class:`~zhie.heads.SoftmaxTagger`
and :class:`~zhie.heads.CrfTagger`, NER ``--head softmax|crf`` and ``cws``): ``P = softmax(emissions)`` per token
(for the CRF, the softmax of its emission scores, not the CRF's path marginals). GlobalPointer / Efficient
GlobalPointer, GPLinker and the sentence-pair losses are **refused**: span heads score every cell independently
against the threshold 0 (multilabel categorical cross-entropy, spec §0.2) and define no distribution over classes to
match (a per-cell Bernoulli ``sigmoid(2 s)`` would be one choice, but it is not R-Drop as published and is not
offered); a multi-task objective is refused too (its members would need one R-Drop each).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zhie.heads.tagger import IGNORE, SoftmaxTagger

__all__ = ["RDropLoss", "symmetric_kl"]


def symmetric_kl(logits1: Tensor, logits2: Tensor, mask: Tensor) -> Tensor:
    """``(KL(P1 || P2) + KL(P2 || P1)) / 2`` with ``P = softmax(logits)`` over the last axis, averaged over the
    positions where ``mask`` is true (fp32); 0 when no position is."""
    lp1, lp2 = F.log_softmax(logits1.float(), -1), F.log_softmax(logits2.float(), -1)
    kl = ((lp1.exp() * (lp1 - lp2)).sum(-1) + (lp2.exp() * (lp2 - lp1)).sum(-1)) / 2
    mask = mask.to(kl.device, torch.bool)
    return kl[mask].sum() / mask.sum().clamp(min=1)


class RDropLoss(nn.Module):
    """``RDropLoss(task, alpha)(model, batch)``: R-Drop of a single tagging task (see the module docstring); a drop-in
    replacement of the task's plain objective (no weights of its own). ``head`` is the task's head in the model,
    checked to be a tagger."""

    def __init__(self, task, alpha: float, head: nn.Module) -> None:
        super().__init__()
        if alpha < 0:
            raise ValueError(f"R-Drop alpha must be >= 0, got {alpha}")
        if not isinstance(head, SoftmaxTagger):
            raise ValueError(
                f"R-Drop (--rdrop) needs a head that outputs a distribution per token (the crf and softmax taggers); "
                f"the {task.name} task's {type(head).__name__} has none: GlobalPointer-style heads score each span "
                "cell on its own against the threshold 0 (multilabel categorical cross-entropy). Train without "
                "--rdrop, or with --head crf / --head softmax.")
        self.task = task
        self.alpha = alpha

    def forward(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        name = self.task.head_name
        ids, mask = batch["input_ids"], batch["attention_mask"]
        outputs = model(input_ids=torch.cat([ids, ids]), attention_mask=torch.cat([mask, mask]), heads=[name])[name]
        out1, out2 = outputs.chunk(2)
        head = model.heads[name]
        plain = (self.task.head_loss(head, out1, batch) + self.task.head_loss(head, out2, batch)) / 2
        labels = batch["labels"]
        if labels.shape != out1.shape[:2]:
            raise ValueError(f"R-Drop needs one tag per token: labels {tuple(labels.shape)}, "
                             f"emissions {tuple(out1.shape)}")
        return plain + self.alpha * symmetric_kl(out1, out2, labels != IGNORE)

    def log(self) -> dict:
        return {}
