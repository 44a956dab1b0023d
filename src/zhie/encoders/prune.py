"""Making an encoder smaller, in place: fewer layers (:func:`truncate_layers`, :func:`select_layers`), narrower
feed-forward blocks (:func:`prune_ffn`, ranked by the neurons' activity: :class:`Activity`, :class:`FfnActivity`,
:func:`ffn_importance`), a smaller vocabulary (:func:`prune_vocab`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn


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
