"""A model is an encoder plus named heads: one encoder pass, every head on its output.

Several tasks can share one encoder by putting their heads in one :class:`Model` (multi-task training), and a
teacher and a student are two models. ``forward`` always returns a dict ``{head name: that head's output}``; each
head documents its output type (:mod:`zhie.heads`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["Ensemble", "Model"]


class Model(nn.Module):
    """``Model(encoder, {"ner": GlobalPointer(...)})``; ``encoder`` is what :func:`zhie.encoders.load` returns.

    A head reads the encoder's last hidden states, or, if it has a ``layers`` attribute (indices into the
    encoder's ``hidden_states``, 0 = embeddings), the average of those layers (e.g. ``(1, -1)`` for
    first-last-avg pooling); the encoder is asked for all its layers only when a head needs them. ``heads`` (names)
    runs only those heads (a multi-task model scoring one task's batch); the result is the same dict, with those keys.

    Under autocast (``--precision bf16|fp16``) only the encoder runs in half precision: the heads get its hidden states
    in fp32 with autocast off, so their masks, decoding and the losses on their outputs stay in fp32.
    """

    def __init__(self, encoder: nn.Module, heads: Mapping[str, nn.Module]) -> None:
        super().__init__()
        if not heads:
            raise ValueError("a model needs at least one head")
        self.encoder = encoder
        self.heads = nn.ModuleDict(heads)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, heads: Sequence[str] | None = None
                ) -> dict[str, object]:
        return self.hidden_and_outputs(input_ids, attention_mask, heads)[1]

    def hidden_and_outputs(self, input_ids: Tensor, attention_mask: Tensor, heads: Sequence[str] | None = None
                           ) -> tuple[Tensor, dict[str, object]]:
        """The encoder's last hidden states ``[b, n, hidden]`` and :meth:`forward`'s outputs, from one encoder pass
        (what distillation with hidden-state matching reads)."""
        chosen = {name: self.heads[name] for name in heads} if heads is not None else dict(self.heads.items())
        layers = {name: tuple(getattr(head, "layers", (-1,))) for name, head in chosen.items()}
        all_layers = any(ids != (-1,) for ids in layers.values())
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=all_layers)
        half = torch.is_autocast_enabled(input_ids.device.type)
        outputs = {}
        with torch.autocast(input_ids.device.type, enabled=False) if half else nullcontext():
            for name, head in chosen.items():
                if layers[name] == (-1,):
                    hidden = out.last_hidden_state
                else:
                    hidden = sum(out.hidden_states[i].float() for i in layers[name]) / len(layers[name])
                outputs[name] = head(hidden.float() if half else hidden, attention_mask)
        return out.last_hidden_state, outputs

    @torch.no_grad()
    def arrays(self, input_ids: np.ndarray, attention_mask: np.ndarray, heads: Sequence[str] | None = None
               ) -> dict[str, object]:
        """:meth:`forward` on int64 numpy inputs (moved to the model's device), its outputs in fp32 numpy on the host (a
        dataclass output, GPLinker's :class:`~zhie.heads.RelationLogits`, as ``{field: array}``): what the decoders
        of :mod:`zhie.core.decoding` read, as from an export (:class:`zhie.deploy.runtime.OnnxModel`). Puts the model in
        eval mode (no dropout), as prediction always has."""
        self.eval()
        device = next(self.parameters()).device
        outputs = self(input_ids=torch.from_numpy(np.asarray(input_ids, dtype=np.int64)).to(device),
                       attention_mask=torch.from_numpy(np.asarray(attention_mask, dtype=np.int64)).to(device),
                       heads=heads)
        return {name: _to_numpy(value) for name, value in outputs.items()}

    def each_arrays(self, batches: Iterable[dict[str, np.ndarray]], heads: Sequence[str] | None = None
                    ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, object]]]:
        """``(batch, arrays(batch's input_ids, attention_mask, heads))`` for each of ``batches``, in order, one after
        the other (an export's :meth:`zhie.deploy.runtime.OnnxModel.each_arrays` runs batches ahead)."""
        for batch in batches:
            yield batch, self.arrays(batch["input_ids"], batch["attention_mask"], heads)

    def head_weights(self, name: str) -> dict[str, np.ndarray]:
        """The weights of head ``name`` (names relative to it, e.g. ``crf.transitions``) as fp32 numpy arrays."""
        return {k: v.detach().float().cpu().numpy() for k, v in self.heads[name].state_dict().items()}

    def view(self, names: Sequence[str]) -> Model:
        """A model sharing this one's encoder and the heads ``names`` (no copy)."""
        return Model(self.encoder, {name: self.heads[name] for name in names})


class Ensemble(Model):
    """Several models of one task (the same heads, the same vocabulary: seeds of one training), answering as one
    model: each head's output is the members' mean (for GPLinker's :class:`~zhie.heads.RelationLogits`, field by
    field), and :meth:`head_weights` the mean of theirs (a CRF decodes with the mean transitions). A distillation
    teacher (``zhie distill student --teacher A --teacher B …``)."""

    def __init__(self, models: Sequence[Model]) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one model")
        names = [sorted(m.heads) for m in models]
        if any(n != names[0] for n in names):
            raise ValueError(f"the models of an ensemble must have the same heads, got {names}")
        super().__init__(models[0].encoder, dict(models[0].heads.items()))
        self.members = nn.ModuleList(models)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, heads: Sequence[str] | None = None
                ) -> dict[str, object]:
        outputs = [m(input_ids=input_ids, attention_mask=attention_mask, heads=heads) for m in self.members]
        return {name: _mean([o[name] for o in outputs]) for name in outputs[0]}

    def head_weights(self, name: str) -> dict[str, np.ndarray]:
        weights = [m.head_weights(name) for m in self.members]
        return {k: np.mean([w[k] for w in weights], axis=0) for k in weights[0]}


def _mean(values: list) -> object:
    if isinstance(values[0], torch.Tensor):
        return torch.stack(values).mean(0) if len(values) > 1 else values[0]
    return type(values[0])(**{f.name: _mean([getattr(v, f.name) for v in values])
                              for f in dataclasses.fields(values[0])})


def _to_numpy(value) -> object:
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy()
    return {f.name: _to_numpy(getattr(value, f.name)) for f in dataclasses.fields(value)}
