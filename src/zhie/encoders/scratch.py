"""Encoders built at random, for training from scratch: :func:`build` (any transformers config, or one of zhie's
families), :func:`new` (with a tokenizer), :func:`parse_new` (the ``new:FAMILY[:key=value,...]`` specs and ``.json``
config files that :func:`zhie.encoders.load` takes), :func:`tiny` (a 2-layer BERT), and the character vocabularies
they build from training texts (:func:`char_vocab`, :func:`wordpiece_tokenizer`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from zhie.encoders.families import config_class, own_model_class

# ``new:FAMILY`` -> the config class's model_type; short keys of ``new:FAMILY:key=value`` -> config fields
FAMILIES = {"bert": "bert", "albert": "albert", "roformer": "roformer", "roformer-v2": "roformer_v2",
            "gau-alpha": "gau_alpha", "conv": "zhie_conv"}
SHORT_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
              "intermediate": "intermediate_size", "key_size": "attention_key_size", "embedding": "embedding_size",
              "act": "hidden_act", "chunk": "chunk_size", "max_length": "max_position_embeddings"}


def parse_new(spec: str):
    """``"new:gau-alpha:layers=4,hidden=256,normalization=squared_relu"`` or a config ``.json`` file ->
    ``(config, tokenizer source or None)``.

    Families: ``bert``, ``albert``, ``roformer``, ``roformer-v2``, ``gau-alpha``, ``conv``. Keys are the config's own
    fields (e.g. ``deepnorm=paper``, ``attention=flash``, ``initializer=xavier``, ``dilations=1-2-4-1``) or the
    short names ``layers``, ``hidden``, ``heads``, ``intermediate``, ``key_size``, ``embedding``, ``act``, ``chunk``,
    ``max_length``, plus ``dropout`` (hidden and attention dropout) and ``tokenizer=DIR_OR_VOCAB_TXT`` (default: a
    character vocabulary built from the training texts, as for ``tiny``). Values are read as int, float,
    true/false/none, or text.
    """
    if not spec.startswith("new:"):
        fields = json.loads(Path(spec).read_text(encoding="utf-8"))
        if not isinstance(fields, dict) or "model_type" not in fields:
            raise ValueError(f"{spec}: an encoder config file is a JSON object with a model_type")
        tokenizer_source = fields.pop("tokenizer", None)
        return config_class(fields.pop("model_type"))(**fields), tokenizer_source
    family, _, options = spec[len("new:"):].partition(":")
    if family not in FAMILIES:
        raise ValueError(f"{spec!r}: unknown encoder family {family!r}; use one of {', '.join(FAMILIES)}")
    from transformers import PretrainedConfig

    cls = config_class(FAMILIES[family])
    known = set(cls().to_dict()) - set(PretrainedConfig().to_dict())
    fields, tokenizer_source = {}, None
    for item in filter(None, options.split(",")):
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"{spec!r}: {item!r} is not key=value")
        value = _parse_value(text)
        if key == "tokenizer":
            tokenizer_source = text
        elif key == "dropout":
            fields.update(hidden_dropout_prob=value, attention_probs_dropout_prob=value)
        elif SHORT_KEYS.get(key, key) in known:
            fields[SHORT_KEYS.get(key, key)] = value
        else:
            allowed = known | {k for k, v in SHORT_KEYS.items() if v in known} | {"dropout", "tokenizer"}
            raise ValueError(f"{spec!r}: {family} has no setting {key!r}; use one of {', '.join(sorted(allowed))}")
    return cls(**fields), tokenizer_source


def _parse_value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false", "none", "null"):
        return {"true": True, "false": False}.get(lowered)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def build(config, *, seed: int = 0) -> nn.Module:
    """A randomly initialised encoder for ``config`` (any transformers config, or zhie's RoFormerV2/GAU-α);
    the pooler that transformers adds to some families is dropped (zhie never uses it)."""
    from transformers import AutoModel

    own = own_model_class(config.model_type)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = own(config) if own else AutoModel.from_config(config)
    if getattr(model, "pooler", None) is not None:
        model.pooler = None
    return model


def new(config, *, texts: Iterable[str] | None = None, tokenizer=None, seed: int = 0):
    """``(build(config), tokenizer)`` with the vocabulary size and padding id taken from the tokenizer:
    ``tokenizer`` is an encoder directory or a ``vocab.txt``; None builds a character vocabulary from ``texts``."""
    if tokenizer is None:
        if texts is None:
            raise ValueError("a new encoder without tokenizer=... builds its vocabulary from training texts: "
                             "pass texts=...")
        tok = wordpiece_tokenizer(char_vocab(texts), max_length=config.max_position_embeddings)
    elif Path(tokenizer).is_file():
        vocab = Path(tokenizer).read_text(encoding="utf-8").splitlines()
        tok = wordpiece_tokenizer(vocab, max_length=config.max_position_embeddings)
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    config.vocab_size, config.pad_token_id = len(tok), tok.pad_token_id
    return build(config, seed=seed), tok


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny(texts: Iterable[str], *, seed: int = 0, hidden_size: int = 128, layers: int = 2, heads: int = 2,
         max_length: int = 512):
    """A random small BERT with one token per distinct (non-space) character of ``texts``."""
    from transformers import BertConfig, BertModel

    vocab = char_vocab(texts)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden_size,
                        max_position_embeddings=max_length, pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = BertModel(config, add_pooling_layer=False)
    return model, wordpiece_tokenizer(vocab, max_length=max_length)


def char_vocab(texts: Iterable[str]) -> list[str]:
    """BERT's special tokens, then every distinct non-space character of ``texts`` in sorted order."""
    return SPECIAL_TOKENS + sorted({c for text in texts for c in text if not c.isspace()})


def wordpiece_tokenizer(vocab: list[str], *, lowercase: bool = False, max_length: int = 512):
    """A BERT-style fast tokenizer over ``vocab`` (which must start with the BERT special tokens)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {token: i for i, token in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_length, unk_token="[UNK]",
                                   pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
