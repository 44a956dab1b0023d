"""Sentence embeddings trained on sentence pairs: CoSENT, the Sentence-BERT softmax objective, cosine-MSE.

Task ``similarity`` (``sts`` is the same task under its first name; ``zhie train sts`` and old model directories keep
working). The head is a :class:`zhie.heads.Pooling` (``cls``, ``mean`` or ``first-last-avg``, spec §4). Training
feeds a batch of B pairs as 2B sentences interleaved ``[a1, b1, a2, b2, …]`` (spec §4.1).

Losses, all in fp32: ``cosent`` (λ = 20, every pair of pairs in the batch), ``sbert`` (a classifier on
``[u; v; |u − v|]`` with cross-entropy, labels as classes; the classifier belongs to the loss,
:class:`zhie.losses.SoftmaxLoss`, and is not part of the saved model; cosine at test time) and ``cosine-mse`` (the
cosine regressed on the label scaled to [0, 1] with the training set's label range). Evaluation: Spearman between
cosine and label.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from zhie.core.decoding import POOLINGS, l2_normalize
from zhie.core.metrics import spearman
from zhie.core.options import check_options, option
from zhie.data.sts import Pair, read_pairs
from zhie.tasks import register
from zhie.tasks.base import Task
from zhie.tasks.batching import input_arrays, model_inputs, sorted_batches
from zhie.tasks.cli_flags import add_text_command, check_max_length, only_auto_format
from zhie.tasks.modeldir import rename_weights
from zhie.tasks.pipeline import CHUNK_LINES, Pipeline, stream_predictions

if TYPE_CHECKING:
    from torch import Tensor, nn

LOSSES = ("cosent", "sbert", "cosine-mse")


@dataclass
class SimilarityConfig:
    loss: str = option("cosent", "cosent: CoSENT over every pair of pairs of a batch; sbert: a classifier on [u; v; "
                                 "|u - v|], labels as classes; cosine-mse: the cosine regressed on the label",
                       choices=LOSSES)
    pooling: str = option("cls", "the sentence vector: cls, the last layer's first token; mean, the last layer over "
                                 "the tokens; first-last-avg, the first and last layers averaged, then over the tokens",
                          choices=POOLINGS)
    max_length: int = option(64, "tokens per sentence, special tokens included")
    prefix: str = ""          # put before every sentence (e5 models expect "query: "); configure's default: by encoder
    scale: float = 20.0       # CoSENT's lambda
    num_classes: int = 0      # sbert: labels are the classes 0 .. num_classes - 1
    label_min: float = 0.0    # cosine-mse: targets are (label - label_min) / (label_max - label_min)
    label_max: float = 1.0
    mode: str = "subword"     # the tokenizer's own tokens

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; use one of {', '.join(LOSSES)}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; use one of {', '.join(POOLINGS)}")
        if self.loss == "sbert" and self.num_classes < 2:
            raise ValueError("the sbert loss needs at least 2 label classes")
        if self.loss == "cosine-mse" and not self.label_max > self.label_min:
            raise ValueError("cosine-mse needs labels with more than one value")


@dataclass
class EncodedPair:
    a: list[int]
    b: list[int]
    label: float


class SentencePipeline(Pipeline):
    """A trained sentence encoder: ``predict``/``encode(texts)`` return a numpy array of vectors,
    ``similarity(a, b)`` the cosine of sentence pairs."""

    def encode(self, texts: list[str] | str, batch_size: int = 64, normalize: bool = True,
               max_tokens: int | None = None) -> np.ndarray:
        """``[n, hidden]`` float32 (one row for a single string: ``[1, hidden]``), in input order."""
        with self.autocast():
            return self.task.embed(self.model, [texts] if isinstance(texts, str) else list(texts), batch_size,
                                   normalize, max_tokens)

    def stream(self, texts: Iterable[str], batch_size: int = 64, max_tokens: int | None = None,
               chunk_size: int = CHUNK_LINES, normalize: bool = True) -> Iterator[np.ndarray]:
        """:meth:`Pipeline.stream` of ``encode``: one ``[hidden]`` vector per text, in order (zeros for a blank
        text)."""
        return stream_predictions(lambda chunk: self.encode(chunk, batch_size, normalize, max_tokens), texts,
                                  chunk_size)

    def similarity(self, a: list[str] | str, b: list[str] | str, batch_size: int = 64) -> np.ndarray:
        """``[n]`` cosines of ``a[i]`` and ``b[i]`` (a single string counts as a list of one)."""
        a, b = [a] if isinstance(a, str) else list(a), [b] if isinstance(b, str) else list(b)
        if len(a) != len(b):
            raise ValueError(f"similarity needs as many texts in a as in b, got {len(a)} and {len(b)}")
        return (self.encode(a, batch_size) * self.encode(b, batch_size)).sum(1)


@register
class SimilarityTask(Task):
    """Sentence vectors: ``predict`` returns a float32 array ``[len(texts), hidden]`` of L2-normalised vectors."""

    item_types = (EncodedPair,)  # its training items (stored teacher outputs load with them allowed)
    name = "similarity"
    aliases = ("sts",)
    help = "sentence embeddings from sentence pairs (CoSENT, Sentence-BERT, cosine-MSE)"
    config_class = SimilarityConfig
    output_key = "embedding"
    metric = "spearman"
    group_by_length = False  # CoSENT ranks the pairs of a batch against each other, so batches are random (§4.1)
    pipeline_class = SentencePipeline
    base_lr = 2e-5  # benchmarks/sts.py's rate: no head but the pooling, so the encoder alone learns the task

    @classmethod
    def add_arguments(cls, parser) -> None:
        super().add_arguments(parser)  # SimilarityConfig's options
        # not the field's default: a prefix not given follows the encoder (configure)
        parser.add_argument("--prefix", default=None, help='text put before every sentence (default: "query: " for e5)')

    @classmethod
    def read(cls, path: str | os.PathLike, format: str = "auto") -> list[Pair]:
        only_auto_format(format, "sentence pairs (s1 TAB s2 TAB label)")
        return read_pairs(path)

    @staticmethod
    def texts(examples: list[Pair]) -> list[str]:
        return [t for p in examples for t in (p.text_a, p.text_b)]

    @classmethod
    def vocabulary_texts(cls, examples: list[Pair], config: SimilarityConfig) -> list[str]:
        return [config.prefix + t for t in cls.texts(examples)]

    @classmethod
    def configure(cls, examples: list[Pair], *, encoder: str, prefix: str | None = None,
                  **options) -> SimilarityConfig:
        """The config of ``options``, :class:`SimilarityConfig`'s option fields (the flags of ``zhie train
        similarity``), and of the labels of ``examples``; ``prefix`` defaults to ``"query: "`` for e5 encoders and to
        nothing otherwise."""
        loss = check_options(SimilarityConfig, options).get("loss", SimilarityConfig.loss)
        labels = sorted({p.label for p in examples})
        if loss == "sbert" and any(y != int(y) or y < 0 for y in labels):
            raise ValueError(f"the sbert loss needs training labels 0, 1, 2, … (classes), got {labels[:5]}")
        if prefix is None:
            prefix = "query: " if "e5" in Path(str(encoder)).name.lower() else ""
        config = SimilarityConfig(**options, prefix=prefix, num_classes=int(labels[-1]) + 1 if loss == "sbert" else 0,
                                  label_min=labels[0], label_max=labels[-1])
        check_max_length(config.max_length)
        return config

    def build_heads(self, hidden_size: int) -> dict[str, nn.Module]:
        from zhie.heads import Pooling

        return {self.head_name: Pooling(self.config.pooling)}

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer([self.config.prefix + t for t in texts], truncation=True,
                              max_length=self.config.max_length)["input_ids"]

    def encode(self, pairs: list[Pair]) -> list[EncodedPair]:
        a, b = self.token_ids([p.text_a for p in pairs]), self.token_ids([p.text_b for p in pairs])
        return [EncodedPair(x, y, p.label) for x, y, p in zip(a, b, pairs)]

    def collate(self, items: list[EncodedPair]) -> dict[str, Tensor]:
        import torch

        batch = model_inputs([ids for it in items for ids in (it.a, it.b)], self.tokenizer.pad_token_id)
        batch["labels"] = torch.tensor([it.label for it in items], dtype=torch.float32)
        return batch

    def pair_vectors(self, model, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        vectors = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        heads=[self.head_name])[self.head_name]
        return vectors[0::2], vectors[1::2]  # the pairs were interleaved by collate

    def head_loss(self, head: nn.Module, vectors: Tensor, batch: dict[str, Tensor]) -> Tensor:
        import torch.nn.functional as F

        from zhie.dist import all_gather_with_grad
        from zhie.losses import cosent_loss, cosine_mse_loss

        c = self.config
        cos = F.cosine_similarity(vectors[0::2], vectors[1::2], dim=-1)
        if c.loss == "cosent":  # over the pairs of every process: the loss does not change with their number
            return cosent_loss(all_gather_with_grad(cos), all_gather_with_grad(batch["labels"]), c.scale)
        return cosine_mse_loss(cos, (batch["labels"] - c.label_min) / (c.label_max - c.label_min))

    def prior_loss(self, items: list[EncodedPair], batch_size: int) -> float:
        """CoSENT: ``log(1 + M)`` per batch (:func:`zhie.multitask.priors.cosent_prior`), over the items in a fixed
        random order cut into batches of ``batch_size``."""
        if self.config.loss != "cosent":
            raise ValueError(f"no prior loss is derived for the {self.config.loss} loss; use another weighting scheme")
        from zhie.multitask.priors import cosent_prior

        labels = [items[i].label for i in random.Random(0).sample(range(len(items)), len(items))]
        return cosent_prior([labels[i:i + batch_size] for i in range(0, len(labels), batch_size)])

    # distillation: the student matches the teacher's pair similarities over every pair of sentences of its batch
    hard_labels = False

    def distill_items(self, examples: list[Pair], texts: list[str], label) -> list[EncodedPair]:
        """The labelled pairs, and the unlabelled ``texts`` paired in order (the last of an odd number is left out);
        no label is read: the targets are the teacher's vectors."""
        return self.encode([*examples, *(Pair(a, b, 0.0) for a, b in zip(texts[0::2], texts[1::2]))])

    soft_temperature = False  # the student matches the teacher's pair similarities: nothing to soften

    def soft_targets(self, vectors: Tensor, batch: dict[str, Tensor], temperature: float) -> list:
        """Per pair, the teacher's two sentence vectors ``[2, d]`` (fp16)."""
        import torch

        return list(vectors.to(torch.float16).cpu().reshape(-1, 2, vectors.shape[-1]))

    def soft_batch(self, batch: dict[str, Tensor], targets: list) -> dict[str, Tensor]:
        import torch

        batch["soft_vectors"] = torch.cat(targets)  # interleaved as collate interleaves the pairs
        return batch

    def soft_loss(self, vectors: Tensor, batch: dict[str, Tensor], temperature: float) -> Tensor:
        from zhie.losses.distill import similarity_matrix_loss

        return similarity_matrix_loss(vectors, batch["soft_vectors"])

    def objective(self, hidden_size: int) -> nn.Module:
        from zhie.losses import SbertObjective, TaskLoss

        return SbertObjective(self, hidden_size) if self.config.loss == "sbert" else TaskLoss(self)

    def embed(self, model, texts: list[str], batch_size: int = 64, normalize: bool = True,
              max_tokens: int | None = None) -> np.ndarray:
        """``[len(texts), hidden]`` float32 sentence vectors, in input order (L2-normalised if ``normalize``); a blank
        text (empty or only whitespace) has the vector of zeros, which no text's normalised vector is; batches as in
        :func:`sorted_batches`."""
        ids = self.token_ids(texts)
        out = None
        plan = list(sorted_batches([len(r) for r in ids], batch_size, max_tokens))
        inputs = (input_arrays([ids[i] for i in batch_idx], self.tokenizer.pad_token_id) for batch_idx in plan)
        for batch_idx, (_, outputs) in zip(plan, model.each_arrays(inputs, heads=[self.head_name])):
            vectors = outputs[self.head_name]
            if out is None:
                out = np.zeros((len(texts), vectors.shape[-1]), dtype=np.float32)
            out[batch_idx] = l2_normalize(vectors) if normalize else vectors
        if out is None:
            return np.zeros((0, 0), dtype=np.float32)
        out[[i for i, text in enumerate(texts) if not text.strip()]] = 0.0
        return out

    def predict(self, model, texts: list[str], batch_size: int = 64, max_tokens: int | None = None) -> np.ndarray:
        return self.embed(model, texts, batch_size, normalize=True, max_tokens=max_tokens)

    def to_json(self, prediction: np.ndarray) -> list[float]:
        return [round(float(x), 6) for x in prediction]

    def evaluate(self, model, pairs: list[Pair], batch_size: int = 64, max_tokens: int | None = None) -> dict:
        texts = list(dict.fromkeys(self.texts(pairs)))
        row = {t: i for i, t in enumerate(texts)}
        vectors = self.embed(model, texts, batch_size, normalize=True, max_tokens=max_tokens)
        cos = [float(vectors[row[p.text_a]] @ vectors[row[p.text_b]]) for p in pairs]
        return {"spearman": spearman(cos, [p.label for p in pairs]), "pairs": len(pairs)}

    def describe(self) -> dict:
        c = self.config
        prefix = [f"every sentence is prefixed with {c.prefix!r} before it is encoded"] if c.prefix else []
        return {**super().describe(), "summary": f"sentence embeddings ({c.pooling} pooling) trained with the {c.loss} "
                                                 "loss; similarity is the cosine of two vectors",
                "pipeline_tag": "sentence-similarity", "metrics": ["spearmanr"],
                "limits": [f"max length {c.max_length} tokens per sentence (special tokens included); longer sentences "
                           "are truncated", *prefix]}

    @classmethod
    def add_commands(cls, commands) -> None:
        p = add_text_command(commands, cls, "embed", "sentence vectors from a trained sentence-embedding model",
                             vectors=True, options=embed_options, batch_size=64,
                             output_help="write an [n, hidden] float32 .npy file instead of JSON lines, one row per "
                                         "input line (zeros for a blank or skipped line), and its mask (v.npy: "
                                         "v.mask.npy, [n] bool: True where the row is a text's vector); to "
                                         "FILE.partial as they come, renamed at the end; after a failure the .partial "
                                         "files keep the rows done")
        p.add_argument("--no-normalize", action="store_true", help="raw pooled vectors, not L2-normalised")

    @classmethod
    def upgrade(cls, meta: dict, weights: dict[str, Tensor]) -> tuple[dict, dict[str, Tensor]]:
        """Format 1 (task ``sts``) saved the Sentence-BERT classifier, a training-only weight: it is dropped."""
        return meta, rename_weights(weights, {"classifier.": None})


def embed_options(args) -> dict:
    """The keywords of :meth:`SentencePipeline.stream` that ``zhie embed``'s flags give."""
    return {"normalize": not args.no_normalize}
