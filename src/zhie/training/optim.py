"""Optimizer parameter groups (encoder / head / CRF learning rates, layer-wise decay), the optimizers (AdamW, LAMB) and
the learning-rate schedule."""

from __future__ import annotations

import re

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from .config import HEAD_LR_RATIO, TrainConfig

__all__ = ["NO_DECAY", "Lamb", "build_optimizer", "build_param_groups", "build_scheduler", "encoder_depth"]

# A parameter whose name contains one of these gets no weight decay (nor does any parameter of a module whose
# class name contains "Norm": LayerNorm, RMSNorm, BatchNorm1d... even when it is named "encoder.2.weight").
NO_DECAY = ("bias", "LayerNorm", "layer_norm", "norm")


def _no_decay_ids(model: nn.Module) -> set[int]:
    ids = {id(p) for name, p in model.named_parameters(remove_duplicate=False)
           if any(key in name for key in NO_DECAY)}
    for module in model.modules():
        if "Norm" in type(module).__name__:
            ids.update(id(p) for p in module.parameters(recurse=False))
    return ids


def lr_multipliers(model: nn.Module) -> dict[int, float]:
    """``{id(parameter): multiplier}`` from every submodule that has ``lr_multipliers() -> {own name: factor}``
    (e.g. :class:`zhie.heads.CRF`): the tag travels with the module, wherever it sits in ``model``."""
    out = {}
    for module in model.modules():
        if callable(getattr(module, "lr_multipliers", None)):
            params = dict(module.named_parameters())
            out.update({id(params[name]): factor for name, factor in module.lr_multipliers().items()})
    return out


def is_encoder_parameter(name: str) -> bool:
    """Parameters under a submodule called ``encoder`` (``encoder.…``, ``model.encoder.…``, ``student.encoder.…``)."""
    return "encoder" in name.split(".")[:-1]


_LAYER = re.compile(r"(?:^|\.)layer\.(\d+)\.")


def encoder_depth(name: str) -> int | None:
    """Where an encoder parameter sits for layer-wise learning-rate decay: ``0`` for the embeddings (a name with a
    part containing ``embeddings``), ``N + 1`` for ``….layer.N.…`` (BERT-style ``encoder.layer.N``, and zhie's own
    RoFormerV2 / GAU-α encoders, which use the same names), ``None`` for anything else (a final norm, a pooler, an
    ALBERT's shared layer group): those count as the top of the encoder."""
    match = _LAYER.search(name)
    if match is not None:
        return int(match.group(1)) + 1
    if any("embeddings" in part for part in name.split(".")[:-1]):
        return 0
    return None


def build_param_groups(model: nn.Module, config: TrainConfig) -> list[dict]:
    """AdamW parameter groups with their own learning rate and weight decay.

    * ``encoder`` / ``encoder_no_decay``: parameters under a submodule named ``encoder`` (``model.encoder``, or
      ``x.encoder`` in a composite such as a multi-task model), lr ``config.lr``;
    * ``head`` / ``head_no_decay``: everything else, lr ``config.head_lr`` (``None`` -> ``HEAD_LR_RATIO`` x
      ``config.lr``, as :meth:`TrainConfig.resolved` gives);
    * ``lr_x{m}``: parameters that a module tags with a learning-rate multiplier ``m`` (``lr_multipliers()``, the
      CRF transitions, spec §8.1), lr ``config.lr * m`` (a multiple of the *encoder* learning rate, as in bert4keras
      where the multiplier scales the one global rate) and no weight decay.

    ``*_no_decay`` groups hold biases and norm weights (names containing one of :data:`NO_DECAY`, or parameters
    of a module whose class name contains "Norm") and get weight decay 0. Frozen parameters
    (``requires_grad=False``) are left out; empty groups are dropped. Every group carries a ``"name"`` key.

    Layer-wise learning-rate decay (``config.llrd = decay``): the encoder groups are split by depth
    (:func:`encoder_depth`): with ``L`` layers, layer ``l`` (1-based, ``….layer.{l-1}.…``) learns at
    ``lr * decay ** (L - l)``, the embeddings (depth 0) at ``lr * decay ** L``, the lowest, and encoder parameters
    outside the layers and the embeddings (a final norm, a pooler) at ``lr``, as the top layer. Groups are named
    ``encoder_L{l}`` / ``encoder_L{l}_no_decay`` (``encoder_top`` for the latter). The heads keep ``head_lr``;
    the schedule multiplies every group's rate alike.
    """
    if config.lr is None:
        raise ValueError("build_param_groups needs the encoder's learning rate: pass config.resolved(width), or a "
                         "config with lr set")
    head_lr = HEAD_LR_RATIO * config.lr if config.head_lr is None else config.head_lr
    settings = {
        "encoder": (config.lr, config.weight_decay),
        "encoder_no_decay": (config.lr, 0.0),
        "head": (head_lr, config.weight_decay),
        "head_no_decay": (head_lr, 0.0),
    }
    no_decay = _no_decay_ids(model)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    depths = {name: encoder_depth(name) for name, _ in named if is_encoder_parameter(name)}
    layers = max((d for d in depths.values() if d is not None), default=0)
    if config.llrd is not None:  # encoder_L{l} groups between the embeddings and the top, in depth order
        encoder_settings = {}
        for depth in range(layers + 1):
            lr = config.lr * config.llrd ** (layers - depth)
            encoder_settings[f"encoder_L{depth}"] = (lr, config.weight_decay)
            encoder_settings[f"encoder_L{depth}_no_decay"] = (lr, 0.0)
        encoder_settings |= {"encoder_top": (config.lr, config.weight_decay),
                             "encoder_top_no_decay": (config.lr, 0.0)}
        settings = encoder_settings | {k: v for k, v in settings.items() if k.startswith("head")}
    params: dict[str, list[nn.Parameter]] = {name: [] for name in settings}
    for name, p in named:
        if name in depths:
            group = "encoder"
            if config.llrd is not None:
                group += "_top" if depths[name] is None else f"_L{depths[name]}"
        else:
            group = "head"
        params[group + ("_no_decay" if id(p) in no_decay else "")].append(p)
    groups = [{"name": name, "params": params[name], "lr": lr, "weight_decay": decay}
              for name, (lr, decay) in settings.items() if params[name]]
    return with_lr_multipliers(model, groups, config.lr)


def with_lr_multipliers(model: nn.Module, groups: list[dict], base_lr: float) -> list[dict]:
    """``groups`` with every parameter that a module of ``model`` tags with a multiplier ``m`` moved to a group
    ``lr_x{m}`` of lr ``base_lr * m`` and no weight decay; applied to any groups, a caller's own included."""
    tagged = lr_multipliers(model)
    out, moved = [], {}
    for group in groups:
        keep = [p for p in group["params"] if id(p) not in tagged]
        for p in group["params"]:
            if id(p) in tagged:
                moved.setdefault(tagged[id(p)], []).append(p)
        if keep:
            out.append({**group, "params": keep})
    for factor, params in moved.items():
        out.append({"name": f"lr_x{factor:g}", "params": params, "lr": base_lr * factor, "weight_decay": 0.0})
    return out


def build_scheduler(optimizer: Optimizer, total_steps: int, warmup: float) -> LambdaLR:
    """transformers' linear schedule: the learning rate rises linearly from 0 over the first ``warmup`` fraction of
    ``total_steps``, then falls linearly to 0 at ``total_steps``."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, int(warmup * total_steps), total_steps)


class Lamb(torch.optim.Optimizer):
    """LAMB as GAU-α was pre-trained with (bert4keras AdamW + layer adaptation, bias correction off, spec §6.3):
    ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``, ``u = m / (sqrt(v) + eps) + wd θ``,
    ``θ <- θ - lr * (||θ|| / ||u||) * u``; the trust ratio is 1 when either norm is 0 and for the groups with
    ``layer_adaptation=False`` (biases and norms, as ``exclude_from_layer_adaptation=['Norm', 'bias']``)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "layer_adaptation": True})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                ratio = 1.0
                if group["layer_adaptation"]:
                    w, u = p.norm(), update.norm()
                    ratio = torch.where((w > 0) & (u > 0), w / u.clamp(min=1e-12), torch.ones_like(w))
                p.sub_(update * (ratio * group["lr"]))
        return loss


def build_optimizer(groups: list[dict], config: TrainConfig) -> Optimizer:
    """``config.optimizer`` over ``groups``: AdamW, or :class:`Lamb` without layer adaptation on the ``*_no_decay``
    groups (biases and norm weights)."""
    if config.optimizer == "lamb":
        groups = [{**g, "layer_adaptation": not g.get("name", "").endswith("no_decay")} for g in groups]
        return Lamb(groups, lr=config.lr, weight_decay=config.weight_decay)
    # torch's fused AdamW where it has one (CPU, CUDA): on the CPU ~7x faster a step than its default loop (a conv
    # student with a 65,536-row bigram table: 6.4 against 44-52 ms; benchmarks/RESULTS.md, "Fast students"), the same
    # update to float rounding (2e-7 after 5 steps).
    fused = all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None)
