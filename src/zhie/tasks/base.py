"""What every task shares: model directories on disk, padding, length-sorted prediction batches."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

import zhie
from zhie.encoders import WeightsMismatchError, quiet_transformers
from zhie.files import replace_dir

META_FILE = "zhie.json"
HEAD_FILE = "head.safetensors"


def save_model_dir(out: str | os.PathLike, model: nn.Module, tokenizer, meta: dict) -> Path:
    """Write ``model`` (with an ``encoder`` attribute) as an HF-style directory, atomically.

    The encoder's ``config.json`` + ``model.safetensors`` and the tokenizer files (so the directory is also
    a plain fine-tuned encoder for transformers), ``head.safetensors`` with every other weight, and
    ``zhie.json`` (task, labels, head and its hyper-parameters, zhie version).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with quiet_transformers():
            model.encoder.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        head = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                if not k.startswith("encoder.")}
        save_file(head, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        meta_text = json.dumps({**meta, "zhie_version": zhie.__version__}, ensure_ascii=False, indent=2)
        (tmp / META_FILE).write_text(meta_text, encoding="utf-8")
        tmp.chmod(0o755)

    replace_dir(out, write)
    return out


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A model directory, or a training run directory whose ``best/`` holds one."""
    path = Path(path)
    if not (path / META_FILE).exists() and (path / "best" / META_FILE).exists():
        return path / "best"
    return path


def read_meta(path: str | os.PathLike, task: str | None = None) -> dict:
    file = resolve_model_dir(path) / META_FILE
    if not file.exists():
        raise FileNotFoundError(f"{path}: no {META_FILE}; is this a model directory written by `zhie train`?")
    meta = json.loads(file.read_text(encoding="utf-8"))
    if task is not None and meta.get("task") != task:
        raise ValueError(f"{path} holds a {meta.get('task')!r} model, not {task!r}")
    return meta


def load_head_weights(model: nn.Module, path: str | os.PathLike) -> None:
    """Load ``head.safetensors`` into the non-encoder part of ``model``; any mismatch is an error."""
    weights = load_file(str(resolve_model_dir(path) / HEAD_FILE))
    expected = {k for k in model.state_dict() if not k.startswith("encoder.")}
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise WeightsMismatchError(f"{path}/{HEAD_FILE}: missing {missing}, unexpected {unexpected}")
    model.load_state_dict(weights, strict=False)


def pad(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> Tensor:
    """Right-pad integer rows into a ``[len(rows), length]`` long tensor."""
    length = max((len(r) for r in rows), default=0) if length is None else length
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


def sparse_cells(rows: list[list[tuple[int, int, int]]], heads: int, n: int) -> Tensor:
    """Per-row ``(head, i, j)`` content positions -> ``[b, heads, P]`` cells ``(i+1) * n + (j+1)``, 0-padded."""
    per_head = [[set() for _ in range(heads)] for _ in rows]
    for b, cells in enumerate(rows):
        for k, i, j in cells:
            per_head[b][k].add((i + 1) * n + j + 1)
    width = max([1] + [len(c) for row in per_head for c in row])
    out = torch.zeros(len(rows), heads, width, dtype=torch.long)
    for b, row in enumerate(per_head):
        for k, cells in enumerate(row):
            out[b, k, : len(cells)] = torch.tensor(sorted(cells), dtype=torch.long)
    return out


def sorted_batches(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Indices grouped into batches of similar length (longest first), for prediction."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for i in range(0, len(order), batch_size):
        yield order[i : i + batch_size]


# Characters kept when a large multilingual vocabulary is pruned for Chinese char-mode tasks.
CJK_CHARSET = "".join(map(chr, [*range(0x4E00, 0xA000), *range(0x3400, 0x4DC0), *range(0x21, 0x7F),
                                 *range(0x3000, 0x3040), *range(0xFF01, 0xFF5F), *range(0x2010, 0x2060)]))


def prepare_encoder(name: str, *, texts: list[str], mode: str = "char", keep_tokens: str = "auto",
                    layers: int | None = None, seed: int = 0):
    """Load an encoder for training: optionally keep only its first ``layers`` layers and prune its vocabulary.

    ``keep_tokens`` (bert4keras's keep_tokens; char mode only): ``"all"`` keeps the vocabulary as it is;
    ``"cjk"`` keeps the tokens of CJK ideographs, ASCII, CJK and full-width punctuation and of every character
    of ``texts``; ``"data"`` only those of ``texts``; ``"auto"`` is ``"cjk"`` for vocabularies over 50,000
    tokens (e5-small's 250k rows shrink to about 20k, which makes every optimiser step cheaper) and ``"all"``
    otherwise.

    On return torch's random generator is seeded with ``seed``, so the task heads built next start from the same
    weights in every run with that seed.
    """
    from zhie import encoders
    from zhie.text import TextTokenizer

    model, tokenizer = encoders.load(name, texts=texts, seed=seed)
    if layers is not None:
        encoders.truncate_layers(model, layers)
    if keep_tokens == "auto":
        keep_tokens = "cjk" if len(tokenizer) > 50_000 else "all"
    if keep_tokens not in ("all", "cjk", "data"):
        raise ValueError(f"unknown keep_tokens {keep_tokens!r}; use auto, all, cjk or data")
    if keep_tokens != "all" and mode == "char":
        chars = {c for text in texts for c in text} | (set(CJK_CHARSET) if keep_tokens == "cjk" else set())
        tt = TextTokenizer(tokenizer, "char")
        model, tokenizer = encoders.prune_vocab(model, tokenizer, {tt.char_id(c) for c in chars} - {None})
    torch.manual_seed(seed)
    return model, tokenizer


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


class Task:
    """A task's configuration and tokenizer, saved with its model as one directory and loaded back.

    Subclasses set ``name``, ``config_class`` (a dataclass, stored in ``zhie.json``) and ``model_class``
    (built as ``model_class(encoder, config)``, with the encoder as its ``encoder`` attribute).
    """

    name: str
    config_class: type
    model_class: type

    def __init__(self, config, tokenizer):
        self.config = config
        self.tokenizer = tokenizer

    def save(self, model: nn.Module, out: Path) -> Path:
        return save_model_dir(out, model, self.tokenizer, {"task": self.name, **self.config.__dict__})

    @classmethod
    def load(cls, path: str | os.PathLike):
        """``(task, model)`` from a model directory (or a run directory with ``best/``), in eval mode."""
        from zhie import encoders

        path = resolve_model_dir(path)
        meta = read_meta(path, cls.name)
        fields = cls.config_class.__dataclass_fields__
        config = cls.config_class(**{k: v for k, v in meta.items() if k in fields})
        encoder, tokenizer = encoders.load_pretrained(path)
        model = cls.model_class(encoder, config)
        load_head_weights(model, path)
        model.eval()
        return cls(config, tokenizer), model


class WindowedTask(Task):
    """What the span tasks share: model inputs and windowed prediction (config has ``mode``, ``max_length`` and
    ``stride``); subclasses implement ``decode(model, logits, attention_mask) -> one list of hits per row``."""

    def __init__(self, config, tokenizer):
        from zhie.text import TextTokenizer

        super().__init__(config, tokenizer)
        self.text_tokenizer = TextTokenizer(tokenizer, config.mode)

    @property
    def window(self) -> tuple[int, int]:
        """(content tokens per window, overlap between windows)."""
        size = self.config.max_length - 2
        return size, min(self.config.stride, size - 1)

    def collate_inputs(self, items) -> dict[str, Tensor]:
        """Items with ``ids`` (content tokens) -> ``input_ids`` with the special tokens and ``attention_mask``."""
        tt = self.text_tokenizer
        return {"input_ids": pad([tt.model_input(it.ids) for it in items], tt.pad_id),
                "attention_mask": pad([[1] * (len(it.ids) + 2) for it in items], 0)}

    @torch.no_grad()
    def window_rows(self, model: nn.Module, texts: list[str], batch_size: int, timings: dict | None = None):
        """Run the model over every window of every text, longest first; yield ``(text index, (a, b), encoding,
        decoded row)`` where the row's token positions are relative to the window start ``a``.

        ``timings`` (optional) accumulates ``model_s`` and ``decode_s``.
        """
        import time
        from types import SimpleNamespace

        from zhie.text import windows

        model.eval()
        device = device_of(model)
        size, stride = self.window
        encodings = [self.text_tokenizer(t) for t in texts]
        jobs = [(i, w) for i, enc in enumerate(encodings) if len(enc) for w in windows(len(enc), size, stride)]
        for batch_jobs in sorted_batches([b - a for _, (a, b) in jobs], batch_size):
            batch = self.collate_inputs([SimpleNamespace(ids=encodings[jobs[j][0]].ids[slice(*jobs[j][1])])
                                         for j in batch_jobs])
            mask = batch["attention_mask"].to(device)
            t0 = time.perf_counter()
            logits = model(input_ids=batch["input_ids"].to(device), attention_mask=mask)
            if timings is not None and device.type == "cuda":
                torch.cuda.synchronize()  # else the model's queued kernels are timed as decoding
            t1 = time.perf_counter()
            rows = self.decode(model, logits, mask)
            if timings is not None:
                timings["model_s"] = timings.get("model_s", 0.0) + t1 - t0
                timings["decode_s"] = timings.get("decode_s", 0.0) + time.perf_counter() - t1
            for j, row in zip(batch_jobs, rows):
                i, window = jobs[j]
                yield i, window, encodings[i], row
