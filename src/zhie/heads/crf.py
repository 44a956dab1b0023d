"""Linear-chain CRF with batched forward algorithm and Viterbi (spec §8).

Conventions follow pytorch-crf (``torchcrf.CRF(num_tags, batch_first=True)``): ``transitions[i, j]`` is the
score of moving from tag ``i`` to tag ``j``; optional ``start_transitions`` / ``end_transitions`` vectors;
a path's score is

    score(y) = start[y_0] + sum_t e_t(y_t) + sum_{t>0} T[y_{t-1}, y_t] + end[y_last]

and ``log_likelihood = score(y) - log Z``. Sequences are right-padded: ``mask[:, 0]`` must be all on and
padded steps carry the forward/Viterbi state unchanged. Everything runs in fp32 and is batched over the sequences;
the only python loops are over time steps, with a few small ops per step and no host synchronisation inside them:

* ``log Z`` (training): the forward recursion with per-step scaling (Rabiner's scaled forward algorithm), which
  turns the ``logsumexp`` over ``[b, L, L]`` into one ``[b, L] @ [L, L]`` matmul per step, and an explicit backward
  pass (the backward recursion and the marginals) instead of autograd through every step. It is exact in fp32 when
  the transitions and end scores each span at most ``_SCALED_RANGE`` nats (any trained CRF); beyond that (e.g.
  ``-inf`` entries) the plain log-space recursion runs instead, so the result never underflows.
* Viterbi (decoding): on the host after one copy of the emissions, tag-major (the batch is the contiguous axis), keeping
  only the running scores; the backtrace recomputes each step's argmax for the one tag on the path (``[L, b]`` per
  step instead of storing ``[n, b, L]`` pointers).

Larger learning rate for the transitions (spec §8.1): the module carries its multiplier (``lr_multiplier``) and
says which of its parameters it applies to (:meth:`CRF.lr_multipliers`); :func:`zhie.training.build_param_groups`
puts them in their own group with ``lr * multiplier`` and no weight decay, whatever module holds the CRF. With Adam
this equals bert4keras's re-parametrisation (store ``T / m``, use ``m * T``): Adam's step does not depend on the
gradient's scale, so the step on ``T / m`` is that of ``T`` at ``lr``, i.e. ``T`` moves ``m`` times as far;
unlike the re-parametrisation it leaves the gradient norm (and so clipping) unchanged.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from zhie.spans import parse_tag

__all__ = ["CRF", "bio_allowed_transitions", "bmes_allowed_transitions"]

# Score given to forbidden transitions / start / end tags at decoding. Viterbi runs in fp32, where this is
# exact enough: any allowed path beats any forbidden one as long as real path scores are << 1e12.
_FORBIDDEN = -1e12
# The scaled forward algorithm keeps probabilities in fp32; with the transitions (per column) and the end scores each
# spanning at most this many nats, no step's normaliser can underflow (e^-60 / L >> 1e-38). Wider: log space.
_SCALED_RANGE = 60.0


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
        """``log Z`` by the forward algorithm -> ``[b]`` (fp32, differentiable once).

        ``alpha_0 = start + e_0``, ``alpha_t(j) = logsumexp_i(alpha_{t-1}(i) + T[i, j]) + e_t(j)`` over unmasked
        steps, ``log Z = logsumexp_j(alpha_last(j) + end(j))``; computed scaled (:class:`_ScaledLogPartition`) or,
        when the scores' range could underflow there, in log space (:meth:`_log_partition_logspace`).
        """
        mask = self._check(emissions, mask)
        em = emissions.float()
        start, end = self._start_end(em)
        trans, end_ = self.transitions.detach(), end.detach()
        spread = torch.stack([(trans.amax(0) - trans.amin(0)).amax(), end_.amax() - end_.amin()])
        if not bool((spread <= _SCALED_RANGE).all()):  # also False for inf / nan
            return self._log_partition_logspace(em, mask, start, end)
        return _ScaledLogPartition.apply(em, mask, self.transitions.float(), start, end)

    def _log_partition_logspace(self, em: Tensor, mask: Tensor, start: Tensor, end: Tensor) -> Tensor:
        """The forward recursion in log space, one ``logsumexp`` over ``[b, L, L]`` per step (autograd)."""
        alpha = em[:, 0] + start
        for t in range(1, em.shape[1]):
            nxt = torch.logsumexp(alpha.unsqueeze(2) + self.transitions + em[:, t].unsqueeze(1), dim=1)
            alpha = torch.where(mask[:, t].unsqueeze(1), nxt, alpha)
        return torch.logsumexp(alpha + end, dim=1)

    def _start_end(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """``(start [L], end [L])`` scores, zeros when the CRF has none."""
        if self.start_transitions is None:
            zeros = like.new_zeros(self.num_tags)
            return zeros, zeros
        return self.start_transitions.float(), self.end_transitions.float()

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
        """Batched Viterbi -> ``(tags [b, n] long with -1 on padded steps, best scores [b])`` on the emissions' device.

        ``allowed [L, L]`` (bool, ``allowed[i, j]`` = tag ``j`` may follow tag ``i``), ``allowed_start [L]``
        and ``allowed_end [L]`` restrict the paths (e.g. from :func:`bio_allowed_transitions`); forbidden
        moves get a score of ``-1e12``. If no allowed path exists the result is the least-violating path.
        Runs on the host (one copy of the emissions there, one copy of the result back): decoding is a chain of
        ``n`` small steps, which a GPU would run as ``n`` rounds of kernel launches.
        """
        mask = self._check(emissions, mask)
        with torch.no_grad():
            trans = self.transitions.detach().float().cpu()
            start, end = (t.detach().cpu() for t in self._start_end(trans))
            L = self.num_tags
            if allowed is not None:
                trans = trans.masked_fill(~self._bool(allowed, (L, L), "allowed"), _FORBIDDEN)
            if allowed_start is not None:
                start = start.masked_fill(~self._bool(allowed_start, (L,), "allowed_start"), _FORBIDDEN)
            if allowed_end is not None:
                end = end.masked_fill(~self._bool(allowed_end, (L,), "allowed_end"), _FORBIDDEN)
            tags, best = _viterbi(emissions.detach().float().cpu(), mask.cpu(), trans, start, end)
        return tags.to(emissions.device), best.to(emissions.device)

    def _bool(self, t: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        return t.to(device="cpu", dtype=torch.bool)


# ----------------------------------------------------------------------------------------------------
# the two recursions
# ----------------------------------------------------------------------------------------------------
class _ScaledLogPartition(torch.autograd.Function):
    """``log Z`` of right-padded sequences by the scaled forward algorithm, with its gradient in closed form.

    With ``K = exp(T - c)`` (``c_j = max_i T[i, j]``) and ``E_t(j) = exp(e_t(j) + c_j - M_t)`` (``M_t`` its row max),
    the forward states ``p_t = exp(alpha_t - s_t)`` follow ``q_t = (p_{t-1} @ K) * E_t``, ``z_t = sum_j q_t(j)``,
    ``p_t = q_t / z_t``, so ``alpha_t = log p_t + sum_{u <= t} (log z_u + M_u) + log max exp(alpha_0)``, and
    ``log Z = s_last + log(p_last @ exp(end))``. Every row runs over all ``n`` steps (a right-padded row's later
    steps never feed its earlier ones) and reads its own last real step.

    Gradient: ``d log Z / d e_t(j)`` is the marginal ``mu_t(j) = p_t(j) r_t(j) / sum_j p_t r_t`` with the scaled
    backward states ``r_{last} ∝ exp(end)``, ``r_{t-1} ∝ K @ (E_t * r_t)``; ``d log Z / d T[i, j]`` sums the
    pair marginals ``p_{t-1}(i) K[i, j] E_t(j) r_t(j) / (z_t sum_j p_t r_t)`` over real steps ``t >= 1``;
    ``start`` / ``end`` get the first / last marginals.
    """

    @staticmethod
    def forward(ctx, em: Tensor, mask: Tensor, trans: Tensor, start: Tensor, end: Tensor) -> Tensor:
        with torch.autocast(em.device.type, enabled=False):
            b, n, L = em.shape
            em = em.masked_fill(~mask.unsqueeze(-1), 0.0).transpose(0, 1)  # [n, b, L]; padded steps: any finite
            c = trans.amax(0)
            k = torch.exp(trans - c)
            x = em + c
            m = x.amax(-1, keepdim=True)  # [n, b, 1]
            e = torch.exp(x - m)
            alpha0 = em[0] + start
            m[0] = alpha0.amax(-1, keepdim=True)
            p = em.new_empty(n, b, L)
            z = em.new_ones(n, b, 1)
            torch.exp(alpha0 - m[0], out=p[0])
            p_, z_, e_ = p.unbind(0), z.unbind(0), e.unbind(0)  # views made once: indexing in the loop costs
            for t in range(1, n):
                q = torch.mm(p_[t - 1], k, out=p_[t]).mul_(e_[t])
                torch.sum(q, -1, keepdim=True, out=z_[t])
                q.div_(z_[t])
            steps = mask.t().unsqueeze(-1)  # [n, b, 1]
            last = mask.sum(1) - 1
            rows = torch.arange(b, device=em.device)
            exp_end = torch.exp(end - end.amax())
            log_z = ((z.log() + m) * steps).sum(0).squeeze(-1) + torch.log(p[last, rows] @ exp_end) + end.amax()
        ctx.save_for_backward(p, z, e, k, exp_end, steps, last)
        return log_z

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, z, e, k, exp_end, steps, last = ctx.saved_tensors
        n, b, L = p.shape
        rows = torch.arange(b, device=p.device)
        with torch.autocast(p.device.type, enabled=False):
            r = torch.empty_like(p)
            r_end = (exp_end / exp_end.sum()).expand(b, L)
            r[n - 1] = r_end
            before_last = (torch.arange(n, device=p.device)[:, None] < last).unsqueeze(-1)  # [n, b, 1]
            r_, e_, before_last_, k_t = r.unbind(0), e.unbind(0), before_last.unbind(0), k.t()
            for t in range(n - 1, 0, -1):
                back = torch.mm(e_[t] * r_[t], k_t)
                torch.where(before_last_[t - 1], back / back.sum(-1, keepdim=True), r_end, out=r_[t - 1])
            pr = p * r
            norm = pr.sum(-1, keepdim=True)  # [n, b, 1]
            weight = grad.float().view(1, b, 1) * steps
            mu = pr * (weight / norm)  # marginals times the incoming gradient, 0 on padded steps
            pair = e[1:] * r[1:] * (weight[1:] / (z[1:] * norm[1:]))
            d_trans = k * (p[:-1].reshape(-1, L).t() @ pair.reshape(-1, L))
        return mu.transpose(0, 1), None, d_trans, mu[0].sum(0), mu[last, rows].sum(0)


def _viterbi(em: Tensor, mask: Tensor, trans: Tensor, start: Tensor, end: Tensor) -> tuple[Tensor, Tensor]:
    """Viterbi on host tensors ``em [b, n, L]``, right-padded ``mask [b, n]`` -> ``(tags [b, n], best [b])``.

    Forward: ``delta_0 = start + e_0``, ``delta_t(j) = max_i(delta_{t-1}(i) + T[i, j]) + e_t(j)``, kept for every
    step and each row read at its own last real step. Tag-major layout (``delta [n, L, b]``): the batch is the
    contiguous axis, so each step is one ``[L, L, b]`` add and a max over its outer axis, vectorised over the batch.
    Backtrace from ``argmax_j(delta_last(j) + end(j))``: the tag before ``j`` at step ``t`` is
    ``argmax_i(delta_{t-1}(i) + T[i, j])``, the same fp32 sums as the max.
    """
    b, n, L = em.shape
    em = em.permute(1, 2, 0).contiguous()  # [n, L, b]
    delta = torch.empty_like(em)
    scores = em.new_empty(L, L, b)  # [i, j, b]: delta_{t-1}(i) + T[i, j]
    trans_ijb = trans.unsqueeze(2)  # [i, j, 1]
    torch.add(em[0], start[:, None], out=delta[0])
    delta_, em_ = delta.unbind(0), em.unbind(0)
    for t in range(1, n):
        torch.add(delta_[t - 1].unsqueeze(1), trans_ijb, out=scores)
        torch.add(scores.amax(0), em_[t], out=delta_[t])
    lengths = mask.sum(1)
    best, tag = (delta[lengths - 1, :, torch.arange(b)] + end).max(-1)

    delta_np, trans_np, real = delta.numpy(), trans.numpy(), (lengths[None, :] > torch.arange(n)[:, None]).numpy()
    tags = np.full((n, b), -1, dtype=np.int64)
    tag = tag.numpy()
    for t in range(n - 1, 0, -1):
        tags[t] = np.where(real[t], tag, -1)
        tag = np.where(real[t], (delta_np[t - 1] + trans_np[:, tag]).argmax(0), tag)
    tags[0] = tag
    return torch.from_numpy(tags).t(), best


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
