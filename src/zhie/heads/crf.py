"""Linear-chain CRF with batched forward algorithm and Viterbi (spec §8).

Conventions follow pytorch-crf (``torchcrf.CRF(num_tags, batch_first=True)``): ``transitions[i, j]`` is the
score of moving from tag ``i`` to tag ``j``; optional ``start_transitions`` / ``end_transitions`` vectors;
a path's score is

    score(y) = start[y_0] + sum_t e_t(y_t) + sum_{t>0} T[y_{t-1}, y_t] + end[y_last]

and ``log_likelihood = score(y) - log Z``. Sequences are right-padded: ``mask[:, 0]`` must be all on and
padded steps carry the forward/Viterbi state unchanged. Everything runs in fp32 and is batched in torch;
the only python loop is over time steps.

Larger learning rate for the transitions (spec §8.1): the module carries its multiplier (``lr_multiplier``) and
says which of its parameters it applies to (:meth:`CRF.lr_multipliers`); :func:`zhie.training.build_param_groups`
puts them in their own group with ``lr * multiplier`` and no weight decay, whatever module holds the CRF. With Adam
this equals bert4keras's re-parametrisation (store ``T / m``, use ``m * T``): Adam's step does not depend on the
gradient's scale, so the step on ``T / m`` is that of ``T`` at ``lr``, i.e. ``T`` moves ``m`` times as far;
unlike the re-parametrisation it leaves the gradient norm (and so clipping) unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zhie.spans import parse_tag

__all__ = ["CRF", "bio_allowed_transitions", "bmes_allowed_transitions"]

# Score given to forbidden transitions / start / end tags at decoding. Viterbi runs in fp32, where this is
# exact enough: any allowed path beats any forbidden one as long as real path scores are << 1e12.
_FORBIDDEN = -1e12


class CRF(nn.Module):
    """Conditional random field over ``num_tags`` tags.

    Args:
        num_tags: number of tags ``L``.
        start_end_transitions: learn start/end score vectors as pytorch-crf does (bert4keras has none;
            with ``False`` they are absent and count as zero).
        lr_multiplier: the transition tensors learn at the base learning rate times this (spec §8: >= 100).

    Parameters: ``transitions [L, L]`` (glorot-uniform init, as bert4keras, spec §8.1) and, if enabled,
    ``start_transitions [L]`` / ``end_transitions [L]`` (zero init).
    """

    def __init__(self, num_tags: int, start_end_transitions: bool = True, lr_multiplier: float = 100.0) -> None:
        super().__init__()
        if num_tags <= 0:
            raise ValueError(f"num_tags must be positive, got {num_tags}")
        if lr_multiplier <= 0:
            raise ValueError(f"lr_multiplier must be > 0, got {lr_multiplier}")
        self.num_tags = num_tags
        self.lr_multiplier = float(lr_multiplier)
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))
        if start_end_transitions:
            self.start_transitions = nn.Parameter(torch.zeros(num_tags))
            self.end_transitions = nn.Parameter(torch.zeros(num_tags))
        else:
            self.register_parameter("start_transitions", None)
            self.register_parameter("end_transitions", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.transitions)
        if self.start_transitions is not None:
            nn.init.zeros_(self.start_transitions)
            nn.init.zeros_(self.end_transitions)

    def lr_multipliers(self) -> dict[str, float]:
        """``{name of own parameter: learning-rate multiplier}``: every transition tensor at ``lr_multiplier``
        (read by :func:`zhie.training.build_param_groups`, spec §8.1)."""
        return {name: self.lr_multiplier for name, _ in self.named_parameters(recurse=False)}

    def extra_repr(self) -> str:
        return (f"num_tags={self.num_tags}, start_end_transitions={self.start_transitions is not None}, "
                f"lr_multiplier={self.lr_multiplier:g}")

    # ------------------------------------------------------------------------------------------------
    # checks
    # ------------------------------------------------------------------------------------------------
    def _check(self, emissions: Tensor, mask: Tensor | None, tags: Tensor | None = None) -> Tensor:
        if emissions.dim() != 3 or emissions.shape[-1] != self.num_tags:
            raise ValueError(
                f"emissions must be [batch, seq, {self.num_tags}], got {tuple(emissions.shape)}")
        if emissions.shape[1] == 0:
            raise ValueError("emissions have an empty sequence axis")
        if tags is not None and tags.shape != emissions.shape[:2]:
            raise ValueError(f"tags must be {tuple(emissions.shape[:2])}, got {tuple(tags.shape)}")
        if mask is None:
            return torch.ones(emissions.shape[:2], dtype=torch.bool, device=emissions.device)
        if mask.shape != emissions.shape[:2]:
            raise ValueError(f"mask must be {tuple(emissions.shape[:2])}, got {tuple(mask.shape)}")
        mask = mask.to(device=emissions.device, dtype=torch.bool)
        if not bool(mask[:, 0].all()):
            raise ValueError("the first timestep of every sequence must be unmasked (right padding only)")
        return mask

    # ------------------------------------------------------------------------------------------------
    # training
    # ------------------------------------------------------------------------------------------------
    def path_score(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None) -> Tensor:
        """Score of the tag paths ``tags [b, n]`` (padded steps ignored) -> ``[b]`` (fp32)."""
        mask = self._check(emissions, mask, tags)
        em = emissions.float()
        maskf = mask.to(em.dtype)
        tags = tags.long().masked_fill(~mask, 0)  # padded tags may hold anything, e.g. -100
        score = (em.gather(-1, tags.unsqueeze(-1)).squeeze(-1) * maskf).sum(1)
        score = score + (self.transitions[tags[:, :-1], tags[:, 1:]] * maskf[:, 1:]).sum(1)
        if self.start_transitions is not None:
            last = tags.gather(1, (mask.sum(1, keepdim=True) - 1)).squeeze(1)
            score = score + self.start_transitions[tags[:, 0]] + self.end_transitions[last]
        return score

    def log_partition(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        """``log Z`` by the forward algorithm in log space -> ``[b]`` (fp32)."""
        mask = self._check(emissions, mask)
        em = emissions.float()
        alpha = em[:, 0]
        if self.start_transitions is not None:
            alpha = alpha + self.start_transitions
        for t in range(1, em.shape[1]):
            nxt = torch.logsumexp(alpha.unsqueeze(2) + self.transitions + em[:, t].unsqueeze(1), dim=1)
            alpha = torch.where(mask[:, t].unsqueeze(1), nxt, alpha)
        if self.end_transitions is not None:
            alpha = alpha + self.end_transitions
        return torch.logsumexp(alpha, dim=1)

    def log_likelihood(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None) -> Tensor:
        """Per-sequence log-likelihood ``score(tags) - log Z`` -> ``[b]``; the loss is ``-mean`` of it.

        Equals ``torchcrf.CRF(L, batch_first=True)(emissions, tags, mask, reduction='none')``.
        """
        return self.path_score(emissions, tags, mask) - self.log_partition(emissions, mask)

    def forward(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None) -> Tensor:
        """Same as :meth:`log_likelihood`."""
        return self.log_likelihood(emissions, tags, mask)

    # ------------------------------------------------------------------------------------------------
    # decoding
    # ------------------------------------------------------------------------------------------------
    def viterbi(self, emissions: Tensor, mask: Tensor | None = None, allowed: Tensor | None = None,
                allowed_start: Tensor | None = None, allowed_end: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        """Batched Viterbi -> ``(tags [b, n] long with -1 on padded steps, best scores [b])``.

        ``allowed [L, L]`` (bool, ``allowed[i, j]`` = tag ``j`` may follow tag ``i``), ``allowed_start [L]``
        and ``allowed_end [L]`` restrict the paths (e.g. from :func:`bio_allowed_transitions`); forbidden
        moves get a score of ``-1e12``. If no allowed path exists the result is the least-violating path.
        """
        mask = self._check(emissions, mask)
        em = emissions.float()
        b, n, L = em.shape
        trans = self.transitions.detach().float()
        start = em.new_zeros(L) if self.start_transitions is None else self.start_transitions.detach().float()
        end = em.new_zeros(L) if self.end_transitions is None else self.end_transitions.detach().float()
        if allowed is not None:
            trans = trans.masked_fill(~self._bool(allowed, (L, L), "allowed"), _FORBIDDEN)
        if allowed_start is not None:
            start = start.masked_fill(~self._bool(allowed_start, (L,), "allowed_start"), _FORBIDDEN)
        if allowed_end is not None:
            end = end.masked_fill(~self._bool(allowed_end, (L,), "allowed_end"), _FORBIDDEN)

        em = em.detach()
        score = start + em[:, 0]  # [b, L]: best score of a path ending in each tag
        identity = torch.arange(L, device=em.device).expand(b, L)
        history = []
        for t in range(1, n):
            best, idx = (score.unsqueeze(2) + trans + em[:, t].unsqueeze(1)).max(dim=1)
            on = mask[:, t].unsqueeze(1)
            score = torch.where(on, best, score)
            history.append(torch.where(on, idx, identity))  # padded steps point to themselves
        best_score, last = (score + end).max(dim=1)
        path = [last]
        for idx in reversed(history):
            last = idx.gather(1, last.unsqueeze(1)).squeeze(1)
            path.append(last)
        tags = torch.stack(path[::-1], dim=1)
        return tags.masked_fill(~mask, -1), best_score

    def _bool(self, t: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        return t.to(device=self.transitions.device, dtype=torch.bool)


# ----------------------------------------------------------------------------------------------------
# transition constraints
# ----------------------------------------------------------------------------------------------------
def bio_allowed_transitions(labels: list[str]) -> tuple[Tensor, Tensor, Tensor]:
    """Constraints of the BIO scheme for ``labels`` (tag id -> name, e.g. ``["O", "B-PER", "I-PER"]``).

    Returns bool ``(allowed [L, L], allowed_start [L], allowed_end [L])``: ``I-X`` may only follow ``B-X``
    or ``I-X`` (so ``O -> I-X`` and ``B-X/I-X -> I-Y``, ``Y != X``, are forbidden) and a sequence may not
    start with ``I-X``; every tag may end a sequence.
    """
    parsed = [parse_tag(label, "BIO") for label in labels]
    L = len(labels)
    allowed = torch.ones(L, L, dtype=torch.bool)
    for j, (pj, tj) in enumerate(parsed):
        if pj == "I":
            for i, (pi, ti) in enumerate(parsed):
                allowed[i, j] = pi in ("B", "I") and ti == tj
    start = torch.tensor([p != "I" for p, _ in parsed], dtype=torch.bool)
    end = torch.ones(L, dtype=torch.bool)
    return allowed, start, end


def bmes_allowed_transitions(labels: list[str]) -> tuple[Tensor, Tensor, Tensor]:
    """Constraints of the BMES scheme (word segmentation ``["S", "B", "M", "E"]``, or typed ``"B-X"`` with
    ``"O"``; ``"I"`` is read as ``"M"`` so BIOES works too).

    Inside a word (after ``B-X`` or ``M-X``) only ``M-X`` / ``E-X`` may follow; after ``S``, ``E`` or ``O``
    only ``B``, ``S`` or ``O``. So ``S->M, S->E, B->S, B->B, M->S, M->B, E->M, E->E`` are forbidden, a
    sequence may not start with ``M``/``E`` nor end with ``B``/``M``.
    Returns bool ``(allowed [L, L], allowed_start [L], allowed_end [L])``.
    """
    scheme = "BMES" if all(len(label) == 1 and label != "O" for label in labels) else "BIOES"
    parsed = [(("M" if p == "I" else p), t) for p, t in (parse_tag(label, scheme) for label in labels)]
    L = len(labels)
    allowed = torch.zeros(L, L, dtype=torch.bool)
    for i, (pi, ti) in enumerate(parsed):
        for j, (pj, tj) in enumerate(parsed):
            if pi in ("B", "M"):
                allowed[i, j] = pj in ("M", "E") and tj == ti
            else:
                allowed[i, j] = pj in ("B", "S", "O")
    start = torch.tensor([p in ("B", "S", "O") for p, _ in parsed], dtype=torch.bool)
    end = torch.tensor([p in ("S", "E", "O") for p, _ in parsed], dtype=torch.bool)
    return allowed, start, end
