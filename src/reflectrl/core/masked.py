"""Masked reductions over the canonical ``[rows, steps]`` layout, and loss aggregation modes."""

from __future__ import annotations

import torch
from torch import Tensor

from .types import StepMask, Steps

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def masked_sum(x: Tensor, mask: Tensor | None, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is true (over ``dim``, or everything); ``mask=None`` keeps all."""
    xm = x if mask is None else x * mask
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x: Tensor, mask: Tensor | None, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the entries where ``mask`` is true; 0 where nothing is masked in."""
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked-in entries of ``x`` (Bessel-corrected by default)."""
    mean = masked_mean(x, mask)
    count = mask.sum()
    sq = masked_sum((x - mean) ** 2, mask)
    denom = (count - 1) if unbiased else count
    return sq / denom.clamp_min(1)


def masked_whiten(x: Steps, mask: StepMask, shift_mean: bool = True, eps: float = 1e-8) -> Steps:
    """Normalize ``x`` to unit std (and zero mean if ``shift_mean``) over masked-in entries."""
    mean = masked_mean(x, mask)
    std = masked_var(x, mask).sqrt()
    out = (x - mean) / (std + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def agg_loss(loss_mat: Steps, mask: StepMask | None, mode: str = "token-mean", norm_len: int | None = None) -> Tensor:
    """Reduce a per-step loss ``[rows, steps]`` to a scalar.

    - ``token-mean``: mean over all real steps of the batch (long sequences weigh more).
    - ``seq-mean-token-mean``: mean over steps within each row, then mean over rows (GRPO).
    - ``seq-mean-token-sum``: sum over steps within each row, then mean over rows.
    - ``seq-mean-token-sum-norm``: sum within each row divided by a constant length ``norm_len``
      (default: the number of steps ``T``), then mean over rows (Dr.GRPO: no length bias).
    """
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    mask = torch.ones_like(loss_mat) if mask is None else mask.to(loss_mat.dtype)
    row_sum = masked_sum(loss_mat, mask, dim=-1)
    rows = (mask.sum(-1) > 0).to(loss_mat.dtype)
    n_rows = rows.sum().clamp_min(1)
    if mode == "seq-mean-token-mean":
        return ((row_sum / mask.sum(-1).clamp_min(1)) * rows).sum() / n_rows
    if mode == "seq-mean-token-sum":
        return row_sum.sum() / n_rows
    if mode == "seq-mean-token-sum-norm":
        length = float(norm_len if norm_len is not None else loss_mat.shape[-1])
        return row_sum.sum() / (n_rows * length)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {', '.join(LOSS_AGG_MODES)}")
