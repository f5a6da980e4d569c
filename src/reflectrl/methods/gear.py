"""gear: granularity-adaptive advantage reweighting from a self-teacher (arXiv 2605.11853, GEAR).

The teacher is the policy itself with the reference answer in its context (stop-gradient); on each
sampled completion it gives every token a log-probability, and the divergence ``d_t`` between teacher and
student marks where the student departs from what the answer implies. Only the abstract of the paper is
public, so everything below beyond that idea is reflectrl's (docs/methods.md):

* **Divergence** ``d_t``: the sampled token's log-ratio ``log pi_T(y_t) - log pi(y_t)`` (default), or the
  full ``KL(pi || pi_T)`` of the two next-token distributions.
* **Departures**: tokens where ``|d_t|`` crosses a threshold: ``absolute`` (``|d_t| > thr``), ``zscore``
  (``|d_t - mean| / std > thr`` within the sequence) or ``quantile`` (``|d_t|`` above the ``thr``-quantile of
  the sequence).
* **Segments**: from a departure at ``t0``, the continuation is one segment up to the next boundary: the
  next departure, the end of the agent's turn, or the first token whose entropy is at most
  ``gear_entropy_threshold`` (a token the policy is sure of ends the deviation; tokens above it extend the
  segment). Every token of a segment takes the weight computed at ``t0``; tokens outside segments keep
  their own.
* **Weight** (the RLSD teacher-modulated form): ``w_t = (1 - lam) + lam * clip(exp(sign(A) * d_s), 1 - eps,
  1 + eps)`` with ``d_s`` the divergence the token's weight reads; ``A_t = w_t * A`` keeps the sign of the
  group advantage ``A`` (``w_t > 0``). A weight of the method contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from ..contract.base import Shaping, StepBatch


@dataclass
class GEAROptions:
    """Options of gear (each a ``reflectrl llm train --algo gear`` flag)."""

    gear_divergence: Literal["logratio", "kl"] = "logratio"
    """d_t: the sampled token's log-ratio log pi_T - log pi, or the full KL(pi || pi_T) (a second forward)."""
    gear_departure: Literal["absolute", "zscore", "quantile"] = "zscore"
    """How |d_t| crosses the threshold: above it, its z-score within the sequence above it, or above that quantile."""
    gear_threshold: float = 2.0
    """The departure threshold (nats for absolute, standard deviations for zscore, a quantile in (0, 1) for quantile)."""
    gear_entropy_threshold: float | None = 0.5
    """A segment ends at the first token whose entropy (nats) is at most this; above it extends the segment
    (None: segments run to the next departure or the turn's end)."""
    gear_lambda: float = 0.5
    """lam in w = (1 - lam) + lam * clip(exp(sign(A) * d), 1 - eps, 1 + eps) (0: plain GRPO)."""
    gear_eps: float = 0.2
    """eps of that clip."""

    def validate_gear_paper(self) -> list[tuple[bool, str]]:
        return [
            (self.gear_threshold > 0 and (self.gear_departure != "quantile" or self.gear_threshold < 1),
             "--gear-threshold must be positive (and below 1 for quantile)"),
            (self.gear_entropy_threshold is None or self.gear_entropy_threshold >= 0,
             "--gear-entropy-threshold must be non-negative"),
            (0 <= self.gear_lambda <= 1 and 0 < self.gear_eps < 1, "--gear-lambda must be in [0, 1], --gear-eps in (0, 1)"),
        ]


def departures(d: Tensor, mask: Tensor, kind: str, threshold: float) -> Tensor:
    """``[R, T]`` bool: the tokens (inside ``mask``) where ``|d_t|`` crosses ``threshold`` by ``kind``."""
    m = mask.bool()
    a = d.abs()
    if kind == "absolute":
        return m & (a > threshold)
    n = m.sum(1, keepdim=True).clamp_min(1)
    if kind == "zscore":
        mean = (d * m).sum(1, keepdim=True) / n
        var = (((d - mean) * m) ** 2).sum(1, keepdim=True) / (n - 1).clamp_min(1)
        z = (d - mean).abs() / var.sqrt().clamp_min(1e-8)
        return m & (z > threshold) & (n > 1)
    if kind == "quantile":
        big = torch.where(m, a, torch.full_like(a, float("nan")))
        q = torch.nanquantile(big, threshold, dim=1, keepdim=True)
        return m & (a > q)
    raise ValueError(f"unknown departure rule {kind!r}; choose absolute, zscore or quantile")


def segment_sources(dep: Tensor, mask: Tensor, entropy: Tensor | None, threshold: float | None,
                    turn: Tensor | None = None) -> Tensor:
    """``[R, T]`` long: the step whose divergence each token's weight reads. A departure at ``t0`` starts a
    segment that runs until the next departure, a change of turn, a step outside ``mask`` or (with an entropy
    ``threshold``) the first step whose entropy is at most it; tokens outside segments read their own step."""
    R, T = dep.shape
    m, dp = mask.bool().tolist(), dep.tolist()
    ent = entropy.tolist() if (entropy is not None and threshold is not None) else None
    tn = turn.tolist() if turn is not None else None
    out = []
    for r in range(R):
        row, cur = list(range(T)), -1
        mr, dr = m[r], dp[r]
        for t in range(T):
            if not mr[t]:
                cur = -1
                continue
            if cur >= 0 and tn is not None and tn[r][t] != tn[r][cur]:
                cur = -1
            if dr[t]:
                cur = t
            elif cur >= 0 and ent is not None and ent[r][t] <= threshold:
                cur = -1
            if cur >= 0:
                row[t] = cur
        out.append(row)
    return torch.tensor(out, dtype=torch.long).reshape(R, T)


def teacher_weights(d: Tensor, adv: Tensor, lam: float, eps: float) -> Tensor:
    """``(1 - lam) + lam * clip(exp(sign(adv) * d), 1 - eps, 1 + eps)``: positive, so sign(w * adv) = sign(adv)."""
    return (1.0 - lam) + lam * torch.exp(torch.sign(adv) * d).clamp(1.0 - eps, 1.0 + eps)


class GEAR:
    """Departures, adaptive segments and teacher-modulated weights on a batch with teacher log-probs."""

    fit_first = True
    reads_states = False  # it shapes from the teacher's and the policy's log-probs, not hidden states

    def __init__(self, opts: GEAROptions):
        self.o = opts
        self._metrics: dict[str, float] = {}
        self.reads = ("teacher_kl",) if opts.gear_divergence == "kl" else ("teacher_logp",)
        """The teacher pass's field it reads (``StepBatch.per_step``)."""

    def fit(self, batch: StepBatch) -> None:
        """Nothing to learn: the teacher is the policy itself."""

    def divergence(self, batch: StepBatch) -> Tensor:
        ps = batch.per_step
        if self.o.gear_divergence == "kl":
            return ps["teacher_kl"]
        return ps["teacher_logp"] - ps["logp"]

    def shape(self, batch: StepBatch) -> Shaping:
        mask = batch.mask if batch.mask is not None else torch.ones_like(batch.rewards)
        d = self.divergence(batch) * mask
        dep = departures(d, mask, self.o.gear_departure, self.o.gear_threshold)
        src = segment_sources(dep, mask, batch.per_step.get("entropy"), self.o.gear_entropy_threshold, batch.turn_ids)
        d_src = torch.gather(d, 1, src)
        w = teacher_weights(d_src, batch.advantages, self.o.gear_lambda, self.o.gear_eps)
        w = torch.where(mask.bool(), w, torch.ones_like(w))
        real = mask.bool()
        in_seg = real & (src != torch.arange(src.shape[1]).expand_as(src))
        n_dep = int(dep.sum())
        self._metrics = {
            "gear/departure_rate": float(dep.sum() / real.sum().clamp_min(1)),
            "gear/segment_len": float((int(in_seg.sum()) + n_dep) / n_dep) if n_dep else 0.0,
            "gear/weight_mean": float(w[real].mean()) if real.any() else 1.0,
            "gear/weight_std": float(w[real].std()) if int(real.sum()) > 1 else 0.0,
            "gear/weight_min": float(w[real].min()) if real.any() else 1.0,
            "gear/weight_max": float(w[real].max()) if real.any() else 1.0,
            "gear/teacher_gap": float(d[real].mean()) if real.any() else 0.0,
        }
        return Shaping(weights=w)

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return {}, {}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        """Stateless."""
