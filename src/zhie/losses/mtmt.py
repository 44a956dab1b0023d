"""MTMT's formulas (ACL 2022, spec §10): the similarity layer, the teachers' per-example weights, the student's loss,
and the word-pair sampler. Tensors in, tensors out; the tasks that use them are in :mod:`zhie.tasks.xner`.

Notation (spec §10.3), per pair of sentences k = 1, 2, each with one selected word: teacher probabilities
``p^T_k`` (softmax of the recogniser's logits at the word's first sub-word), student probabilities ``p^S_k``,
teacher similarity ``s^T`` (the evaluator), student similarity ``s^S = σ(cos(h^S_1, h^S_2))`` of the student's
hidden states at the two words. All weights come from the teachers and are detached (official code, commit 9357445,
``trainers/mtmt_trainer.py``).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["MtmtWeights", "bce", "mtmt_loss", "mtmt_weights", "sample_pairs", "sigmoid_cosine"]


def sigmoid_cosine(a: Tensor, b: Tensor) -> Tensor:
    """``σ(cos(a, b))`` row by row (the evaluator's similarity layer, ``nn.CosineSimilarity(dim=1, eps=1e-6)`` then
    sigmoid): values in ``[σ(-1), σ(1)] ≈ [0.269, 0.731]``."""
    return torch.sigmoid(F.cosine_similarity(a, b, dim=-1, eps=1e-6))


def bce(prediction: Tensor, target: Tensor) -> Tensor:
    """Element-wise binary cross-entropy ``-(t log y + (1 - t) log(1 - y))`` with the logs clamped at -100, as
    ``nn.BCELoss(reduction="none")``; written out because ``F.binary_cross_entropy`` refuses to run under autocast."""
    prediction, target = prediction.float(), target.float()
    log_y = torch.log(prediction).clamp(min=-100)
    log_not_y = torch.log1p(-prediction).clamp(min=-100)
    return -(target * log_y + (1 - target) * log_not_y)


class MtmtWeights(NamedTuple):
    """The per-example weights of spec §10.3, each ``[B]``."""

    alpha_1: Tensor
    alpha_2: Tensor
    beta: Tensor
    gamma: Tensor


def mtmt_weights(teacher_p1: Tensor, teacher_p2: Tensor, teacher_sim: Tensor) -> MtmtWeights:
    """The weights of the official code, from the teachers only (detached)::

        α_k = (max_c p^T_k(c))²                    trust confident recogniser predictions
        β   = min(1, (2 s^T − 1)² + 0.5)           trust similarity targets far from 0.5 (the +0.5 and the clip)
        γ   = 1 − |σ(cos(p^T_1, p^T_2)) − s^T|     agreement of the recogniser's and the evaluator's similarity
    """
    p1, p2, s = teacher_p1.detach().float(), teacher_p2.detach().float(), teacher_sim.detach().float()
    beta = ((2 * s - 1) ** 2 + 0.5).clamp(max=1.0)
    gamma = 1 - (sigmoid_cosine(p1, p2) - s).abs()
    return MtmtWeights(p1.max(-1).values ** 2, p2.max(-1).values ** 2, beta, gamma)


def mtmt_loss(student_p1: Tensor, student_p2: Tensor, student_sim: Tensor, teacher_p1: Tensor, teacher_p2: Tensor,
              teacher_sim: Tensor, *, loss_alpha: float = 0.5, alpha: bool = True, beta: bool = True,
              gamma: bool = True, similarity: bool = True) -> Tensor:
    """The student's loss (spec §10.3; the official code's ``--weight_loss`` mode)::

        ℓ_ner,k = Σ_c (p^S_k(c) − p^T_k(c))²            ℓ_sim = BCE(s^S, s^T)
        L = loss_alpha · mean(γ β ℓ_sim) + ½ mean(γ α_1 ℓ_ner,1) + ½ mean(γ α_2 ℓ_ner,2)

    ``alpha``, ``beta``, ``gamma`` = False replace that weight by 1 (ablations); ``similarity=False`` drops the
    similarity term (the single-teacher TSL baseline is all four off). Inputs ``p`` are ``[B, C]`` probabilities,
    ``sim`` ``[B]``; the result is an fp32 scalar.
    """
    w = mtmt_weights(teacher_p1, teacher_p2, teacher_sim)
    one = torch.ones_like(w.beta)
    g = w.gamma if gamma else one
    ner_1 = ((student_p1.float() - teacher_p1.detach().float()) ** 2).sum(-1)
    ner_2 = ((student_p2.float() - teacher_p2.detach().float()) ** 2).sum(-1)
    loss = 0.5 * (g * (w.alpha_1 if alpha else one) * ner_1).mean() + 0.5 * (g * (w.alpha_2 if alpha else one)
                                                                           * ner_2).mean()
    if similarity:
        loss = loss + loss_alpha * (g * (w.beta if beta else one) * bce(student_sim, teacher_sim.detach())).mean()
    return loss


def sample_pairs(tags: Sequence[Sequence[Hashable | None]], n: int, *, balanced: bool = True, seed: int = 0
                 ) -> list[tuple[tuple[int, int], tuple[int, int], bool]]:
    """``n`` word pairs ``((sentence, word), (sentence, word), same tag)`` for the Siamese evaluator and the student.

    ``tags[i][w]`` is the tag of word ``w`` of sentence ``i`` (``None``: the word is left out). The first word of a
    pair is drawn uniformly from all words. ``balanced`` (the official loader's ``isequal``, spec §10.2): pairs
    alternate between a partner with the same tag and one with a different tag, each drawn uniformly from those
    words, so that half the pairs are positive; otherwise the partner is drawn uniformly too. A word is never paired
    with itself. Deterministic for a ``seed``.
    """
    positions = [(i, w) for i, row in enumerate(tags) for w, t in enumerate(row) if t is not None]
    by_tag: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, w in positions:
        by_tag[tags[i][w]].append((i, w))
    if len(positions) < 2:
        raise ValueError(f"{len(positions)} word(s) to pair: need at least 2")
    if balanced and len(by_tag) < 2:
        raise ValueError(f"every word has the tag {next(iter(by_tag))!r}: no pair with different tags to balance")
    if balanced and all(len(words) < 2 for words in by_tag.values()):
        raise ValueError("no two words share a tag: no pair with the same tag to balance")
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        anchor = positions[rng.randrange(len(positions))]
        tag = tags[anchor[0]][anchor[1]]
        if not balanced:
            partner = positions[rng.randrange(len(positions))]
        elif len(pairs) % 2 == 0:
            same = by_tag[tag]
            partner = same[rng.randrange(len(same))]
        else:
            partner = positions[rng.randrange(len(positions))]
            while tags[partner[0]][partner[1]] == tag:  # uniform over the words of other tags, by rejection
                partner = positions[rng.randrange(len(positions))]
        if partner != anchor:
            pairs.append((anchor, partner, tags[partner[0]][partner[1]] == tag))
    return pairs
