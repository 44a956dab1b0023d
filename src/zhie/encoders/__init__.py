"""Encoders: ``load(name_or_dir) -> (model, tokenizer)``, the one entry point that every other module uses to get an
encoder, and what is done to one before training. The names below are the package's; each lives in the module of its
concern:

* :mod:`~zhie.encoders.loading`: :func:`load` (directories, hub names, ``"e5-small"``, and the random encoders
  below), :func:`load_pretrained` with its strict check of the weights (:class:`WeightsMismatchError`),
  :func:`quiet_transformers`;
* :mod:`~zhie.encoders.scratch`: encoders built at random for training from scratch, :func:`build`, :func:`new`,
  :func:`parse_new` (``new:FAMILY[:key=value,...]``, a ``.json`` config), :func:`tiny`, and the character
  vocabularies they build from the training texts (:func:`char_vocab`, :func:`wordpiece_tokenizer`);
* :mod:`~zhie.encoders.families`: zhie's own classes by ``model_type`` (:func:`own_model_class`);
* :mod:`~zhie.encoders.prune`: making an encoder smaller (layers, feed-forward width, vocabulary);
* each of zhie's own families is a module of its own: :mod:`~zhie.encoders.gau` (RoFormerV2, GAU-α, FLASH,
  DeepNorm), :mod:`~zhie.encoders.conv`, :mod:`~zhie.encoders.student_bert`, :mod:`~zhie.encoders.albert` (ALBERT
  unsharing), :mod:`~zhie.encoders.e5` (multilingual-e5-small without the network), :mod:`~zhie.encoders.mlm` (MLM
  heads).
"""

from __future__ import annotations

from zhie.encoders.families import config_class, own_model_class
from zhie.encoders.loading import (
    PRETRAINING_HEADS,
    WeightsMismatchError,
    check_loading_info,
    is_random,
    load,
    load_pretrained,
    quiet_transformers,
)
from zhie.encoders.prune import (
    Activity,
    FfnActivity,
    ffn_importance,
    ffn_layers,
    prune_ffn,
    prune_vocab,
    select_layers,
    truncate_layers,
)
from zhie.encoders.scratch import (
    FAMILIES,
    SHORT_KEYS,
    SPECIAL_TOKENS,
    build,
    char_vocab,
    new,
    parse_new,
    tiny,
    wordpiece_tokenizer,
)

__all__ = ["FAMILIES", "PRETRAINING_HEADS", "SHORT_KEYS", "SPECIAL_TOKENS", "Activity", "FfnActivity",
           "WeightsMismatchError", "build", "char_vocab", "check_loading_info", "config_class", "ffn_importance",
           "ffn_layers", "is_random", "load", "load_pretrained", "new", "own_model_class", "parse_new", "prune_ffn",
           "prune_vocab", "quiet_transformers", "select_layers", "tiny", "truncate_layers", "wordpiece_tokenizer"]
