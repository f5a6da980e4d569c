"""PPO-family losses on ``[rows, steps]`` tensors (or any shape with a matching mask)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .masked import agg_loss, masked_mean
from .types import StepMask, Steps


def ppo_policy_loss(
    logp: Steps,
    old_logp: Steps,
    advantages: Steps,
    mask: StepMask | None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    agg_mode: str = "token-mean",
    norm_len: int | None = None,
    clip_c: float | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss ``-min(rho*A, clip(rho, 1-clip_low, 1+clip_high)*A)``.

    ``clip_high=None`` gives the symmetric range; ``clip_high > clip_low`` is DAPO's clip-higher.
    ``clip_c`` (> 1) adds dual-clip: for ``A < 0`` the loss is at most ``-clip_c * A`` (Ye et al. 2020).
    ``log_ratio_clamp`` clamps ``log rho`` to ``±clamp`` before the exponential (verl uses 20).
    Returns the aggregated loss and detached stats: ``clipfrac`` (CleanRL's: share of steps whose ratio
    lies outside the clip range), ``clip_binding_frac`` (verl's ``pg_clipfrac``: share where the clipped
    term is the one taken, i.e. the clip changes the loss), ``dual_clip_frac``, ``approx_kl`` (k3, as
    CleanRL logs it), ``old_approx_kl`` (k1).
    """
    term = ClippedTerm(logp, old_logp, advantages, clip_low, clip_high, clip_c, log_ratio_clamp)
    loss = agg_loss(term.per_step, mask, agg_mode, norm_len)
    return loss, term.stats(None if mask is None else mask.to(term.ratio.dtype))


class ClippedTerm:
    """The one clipped policy term every policy loss takes (per step, ``[R, T]``): the PPO clip with clip-higher,
    optional dual-clip and log-ratio clamp (:func:`ppo_policy_loss` documents each), and its statistics. A loss
    that treats some steps otherwise (exgrpo's replayed tokens) puts its own term over this one with
    ``torch.where``, so that every option of the clip holds for the other steps."""

    def __init__(self, logp: Steps, old_logp: Steps, advantages: Steps, clip_low: float = 0.2,
                 clip_high: float | None = None, clip_c: float | None = None, log_ratio_clamp: float | None = None):
        self.clip_low, self.clip_high = clip_low, clip_low if clip_high is None else clip_high
        self.clip_c, self.advantages = clip_c, advantages
        log_ratio = logp - old_logp
        if log_ratio_clamp is not None:
            log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
        self.log_ratio = log_ratio
        self.ratio = ratio = log_ratio.exp()
        pg1 = -advantages * ratio
        pg2 = -advantages * ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        self.clipped = torch.maximum(pg1, pg2)
        self.per_step = self.clipped
        if clip_c is not None:
            pg3 = -advantages * clip_c
            self.per_step = torch.where(advantages < 0, torch.minimum(pg3, self.clipped), self.clipped)

    def stats(self, m: Tensor | None) -> dict[str, Tensor]:
        """Detached statistics over the steps weighted by ``m`` (None: all)."""
        ratio, adv, low, high = self.ratio, self.advantages, self.clip_low, self.clip_high
        with torch.no_grad():
            outside = (ratio < 1.0 - low) | (ratio > 1.0 + high)
            binding = ((ratio < 1.0 - low) & (adv < 0)) | ((ratio > 1.0 + high) & (adv > 0))
            stats = {
                "clipfrac": masked_mean(outside.to(ratio.dtype), m),
                "clip_binding_frac": masked_mean(binding.to(ratio.dtype), m),
                "approx_kl": masked_mean((ratio - 1) - self.log_ratio, m),
                "old_approx_kl": masked_mean(-self.log_ratio, m),
            }
            if self.clip_c is not None:
                dual = (self.clipped > -adv * self.clip_c) & (adv < 0)
                stats["dual_clip_frac"] = masked_mean(dual.to(ratio.dtype), m)
        return stats


@dataclass
class PolicyLossConfig:
    """Settings of the registered policy losses (verl's actor names)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float | None = None
    clip_ratio_c: float | None = None
    """Dual-clip bound (> 1) for negative advantages; None: no dual clip."""
    log_ratio_clamp: float | None = None
    """Clamp of the log-ratio before exp; None: none."""
    norm_len: int | None = None
    """Divisor of ``seq-mean-token-sum-norm``."""


PolicyLoss = Callable[..., tuple[Tensor, dict[str, Tensor]]]
_POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register a policy loss ``fn(old_log_prob, log_prob, advantages, response_mask,
    loss_agg_mode, config, **kwargs) -> (loss, stats)`` (verl's argument names) under ``name``."""
    def deco(fn: PolicyLoss) -> PolicyLoss:
        if name in _POLICY_LOSSES and _POLICY_LOSSES[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered")
        _POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLoss:
    """Look up a registered policy loss."""
    if name not in _POLICY_LOSSES:
        raise KeyError(f"unknown policy loss {name!r}; registered: {', '.join(sorted(_POLICY_LOSSES))}")
    return _POLICY_LOSSES[name]


def policy_loss_names() -> list[str]:
    return sorted(_POLICY_LOSSES)


@register_policy_loss("vanilla")
def clipped_policy_loss(old_log_prob: Steps, log_prob: Steps, advantages: Steps, response_mask: StepMask | None,
                        loss_agg_mode: str = "token-mean", config: PolicyLossConfig | None = None,
                        **kwargs: object) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO clipped loss with clip-higher, optional dual-clip and log-ratio clamp (:func:`ppo_policy_loss`)."""
    c = config or PolicyLossConfig()
    return ppo_policy_loss(log_prob, old_log_prob, advantages, response_mask, c.clip_ratio_low, c.clip_ratio_high,
                           loss_agg_mode, c.norm_len, c.clip_ratio_c, c.log_ratio_clamp)


def value_loss(
    values: Steps,
    old_values: Steps,
    returns: Steps,
    mask: StepMask | None,
    clip_coef: float | None = None,
    agg_mode: str = "token-mean",
) -> Tensor:
    """``0.5 * (V - R)^2``; with ``clip_coef`` the PPO clipped form ``0.5 * max((V-R)^2, (V_clip-R)^2)``
    where ``V_clip = V_old + clip(V - V_old, -clip_coef, clip_coef)``."""
    err = (values - returns) ** 2
    if clip_coef is not None:
        v_clip = old_values + (values - old_values).clamp(-clip_coef, clip_coef)
        err = torch.maximum(err, (v_clip - returns) ** 2)
    return 0.5 * agg_loss(err, mask, agg_mode)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution given by ``logits`` along the last axis."""
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)


def approx_kl(logp: Steps, ref_logp: Steps, kind: str = "k3") -> Steps:
    """Per-step estimate of KL(pi || ref) from samples of pi (Schulman's estimators).

    ``k1 = logp - ref_logp`` (unbiased, high variance); ``k3 = exp(ref - logp) - (ref - logp) - 1``
    (unbiased, non-negative, low variance).
    """
    if kind == "k1":
        return logp - ref_logp
    if kind == "k3":
        d = ref_logp - logp
        return d.exp() - d - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1 or k3")


def explained_variance(pred: Tensor, target: Tensor) -> float:
    """1 - Var[target - pred] / Var[target] (nan when the target has no variance)."""
    var_y = target.var()
    if var_y == 0:
        return float("nan")
    return float(1.0 - (target - pred).var() / var_y)


def shaped_ratio(w: Tensor, beta: float = 0.1) -> Tensor:
    """ExGRPO's policy shaping of an off-policy ratio: ``f(w) = w / (w + beta)``, increasing and bounded by 1
    (it damps the gradient of large ratios instead of clipping them)."""
    return w / (w + beta)


@register_policy_loss("exgrpo")
def mixed_policy_loss(old_log_prob: Steps, log_prob: Steps, advantages: Steps, response_mask: StepMask | None,
                      loss_agg_mode: str = "token-mean", config: PolicyLossConfig | None = None,
                      offpolicy: StepMask | None = None, stored_logp: Steps | None = None,
                      **kwargs: object) -> tuple[Tensor, dict[str, Tensor]]:
    """ExGRPO's mixed objective on one batch: fresh tokens take the clipped loss (:class:`ClippedTerm`, every
    option of it: dual-clip, clip-higher, the log-ratio clamp); tokens of replayed stored
    trajectories (``offpolicy`` [R, T] = 1) take ``-A * f(w)`` with ``w = exp(logp - stored_logp)`` against the
    log-probs they were sampled with, unclipped (arXiv 2510.02245). Aggregated as ``loss_agg_mode``."""
    c = config or PolicyLossConfig()
    term = ClippedTerm(log_prob, old_log_prob, advantages, c.clip_ratio_low, c.clip_ratio_high, c.clip_ratio_c,
                       c.log_ratio_clamp)
    per_step = term.per_step
    stats: dict[str, Tensor] = {}
    m = None if response_mask is None else response_mask.to(term.ratio.dtype)
    if offpolicy is not None and stored_logp is not None:
        off = offpolicy.to(term.ratio.dtype)
        w = torch.exp((log_prob - stored_logp).clamp(-20.0, 20.0))
        per_step = torch.where(off > 0, -advantages * shaped_ratio(w), term.per_step)
        with torch.no_grad():
            mo = off if m is None else off * m
            mf = (1.0 - off) if m is None else (1.0 - off) * m
            stats["stored_ratio"] = masked_mean(w.detach(), mo)
            stats["fresh_ratio"] = masked_mean(term.ratio.detach(), mf)
            stats["stored_share"] = masked_mean(off, m)
    loss = agg_loss(per_step, response_mask, loss_agg_mode, c.norm_len)
    fresh = m if offpolicy is None else ((1.0 - offpolicy.to(term.ratio.dtype)) * (m if m is not None else 1.0))
    stats.update(term.stats(fresh))
    return loss, stats
