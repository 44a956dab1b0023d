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
* Viterbi (decoding): :func:`zhie.core.decoding.viterbi`, in numpy on the host (the one implementation, shared with
  exported models); :meth:`CRF.viterbi` hands it this CRF's scores.

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

from zhie.core import decoding

__all__ = ["CRF", "bio_allowed_transitions", "bmes_allowed_transitions"]

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
        """Batched Viterbi (:func:`zhie.core.decoding.viterbi`) -> ``(tags [b, n] long with -1 on padded steps, best
        scores [b])`` on the emissions' device.

        ``allowed [L, L]`` (bool, ``allowed[i, j]`` = tag ``j`` may follow tag ``i``), ``allowed_start [L]``
        and ``allowed_end [L]`` restrict the paths (e.g. from :func:`bio_allowed_transitions`); forbidden
        moves get a score of ``-1e12``. If no allowed path exists the result is the least-violating path.
        """
        mask = self._check(emissions, mask)
        L = self.num_tags
        given = (allowed, allowed_start, allowed_end)
        constraints = None if all(c is None for c in given) else tuple(
            self._bool(c, shape, name) for c, shape, name in zip(given, ((L, L), (L,), (L,)),
                                                                 ("allowed", "allowed_start", "allowed_end")))
        with torch.no_grad():
            start, end = (t.detach().cpu().numpy() for t in self._start_end(self.transitions.float()))
            scores = decoding.constrained(self.transitions.detach().float().cpu().numpy(), start, end, constraints)
            tags, best = decoding.viterbi(emissions.detach().float().cpu().numpy(), mask.sum(1).cpu().numpy(), *scores)
        return torch.from_numpy(tags).to(emissions.device), torch.from_numpy(best).to(emissions.device)

    def _bool(self, t: Tensor | None, shape: tuple[int, ...], name: str):
        """A constraint as a numpy bool array (all allowed when ``t`` is None)."""
        if t is None:
            return torch.ones(shape, dtype=torch.bool).numpy()
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        return t.to(device="cpu", dtype=torch.bool).numpy()


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


# ----------------------------------------------------------------------------------------------------
# transition constraints
# ----------------------------------------------------------------------------------------------------
def bio_allowed_transitions(labels: list[str]) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`zhie.core.decoding.bio_allowed_transitions` as bool tensors."""
    return tuple(torch.from_numpy(a) for a in decoding.bio_allowed_transitions(labels))


def bmes_allowed_transitions(labels: list[str]) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`zhie.core.decoding.bmes_allowed_transitions` as bool tensors."""
    return tuple(torch.from_numpy(a) for a in decoding.bmes_allowed_transitions(labels))
