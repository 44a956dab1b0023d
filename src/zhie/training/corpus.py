"""The pre-training corpus (``zhie pretrain``): read, checked, cut into words and tokens, packed and shuffled.

The corpus is plain UTF-8 text, one paragraph (or sentence) per line, in one or more files. It is **streamed**: each
file is read line by line from a byte offset, never whole (:func:`iter_corpus`); :func:`scan_corpus` checks it all
before anything is written. Lines are cut into tokens (``char`` mode, one token per character as zhie's tasks read
text, or the tokenizer's ``subword`` tokens), their word boundaries taken from a segmenter (:func:`make_segmenter`:
``rjieba``, ``jieba``, or a zhie CWS model directory; :func:`encode_lines`), and **packed** (:class:`Packer`):
consecutive lines fill sequences of a given number of tokens, cut at a word boundary (a word longer than a whole
sequence is cut where it must). :class:`TrainingStream` makes them endlessly, pass after pass, through a **shuffle
buffer**, its whole state kept for an exact resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from zhie.data.base import DataError

MAX_LINE_BYTES = 1 << 20  # a longer "line" is not running text (or not text at all)


def iter_corpus(path: str | os.PathLike, offset: int = 0, line: int = 0) -> Iterator[tuple[int, int, str]]:
    """``(line number, byte offset after the line, text)`` for each line of ``path`` from byte ``offset`` (where
    line ``line`` ended), streamed. A NUL byte (a binary file), a line that is not UTF-8 or an over-long line raises
    :class:`DataError` with the file and line."""
    with open(path, "rb") as f:
        if offset == 0:  # a NUL byte near the start: a binary file, even if an earlier line is not UTF-8
            head = f.read(8192)
            if b"\0" in head:
                raise DataError(path, head[:head.index(b"\0")].count(b"\n") + 1,
                                "binary data (a NUL byte): the corpus must be UTF-8 text, one paragraph per line")
        f.seek(offset)
        while raw := f.readline(MAX_LINE_BYTES):
            line += 1
            if b"\0" in raw:
                raise DataError(path, line, "binary data (a NUL byte): the corpus must be UTF-8 text, one paragraph "
                                            "per line")
            if len(raw) >= MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise DataError(path, line, f"a line longer than {MAX_LINE_BYTES} bytes: the corpus must be text with "
                                            "one paragraph per line")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(path, line, f"not valid UTF-8 ({e.reason} at byte {e.start} of the line); convert "
                                            "the file to UTF-8 (e.g. iconv -f GB18030 -t UTF-8)") from None
            if line == 1:
                text = text.removeprefix("\ufeff")
            yield line, f.tell(), text.rstrip("\r\n")


@dataclass
class CorpusInfo:
    """What :func:`scan_corpus` learnt: non-blank lines per file, characters, the distinct characters, and where
    training starts (file index, byte offset, line) once the held-out lines are skipped."""

    lines: list[int]
    chars: int
    charset: set[str]
    heldout: list[str]
    start: tuple[int, int, int]
    sizes: list[int]


def scan_corpus(paths: list[Path], heldout: int) -> CorpusInfo:
    """Read the whole corpus once (streamed) to check it: every file exists, is UTF-8 text and has a non-blank line,
    and more than ``heldout`` lines remain for training. Raises before anything is written."""
    if not paths:
        raise ValueError("no corpus: give one or more text files (--corpus FILE ...)")
    lines, chars, charset, kept, start = [], 0, set(), [], None
    for index, path in enumerate(paths):
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such corpus file")
        if path.is_dir():
            raise IsADirectoryError(f"{path}: a directory; --corpus takes text files")
        count = 0
        for _lineno, offset, text in iter_corpus(path):
            if not text.strip():
                continue
            count += 1
            chars += len(text)
            charset.update(text)
            if len(kept) < heldout:
                kept.append(text)
                if len(kept) == heldout:
                    start = (index, offset, _lineno)
        if count == 0:
            raise DataError(path, 1, "no text: the file is empty or blank; a corpus file holds one paragraph per line")
        lines.append(count)
    if sum(lines) <= heldout:
        raise ValueError(f"the corpus has {sum(lines)} non-blank lines and the first {heldout} are held out for "
                         "evaluation: none is left to train on; lower --heldout or add text")
    return CorpusInfo(lines, chars, charset, kept, start or (0, 0, 0), [p.stat().st_size for p in paths])


# --------------------------------------------------------------------------------------- words, tokens, packing
def make_segmenter(name: str) -> Callable[[list[str]], list[list[str]]]:
    """``texts -> words of each text`` (joined, the words give the text back): rjieba, jieba or a zhie CWS model."""
    if name == "rjieba":
        try:
            import rjieba
        except ImportError:
            raise ValueError("--segmenter rjieba needs the rjieba package (pip install rjieba), or use "
                             "--segmenter jieba, a CWS model directory, or --mask char") from None
        return lambda texts: [rjieba.cut(t) for t in texts]
    if name == "jieba":
        try:
            import jieba
        except ImportError:
            raise ValueError("--segmenter jieba needs the jieba package (pip install jieba), or use "
                             "--segmenter rjieba, a CWS model directory, or --mask char") from None
        jieba.setLogLevel(60)
        return lambda texts: [jieba.lcut(t) for t in texts]
    if Path(name).is_dir():
        from zhie.tasks.pipeline import load_pipeline

        pipe = load_pipeline(name)
        if pipe.task.name != "cws":
            raise ValueError(f"--segmenter {name}: a {pipe.task.name!r} model; a segmenter is a cws model")
        return lambda texts: pipe.segment(texts, batch_size=64)
    raise ValueError(f"unknown segmenter {name!r}: use rjieba, jieba or a zhie CWS model directory")


def encode_lines(texts: list[str], text_tokenizer, segment: Callable | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each text -> ``(token ids int32, word starts bool)``: a token starts a word when its first character lies in
    another segmented word than the previous token's (``segment=None``: every token is a word, char masking)."""
    words = segment(texts) if segment is not None else [None] * len(texts)
    out = []
    for text, text_words in zip(texts, words):
        enc = text_tokenizer(text)
        ids = np.asarray(enc.ids, dtype=np.int32)
        if text_words is None:
            starts = np.ones(len(ids), dtype=bool)
        else:
            word_of_char = np.empty(len(text), dtype=np.int64)
            position = 0
            for w, word in enumerate(text_words):
                found = text.find(word, position) if word else position
                if found < 0:  # a segmenter that normalised the text: keep what is known, one word per char after
                    word_of_char[position:] = np.arange(w, w + len(text) - position)
                    position = len(text)
                    break
                word_of_char[position:found + len(word)] = w
                position = found + len(word)
            word_of_char[position:] = len(text_words) + np.arange(len(text) - position)
            token_chars = np.minimum(np.asarray(enc.starts, dtype=np.int64), max(len(text) - 1, 0))
            token_words = word_of_char[token_chars] if len(ids) else word_of_char[:0]
            starts = np.ones(len(ids), dtype=bool)
            starts[1:] = token_words[1:] != token_words[:-1]
        out.append((ids, starts))
    return out


class Packer:
    """Concatenates lines of tokens and cuts them into sequences of at most ``capacity`` content tokens, at a word
    start (a word longer than ``capacity`` is cut where it must)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ids: list[np.ndarray] = []
        self.starts: list[np.ndarray] = []
        self.size = 0

    def feed(self, ids: np.ndarray, starts: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Add one line; yield the sequences it completes."""
        if not len(ids):
            return
        starts = starts.copy()
        starts[0] = True  # a line starts a word
        self.ids.append(ids)
        self.starts.append(starts)
        self.size += len(ids)
        while self.size > self.capacity:
            ids, starts = np.concatenate(self.ids), np.concatenate(self.starts)
            candidates = np.flatnonzero(starts[1:self.capacity + 1]) + 1  # cut before a word start
            cut = int(candidates[-1]) if len(candidates) else self.capacity
            rest_starts = starts[cut:].copy()
            rest_starts[0] = True
            self.ids, self.starts, self.size = [ids[cut:]], [rest_starts], len(ids) - cut
            yield ids[:cut], starts[:cut]

    def flush(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The unfinished sequence, if any."""
        if self.size:
            ids, starts = np.concatenate(self.ids), np.concatenate(self.starts)
            self.ids, self.starts, self.size = [], [], 0
            yield ids, starts

    def state_dict(self) -> dict:
        return {"ids": torch.from_numpy(np.concatenate([np.zeros(0, np.int32), *self.ids])),
                "starts": torch.from_numpy(np.concatenate([np.zeros(0, bool), *self.starts]))}

    def load_state_dict(self, state: dict) -> None:
        ids, starts = state["ids"].numpy(), state["starts"].numpy()
        self.ids, self.starts, self.size = ([ids], [starts], len(ids)) if len(ids) else ([], [], 0)


def pack(lines: Iterable[tuple[np.ndarray, np.ndarray]], capacity: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Every sequence :class:`Packer` makes of ``lines``, the last (shorter) one included."""
    packer = Packer(capacity)
    for ids, starts in lines:
        yield from packer.feed(ids, starts)
    yield from packer.flush()


class TrainingStream:
    """Packed training sequences, endlessly (pass after pass over the corpus, each starting after the held-out
    lines), through a shuffle buffer. Its whole state (corpus position, packer, buffer, draws) is in
    :meth:`state_dict`, so a resumed run draws the same sequences."""

    def __init__(self, paths: list[Path], encode: Callable[[list[str]], list], capacity: int, *,
                 start: tuple[int, int, int], buffer_size: int, seed: int, chunk_lines: int = 64) -> None:
        self.paths, self.encode, self.start = paths, encode, start
        self.buffer_size, self.seed, self.chunk_lines = buffer_size, seed, chunk_lines
        self.packer = Packer(capacity)
        self.buffer: list[tuple[np.ndarray, np.ndarray]] = []
        self.file, self.offset, self.line = start
        self.passes = 0
        self.draws = 0
        self.pass_sequences = 0  # sequences made in the current pass

    def _fill(self) -> None:
        """Read up to ``chunk_lines`` lines, pack them into the buffer; at the end of the corpus, flush and rewind."""
        texts = []
        for lineno, offset, text in iter_corpus(self.paths[self.file], self.offset, self.line):
            self.offset, self.line = offset, lineno
            if text.strip():
                texts.append(text)
                if len(texts) == self.chunk_lines:
                    break
        else:  # end of this file
            self.file, self.offset, self.line = self.file + 1, 0, 0
        before = len(self.buffer)
        for ids, starts in self.encode(texts):
            self.buffer.extend(self.packer.feed(ids, starts))
        if self.file == len(self.paths):
            self.buffer.extend(self.packer.flush())
            self.file, self.offset, self.line = self.start
            self.passes += 1
        self.pass_sequences += len(self.buffer) - before
        if self.file == self.start[0] and self.offset == self.start[1]:
            if self.pass_sequences == 0:
                raise ValueError(f"the training part of the corpus ({', '.join(map(str, self.paths))}, after the "
                                 "held-out lines) has no token the tokenizer keeps")
            self.pass_sequences = 0

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        while len(self.buffer) < self.buffer_size:
            self._fill()
        i = int(np.random.default_rng([self.seed, self.draws]).integers(len(self.buffer)))
        self.draws += 1
        self.buffer[i], self.buffer[-1] = self.buffer[-1], self.buffer[i]
        return self.buffer.pop()

    def __iter__(self) -> TrainingStream:
        return self

    def state_dict(self) -> dict:
        lengths = [len(ids) for ids, _ in self.buffer]
        return {"file": self.file, "offset": self.offset, "line": self.line, "passes": self.passes,
                "draws": self.draws, "pass_sequences": self.pass_sequences, "packer": self.packer.state_dict(),
                "buffer_lengths": torch.tensor(lengths, dtype=torch.int64),
                "buffer_ids": torch.from_numpy(np.concatenate([np.zeros(0, np.int32), *(i for i, _ in self.buffer)])),
                "buffer_starts": torch.from_numpy(np.concatenate([np.zeros(0, bool), *(s for _, s in self.buffer)]))}

    def load_state_dict(self, state: dict) -> None:
        self.file, self.offset, self.line = state["file"], state["offset"], state["line"]
        self.passes, self.draws, self.pass_sequences = state["passes"], state["draws"], state["pass_sequences"]
        self.packer.load_state_dict(state["packer"])
        bounds = np.cumsum([0, *state["buffer_lengths"].tolist()])
        ids, starts = state["buffer_ids"].numpy(), state["buffer_starts"].numpy()
        self.buffer = [(ids[a:b], starts[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
