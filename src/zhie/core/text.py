"""Tokenisation with exact character offsets, and windows over long texts.

An :class:`Encoding` holds the *content* tokens of one text (no ``[CLS]``/``[SEP]``): their ids and, per
token, the character range ``[start, end)`` of the original text it stands for. Model inputs add the
special tokens around a window of content tokens (:meth:`TextTokenizer.model_input`).

Two modes:

* ``char`` — one token per character, how Chinese NER and segmentation data are labelled. Each character
  is normalised by the tokenizer's own normaliser (full-width -> half-width, lower-casing, ... whatever the
  encoder was trained with) and looked up in the vocabulary (for SentencePiece vocabularies also with the
  ``▁`` prefix); a character missing from the vocabulary becomes the unknown token and keeps its offset.
  **Whitespace** (``str.isspace``: spaces, tabs, newlines, U+3000, ...) and characters that normalise to
  nothing (control characters) produce **no token**: they are never part of a token, a span can contain
  them but cannot start or end on them.
* ``subword`` — the fast tokenizer's own tokens and offsets (English and word-level data). Offsets are
  trimmed of surrounding whitespace; a token that stands for no character (a lone ``▁``) gets an empty
  range at the position of the next character.

Both modes guarantee: ``0 <= start <= end <= len(text)``, starts and ends never decrease, and
``text[start:end]`` of any token range is the text that range covers.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Encoding:
    text: str
    ids: list[int]
    starts: list[int]
    ends: list[int]
    _char_to_token: list[int] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def char_to_token(self) -> list[int]:
        """For each character, the first token that covers it, or -1 (whitespace, dropped characters)."""
        if self._char_to_token is None:
            table = [-1] * len(self.text)
            for t, (s, e) in enumerate(zip(self.starts, self.ends)):
                for c in range(s, e):
                    if table[c] < 0:
                        table[c] = t
            self._char_to_token = table
        return self._char_to_token

    def token_span_to_chars(self, start: int, end: int) -> tuple[int, int]:
        """Content tokens ``[start, end)`` -> characters ``[s, e)``."""
        return self.starts[start], self.ends[end - 1]

    def char_span_to_tokens(self, start: int, end: int) -> tuple[int, int] | None:
        """Characters ``[start, end)`` -> the content tokens ``[s, e)`` overlapping them, or None if none does."""
        first = bisect.bisect_right(self.ends, start)
        last = bisect.bisect_left(self.starts, end)
        return (first, last) if first < last else None


class TextTokenizer:
    """Wraps a transformers fast tokenizer; ``mode`` is ``"char"`` or ``"subword"``."""

    def __init__(self, tokenizer, mode: str = "char"):
        if mode not in ("char", "subword"):
            raise ValueError(f"unknown tokenisation mode {mode!r}; use 'char' or 'subword'")
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError("zhie needs a fast (tokenizers-backed) tokenizer for character offsets")
        self.tokenizer = tokenizer
        self.mode = mode
        self.cls_id = _first_id(tokenizer, "cls_token_id", "bos_token_id")
        self.sep_id = _first_id(tokenizer, "sep_token_id", "eos_token_id")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.unk_id = tokenizer.unk_token_id
        # the vocabulary's lookup, one piece at a time (get_vocab() would build a dict of every piece: 0.25 s at
        # e5-small's 250,002, at every load of a model)
        self._token_id = tokenizer.backend_tokenizer.token_to_id
        self._normalizer = tokenizer.backend_tokenizer.normalizer
        self._char_ids: dict[str, int | None] = {}
        # the token that stands for no character of its own (SentencePiece's lone metaspace; None: there is none)
        self._empty_id = self._token_id("\u2581")

    def __call__(self, text: str) -> Encoding:
        return self.encode_char(text) if self.mode == "char" else self.encode_subword(text)

    def char_id(self, char: str) -> int | None:
        """The token id of one character in char mode; None when it produces no token."""
        if char not in self._char_ids:
            self._char_ids[char] = self._lookup(char)
        return self._char_ids[char]

    def _lookup(self, char: str) -> int | None:
        if char.isspace():
            return None
        norm = self._normalizer.normalize_str(char).strip() if self._normalizer else char
        if not norm:
            return None
        for piece in (norm, "\u2581" + norm, char):
            token = self._token_id(piece)
            if token is not None:
                return token
        return self.unk_id

    def encode_char(self, text: str) -> Encoding:
        """One token per character (:meth:`char_id`), the characters that produce none left out. The characters are
        read from the cache of :meth:`char_id` in one pass; a text with characters not seen before first adds them."""
        table = self._char_ids
        try:
            ids = list(map(table.__getitem__, text))
        except KeyError:
            for char in set(text).difference(table):
                table[char] = self._lookup(char)
            ids = list(map(table.__getitem__, text))
        if None in ids:  # whitespace, control characters: no token
            starts = [i for i, token in enumerate(ids) if token is not None]
            ids = [ids[i] for i in starts]
            return Encoding(text, ids, starts, [s + 1 for s in starts])
        return Encoding(text, ids, list(range(len(ids))), list(range(1, len(ids) + 1)))

    def encode_subword(self, text: str) -> Encoding:
        out = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, starts, ends = list(out["input_ids"]), [], []
        for token, (s, e) in zip(ids, out["offset_mapping"]):
            if token == self._empty_id:
                s = e
            while s < e and text[s].isspace():
                s += 1
            while e > s and text[e - 1].isspace():
                e -= 1
            starts.append(s)
            ends.append(e)
        # empty tokens (a lone metaspace) sit at the next token's start; keep both sequences monotone
        nxt = len(text)
        for t in range(len(ids) - 1, -1, -1):
            if starts[t] == ends[t]:
                starts[t] = ends[t] = nxt
            nxt = starts[t]
        for t in range(1, len(ids)):
            starts[t] = max(starts[t], starts[t - 1])
            ends[t] = max(ends[t], ends[t - 1], starts[t])
        return Encoding(text, ids, starts, ends)

    def model_input(self, ids: list[int]) -> list[int]:
        """Content token ids -> model input ids with the special tokens (``[CLS] ids [SEP]``)."""
        return [self.cls_id, *ids, self.sep_id]


class FastTokenizer:
    """A model directory's ``tokenizer.json`` in the ``tokenizers`` library, with the part of a transformers fast
    tokenizer's interface that zhie reads (special token ids, vocabulary, normaliser, ``__call__`` with offsets and
    truncation), so that exports tokenise without transformers. The special tokens come from
    ``tokenizer_config.json`` / ``special_tokens_map.json``, as transformers reads them."""

    is_fast = True
    SPECIAL = ("cls", "sep", "pad", "unk", "bos", "eos")

    def __init__(self, backend, special_tokens: dict[str, str]) -> None:
        self.backend_tokenizer = backend
        backend.no_truncation()
        backend.no_padding()
        for name in self.SPECIAL:
            token = special_tokens.get(f"{name}_token")
            setattr(self, f"{name}_token_id", None if token is None else backend.token_to_id(token))

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> FastTokenizer:
        from tokenizers import Tokenizer

        directory = Path(directory)
        if not (directory / "tokenizer.json").exists():
            raise FileNotFoundError(f"{directory}: no tokenizer.json (a fast tokenizer's file); export the model again")
        special: dict[str, str] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            file = directory / name
            if file.exists():
                for key, value in json.loads(file.read_text(encoding="utf-8")).items():
                    if key.endswith("_token") and value is not None:
                        special[key] = value["content"] if isinstance(value, dict) else value
        return cls(Tokenizer.from_file(str(directory / "tokenizer.json")), special)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str | list[str], add_special_tokens: bool = True, return_offsets_mapping: bool = False,
                 truncation: bool = False, max_length: int | None = None) -> dict:
        """``{"input_ids", "offset_mapping"?}`` of one text, or of each of a list of texts (lists of rows)."""
        rows = [self._encode(t, add_special_tokens, max_length if truncation else None)
                for t in ([text] if isinstance(text, str) else text)]
        out = {"input_ids": [r.ids for r in rows]}
        if return_offsets_mapping:
            out["offset_mapping"] = [r.offsets for r in rows]
        return {k: v[0] for k, v in out.items()} if isinstance(text, str) else out

    def _encode(self, text: str, add_special_tokens: bool, max_length: int | None):
        backend = self.backend_tokenizer
        encoding = backend.encode(text, add_special_tokens=False)
        if max_length is not None:  # as transformers: the special tokens count towards max_length
            encoding.truncate(max(0, max_length - (backend.num_special_tokens_to_add(False) if add_special_tokens
                                                   else 0)))
        return backend.post_process(encoding, None, add_special_tokens) if add_special_tokens else encoding


def _first_id(tokenizer, *attrs: str) -> int:
    for attr in attrs:
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return value
    raise ValueError(f"tokenizer has none of {attrs}")


def windows(n_tokens: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """Token ranges ``[a, b)`` of at most ``size`` tokens covering ``range(n_tokens)``, consecutive ones
    overlapping by ``overlap`` tokens (one empty-free window ``(0, n_tokens)`` when the text fits)."""
    if size <= 0 or not 0 <= overlap < size:
        raise ValueError(f"need size > 0 and 0 <= overlap < size (size={size}, overlap={overlap})")
    out, start = [], 0
    while True:
        end = min(start + size, n_tokens)
        out.append((start, end))
        if end >= n_tokens:
            return out
        start = end - overlap


def reporting_window(windows: list[tuple[int, int]], start: int, end: int, *, cut_at_right_edge: bool = False
                     ) -> int | None:
    """The index of the one window of ``windows`` (from :func:`windows`) that reports the span of tokens
    ``[start, end)``, or None.

    A span is reported by a window that contains it whole, the one where it is most central: the largest distance
    from the span to the window's inner edges (an edge that is also the text's edge is no edge), the earlier
    window on a tie. ``cut_at_right_edge=True`` is for taggers, which see a span that crosses a window's right
    edge as one that ends there: a span ending at the right edge of a window that is not the last is then never
    reported by that window.

    Consequences, for every head (tested as a property in ``tests/test_windows.py``): a span of at most
    ``overlap`` tokens is whole in some window and reported exactly once; a span found in a window that sees only
    part of it is reported only when no window sees more of it. A span longer than the overlap may be whole in no
    window: the span heads (GP, EGP, GPLinker) then cannot find it at all, and a tagger reports only the part of
    it that lies in the later window (the part in the earlier window ends at that window's right edge).
    """
    n = windows[-1][1]
    best, best_margin = None, -1
    for i, (a, b) in enumerate(windows):
        if not a <= start < end <= b:
            continue
        if cut_at_right_edge and end == b < n:
            continue
        margin = min(start - a if a > 0 else n, b - end if b < n else n)
        if margin > best_margin:
            best, best_margin = i, margin
    return best
