"""Exponential moving average of the weights, with bias correction as in bert4keras.

bert4keras ``extend_with_exponential_moving_average``: the shadow starts at zero and after each optimizer
step becomes ``shadow = d * shadow + (1 - d) * w``; the weights used for evaluation are
``shadow / (1 - d**t)`` after ``t`` updates. After one update they equal the weights; constant weights stay
constant.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = ["EMA"]


class EMA:
    """Shadow weights of a model's trainable parameters (names as in ``model.named_parameters()``).

    Use :meth:`update` after each optimizer step and :meth:`applied` (or :meth:`swap_in` / :meth:`swap_out`)
    to evaluate or save with the averaged weights.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.steps = 0
        self.shadow: dict[str, Tensor] = {
            name: torch.zeros_like(p, memory_format=torch.preserve_format)
            for name, p in model.named_parameters() if p.requires_grad
        }
        self._backup: dict[str, Tensor] | None = None

    def _params(self, model: nn.Module) -> dict[str, nn.Parameter]:
        params = dict(model.named_parameters())
        missing = [name for name in self.shadow if name not in params]
        if missing:
            raise ValueError(f"the model has no parameters named {missing}; EMA was built for another model")
        return {name: params[name] for name in self.shadow}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """``shadow = d * shadow + (1 - d) * w`` for every tracked parameter."""
        if self._backup is not None:
            raise RuntimeError("EMA.update called while the average is swapped in; call swap_out first")
        self.steps += 1
        for name, p in self._params(model).items():
            self.shadow[name].mul_(self.decay).add_(p.detach(), alpha=1.0 - self.decay)

    @torch.no_grad()
    def average(self) -> dict[str, Tensor]:
        """The bias-corrected average ``shadow / (1 - d**t)`` (empty before the first update)."""
        if self.steps == 0:
            return {}
        scale = 1.0 - self.decay ** self.steps
        return {name: s / scale for name, s in self.shadow.items()}

    @torch.no_grad()
    def swap_in(self, model: nn.Module) -> None:
        """Put the averaged weights into ``model``, keeping a copy of the current ones for :meth:`swap_out`.
        Before the first update the model keeps its weights."""
        if self._backup is not None:
            raise RuntimeError("EMA weights are already swapped in")
        params = self._params(model)
        self._backup = {name: p.detach().clone() for name, p in params.items()}
        for name, value in self.average().items():
            params[name].copy_(value)

    @torch.no_grad()
    def swap_out(self, model: nn.Module) -> None:
        """Restore the weights saved by :meth:`swap_in`, bit for bit."""
        if self._backup is None:
            raise RuntimeError("EMA.swap_out called without swap_in")
        for name, p in self._params(model).items():
            p.copy_(self._backup[name])
        self._backup = None

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """``with ema.applied(model): evaluate(model)``: averaged weights inside, training weights after."""
        self.swap_in(model)
        try:
            yield model
        finally:
            self.swap_out(model)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "steps": self.steps, "shadow": dict(self.shadow)}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if set(state["shadow"]) != set(self.shadow):
            raise ValueError("EMA state does not match the model's trainable parameters: "
                             f"missing {sorted(set(self.shadow) - set(state['shadow']))}, "
                             f"unexpected {sorted(set(state['shadow']) - set(self.shadow))}")
        self.decay = state["decay"]
        self.steps = state["steps"]
        for name, value in state["shadow"].items():
            self.shadow[name].copy_(value)
