"""``zhie export DIR --out OUT [--opset N] [--quantize int8]``: a model directory as an ONNX graph plus what decodes it.

The graph (``model.onnx``) holds the encoder and the heads' logits: inputs ``input_ids`` and ``attention_mask``
(int64 ``[batch, length]``, both axes dynamic), one output per head tensor, in the order of
:func:`output_layout` (a head whose output is a dataclass, GPLinker's :class:`~zhie.heads.RelationLogits`, gives
one output per field, ``NAME.FIELD``). Decoding stays outside the graph and is zhie's own numpy decoders
(:mod:`zhie.core.decoding`, the torch model's too): thresholding for GP/EGP/GPLinker, constrained Viterbi for the CRF,
argmax for softmax, windows for long texts. :mod:`zhie.deploy.runtime` runs an export without torch.

The export directory is a model directory without the encoder's weights: ``config.json``, the tokenizer files,
``zhie.json``, ``head.safetensors`` (the heads' weights: decoding reads the CRF's transitions there; the BIO/BMES
constraints follow from the tags in ``zhie.json``), the task's own files, ``model.onnx`` and ``export.json`` (opset,
quantisation, outputs, the largest difference to torch's logits measured at export). ``zhie.load(OUT)`` runs it on
onnxruntime. ``--quantize int8``: onnxruntime's dynamic quantisation (int8 weights of the matrix products, activations
quantised per batch at run time); its outputs differ from fp32's and are checked against an accuracy floor.

A multi-task model exports as one graph with every member's head; its members decode from it as from the torch model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from zhie.core.text import TextTokenizer
from zhie.deploy.runtime import EXPORT_FILE, GRAPH_FILE, INPUTS
from zhie.tasks.base import model_inputs, save_model_dir
from zhie.version import __version__

ENCODER_WEIGHTS = "model.safetensors"
DEFAULT_OPSET = 18  # the torch.onnx (dynamo) exporter's own; a lower one goes through a version conversion
FP32_TOLERANCE = 1e-3  # export fails if the graph's logits differ from torch's by more on its check texts
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


def check_inputs(task, texts: tuple[str, ...] | list[str]) -> dict[str, Tensor]:
    """Model inputs of ``texts`` as the task builds them (rows of different lengths, right-padded)."""
    tt = TextTokenizer(task.tokenizer, getattr(task.config, "mode", "subword"))
    return model_inputs([tt.model_input(tt(t).ids) for t in texts], tt.pad_id)


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


def export(model_dir: str | os.PathLike, out: str | os.PathLike, *, opset: int = DEFAULT_OPSET,
           quantize: str | None = None) -> Path:
    """Write the export directory ``out`` for the model in ``model_dir`` (atomically); returns ``out``.

    Raises ``ValueError`` for an unknown ``quantize``, or an fp32 graph whose logits differ from torch's by more than
    :data:`FP32_TOLERANCE` on :data:`CHECK_TEXTS`.
    """
    import onnxruntime as ort

    from zhie.deploy.pipeline import load
    from zhie.tasks.base import WindowedTask

    if quantize not in (None, "int8"):
        raise ValueError(f"unknown quantisation {quantize!r}; use int8 (or none)")
    pipe = load(model_dir, device="cpu")
    task, model = pipe.task, pipe.model
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
        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        diff = largest_difference(expected, session.run(None, {k: check[k].numpy() for k in INPUTS}))
        if diff > FP32_TOLERANCE:
            raise ValueError(f"the exported graph's logits differ from torch's by {diff:.3g} (> {FP32_TOLERANCE}); "
                             f"try another --opset (this was {opset})")
        record = {"graph": GRAPH_FILE, "inputs": list(INPUTS), "outputs": layout, "opset": opset,
                  "quantize": quantize, "fp32_max_abs_diff": diff, "torch": torch.__version__,
                  "onnxruntime": ort.__version__, "zhie_version": __version__, "source": str(model_dir)}
        if quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            fp32 = tmp / "fp32.onnx"
            graph.rename(fp32)
            quantize_dynamic(str(fp32), str(graph), weight_type=QuantType.QInt8)
            fp32.unlink()
            session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
            record["int8_max_abs_diff"] = largest_difference(expected, session.run(
                None, {k: check[k].numpy() for k in INPUTS}))
        (tmp / EXPORT_FILE).write_text(json.dumps(record, ensure_ascii=False, indent=2), encoding="utf-8")

    def files(tmp: Path) -> None:
        task.save_files(tmp)
        write(tmp)

    return save_model_dir(out, model, task.tokenizer, {"task": task.name, **dataclasses.asdict(task.config)}, files)
