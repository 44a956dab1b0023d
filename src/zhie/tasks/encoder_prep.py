"""The encoder a training run starts from: :func:`prepare_encoder` loads it, keeps its first layers if asked and prunes
its vocabulary to the tokens the data needs (:func:`kept_token_ids`, also ``zhie pretrain --keep-tokens``).

No torch at import: :mod:`zhie.encoders` is imported by the function that loads.
"""

from __future__ import annotations

from zhie.core.text import TextTokenizer

# Characters kept when a large multilingual vocabulary is pruned for Chinese char-mode tasks.
CJK_CHARSET = "".join(map(chr, [*range(0x4E00, 0xA000), *range(0x3400, 0x4DC0), *range(0x21, 0x7F),
                                 *range(0x3000, 0x3040), *range(0xFF01, 0xFF5F), *range(0x2010, 0x2060)]))


def prepare_encoder(name: str, *, texts: list[str], mode: str = "char", keep_tokens: str = "auto",
                    layers: int | None = None, seed: int = 0, unshare: bool = False):
    """Load an encoder for training: optionally keep only its first ``layers`` layers and prune its vocabulary.

    ``keep_tokens`` (bert4keras's keep_tokens): ``"all"`` keeps the vocabulary as it is; ``"cjk"`` keeps the
    tokens of CJK ideographs, ASCII, CJK and full-width punctuation and of every character of ``texts``;
    ``"data"`` only those of ``texts``; ``"auto"`` is ``"cjk"`` for vocabularies over 50,000 tokens (e5-small's
    250k rows shrink to about 20k, which makes every optimiser step cheaper) and ``"all"`` otherwise. In sub-word
    mode (or a multi-task model with a sub-word member) only ``"data"`` prunes: it keeps the pieces that
    ``texts`` tokenise into, and their characters. Those texts then tokenise exactly as before (a Unigram or
    WordPiece tokenizer still finds its pieces), but unseen text may split into other pieces or ``<unk>``, so
    prune with ``"data"`` only for a closed set of texts (benchmarks, a fixed corpus); the other values keep the
    whole sub-word vocabulary. ``seed`` initialises the ``tiny`` encoder; ``unshare`` drops an ALBERT's layer
    sharing (spec §9.1).
    """
    from zhie import encoders

    model, tokenizer = encoders.load(name, texts=texts, seed=seed, unshare=unshare)
    if layers is not None:
        encoders.truncate_layers(model, layers)
    keep = kept_token_ids(tokenizer, keep_tokens, {c for text in texts for c in text})
    if keep is not None and mode != "char":
        keep = keep | {i for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in ids} \
            if keep_tokens == "data" else None
    if keep is not None:
        model, tokenizer = encoders.prune_vocab(model, tokenizer, keep)
    return model, tokenizer


def kept_token_ids(tokenizer, keep_tokens: str, chars: set[str]) -> set[int] | None:
    """The token ids ``keep_tokens`` keeps for char-mode text made of ``chars`` (see :func:`prepare_encoder`), or
    None when it keeps the whole vocabulary; :func:`zhie.encoders.prune_vocab` adds the special tokens."""
    if keep_tokens == "auto":
        keep_tokens = "cjk" if len(tokenizer) > 50_000 else "all"
    if keep_tokens not in ("all", "cjk", "data"):
        raise ValueError(f"unknown keep_tokens {keep_tokens!r}; use auto, all, cjk or data")
    if keep_tokens == "all":
        return None
    tt = TextTokenizer(tokenizer, "char")
    return {tt.char_id(c) for c in chars | (set(CJK_CHARSET) if keep_tokens == "cjk" else set())} - {None}

