"""Run an export directory (:mod:`zhie.export`) on onnxruntime: ``zhie.load(EXPORT_DIR).predict(texts)``.

:class:`OnnxModel` stands where a :class:`zhie.model.Model` stands: ``forward(input_ids, attention_mask)`` returns
``{head name: output}`` (tensors over the graph's numpy outputs, without a copy; GPLinker's outputs put back into
:class:`~zhie.heads.RelationLogits`), so the task's own code tokenises, cuts windows and decodes, and predictions
equal those of the torch model up to the graph's numerical differences.

Where torch is still needed, and why: the task classes (configuration, windows, ``from_hits``) live in modules that
import torch; decoding is zhie's own decoders, which run torch operations on CPU tensors (``nonzero`` on the span
logits, the CRF's batched Viterbi with the transitions of ``head.safetensors``, argmax). No torch layer of the network
runs: the encoder and the heads' logits are the graph's. A torch-free runtime needs these decoders on numpy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from zhie import tasks
from zhie.encoders import WeightsMismatchError
from zhie.export import EXPORT_FILE, INPUTS
from zhie.heads import RelationLogits
from zhie.tasks.base import HEAD_FILE, read_meta

OUTPUT_TYPES = {"RelationLogits": RelationLogits}  # the dataclass head outputs a graph may have, by field names
_BY_FIELDS = {tuple(f for f in cls.__dataclass_fields__): cls for cls in OUTPUT_TYPES.values()}


def is_export(path: str | os.PathLike) -> bool:
    return (Path(path) / EXPORT_FILE).exists()


class ExportedEncoder(nn.Module):
    """The encoder of an export: its configuration only; its layers are inside ``model.onnx``."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    def forward(self, *args, **kwargs):
        raise TypeError("the encoder of an exported model runs inside model.onnx; call the OnnxModel instead")


class OnnxModel(nn.Module):
    """An exported graph in an onnxruntime session, called like :class:`zhie.model.Model`.

    ``heads`` are the model's heads with their weights (decoding reads the CRF's transitions there; their layers do
    not run, the graph computes their logits). ``threads``: onnxruntime's intra-op threads (None: its default).
    """

    runtime = "onnxruntime"

    def __init__(self, directory: str | os.PathLike, heads: nn.ModuleDict, encoder_config, threads: int | None = None
                 ) -> None:
        import onnxruntime as ort

        super().__init__()
        directory = Path(directory)
        self.record = json.loads((directory / EXPORT_FILE).read_text(encoding="utf-8"))
        self.layout: dict[str, list[str] | None] = self.record["outputs"]
        for name, fields in self.layout.items():
            if fields is not None and tuple(fields) not in _BY_FIELDS:
                raise ValueError(f"{directory}/{EXPORT_FILE}: head {name!r} has outputs {fields}, which zhie does not "
                                 f"know; is it from a newer zhie?")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(directory / self.record["graph"]), options,
                                            providers=["CPUExecutionProvider"])
        self.heads = heads
        self.encoder = ExportedEncoder(encoder_config)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, heads: Sequence[str] | None = None
                ) -> dict[str, object]:
        """``{head name: output}`` for every head (or those of ``heads``), as :meth:`zhie.model.Model.forward`."""
        feeds = {name: t.detach().cpu().numpy().astype(np.int64)
                 for name, t in zip(INPUTS, (input_ids, attention_mask))}
        arrays = iter(self.session.run(None, feeds))
        outputs = {}
        for name, fields in self.layout.items():
            if fields is None:
                outputs[name] = torch.from_numpy(next(arrays))
            else:
                outputs[name] = _BY_FIELDS[tuple(fields)](**{f: torch.from_numpy(next(arrays)) for f in fields})
        return outputs if heads is None else {name: outputs[name] for name in heads}


def load_export(path: str | os.PathLike, threads: int | None = None):
    """``(task, model)`` of an export directory: the task from ``zhie.json`` and the tokenizer files, the model an
    :class:`OnnxModel` whose heads are loaded strictly from ``head.safetensors``."""
    from zhie.encoders import own_model_class

    path = Path(path)
    meta = read_meta(path)
    cls = tasks.get(str(meta.get("task")))
    fields = cls.config_class.__dataclass_fields__
    config = cls.config_class(**{k: v for k, v in meta.items() if k in fields})
    from transformers import AutoConfig, AutoTokenizer

    model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    own = own_model_class(model_type)
    encoder_config = own.config_class.from_pretrained(path) if own else AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path, **({"config": encoder_config} if own else {}))
    task = cls(config, tokenizer)
    heads = nn.ModuleDict(task.build_heads(encoder_config.hidden_size))
    weights = {k.removeprefix("heads."): v for k, v in load_file(str(path / HEAD_FILE)).items()}
    expected = set(heads.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise WeightsMismatchError(f"{path}/{HEAD_FILE}: missing {missing}, unexpected {unexpected}")
    heads.load_state_dict(weights)
    heads.eval()
    task.load_files(path)
    return task, OnnxModel(path, heads, encoder_config, threads)
