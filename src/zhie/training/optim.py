"""Optimizer parameter groups (encoder / head / CRF learning rates) and the learning-rate schedule."""

from __future__ import annotations

from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from .config import TrainConfig

__all__ = ["NO_DECAY", "build_param_groups", "build_scheduler", "linear_warmup_decay"]

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


def build_param_groups(model: nn.Module, config: TrainConfig) -> list[dict]:
    """AdamW parameter groups with their own learning rate and weight decay.

    * ``encoder`` / ``encoder_no_decay``: parameters of ``model.encoder`` (if the model has one), lr ``config.lr``;
    * ``head`` / ``head_no_decay``: everything else, lr ``config.head_lr`` (``None`` -> ``config.lr``);
    * ``crf``: the tensors returned by ``transition_parameters()`` of any submodule that has that method,
      lr ``lr * crf_lr_multiplier`` (a multiple of the *encoder* learning rate, as in bert4keras where the
      multiplier scales the one global rate; spec §8: >= 100x the body lr) and no weight decay (with Adam a
      separate group with lr x m equals bert4keras's re-parametrisation).

    ``*_no_decay`` groups hold biases and norm weights (names containing one of :data:`NO_DECAY`, or parameters
    of a module whose class name contains "Norm") and get weight decay 0. Frozen parameters
    (``requires_grad=False``) are left out; empty groups are dropped. Every group carries a ``"name"`` key.
    """
    head_lr = config.lr if config.head_lr is None else config.head_lr
    crf_ids = {
        id(p)
        for module in model.modules()
        if callable(getattr(module, "transition_parameters", None))
        for p in module.transition_parameters()
    }
    encoder = getattr(model, "encoder", None)
    encoder_ids = {id(p) for p in encoder.parameters()} if isinstance(encoder, nn.Module) else set()

    settings = {
        "encoder": (config.lr, config.weight_decay),
        "encoder_no_decay": (config.lr, 0.0),
        "head": (head_lr, config.weight_decay),
        "head_no_decay": (head_lr, 0.0),
        "crf": (config.lr * config.crf_lr_multiplier, 0.0),
    }
    no_decay = _no_decay_ids(model)
    params: dict[str, list[nn.Parameter]] = {name: [] for name in settings}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if id(p) in crf_ids:
            group = "crf"
        else:
            group = "encoder" if id(p) in encoder_ids else "head"
            if id(p) in no_decay:
                group += "_no_decay"
        params[group].append(p)
    return [
        {"name": name, "params": params[name], "lr": lr, "weight_decay": decay}
        for name, (lr, decay) in settings.items()
        if params[name]
    ]


def linear_warmup_decay(step: int, warmup_steps: int, total_steps: int) -> float:
    """Learning-rate factor at optimizer step ``step`` (0-based): linear 0 -> 1 over ``warmup_steps``, then
    linear 1 -> 0 at ``total_steps`` (the formula of transformers' ``get_linear_schedule_with_warmup``)."""
    if step < warmup_steps:
        return step / warmup_steps
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def build_scheduler(optimizer: Optimizer, total_steps: int, warmup: float) -> LambdaLR:
    """:class:`LambdaLR` with :func:`linear_warmup_decay`; ``warmup`` is a fraction of ``total_steps``."""
    warmup_steps = int(warmup * total_steps)
    return LambdaLR(optimizer, lambda step: linear_warmup_decay(step, warmup_steps, total_steps))
