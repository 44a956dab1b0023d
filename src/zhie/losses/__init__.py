"""Losses. Every loss computes in fp32 whatever the input dtype and returns an fp32 tensor (MTMT's distillation
loss: :mod:`zhie.losses.mtmt`).

Multilabel categorical cross-entropy ("ZLPR", spec §0.2-§0.3, https://kexue.fm/archives/7359): for one
multilabel instance with raw scores ``s`` (no sigmoid/softmax), positives ``P`` and negatives ``N``,

    L = log(1 + sum_{i in N} exp(s_i)) + log(1 + sum_{j in P} exp(-s_j))

with the decision threshold at 0 (predict the classes with ``s > 0``).

Masked cells: the heads give masked cells the finite value :func:`zhie.heads.masking_value` (``-1e12`` in
fp32/bf16, ``-32752`` in fp16). The dense and soft losses treat every logit ``<= MASKED_LOGIT_THRESHOLD``
(``-1e4``) as masked: it is neither a negative nor a positive (bert4keras HEAD does the same for ``-inf``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "MASKED_LOGIT_THRESHOLD",
    "SbertObjective",
    "SoftmaxLoss",
    "TaskLoss",
    "cosent_loss",
    "cosine_mse_loss",
    "global_pointer_loss",
    "multilabel_categorical_crossentropy",
    "soft_multilabel_categorical_crossentropy",
    "sparse_multilabel_categorical_crossentropy",
]

MASKED_LOGIT_THRESHOLD = -1e4
"""Logits at or below this value are masked cells (no trained logit gets anywhere near it)."""

_REDUCTIONS = ("mean", "sum_heads_mean_batch", "none")


def _logsumexp_with_zero(x: Tensor) -> Tensor:
    """``logsumexp([x_1, ..., x_K, 0])`` over the last axis (the appended 0 logit is the threshold class)."""
    return torch.logsumexp(torch.cat([x, x.new_zeros(x.shape[:-1] + (1,))], dim=-1), dim=-1)


def multilabel_categorical_crossentropy(y_pred: Tensor, y_true: Tensor) -> Tensor:
    """Dense MCE over the last axis (spec §0.2); returns the per-instance loss ``y_pred.shape[:-1]`` (fp32).

    ``L = logsumexp([s_i for i in neg] + [0]) + logsumexp([-s_j for j in pos] + [0])``

    Args:
        y_pred: raw scores ``[..., K]``, any float dtype.
        y_true: 0/1 (or bool) labels of the same shape. Cells with ``y_pred <= MASKED_LOGIT_THRESHOLD``
            count neither as negatives nor as positives.
    """
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true {tuple(y_true.shape)} must have y_pred's shape {tuple(y_pred.shape)}")
    s = y_pred.float()
    valid = s > MASKED_LOGIT_THRESHOLD
    pos = y_true.to(device=s.device, dtype=torch.float32) > 0.5
    neg_in = torch.where(valid & ~pos, s, float("-inf"))
    pos_in = torch.where(valid & pos, -s, float("-inf"))
    return _logsumexp_with_zero(neg_in) + _logsumexp_with_zero(pos_in)


def soft_multilabel_categorical_crossentropy(y_pred: Tensor, y_soft: Tensor) -> Tensor:
    """Soft-label MCE (spec §0.2, https://kexue.fm/archives/9064); per-instance loss ``y_pred.shape[:-1]``.

    ``L = log(1 + sum_i (1 - t_i) e^{s_i}) + log(1 + sum_i t_i e^{-s_i})`` with targets ``t in [0, 1]``,
    computed as logsumexps of ``s_i + log(1 - t_i)`` and ``-s_i + log t_i`` with the 0 logit appended.
    ``log 0`` terms are left out (not evaluated), so ``t = 0`` / ``t = 1`` give exactly the dense loss and
    no NaN gradient. The calibrated probability of a class is ``sigmoid(2 s)``. Masked cells
    (``<= MASKED_LOGIT_THRESHOLD``) are ignored.
    """
    if y_soft.shape != y_pred.shape:
        raise ValueError(f"y_soft {tuple(y_soft.shape)} must have y_pred's shape {tuple(y_pred.shape)}")
    s = y_pred.float()
    t = y_soft.to(device=s.device, dtype=torch.float32).clamp(0.0, 1.0)
    valid = s > MASKED_LOGIT_THRESHOLD
    log_t = torch.log(torch.where(t > 0, t, torch.ones_like(t)))
    log_1mt = torch.log1p(-torch.where(t < 1, t, torch.zeros_like(t)))
    neg_in = torch.where(valid & (t < 1), s + log_1mt, float("-inf"))
    pos_in = torch.where(valid & (t > 0), -s + log_t, float("-inf"))
    return _logsumexp_with_zero(neg_in) + _logsumexp_with_zero(pos_in)


def sparse_multilabel_categorical_crossentropy(y_pred: Tensor, y_true_idx: Tensor, mask_zero: bool = False,
                                               epsilon: float = 1e-7) -> Tensor:
    """Sparse MCE (spec §0.3; bert4keras ``sparse_multilabel_categorical_crossentropy``, used by GPLinker).

    With ``a = log(1 + sum_{i in A} e^{s_i})`` over all classes and ``b = log sum_{i in P} e^{s_i}``:

        pos = log(1 + sum_{j in P} e^{-s_j})
        neg = log(1 + sum_{i in N} e^{s_i}) = a + log(1 - e^{b - a})   (clamped to [epsilon, 1] inside the log)

    Algorithm exactly as bert4keras: append a 0 logit; if ``mask_zero``, column 0 is the padding index and
    is set to ``+inf`` for the positive gather (padded positives contribute ``e^{-inf} = 0``) and to
    ``-inf`` for ``a`` and ``b``. One PyTorch addition: an instance whose positives are all padding gets
    ``neg = a`` directly, because ``logsumexp`` of an all ``-inf`` row has a NaN gradient in torch.

    Args:
        y_pred: scores ``[..., K]``, any float dtype.
        y_true_idx: integer indices of the positives ``[..., P]``; padded with 0 when ``mask_zero``
            (then class 0 is never a real class). Without ``mask_zero`` the indices must be distinct.
        mask_zero: reserve index 0 as padding.
        epsilon: clamp of ``1 - e^{b - a}`` (Keras ``K.epsilon()``).

    Returns the per-instance loss ``y_pred.shape[:-1]`` in fp32.
    """
    if y_true_idx.shape[:-1] != y_pred.shape[:-1]:
        raise ValueError(f"y_true_idx {tuple(y_true_idx.shape)} and y_pred {tuple(y_pred.shape)} must share "
                         "all axes but the last")
    s = y_pred.float()
    idx = y_true_idx.to(device=s.device, dtype=torch.long)
    zeros = s.new_zeros(s.shape[:-1] + (1,))
    s = torch.cat([s, zeros], dim=-1)
    if mask_zero:
        infs = zeros + float("inf")
        s_pos = torch.cat([infs, s[..., 1:]], dim=-1)
        s = torch.cat([-infs, s[..., 1:]], dim=-1)
    else:
        s_pos = s
    y_pos_1 = torch.cat([s_pos.gather(-1, idx), zeros], dim=-1)
    y_pos_2 = s.gather(-1, idx)
    pos_loss = torch.logsumexp(-y_pos_1, dim=-1)
    all_loss = torch.logsumexp(s, dim=-1)
    if mask_zero:
        has_pos = (idx != 0).any(-1)
    else:
        has_pos = torch.full(idx.shape[:-1], idx.shape[-1] > 0, dtype=torch.bool, device=s.device)
    y_pos_2 = torch.where(has_pos.unsqueeze(-1), y_pos_2, 0.0)  # finite dummy row; discarded below
    aux = torch.where(has_pos, torch.logsumexp(y_pos_2, dim=-1) - all_loss, float("-inf"))
    aux = torch.clamp(1 - torch.exp(aux), epsilon, 1)
    neg_loss = all_loss + torch.log(aux)
    return pos_loss + neg_loss


def global_pointer_loss(logits: Tensor, index_labels: Tensor, mask_zero: bool = True,
                        reduction: str = "mean") -> Tensor:
    """MCE of (Efficient) GlobalPointer logits against sparse span labels (spec §1.4, §3.1).

    Args:
        logits: ``[b, heads, n, n]`` masked span logits.
        index_labels: ``[b, heads, P]`` integer cells ``row * n + col`` of the gold spans/pairs, padded
            with 0 (cell 0 = ``([CLS], [CLS])`` is never a real label). No dense ``[b, heads, n, n]`` label
            tensor is ever built.
        mask_zero: index 0 is padding (see :func:`sparse_multilabel_categorical_crossentropy`); the
            ``([CLS], [CLS])`` cell then counts as neither positive nor negative.
        reduction: ``"mean"`` over batch x heads (GlobalPointer NER, §1.4); ``"sum_heads_mean_batch"``:
            summed over heads, averaged over the batch (GPLinker, §3.1); ``"none"``: the ``[b, heads]``
            losses.

    Returns an fp32 tensor (scalar unless ``reduction="none"``).
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {_REDUCTIONS}")
    if logits.dim() != 4 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits must be [batch, heads, n, n], got {tuple(logits.shape)}")
    b, h, n, _ = logits.shape
    if index_labels.dim() != 3 or tuple(index_labels.shape[:2]) != (b, h):
        raise ValueError(f"index_labels must be [{b}, {h}, P], got {tuple(index_labels.shape)}")
    loss = sparse_multilabel_categorical_crossentropy(logits.reshape(b, h, n * n), index_labels, mask_zero)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum_heads_mean_batch":
        return loss.sum(dim=1).mean()
    return loss


# ----------------------------------------------------------------------------------------------------
# sentence-pair losses (spec §4)
# ----------------------------------------------------------------------------------------------------
def cosent_loss(cos: Tensor, labels: Tensor, scale: float = 20.0) -> Tensor:
    """CoSENT: ``log(1 + sum_{(k, l): y_k < y_l} exp(scale * (c_k - c_l)))`` over every pair of pairs in the batch.

    ``cos [B]``: the cosine of each sentence pair; ``labels [B]``: their labels (only their order matters).
    One logsumexp with a 0 prepended over the whole ``B x B`` matrix: a scalar per batch, not a mean (spec §4.1).
    """
    cos, labels = cos.float() * scale, labels.float()
    diff = cos[:, None] - cos[None, :]                              # [k, l] = c_k - c_l
    diff = diff.masked_fill(labels[:, None] >= labels[None, :], -1e12)  # keep y_k < y_l
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff.flatten()]), dim=0)


class SoftmaxLoss(torch.nn.Module):
    """Sentence-BERT's classification objective (spec §4.1 baseline; sentence-transformers' ``SoftmaxLoss``):
    cross-entropy of ``classifier([u; v; |u - v|])`` against the pair's class. The classifier is a training-only
    weight that this loss owns: at test time only the cosine of ``u`` and ``v`` is used."""

    def __init__(self, hidden_size: int, num_classes: int) -> None:
        super().__init__()
        self.classifier = torch.nn.Linear(3 * hidden_size, num_classes)

    def forward(self, u: Tensor, v: Tensor, labels: Tensor) -> Tensor:
        logits = self.classifier(torch.cat([u, v, (u - v).abs()], dim=-1))
        return torch.nn.functional.cross_entropy(logits.float(), labels)


def cosine_mse_loss(cos: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error between each pair's cosine and its target (labels scaled to [0, 1] by the task)."""
    return torch.nn.functional.mse_loss(cos.float(), targets.float())


class TaskLoss(torch.nn.Module):
    """A task's loss as a module: ``TaskLoss(task)(model, batch) == task.loss(model, batch)``; no weights here."""

    def __init__(self, task) -> None:
        super().__init__()
        self.task = task

    def forward(self, model, batch: dict[str, Tensor]) -> Tensor:
        return self.task.loss(model, batch)

    def log(self) -> dict:
        """What the loss recorded since the last call, for the evaluation's record in ``metrics.jsonl`` (a multi-task
        loss: each step's per-task losses and weights); called at each evaluation."""
        return {}

    def step_log(self) -> dict:
        """The same for each step record in ``metrics.jsonl`` (a multi-task loss: its members' mean losses and
        weights since the last call)."""
        return {}


class SbertObjective(TaskLoss):
    """The Sentence-BERT objective of a similarity task with its classifier (trained with the model, not saved with
    it)."""

    def __init__(self, task, hidden_size: int) -> None:
        super().__init__(task)
        self.softmax_loss = SoftmaxLoss(hidden_size, task.config.num_classes)

    def forward(self, model, batch: dict[str, Tensor]) -> Tensor:
        u, v = self.task.pair_vectors(model, batch)
        return self.softmax_loss(u, v, batch["labels"].long())
