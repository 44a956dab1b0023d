"""The multi-task objective (spec §5): the members' losses weighted by a scheme of :mod:`zhie.multitask.weighting`;
the task itself is :class:`zhie.tasks.multitask.MultiTask`, whose ``objective`` builds this."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zhie.losses import TaskLoss
from zhie.model import Model
from zhie.multitask.weighting import (
    MGDA,
    Equal,
    GeneralisedMean,
    GradNormalise,
    InitialLoss,
    MainAuxiliary,
    PriorLoss,
    RealTime,
    UncertaintyWeighting,
    combine,
)


class MultiTaskLoss(TaskLoss):
    """``Σ_i sg(α_i) L_i`` over the members' batches, ``α`` from the scheme (:mod:`zhie.multitask.weighting`); under
    ``uncertainty`` the Kendall et al. objective with its learnable ``log σ_i²`` (not in Su's posts).

    Each member's ``L_i`` is its own objective's (a member with weights of its own, Sentence-BERT's classifier, keeps
    them here). Gradient schemes get ``g_i = ∇L_i`` over the encoder's trainable parameters (``retain_graph``; the
    heads are each one task's own, and each gets ``α_i ∇L_i``), or over the encoder's outputs (``gradients =
    "encoder-output"``). Main-auxiliary sees the main task first. On a sampled step (one member's batch), the absent
    members' losses are 0 and their weights 0.
    """

    def __init__(self, task, hidden_size: int) -> None:
        super().__init__(task)
        c = task.config
        self.names = [m.head_name for m in task.members]
        self.member_losses = nn.ModuleList([m.objective(hidden_size) for m in task.members])
        main = self.names.index(c.main) if c.weighting == "main-auxiliary" else 0
        self.order = [main] + [i for i in range(len(self.names)) if i != main]
        self.uncertainty = UncertaintyWeighting(len(self.names)) if c.weighting == "uncertainty" else None
        self.output_space = c.gradients == "encoder-output"
        self.scheme = {
            "equal": Equal, "real-time": RealTime, "grad-normalise": GradNormalise, "mgda": MGDA,
            "main-auxiliary": MainAuxiliary, "uncertainty": Equal,  # uncertainty: the module above decides
            "initial": lambda: InitialLoss(None, c.initial_batches),
            "generalised-mean": lambda: GeneralisedMean(c.gamma),
            "prior": lambda: PriorLoss([m.prior_loss(items, b) for m, items, b in zip(
                task.members, task.member_items, task.batch_sizes)]),
        }[c.weighting]()
        self.batches = 0
        self.rows: list[tuple[int, Tensor, Tensor, Tensor]] = []  # (batch, losses, weights, present) to log

    @staticmethod
    def gradients(losses: Tensor, inputs: list[list[Tensor]]) -> Tensor:
        """``[n, P]``: row ``i`` is ``∇L_i`` w.r.t. ``inputs[i]`` (tensors, flattened; a ``None`` gradient is zeros).
        Over the encoder's parameters every row has the same inputs; over encoder outputs each member has its own
        (its batch's), so the rows are placed in disjoint blocks of one long vector."""
        rows = []
        for loss, tensors in zip(losses, inputs):
            grads = torch.autograd.grad(loss, tensors, retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(g if g is not None else torch.zeros_like(t)).reshape(-1).float()
                                   for g, t in zip(grads, tensors)]))
        if all(len(ts) == len(inputs[0]) and all(t is u for t, u in zip(ts, inputs[0])) for ts in inputs):
            return torch.stack(rows)
        return torch.block_diag(*(row.unsqueeze(0) for row in rows))

    def forward(self, model: Model, batch: dict[str, Tensor]) -> Tensor:
        device = next(iter(batch.values())).device
        losses, outputs, present = [], [], []
        hook = (model.encoder.register_forward_hook(lambda module, args, out: outputs[-1].append(out.last_hidden_state))
                if self.output_space else None)
        try:
            for name, objective in zip(self.names, self.member_losses):
                prefix = f"{name}/"
                member_batch = {k[len(prefix):]: v for k, v in batch.items() if k.startswith(prefix)}
                outputs.append([])
                present.append(bool(member_batch))
                losses.append(objective(model, member_batch).float() if member_batch
                              else torch.zeros((), device=device))
        finally:
            if hook is not None:
                hook.remove()
        losses = torch.stack(losses)
        present = torch.tensor(present, device=device)
        if self.uncertainty is not None:
            total, weights = self.uncertainty(losses, present), self.uncertainty.weights()
        else:
            ordered = losses[self.order]
            grads = None
            if self.scheme.needs_gradients:
                params = [p for p in model.encoder.parameters() if p.requires_grad]
                grads = self.gradients(ordered, [outputs[i] for i in self.order] if self.output_space
                                       else [params] * len(ordered))
            weights = torch.empty_like(losses)
            weights[self.order] = self.scheme.weights(ordered, grads).to(losses.device)
            total = combine(losses, weights)
        weights = weights * present
        self.batches += 1
        self.rows.append((self.batches, losses.detach(), weights.detach(), present))
        return total

    def log(self) -> dict:
        """``per_batch``: each batch's ``losses`` and ``weights`` by member; ``task_losses``, ``task_weights``: their
        means since the last call."""
        rows = [{"batch": b, **{key: {n: v for n, v, here in zip(self.names, values.tolist(), present) if here}
                                for key, values in (("losses", losses), ("weights", weights))}}
                for b, losses, weights, present in self.rows]
        self.rows = []
        if not rows:
            return {}

        def mean(key: str, name: str) -> float | None:
            values = [r[key][name] for r in rows if name in r[key]]
            return sum(values) / len(values) if values else None

        return {"task_losses": {n: mean("losses", n) for n in self.names},
                "task_weights": {n: mean("weights", n) for n in self.names}, "per_batch": rows}

    def get_extra_state(self) -> dict:
        """The scheme's state (initial losses), the batch count and the rows not logged yet, for checkpoints."""
        return {"scheme": self.scheme.state_dict(), "batches": self.batches,
                "rows": [(b, losses.cpu(), weights.cpu(), present.cpu()) for b, losses, weights, present in self.rows]}

    def set_extra_state(self, state: dict) -> None:
        self.scheme.load_state_dict(state["scheme"])
        self.batches, self.rows = state["batches"], list(state["rows"])
