"""Prior losses for prior-loss normalisation (spec §5.1.3): the loss of a model that knows only the labels'
statistics, for each loss zhie trains with. Each function takes the training labels and returns that loss as the
training loop computes it (same reduction), so ``L_i / L_i^prior`` is 1 for a model that learned nothing but the
prior.

* **Softmax tagging** (token cross-entropy, mean over tagged tokens): the best input-blind model predicts the tag
  frequencies ``p`` at every token, and its loss is their entropy ``H(p) = -Σ_k p_k log p_k``.
* **CRF** (negative log-likelihood, mean over sequences): with no emissions, a linear-chain CRF whose start scores are
  ``log π(y)`` (first-tag frequencies) and transitions ``log P(y_t | y_{t-1})`` (bigram frequencies) is the Markov
  chain of the tags, whose partition function is 1 (the probabilities of all paths of a given length sum to 1).
  It is the maximum-likelihood input-blind CRF, and its loss is the chain's cross-entropy on the data:
  ``mean over sequences of -log π(y_0) - Σ_t log P(y_t | y_{t-1})``.
* **Multilabel categorical cross-entropy** (GP, EGP, GPLinker; one instance = one head of one text): an input-blind
  model gives every valid cell of head ``a`` the same logit ``s_a``. With ``N`` negative and ``P`` positive valid cells
  the instance's loss is ``log(1 + N e^s) + log(1 + P e^{-s})`` (optimal for that instance at ``s = ½ log(P/N)``,
  giving ``2 log(1 + √(NP))``); the prior model takes, per head, the ``s_a`` that minimises the mean over the
  training instances (a convex 1-d problem, solved by bisection on the derivative), and the prior loss is that
  minimum, reduced as the task reduces (mean over instances for NER; for GPLinker, summed over heads and averaged
  over texts).
* **CoSENT** (one logsumexp per batch): a model that knows no sentence gives every pair the same cosine, so every
  ``λ (c_k - c_l)`` is 0 and a batch's loss is ``log(1 + M)``, ``M`` the number of ordered pairs of pairs with
  ``y_k < y_l`` in it; the prior loss is its mean over the training batches.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from zhie.heads.tagger import IGNORE

__all__ = ["cosent_prior", "crf_prior", "multilabel_prior", "softmax_tagging_prior"]


def softmax_tagging_prior(tag_sequences: Sequence[Sequence[int]]) -> float:
    """``H(p)`` of the tag frequencies over every tagged token (tags ``-100`` are not tagged)."""
    counts = Counter(t for tags in tag_sequences for t in tags if t != IGNORE)
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values())


def crf_prior(tag_sequences: Sequence[Sequence[int]]) -> float:
    """The tags' Markov chain's negative log-likelihood, averaged over the (non-empty) sequences."""
    sequences = [[t for t in tags if t != IGNORE] for tags in tag_sequences]
    sequences = [s for s in sequences if s]
    first = Counter(s[0] for s in sequences)
    pairs = Counter((a, b) for s in sequences for a, b in zip(s, s[1:]))
    leaving = Counter(a for s in sequences for a in s[:-1])
    total = -sum(math.log(first[s[0]] / len(sequences)) for s in sequences)
    total -= sum(math.log(pairs[a, b] / leaving[a]) for s in sequences for a, b in zip(s, s[1:]))
    return total / len(sequences)


def _instance_loss(s: float, negatives: int, positives: int) -> float:
    """``log(1 + N e^s) + log(1 + P e^-s)``, computed stably."""
    def softplus_log(count: int, x: float) -> float:  # log(1 + count e^x)
        if count == 0:
            return 0.0
        z = math.log(count) + x
        return z + math.log1p(math.exp(-z)) if z > 0 else math.log1p(math.exp(z))
    return softplus_log(negatives, s) + softplus_log(positives, -s)


def _best_constant(instances: Sequence[tuple[int, int]]) -> float:
    """The ``s`` minimising the mean instance loss (convex): bisection on its derivative (each distinct
    ``(negatives, positives)`` pair once, times its count)."""
    counts = Counter(instances)

    def slope(s: float) -> float:
        total = 0.0
        for (n, p), count in counts.items():
            if n:
                total += count / (1 + math.exp(-(math.log(n) + s)))
            if p:
                total -= count / (1 + math.exp(-(math.log(p) - s)))
        return total
    lo, hi = -60.0, 60.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if slope(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def multilabel_prior(instances: Sequence[Sequence[tuple[int, int]]],
                     reduction: str = "mean") -> tuple[float, list[float]]:
    """``instances[b][a] = (negative valid cells, positive cells)`` of head ``a`` in text ``b`` -> (prior loss, the
    prior logit ``s_a`` of each head). ``reduction``: ``"mean"`` over texts x heads (GP/EGP NER) or
    ``"sum_heads_mean_batch"`` (GPLinker's modules)."""
    if reduction not in ("mean", "sum_heads_mean_batch"):
        raise ValueError(f"unknown reduction {reduction!r}")
    heads = len(instances[0])
    logits = [_best_constant([row[a] for row in instances]) for a in range(heads)]
    per_head = [sum(_instance_loss(logits[a], *row[a]) for row in instances) / len(instances) for a in range(heads)]
    return (sum(per_head) / heads if reduction == "mean" else sum(per_head)), logits


def cosent_prior(batch_labels: Sequence[Sequence[float]]) -> float:
    """Mean over batches of ``log(1 + #{(k, l): y_k < y_l})``."""
    def one(labels: Sequence[float]) -> float:
        return math.log1p(sum(a < b for a in labels for b in labels))
    return sum(one(labels) for labels in batch_labels) / len(batch_labels)
