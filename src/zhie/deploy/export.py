"""``zhie export DIR --out OUT [--opset N] [--quantize int8 [--per-channel] [--reduce-range] [--keep-fp32 PATTERN]
[--calibrate FILE]]``: a model directory as an ONNX graph plus what decodes it.

The graph (``model.onnx``) holds the encoder and the heads' logits: inputs ``input_ids`` and ``attention_mask``
(int64 ``[batch, length]``, both axes dynamic), one output per head tensor, in the order of
:func:`output_layout` (a head whose output is a dataclass, GPLinker's :class:`~zhie.heads.RelationLogits`, gives
one output per field, ``NAME.FIELD``). Decoding stays outside the graph and is zhie's own numpy decoders
(:mod:`zhie.core.decoding`, the torch model's too): thresholding for GP/EGP/GPLinker, constrained Viterbi for the CRF,
argmax for softmax, windows for long texts. :mod:`zhie.deploy.runtime` runs an export without torch. A convolutional
encoder's embeddings (projection and LayerNorm) are folded into their table first
(:func:`zhie.encoders.conv.fold_embeddings`: the same function, one matrix product and one LayerNorm fewer per token).

The export directory is a model directory without the encoder's weights: ``config.json``, the tokenizer files,
``zhie.json``, ``head.safetensors`` (the heads' weights: decoding reads the CRF's transitions there; the BIO/BMES
constraints follow from the tags in ``zhie.json``), the task's own files, ``model.onnx`` and ``export.json`` (opset,
quantisation, outputs, the largest difference to torch's logits measured at export). ``zhie.load(OUT)`` runs it on
onnxruntime. ``--quantize int8``: onnxruntime's dynamic quantisation (int8 weights of the matrix products and of the
embedding's Gather, one scale per tensor), with each token's activations quantised at run time with a scale of their
own (:func:`token_scales`), so that a text's answer never depends on the texts batched with it; its outputs differ
from fp32's (``int8_max_abs_diff`` in ``export.json``). Its variants (issues 25 and 51), each one option of
:func:`export`:

- ``batch_scales``: one activation scale per run, for the whole batch, as onnxruntime makes it (faster: no graph
  rewrite; but a text's entities can change with the texts batched with it, in ``zhie serve`` another client's);

- ``per_channel``: one scale per output channel of each weight instead of one per tensor;
- ``reduce_range``: 7-bit weights. onnxruntime multiplies uint8 activations by int8 weights; on an x86 CPU without
  VNNI (AVX2 only) its kernel adds pairs of products in int16, which saturates when both are large, and 7-bit
  weights cannot saturate. On the tiny test model on an AVX2 CPU it cut the mean logit error 4x (per tensor) and 30x
  (per channel, whose weights fill the whole int8 range far more often);
- ``keep_fp32``: weights whose name contains one of these substrings stay fp32 (the nodes that read them are left
  out of quantisation). The names are the torch model's parameter names:
  ``model.encoder.embeddings.word_embeddings.weight`` (the embedding's Gather, most of a multilingual encoder's
  weights), ``model.encoder.encoder.layer.N.attention.self.query.weight`` …
  ``model.encoder.encoder.layer.N.output.dense.weight`` (a BERT layer's six matrix products),
  ``model.heads.NAME.dense.weight``. The exporter folds each Linear's transposed weight into an anonymous constant
  (``val_93``); such a constant is named after the module of the node that reads it (:func:`weight_names`). Useful
  patterns: ``embeddings``, ``layer.11.`` (e5-small's last layer; the trailing dot keeps ``layer.1.`` from matching
  ``layer.10.``), ``heads.``. A pattern that matches no weight is an error;
- ``calibration``: texts for static quantisation (``quantize_static``, QDQ format, int8 weights and uint8 activations
  whose ranges are measured on these texts, tokenised as the task reads them) instead of dynamic; the same operators
  as dynamic (matrix products with a constant weight, the embedding's Gather) are quantised. The activations are
  uint8, as onnxruntime's x86 kernels take them: given int8 ones, onnxruntime 1.32 rewrites them to uint8 when it
  loads the graph, and on graphs that slice a quantised tensor (Efficient GlobalPointer, GPLinker) that rewrite wrote
  a ``QuantizeLinear`` it then refused to load.

A multi-task model exports as one graph with every member's head; its members decode from it as from the torch model.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from zhie.core import card
from zhie.core.options import option
from zhie.core.text import TextTokenizer
from zhie.deploy import runtime
from zhie.deploy.runtime import EXPORT_FILE, GRAPH_FILE, INPUTS, is_export
from zhie.tasks.batching import model_inputs
from zhie.tasks.modeldir import resolve_model_dir, save_model_dir
from zhie.version import __version__

ENCODER_WEIGHTS = "model.safetensors"
# 23: the first opset with ONNX's own Attention operator, which the exporter writes for scaled dot-product attention
# (18, its own default, spells it out in ~15 nodes a layer). On e5-small (CLUENER, 2 CPU threads) onnxruntime then
# ran fp32 10 % and dynamic int8 10 % faster (benchmarks/RESULTS.md, "Serving and export")
DEFAULT_OPSET = 23
FP32_TOLERANCE = 1e-3  # export fails if the graph's logits differ from torch's by more on its check texts
CALIBRATION_BATCH = 16  # texts per calibration batch of static quantisation
WEIGHT_OPS = ("MatMul", "Gemm", "Gather", "Conv")  # the operators whose constant weights int8 quantises
CHECK_TEXTS = ("王伟在青山市的远华大学工作了很多年，后来去了临江县。", "好",
               "记者从恒信银行获悉，李娜将前往北宁县考察。")


def output_layout(outputs: dict) -> dict[str, list[str] | None]:
    """Per head, ``None`` for a tensor output, or the field names of a dataclass output (each one graph output)."""
    return {name: None if isinstance(value, Tensor) else [f.name for f in dataclasses.fields(value)]
            for name, value in outputs.items()}


def flatten(outputs: dict) -> list[Tensor]:
    """The head outputs as the graph's list of tensors (the order of :func:`output_layout`)."""
    return [t for value in outputs.values()
            for t in ([value] if isinstance(value, Tensor) else [getattr(value, f.name)
                                                                 for f in dataclasses.fields(value)])]


def output_names(layout: dict[str, list[str] | None]) -> list[str]:
    return [name if fields is None else f"{name}.{field}" for name, fields in layout.items() for field in
            (fields or [None])]


class Graph(nn.Module):
    """``model`` with tensor inputs and a tuple of tensors out: what ``torch.onnx.export`` traces."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        return tuple(flatten(self.model(input_ids=input_ids, attention_mask=attention_mask)))


def check_inputs(task, texts: Sequence[str]) -> dict[str, Tensor]:
    """Model inputs of ``texts`` as the task builds them (rows of different lengths, right-padded; a text longer
    than the task's ``max_length`` is cut to its first window)."""
    tt = TextTokenizer(task.tokenizer, getattr(task.config, "mode", "subword"))
    size = getattr(task.config, "max_length", 512) - len(tt.model_input([]))
    return model_inputs([tt.model_input(tt(t).ids[:size]) for t in texts], tt.pad_id)


def calibration_batches(task, texts: Sequence[str], batch_size: int = CALIBRATION_BATCH
                        ) -> Iterator[dict[str, np.ndarray]]:
    """The graph's inputs for ``texts``, ``batch_size`` texts at a time (:func:`check_inputs`)."""
    for i in range(0, len(texts), batch_size):
        yield {k: v.numpy() for k, v in check_inputs(task, texts[i:i + batch_size]).items()}


def weight_names(graph) -> dict[str, dict[str, str]]:
    """``{node name: {initializer: weight name}}`` for the nodes of :data:`WEIGHT_OPS` that read a float initializer
    of two or more dimensions (an ``onnx.GraphProto``).

    A weight's name is its initializer's when that is a parameter's name
    (``model.encoder.embeddings.word_embeddings.weight``); the torch exporter folds a Linear's transposed weight into
    an anonymous constant (``val_93``), which is named ``MODULE.weight`` after the module that the node comes from
    (its ``pkg.torch.onnx.name_scopes``).
    """
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    weights = {i.name for i in graph.initializer if i.data_type in floats and len(i.dims) >= 2}
    names: dict[str, dict[str, str]] = {}
    for node in graph.node:
        read = [i for i in node.input if i in weights]
        if node.op_type not in WEIGHT_OPS or not read:
            continue
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "[]")
        try:
            module = ast.literal_eval(scopes)[-2]  # [..., the module, the operator's own name]
        except (ValueError, SyntaxError, IndexError):
            module = ""
        names[node.name] = {i: i if "." in i or not module else f"{module}.weight" for i in read}
    return names


def excluded_nodes(graph, keep_fp32: Sequence[str]) -> tuple[list[str], list[str]]:
    """The nodes that read a weight matching one of the ``keep_fp32`` substrings, and those weights' names.

    Raises ``ValueError`` for a pattern that matches no weight, with some of the names there are.
    """
    names = weight_names(graph)
    nodes, kept = [], set()
    for pattern in keep_fp32:
        hits = {node: [n for i, n in weights.items() if pattern in n or pattern in i]
                for node, weights in names.items()}
        hits = {node: found for node, found in hits.items() if found}
        if not hits:
            every = sorted({n for weights in names.values() for n in weights.values()})
            sample = ", ".join(every[:3] + ["..."] + every[-3:] if len(every) > 6 else every)
            raise ValueError(f"keep_fp32 pattern {pattern!r} matches none of the {len(every)} quantisable weights of "
                             f"the graph ({sample}); give a substring of one of these names, e.g. 'embeddings', "
                             f"'layer.0.' or 'heads.'")
        nodes += [node for node in hits if node not in nodes]
        kept.update(n for found in hits.values() for n in found)
    return nodes, sorted(kept)


def quantize_int8(fp32: Path, out: Path, task, *, per_channel: bool = False, reduce_range: bool = False,
                  keep_fp32: Sequence[str] = (), calibration: Sequence[str] | None = None,
                  batch_scales: bool = False) -> dict:
    """Quantise the graph ``fp32`` to ``out`` (see the module's doc); returns what ``export.json`` records of it."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    exclude, kept = excluded_nodes(onnx.load(str(fp32), load_external_data=False).graph, keep_fp32)
    if calibration is None:
        # the weight operators only: the quantiser's own Attention handler is for Microsoft's operator, not ONNX's
        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=per_channel,
                         reduce_range=reduce_range, nodes_to_exclude=exclude, op_types_to_quantize=list(WEIGHT_OPS))
        if not batch_scales:
            graph = onnx.load(str(out))
            token_scales(graph)
            onnx.save(graph, str(out))
    else:
        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.batches = calibration_batches(task, list(calibration))

            def get_next(self) -> dict | None:
                return next(self.batches, None)

        quantize_static(str(fp32), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=list(WEIGHT_OPS), per_channel=per_channel, reduce_range=reduce_range,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=exclude,
                        extra_options={"MatMulConstBOnly": True})
    kind = "static" if calibration is not None else "dynamic, per batch" if batch_scales else "dynamic, per token"
    return {"fp32_weights": kept, "int8_activations": kind}


TOKEN_SCALE_PREFIX = "zhie_token_"  # the names of the constants and nodes that :func:`token_scales` adds


def token_scales(model) -> None:
    """Rewrite, in place, an ``onnx.ModelProto`` made by onnxruntime's dynamic quantisation (opset 21 or later) so that
    each token's
    activations have their own scale: every ``DynamicQuantizeLinear`` (one uint8 scale and zero point for its whole
    input, the batch's every token) becomes ``s = max|x| / 127`` over the last axis (the products' inner dimension:
    ``ReduceMax`` and ``ReduceMin``) and one blocked ``QuantizeLinear`` (opset 21; the block is the whole token) to
    uint8 with the zero point 128, feeding the same ``MatMulInteger`` nodes. A text's logits then depend on its own
    tokens only, never on the texts batched with it or on the padding, and the matrix products stay int8.

    The float rescaling after each product (``Mul(cast, Mul(x_scale, w_scale))``) becomes ``Mul(Mul(cast, w_scale),
    x_scale)``: onnxruntime fuses the first form into ``MatMulIntegerToFloat``, whose activation scale is one per
    tensor, and gives wrong logits for a scale per token.

    Raises ``ValueError`` for a graph whose quantised activations or scales are read otherwise.
    """
    from onnx import helper, numpy_helper

    graph, c = model.graph, TOKEN_SCALE_PREFIX
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 21:
        raise ValueError(f"--opset {opset}: int8 with a scale per token needs opset 21 or later (blocked "
                         f"QuantizeLinear); export with the default --opset {DEFAULT_OPSET}, or give --batch-scales")
    graph.initializer.extend([numpy_helper.from_array(np.array(128, np.uint8), f"{c}zero_point"),
                              numpy_helper.from_array(np.array([-1], np.int64), f"{c}last_axis"),
                              numpy_helper.from_array(np.array(1 / 127, np.float32), f"{c}inv127"),
                              numpy_helper.from_array(np.array(-1 / 127, np.float32), f"{c}minus_inv127"),
                              numpy_helper.from_array(np.array(1e-30, np.float32), f"{c}tiny")])
    weights = {i.name: i for i in graph.initializer}
    quantised = [n for n in graph.node if n.op_type == "DynamicQuantizeLinear"]
    width = {n.input[0]: weights[n.input[1]].dims[0] for n in graph.node if n.op_type == "MatMulInteger"
             and n.input[1] in weights}
    scales = {q.output[1] for q in quantised}
    products = {n.output[0]: n for n in graph.node if n.op_type == "Mul" and n.input[0] in scales}
    expected = {name: (op, k) for q in quantised  # how each name may be read: (operator, input position)
                for name, op, k in zip(q.output, ("MatMulInteger", "Mul", "MatMulInteger"), (0, 0, 2))}
    expected.update({name: ("Mul", 1) for name in products})
    if any(q.output[0] not in width for q in quantised) or any(
            expected[i] != (n.op_type, k) for n in graph.node for k, i in enumerate(n.input) if i in expected):
        raise ValueError("the quantised graph's activations are not read as onnxruntime's dynamic quantisation writes "
                         "them (MatMulInteger, then Mul(cast, Mul(x_scale, w_scale))); export with --batch-scales")
    nodes = []
    for n in graph.node:
        if n.op_type == "DynamicQuantizeLinear":
            (x,), (q, s, z), p = n.input, n.output, f"{c}{n.output[0]}"
            nodes += [helper.make_node("ReduceMax", [x, f"{c}last_axis"], [f"{p}_max"], keepdims=1),
                      helper.make_node("ReduceMin", [x, f"{c}last_axis"], [f"{p}_min"], keepdims=1),
                      helper.make_node("Mul", [f"{p}_max", f"{c}inv127"], [f"{p}_high"]),
                      helper.make_node("Mul", [f"{p}_min", f"{c}minus_inv127"], [f"{p}_low"]),
                      helper.make_node("Max", [f"{p}_high", f"{p}_low", f"{c}tiny"], [s]),  # tiny: a token of zeros
                      helper.make_node("Shape", [s], [f"{p}_shape"]),
                      helper.make_node("Expand", [f"{c}zero_point", f"{p}_shape"], [f"{p}_zero_points"]),
                      helper.make_node("QuantizeLinear", [x, s, f"{p}_zero_points"], [q], axis=-1,
                                       block_size=width[q]),
                      helper.make_node("Identity", [f"{c}zero_point"], [z])]
        elif n.op_type == "Mul" and n.output[0] in products:
            continue  # the scales' product: replaced by the two products below
        elif n.op_type == "Mul" and n.input[1] in products:
            x_scale, w_scale = products[n.input[1]].input
            nodes += [helper.make_node("Mul", [n.input[0], w_scale], [f"{c}{n.output[0]}"]),
                      helper.make_node("Mul", [f"{c}{n.output[0]}", x_scale], [n.output[0]])]
        else:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)


def largest_difference(expected: list[Tensor], got: list[np.ndarray]) -> float:
    """The largest absolute difference between two lists of outputs, over the cells torch did not mask."""
    worst = 0.0
    for e, g in zip(expected, got, strict=True):
        e = e.detach().float().numpy()
        if e.shape != g.shape:
            raise ValueError(f"the graph's output has shape {g.shape}, torch's {e.shape}")
        keep = e > -1e11  # masked cells hold -1e12 in both (zhie.heads.masking)
        if keep.any():
            worst = max(worst, float(np.abs(e[keep] - g[keep]).max()))
    return worst


@dataclasses.dataclass
class ExportOptions:
    """The options of ``zhie export`` (:func:`export`'s keywords take their defaults from here)."""

    out: str | None = option(None, "export directory; zhie.load, predict and serve run it on onnxruntime",
                             required=True)
    opset: int = option(DEFAULT_OPSET, "ONNX opset (23: the first with ONNX's own Attention operator; onnxruntime "
                                       ">= 1.23)")
    quantize: str | None = option(None, "int8 quantisation (dynamic: int8 weights, each token's activations quantised "
                                        "with a scale of its own at run time)", choices=("int8",))
    per_channel: bool = option(False, "int8: one scale per output channel of each weight")
    reduce_range: bool = option(False, "int8: 7-bit weights, which the int8 kernels of x86 CPUs without VNNI (AVX2) "
                                       "cannot saturate; more accurate there (see export.json's int8_max_abs_diff)")
    keep_fp32: tuple[str, ...] | None = option(None, "int8: weights whose name contains PATTERN stay fp32 "
                                                     "(repeatable), e.g. 'embeddings' (the embedding table) or "
                                                     "'layer.11.' (e5-small's last layer); the names are the torch "
                                                     "model's parameters "
                                                     "(model.encoder.encoder.layer.0.attention.self.query.weight, ...)",
                                               action="extend", metavar="PATTERN")
    calibrate: str | None = option(None, "int8: static quantisation (uint8 activations too), their ranges measured on "
                                         "the texts of FILE: one text per line, or JSON lines with a field 'text' "
                                         "(e.g. the training file)", metavar="FILE")
    batch_scales: bool = option(False, "int8: one activation scale per run for the whole batch, as onnxruntime's "
                                       "dynamic quantisation makes it, instead of one per token; a text's answer then "
                                       "depends on the texts batched with it")
    calibrate_lines: int | None = option(None, "read the first N texts of --calibrate FILE (default 200)",
                                         metavar="N")


CALIBRATION_TEXTS = 200  # --calibrate FILE: the texts read when --calibrate-lines is not given


def calibration_texts(path: str, n: int) -> list[str]:
    """The first ``n`` texts of ``zhie export --calibrate FILE`` (:func:`zhie.data.base.read_texts`' lines)."""
    from itertools import islice

    from zhie.data.base import iter_texts

    if n < 1:
        raise ValueError(f"--calibrate-lines {n}: give a positive number of texts (default {CALIBRATION_TEXTS})")
    if not Path(path).is_file():
        raise FileNotFoundError(f"--calibrate {path}: no such file; give a text file, one text per line (or JSON "
                                f"lines with a field 'text', e.g. the model's training file)")
    texts = list(islice((text for _, text in iter_texts(path) if text is not None), n))
    if not texts:
        raise ValueError(f"--calibrate {path}: the file has no text (blank lines are skipped); give a file of the "
                         f"texts the model will read, one per line")
    return texts


def export(model_dir: str | os.PathLike, out: str | os.PathLike, *, opset: int = ExportOptions.opset,
           quantize: str | None = ExportOptions.quantize, per_channel: bool = ExportOptions.per_channel,
           reduce_range: bool = ExportOptions.reduce_range, keep_fp32: Sequence[str] | None = ExportOptions.keep_fp32,
           calibration: Sequence[str] | None = None, batch_scales: bool = ExportOptions.batch_scales) -> Path:
    """Write the export directory ``out`` for the model in ``model_dir`` (atomically); returns ``out``.

    ``quantize="int8"`` quantises the graph; ``per_channel``, ``reduce_range``, ``keep_fp32`` (substrings of weight
    names), ``calibration`` (texts: static quantisation) and ``batch_scales`` are its options (the module's doc).

    Raises ``ValueError`` for an unknown ``quantize``, an int8 option without ``quantize="int8"``, no calibration
    texts, a ``keep_fp32`` pattern that matches no weight, or an fp32 graph whose logits differ from torch's by more
    than :data:`FP32_TOLERANCE` on :data:`CHECK_TEXTS`.
    """
    import onnx
    import onnxruntime as ort

    from zhie.deploy.pipeline import load
    from zhie.tasks.base import WindowedTask

    if quantize not in (None, "int8"):
        raise ValueError(f"unknown quantisation {quantize!r}; use int8 (or none)")
    keep_fp32 = (keep_fp32,) if isinstance(keep_fp32, str) else tuple(keep_fp32 or ())
    calibration = None if calibration is None else list(calibration)
    given = [name for name, value in (("per_channel", per_channel), ("reduce_range", reduce_range),
                                      ("keep_fp32", keep_fp32), ("calibration", calibration is not None),
                                      ("batch_scales", batch_scales)) if value]
    if given and quantize != "int8":
        raise ValueError(f"{', '.join(given)} {'is an option' if len(given) == 1 else 'are options'} of int8 "
                         f"quantisation; give quantize='int8' (zhie export --quantize int8) as well")
    if calibration is not None and not any(t.strip() for t in calibration):
        raise ValueError("static quantisation needs calibration texts, and none were given")
    if batch_scales and calibration is not None:
        raise ValueError("batch_scales is an option of dynamic quantisation; static quantisation (calibration) has "
                         "fixed activation scales: give one of the two")
    if any(not p for p in keep_fp32):
        raise ValueError("an empty keep_fp32 pattern would match every weight; leave out quantize='int8' instead")
    if not 1 <= opset <= onnx.defs.onnx_opset_version():
        raise ValueError(f"--opset {opset}: ONNX has opsets 1 to {onnx.defs.onnx_opset_version()}; use one the model "
                         f"can be written in, such as the default {DEFAULT_OPSET}")
    check_out(model_dir, Path(out))
    pipe = load(model_dir, device="cpu")
    task, model = pipe.task, pipe.model
    if getattr(model.encoder.config, "model_type", None) == "zhie_conv":  # the same function, one product fewer
        from zhie.encoders.conv import fold_embeddings
        from zhie.model import Model

        model = Model(fold_embeddings(model.encoder), dict(model.heads.items()))
    if not isinstance(task, WindowedTask) and not hasattr(pipe, "encode"):
        raise ValueError(f"zhie export knows span tasks and sentence encoders; {task.name} is neither")
    example = check_inputs(task, CHECK_TEXTS[1:])
    check = check_inputs(task, CHECK_TEXTS)
    with torch.no_grad():
        expected = flatten(model(**check))
        layout = output_layout(model(**example))

    def write(tmp: Path) -> None:
        (tmp / ENCODER_WEIGHTS).unlink()  # the encoder's weights are in the graph
        graph = tmp / GRAPH_FILE
        dim = torch.export.Dim
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Graph(model), (example["input_ids"], example["attention_mask"]), str(graph),
                              input_names=list(INPUTS), output_names=output_names(layout), opset_version=opset,
                              dynamic_shapes=({0: dim("batch"), 1: dim("length")},) * 2, dynamo=True,
                              external_data=False, verbose=False)
        written = graph_opset(graph)
        if written != opset:
            raise ValueError(f"--opset {opset}: torch's exporter could not write the model in that opset (the graph "
                             f"has opset {written}); use a later one, such as the default {DEFAULT_OPSET}")
        session = runtime.session(graph)
        diff = largest_difference(expected, session.run(None, {k: check[k].numpy() for k in INPUTS}))
        if diff > FP32_TOLERANCE:
            raise ValueError(f"the exported graph's logits differ from torch's by {diff:.3g} (> {FP32_TOLERANCE}); "
                             f"try another --opset (this was {opset})")
        record = {"graph": GRAPH_FILE, "inputs": list(INPUTS), "outputs": layout, "opset": opset,
                  "quantize": quantize, "per_channel": per_channel, "reduce_range": reduce_range,
                  "keep_fp32": list(keep_fp32),
                  "calibration_texts": None if calibration is None else len(calibration),
                  "fp32_max_abs_diff": diff, "torch": torch.__version__,
                  "onnxruntime": ort.__version__, "zhie_version": __version__, "source": str(model_dir)}
        if quantize == "int8":
            fp32 = tmp / "fp32.onnx"
            graph.rename(fp32)
            record.update(quantize_int8(fp32, graph, task, per_channel=per_channel, reduce_range=reduce_range,
                                        keep_fp32=keep_fp32, calibration=calibration, batch_scales=batch_scales))
            fp32.unlink()
            session = runtime.session(graph)
            record["int8_max_abs_diff"] = largest_difference(expected, session.run(
                None, {k: check[k].numpy() for k in INPUTS}))
        (tmp / EXPORT_FILE).write_text(json.dumps(record, ensure_ascii=False, indent=2), encoding="utf-8")

    def files(tmp: Path) -> None:
        task.save_files(tmp)
        write(tmp)

    about, record = card_facts(task, model_dir, quantize)
    return save_model_dir(out, model, task.tokenizer, {"task": task.name, **dataclasses.asdict(task.config)}, files,
                          about=about, record=record)


def check_out(model_dir: str | os.PathLike, out: Path) -> None:
    """Refuse, before any work, an export of an export, and an ``out`` whose content the export would replace and that
    is not an export (a file, the model itself, any other non-empty directory)."""
    if is_export(resolve_model_dir(model_dir)):
        raise ValueError(f"{model_dir} is already an ONNX export; export the model directory it was made from")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out}: exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not is_export(out):
        raise ValueError(f"--out {out}: a non-empty directory that is not a zhie export (its content would be "
                         "replaced); choose another --out")


def graph_opset(graph: Path) -> int:
    """The ONNX opset of the graph file ``graph`` (its default domain's)."""
    import onnx

    imports = onnx.load(str(graph), load_external_data=False).opset_import
    return next(o.version for o in imports if o.domain in ("", "ai.onnx"))


def card_facts(task, model_dir: str | os.PathLike, quantize: str | None) -> tuple[dict, dict | None]:
    """What the export's model card says: the task's card facts with a line on the export, and the source's training
    record (``training.json``, copied), when it has one."""
    source = resolve_model_dir(model_dir) / card.RECORD_FILE
    record = json.loads(source.read_text(encoding="utf-8")) if source.exists() else None
    about = task.describe()
    kind = "an int8-quantised" if quantize == "int8" else "an fp32"
    about["limits"] = [*about["limits"], f"this is {kind} ONNX export ({GRAPH_FILE}; how it was made: {EXPORT_FILE}):"
                       f" it runs with onnxruntime, without torch (`pip install 'zhie[runtime]'`), and cannot be "
                       f"trained further"]
    return about, record
