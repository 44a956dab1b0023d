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

LOGGED_ROWS = 100  # per_batch rows in an evaluation's record at most (evenly spaced, and the last batch)


class MultiTaskLoss(TaskLoss):
    """``Σ_i sg(α_i) L_i`` over the members' batches, ``α`` from the scheme (:mod:`zhie.multitask.weighting`); under
    ``uncertainty`` the Kendall et al. objective with its learnable ``log σ_i²`` (not in Su's posts).

    Each member's ``L_i`` is its own objective's (a member with weights of its own, Sentence-BERT's classifier, keeps
    them here). Gradient schemes get ``g_i = ∇L_i`` over the encoder's trainable parameters (``retain_graph``; the
    heads are each one task's own, and each gets ``α_i ∇L_i``), or over the encoder's outputs (``gradients =
    "encoder-output"``). Main-auxiliary sees the main task first. On a sampled step (one member's batch), the absent
    members' losses are 0 and their weights 0, and ``equal`` gives the member weight 1 (one task per step).
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
            "equal": lambda: Equal(1 if c.sampling != "all" else None),  # sampled: one task per step
            "real-time": RealTime, "grad-normalise": GradNormalise, "mgda": MGDA,
            "main-auxiliary": MainAuxiliary, "uncertainty": Equal,  # uncertainty: the module above decides
            "initial": lambda: InitialLoss(None, c.initial_batches),
            "generalised-mean": lambda: GeneralisedMean(c.gamma),
            "prior": lambda: PriorLoss([m.prior_loss(items, b) for m, items, b in zip(
                task.members, task.member_items, task.batch_sizes)]),
        }[c.weighting]()
        self.batches = 0
        # Since the last log: per member the sums of the losses and weights and the number of batches ([3, n]), and
        # (batch, losses, weights, present) of every `stride`-th batch and of the last one (at most LOGGED_ROWS + 1).
        self.sums: Tensor | None = None
        self.rows: list[tuple[int, Tensor, Tensor, Tensor]] = []
        self.stride = 1
        self.step_sums: Tensor | None = None  # the same sums since the last step record (step_log)

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
        self.record(losses.detach(), weights.detach(), present)
        return total

    def record(self, losses: Tensor, weights: Tensor, present: Tensor) -> None:
        """Add a batch to what :meth:`log` reports (on the device: no synchronisation per batch)."""
        self.batches += 1
        sums = torch.stack([losses, weights, present.float()])
        self.sums = sums if self.sums is None else self.sums.to(sums.device) + sums
        self.step_sums = sums if self.step_sums is None else self.step_sums.to(sums.device) + sums
        if self.rows and self.rows[-1][0] % self.stride:
            self.rows.pop()  # kept only while it was the last batch
        self.rows.append((self.batches, losses, weights, present))
        if len(self.rows) > LOGGED_ROWS:
            self.stride *= 2
            self.rows = [r for r in self.rows[:-1] if r[0] % self.stride == 0] + self.rows[-1:]

    def log(self) -> dict:
        """Since the last call: ``task_losses``, ``task_weights`` (each member's means over the batches that had it)
        and ``task_batches`` (how many had it); ``per_batch``: the ``losses`` and ``weights`` by member of each batch,
        or, past ``LOGGED_ROWS`` batches, of every ``k``-th (``k`` a power of 2) and of the last one, so that neither
        a record nor the loop's history in the checkpoint grows with the batches between evaluations."""
        if self.sums is None:
            return {}
        rows = [{"batch": b, **{key: {n: v for n, v, here in zip(self.names, values.tolist(), present) if here}
                                for key, values in (("losses", losses), ("weights", weights))}}
                for b, losses, weights, present in self.rows]
        losses, weights, counts = self.sums.tolist()
        self.sums, self.rows, self.stride = None, [], 1
        return {"task_losses": {n: x / c if c else None for n, x, c in zip(self.names, losses, counts)},
                "task_weights": {n: x / c if c else None for n, x, c in zip(self.names, weights, counts)},
                "task_batches": {n: int(c) for n, c in zip(self.names, counts)}, "per_batch": rows}

    def step_log(self) -> dict:
        """``task_losses``, ``task_weights``: each member's means over its batches since the last call (the loop's
        step records)."""
        if self.step_sums is None:
            return {}
        losses, weights, counts = self.step_sums.tolist()
        self.step_sums = None
        return {key: {n: x / c for n, x, c in zip(self.names, sums, counts) if c}
                for key, sums in (("task_losses", losses), ("task_weights", weights))}

    def get_extra_state(self) -> dict:
        """For checkpoints: the scheme's state (initial losses), the batch count, what :meth:`log` has not reported
        yet, and the task's count of drawn batches (the sampled members' sequence goes on from it)."""
        return {"scheme": self.scheme.state_dict(), "batches": self.batches, "draws": self.task.draws,
                "sums": None if self.sums is None else self.sums.cpu(), "stride": self.stride,
                "step_sums": None if self.step_sums is None else self.step_sums.cpu(),
                "rows": [(b, losses.cpu(), weights.cpu(), present.cpu()) for b, losses, weights, present in self.rows]}

    def set_extra_state(self, state: dict) -> None:
        self.scheme.load_state_dict(state["scheme"])
        self.batches, self.task.draws, self.sums = state["batches"], state["draws"], state["sums"]
        self.stride, self.rows, self.step_sums = state["stride"], list(state["rows"]), state["step_sums"]
