"""Cross-lingual NER by multi-task, multi-teacher distillation (MTMT, ACL 2022; spec §10).

Three models, all word-level (one prediction per word, on its first sub-word: :mod:`zhie.core.words`):

* the **entity recogniser** (teacher 1) is an ordinary word-level NER model on the labelled source language:
  ``zhie train ner --mode word --head softmax`` (dropout -> linear -> softmax, CE on first sub-words, spec §10.2);
* the **similarity evaluator** (teacher 2) is the task ``xner-evaluator`` here: a Siamese encoder over two sentences
  each with one selected word; its prediction is ``σ(cos(e_1, e_2))`` of the two words' last hidden states (after
  dropout), trained with BCE against "the two words have the same BIO tag", on word pairs from
  :func:`zhie.losses.mtmt.sample_pairs` (class-balanced: the official loader's ``isequal``);
* the **student** (``zhie distill``): one fresh encoder + one linear head, trained on unlabelled target-language
  pairs with :func:`zhie.losses.mtmt.mtmt_loss`, is a job on the training engine: :mod:`zhie.training.mtmt`, which
  reads the target words through this module's :func:`word_inputs` and :func:`word_outputs`.

Like every task module this one imports torch only where it trains or runs a torch model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from zhie.core.metrics import prf
from zhie.core.options import check_options, option
from zhie.core.text import TextTokenizer
from zhie.core.words import word_heads, word_ranges, word_tags
from zhie.data import NerExample, read_ner
from zhie.tasks import register
from zhie.tasks.base import Task
from zhie.tasks.batching import device_of, model_inputs, sorted_batches
from zhie.tasks.cli_flags import check_max_length

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = ["XnerEvaluatorTask", "word_inputs", "word_outputs"]


# ------------------------------------------------------------------------------------------------- words in, rows out
def word_inputs(tt: TextTokenizer, text: str, max_length: int) -> tuple[list[int], list[int]]:
    """The content token ids of ``text`` (at most ``max_length - 2``) and, per word, the index of its first sub-word
    among them (-1: the word has none, or it lies past the cut)."""
    enc, size = tt(text), max_length - 2
    return enc.ids[:size], [h if 0 <= h < size else -1 for h in word_heads(enc, word_ranges(text))]


def pair_inputs(tt: TextTokenizer, a: list[list[int]], b: list[list[int]], a_word: list[int], b_word: list[int]
                ) -> dict[str, Tensor]:
    """A batch of B sentence pairs as 2B model inputs, the first sentences then the second ones; ``positions`` are
    the selected words' first sub-words in the model inputs (content index + 1 for ``[CLS]``)."""
    import torch

    batch = model_inputs([tt.model_input(ids) for ids in a + b], tt.pad_id)
    batch["positions"] = torch.tensor([w + 1 for w in a_word + b_word], dtype=torch.long)
    return batch


def selected_rows(output: Tensor, positions: Tensor) -> Tensor:
    """``output[b, positions[b]]`` in fp32: ``[2B, X]`` from ``[2B, n, X]``."""
    import torch

    return output[torch.arange(output.shape[0], device=output.device), positions].float()


def word_outputs(model, head_name: str, tt: TextTokenizer, inputs: list[tuple[list[int], list[int]]],
                 batch_size: int = 64) -> list[Tensor]:
    """Per sentence of ``inputs`` (from :func:`word_inputs`), the fp32 output of head ``head_name`` at each word's
    first sub-word, ``[n_words, X]`` on the CPU (a zero row for a word without one); without gradients."""
    import torch

    model.eval()
    device = device_of(model)
    out: list[Tensor] = [torch.zeros(0)] * len(inputs)
    with torch.no_grad():
        for idx in sorted_batches([len(ids) for ids, _ in inputs], batch_size):
            batch = model_inputs([tt.model_input(inputs[i][0]) for i in idx], tt.pad_id)
            y = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                      heads=[head_name])[head_name].float().cpu()
            for row, i in enumerate(idx):
                heads = torch.tensor(inputs[i][1], dtype=torch.long)
                out[i] = y[row, heads.clamp(min=0) + 1] * (heads >= 0).unsqueeze(-1)
    return out


# ------------------------------------------------------------------------------------------------- the evaluator
@dataclass
class EvaluatorConfig:
    tags: list[str]              # the BIO tags whose equality the evaluator learns
    mode: str = "subword"
    max_length: int = option(128, "tokens per sentence, [CLS] and [SEP] included (words past it are not paired)")
    pairs: int = option(20_000, "training word pairs (the official loader: up to 500k)")
    balanced: bool = option(True, "draw partners uniformly instead of half with the same tag (the official loader's "
                                  "isequal)", flags=("--no-balance",))
    dev_pairs: int = option(2_000, "development word pairs scored after each epoch")
    dropout: float = 0.1
    pair_seed: int = 0


@dataclass
class WordPair:
    a: list[int]
    a_word: int
    b: list[int]
    b_word: int
    label: float


@register
class XnerEvaluatorTask(Task):
    """MTMT's similarity evaluator: ``predict`` returns, per text, a float32 array ``[n_words, hidden]`` of its
    words' vectors (first sub-words); two words' similarity is ``σ(cos)`` of theirs."""

    name = "xner-evaluator"
    help = "MTMT similarity evaluator: do two words (in two sentences) carry the same entity tag? (spec 10.2)"
    config_class = EvaluatorConfig
    output_key = "word_vectors"
    metric = "f1"
    group_by_length = False

    def __init__(self, config: EvaluatorConfig, tokenizer) -> None:
        super().__init__(config, tokenizer)
        self.text_tokenizer = TextTokenizer(tokenizer, "subword")

    @classmethod
    def read(cls, path: str | os.PathLike, format: str = "auto") -> list[NerExample]:
        return read_ner(path, format)

    @classmethod
    def configure(cls, examples: list[NerExample], *, encoder: str, **options) -> EvaluatorConfig:
        """The config of the BIO tags of the entity types of ``examples`` and ``options``, :class:`EvaluatorConfig`'s
        option fields (the flags of ``zhie train xner-evaluator``)."""
        labels = sorted({s.label for ex in examples for s in ex.spans})
        config = EvaluatorConfig(["O"] + [f"{p}-{label}" for label in labels for p in "BI"],
                                 **check_options(EvaluatorConfig, options))
        check_max_length(config.max_length)
        return config

    def build_heads(self, hidden_size: int) -> dict[str, nn.Module]:
        from zhie.heads import WordVectors

        return {self.head_name: WordVectors(self.config.dropout)}

    def sentences(self, examples: list[NerExample]) -> tuple[list[tuple[list[int], list[int]]], list[list]]:
        """Each example's :func:`word_inputs` and its words' gold tags (None for a word that cannot be selected)."""
        inputs = [word_inputs(self.text_tokenizer, ex.text, self.config.max_length) for ex in examples]
        tags = [[tag if h >= 0 else None for h, tag in zip(heads, word_tags(word_ranges(ex.text), ex.spans))]
                for ex, (_, heads) in zip(examples, inputs)]
        return inputs, tags

    def pairs(self, examples: list[NerExample], n: int, seed: int) -> tuple[list, list[WordPair]]:
        from zhie.losses.mtmt import sample_pairs

        inputs, tags = self.sentences(examples)
        pairs = sample_pairs(tags, n, balanced=self.config.balanced, seed=seed)
        return pairs, [WordPair(inputs[i][0], inputs[i][1][w], inputs[j][0], inputs[j][1][v], float(same))
                       for (i, w), (j, v), same in pairs]

    def encode(self, examples: list[NerExample]) -> list[WordPair]:
        items = self.pairs(examples, self.config.pairs, self.config.pair_seed)[1]
        self.stats["pairs"], self.stats["positive_pairs"] = len(items), int(sum(it.label for it in items))
        return items

    def collate(self, items: list[WordPair]) -> dict[str, Tensor]:
        import torch

        batch = pair_inputs(self.text_tokenizer, [it.a for it in items], [it.b for it in items],
                            [it.a_word for it in items], [it.b_word for it in items])
        batch["labels"] = torch.tensor([it.label for it in items], dtype=torch.float32)
        return batch

    def head_loss(self, head: nn.Module, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Mean BCE of ``σ(cos(e_1, e_2))`` against the same-tag label."""
        from zhie.losses.mtmt import bce, sigmoid_cosine

        vectors = selected_rows(output, batch["positions"])
        half = batch["labels"].shape[0]
        return bce(sigmoid_cosine(vectors[:half], vectors[half:]), batch["labels"]).mean()

    def predict(self, model, texts: list[str], batch_size: int = 64, max_tokens: int | None = None
                ) -> list[np.ndarray]:
        """Per text, its words' vectors ``[n_words, hidden]``, in batches of ``batch_size`` sentences (``max_tokens``,
        of the Task protocol, is not used: the evaluator's sentences are short)."""
        inputs = [word_inputs(self.text_tokenizer, t, self.config.max_length) for t in texts]
        return [x.numpy() for x in word_outputs(model, self.head_name, self.text_tokenizer, inputs, batch_size)]

    def to_json(self, prediction: np.ndarray) -> list[list[float]]:
        return [[round(float(x), 6) for x in row] for row in prediction]

    def evaluate(self, model, examples: list[NerExample], batch_size: int = 64, max_tokens: int | None = None) -> dict:
        """F1 (and accuracy) of "same tag" = ``σ(cos) >= 0.5`` on ``dev_pairs`` class-balanced pairs of ``examples``
        (the official evaluator's sklearn F1), and their mean BCE."""
        import torch

        from zhie.losses.mtmt import bce, sigmoid_cosine

        pairs, items = self.pairs(examples, self.config.dev_pairs, self.config.pair_seed + 1)
        used = sorted({i for (i, _), (j, _), _ in pairs} | {j for _, (j, _), _ in pairs})
        inputs = [word_inputs(self.text_tokenizer, examples[i].text, self.config.max_length) for i in used]
        rows = dict(zip(used, word_outputs(model, self.head_name, self.text_tokenizer, inputs, batch_size)))
        a = torch.stack([rows[i][w] for (i, w), _, _ in pairs])
        b = torch.stack([rows[j][v] for _, (j, v), _ in pairs])
        sim, labels = sigmoid_cosine(a, b), torch.tensor([it.label for it in items])
        said = sim >= 0.5
        tp = int((said & (labels == 1)).sum())
        accuracy = float((said == (labels == 1)).float().mean())
        return {**prf(tp, int(said.sum()), int(labels.sum())), "accuracy": accuracy,
                "bce": float(bce(sim, labels).mean()), "pairs": len(pairs)}
