"""Discounted sums along the steps of ``[rows, steps]``: the one implementation every estimator uses.

``y_t = x_t + discount * (1 - end_t) * y_{t+1}`` with ``y_T = bootstrap`` (0 by default). GAE is this
sum of the TD errors with ``discount = gamma * lambda``; Monte-Carlo returns are it of the rewards with
``discount = gamma``; and because GAE is linear in the rewards, a reward change ``d`` moves the GAE
advantages by ``discounted_cumsum(d, episode_end, gamma * lambda)``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from .types import Rows, StepFlags, Steps

_POW_CACHE: dict[tuple, Tensor] = {}
_MATRIX_LIMIT = 4_000_000  # rows * steps^2 above which "auto" loops instead of one batched matmul
Kernel = Literal["auto", "loop", "matmul", "closed"]


def discounted_cumsum(x: Steps, episode_end: StepFlags | None, discount: float, bootstrap: Rows | float | None = None,
                      kernel: Kernel = "auto") -> Steps:
    """``y_t = x_t + discount * (1 - end_t) * y_{t+1}`` along the steps of ``x [R, T]``; ``y_T = bootstrap [R]``.

    ``episode_end [R, T]`` (None: no ends) stops the sum after step t. Kernels give the same values up
    to rounding: ``loop`` (the recursion step by step, in that order), ``matmul`` (one batched matmul
    with a cached ``[T, T]`` power matrix: fastest for many short rows), ``closed`` (powers and a
    cumulative sum in float64; rows without episode ends only); ``auto`` picks ``closed`` for rows
    without ends, ``matmul`` while ``R * T^2`` is small and ``loop`` otherwise."""
    rows, steps = x.shape
    if kernel == "auto":
        if episode_end is None and _closed_is_safe(steps, discount):
            kernel = "closed"
        else:
            kernel = "matmul" if rows * steps * steps <= _MATRIX_LIMIT else "loop"
    if kernel == "closed":
        if episode_end is not None and bool(episode_end[:, :-1].any()):
            raise ValueError("the closed-form kernel needs rows without episode ends")
        return _closed(x, discount, bootstrap)
    end = torch.zeros_like(x, dtype=torch.bool) if episode_end is None else episode_end.bool()
    if kernel == "loop":
        return _loop(x, end, discount, bootstrap)
    if kernel != "matmul":
        raise ValueError(f"unknown kernel {kernel!r}; choose auto, loop, matmul or closed")
    out = _matmul(x, end, discount)
    if bootstrap is not None:
        out = out + _bootstrap_term(end, discount, bootstrap, x.dtype)
    return out


def _loop(x: Tensor, end: Tensor, discount: float, bootstrap: Tensor | float | None) -> Tensor:
    out = torch.zeros_like(x)
    run = torch.zeros_like(x[:, 0])
    if bootstrap is not None:
        run = run + torch.as_tensor(bootstrap, dtype=x.dtype)
    keep = discount * (1.0 - end.to(x.dtype))
    for t in range(x.shape[1] - 1, -1, -1):
        run = x[:, t] + keep[:, t] * run
        out[:, t] = run
    return out


def _matmul(x: Tensor, end: Tensor, discount: float) -> Tensor:
    steps = x.shape[1]
    key = (steps, float(discount), x.dtype)
    if key not in _POW_CACHE:
        idx = torch.arange(steps, dtype=torch.float64)
        diff = idx[None, :] - idx[:, None]
        _POW_CACHE[key] = torch.where(diff >= 0, torch.tensor(float(discount), dtype=torch.float64) ** diff.clamp_min(0),
                                      torch.zeros(())).to(x.dtype)
    e = end.to(torch.int64)
    seg = e.cumsum(1) - e  # episode ends strictly before each step
    same = seg.unsqueeze(2) == seg.unsqueeze(1)
    return torch.bmm(_POW_CACHE[key] * same, x.unsqueeze(-1)).squeeze(-1)


def _bootstrap_term(end: Tensor, discount: float, bootstrap: Tensor | float, dtype: torch.dtype) -> Tensor:
    """``discount^(T - t) * bootstrap`` for the steps after the row's last episode end, 0 before it."""
    steps = end.shape[1]
    after_last = torch.flip(torch.cumsum(torch.flip(end.to(torch.int64), [1]), 1), [1]) - end.to(torch.int64) == 0
    after_last &= ~end
    powers = torch.tensor(float(discount), dtype=torch.float64) ** torch.arange(steps, 0, -1, dtype=torch.float64)
    b = torch.as_tensor(bootstrap, dtype=torch.float64).reshape(-1, 1)
    return (powers[None, :] * b * after_last).to(dtype)


def _closed_is_safe(steps: int, discount: float) -> bool:
    return discount > 0.0 and steps * math.log(discount) >= -600.0


def _closed(x: Tensor, discount: float, bootstrap: Tensor | float | None) -> Tensor:
    """Rows without episode ends: ``y_t = (sum_{k>=t} d^k x_k) / d^t + d^(T-t) * bootstrap`` in float64."""
    rows, n = x.shape
    if n == 0:
        return x.clone()
    if not _closed_is_safe(n, discount):
        return _loop(x.to(torch.float64), torch.zeros_like(x, dtype=torch.bool), discount, bootstrap).to(x.dtype)
    r = x.to(torch.float64)
    powers = torch.tensor(float(discount), dtype=torch.float64) ** torch.arange(n + 1, dtype=torch.float64)
    tail = torch.flip(torch.cumsum(torch.flip(powers[:n] * r, [1]), 1), [1])
    y = tail / powers[:n]
    if bootstrap is not None:
        y = y + powers.flip(0)[:n] * torch.as_tensor(bootstrap, dtype=torch.float64).reshape(-1, 1)
    return y.to(x.dtype)


def discounted_returns(rewards: Steps, episode_end: StepFlags, gamma: float) -> Steps:
    """Monte-Carlo returns ``G_t = r_t + gamma * G_{t+1}``, reset at episode ends (no bootstrap)."""
    return discounted_cumsum(rewards, episode_end, gamma, kernel="loop")


def returns_to_go(rewards: Tensor, gamma: float, bootstrap: float = 0.0) -> Tensor:
    """``G_t = sum_k gamma^(k-t) r_k + gamma^(L-t) * bootstrap`` of one trajectory ``[L]`` (``bootstrap``:
    the value of the state after the last step, 0 if it terminated)."""
    if rewards.shape[0] == 0:
        return rewards.clone()
    return discounted_cumsum(rewards[None], None, gamma, float(bootstrap), kernel="closed")[0]
