"""Chinese word segmentation: BMES tagging with a CRF or softmax head, on the NER machinery.

Words are spans with label ``""``; tags are S = 0, B = 1, M = 2, E = 3 (spec §8.1) and the CRF decodes with
the BMES constraints (no S->M, B->S, B->B, ...). Training sentences longer than ``max_length`` are cut at word
boundaries. :meth:`CwsTask.segment` always returns a partition of the text: joining the words gives the input
back exactly (whitespace runs are pieces of their own).
"""

from __future__ import annotations

from pathlib import Path

from zhie.data import NerExample
from zhie.metrics import segmentation_prf
from zhie.spans import Span
from zhie.tasks.base import resolve_model_dir
from zhie.tasks.ner import NerConfig, NerModel, NerTask

VOCAB_FILE = "train_words.txt"


def partition(text: str, spans: list[Span]) -> list[Span]:
    """Non-overlapping spans covering ``text`` exactly: the first of overlapping spans wins, gaps become pieces."""
    out: list[Span] = []
    pos = 0
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if span.start < pos:
            continue
        if span.start > pos:
            out.append(Span(pos, span.start, "", text[pos:span.start]))
        out.append(span)
        pos = span.end
    if pos < len(text):
        out.append(Span(pos, len(text), "", text[pos:]))
    return out


class CwsTask(NerTask):
    name = "cws"

    def __init__(self, config: NerConfig, tokenizer, train_vocab: set[str] | None = None):
        super().__init__(config, tokenizer)
        self.train_vocab = train_vocab or set()

    @staticmethod
    def make_config(head: str, max_length: int = 256) -> NerConfig:
        return NerConfig([""], head=head, mode="char", max_length=max_length, scheme="BMES")

    def split_long(self, examples: list[NerExample]) -> list[NerExample]:
        """Cut sentences at word boundaries into pieces of at most ``max_length - 2`` characters.

        A single word longer than that (none in SXU) is itself cut into pieces of that length.
        """
        size, out = self.config.max_length - 2, []
        for ex in examples:
            words = [Span(a, min(a + size, w.end), "", ex.text[a:min(a + size, w.end)])
                     for w in ex.spans for a in range(w.start, w.end, size)]
            start, piece = 0, []
            for word in words:
                if word.end - start > size and piece:
                    out.append(self._piece(ex.text, start, piece))
                    start, piece = word.start, []
                piece.append(word)
            if piece:
                out.append(self._piece(ex.text, start, piece))
        return out

    @staticmethod
    def _piece(text: str, start: int, words: list[Span]) -> NerExample:
        end = words[-1].end
        return NerExample(text[start:end], [Span(w.start - start, w.end - start, "", w.text) for w in words])

    def encode(self, examples: list[NerExample]):
        return super().encode(self.split_long(examples))

    def segment(self, model: NerModel, texts: list[str], batch_size: int = 32) -> list[list[Span]]:
        return [partition(text, spans) for text, spans in zip(texts, self.predict(model, texts, batch_size))]

    def evaluate(self, model: NerModel, examples: list[NerExample], batch_size: int = 32) -> dict:
        pred = self.segment(model, [ex.text for ex in examples], batch_size)
        words = [[s.text for s in ex.spans] for ex in examples]
        return segmentation_prf([ex.spans for ex in examples], pred, words, self.train_vocab)

    def save(self, model: NerModel, out: Path) -> Path:
        path = super().save(model, out)
        (path / VOCAB_FILE).write_text("\n".join(sorted(self.train_vocab)), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path):
        task, model = super().load(path)
        vocab_file = resolve_model_dir(path) / VOCAB_FILE
        task.train_vocab = set(vocab_file.read_text(encoding="utf-8").split("\n")) if vocab_file.exists() else set()
        return task, model


def train_cws(train_path, dev_path, *, out, encoder: str = "e5-small", head: str = "crf", max_length: int = 256,
              keep_tokens: str = "auto", encoder_layers: int | None = None, config=None, resume: bool = True,
              progress: bool = True) -> dict:
    """Train a segmenter on segmented text; the best model on ``dev_path`` goes to ``out/best``."""
    from zhie.data.cws import read_segmented
    from zhie.tasks.base import prepare_encoder
    from zhie.training import TrainConfig, train

    config = config or TrainConfig()
    train_examples, dev_examples = read_segmented(train_path), read_segmented(dev_path)
    enc, tokenizer = prepare_encoder(encoder, texts=[ex.text for ex in train_examples + dev_examples],
                                     keep_tokens=keep_tokens, layers=encoder_layers, seed=config.seed)
    vocab = {s.text for ex in train_examples for s in ex.spans}
    task = CwsTask(CwsTask.make_config(head, max_length), tokenizer, vocab)
    items = task.encode(train_examples)
    model = NerModel(enc, task.config)

    def evaluate(m: NerModel) -> dict:
        return {k: v for k, v in task.evaluate(m, dev_examples).items() if isinstance(v, float)}

    Path(out).mkdir(parents=True, exist_ok=True)
    return train(model, items, collate=task.collate, loss_fn=task.loss, config=config, out_dir=Path(out),
                 evaluate=evaluate, metric="f1", save_best=task.save, lengths=[len(it.ids) for it in items],
                 resume=resume, progress=progress)
