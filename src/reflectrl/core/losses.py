"""PPO-family losses on ``[rows, steps]`` tensors (or any shape with a matching mask)."""

from __future__ import annotations

import torch
from torch import Tensor

from .masked import agg_loss, masked_mean


def ppo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    agg_mode: str = "token-mean",
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss ``-min(rho*A, clip(rho, 1-clip_low, 1+clip_high)*A)``.

    ``clip_high=None`` gives the symmetric range; ``clip_high > clip_low`` is DAPO's clip-higher.
    Returns the aggregated loss and detached stats: ``clipfrac``, ``approx_kl`` (k3, as CleanRL
    logs it), ``old_approx_kl`` (k1).
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = agg_loss(torch.maximum(pg1, pg2), mask, agg_mode, norm_len)
    with torch.no_grad():
        m = None if mask is None else mask.to(ratio.dtype)
        clipped = ((ratio < 1.0 - clip_low) & (advantages < 0)) | ((ratio > 1.0 + clip_high) & (advantages > 0))
        stats = {
            "clipfrac": masked_mean(clipped.to(ratio.dtype), m),
            "approx_kl": masked_mean((ratio - 1) - log_ratio, m),
            "old_approx_kl": masked_mean(-log_ratio, m),
        }
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor | None,
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


def approx_kl(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
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
