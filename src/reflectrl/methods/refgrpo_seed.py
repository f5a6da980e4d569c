"""refgrpo-seed: a calibration bonus from a reflection predictor (seed 000; docs/methods.md).

A reflection predictor f(features) is regressed onto the batch-normalized advantages Â_n; the
bonus ``b = -alpha * (f - target)^2`` (target Â or Â_n), clipped to ``±k * mean|r|`` and scaled by a
fixed or adaptive beta, is added to the rewards (advantages re-estimated) or to the advantages.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from ..checkpoint import (
    pack_optimizer,
    pack_state_dict,
    unpack_optimizer,
    unpack_state_dict,
)
from ..contract.base import Shaping, StepBatch
from ..contract.nets import ScalarMLP, adam_for, fit_regression
from ..core import masked_mean, masked_whiten


def normalized_advantages(adv: Tensor, mask: Tensor | None = None) -> Tensor:
    """Â_n = (Â - mean) / (std + 1e-8) over the batch's real steps (0 elsewhere)."""
    m = torch.ones_like(adv) if mask is None else mask.to(adv.dtype)
    return masked_whiten(adv, m, eps=1e-8)


def calibration_bonus(pred: Tensor, target: Tensor, alpha: float) -> Tensor:
    """b_cal = -alpha * (f - target)^2: zero where the reflection matches, negative elsewhere."""
    return -alpha * (pred - target).pow(2)


def clip_bonus(bonus: Tensor, rewards: Tensor, k: float, floor: float = 0.0,
               mask: Tensor | None = None) -> tuple[Tensor, float]:
    """Clip to ``±c`` with ``c = max(k * mean|r_t|, floor)`` over the batch; returns ``(clipped, c)``."""
    c = max(k * float(masked_mean(rewards.abs(), mask)), floor)
    return bonus.clamp(-c, c), c


def adaptive_beta(beta: float, cal_loss: float, loss_ref: float, lo: float, hi: float) -> float:
    """beta * L_cal / L_ref, clipped to [lo, hi]: the bonus weighs more while the predictor is
    miscalibrated and less as it calibrates. L_ref = 1 is the loss of predicting 0 for Â_n."""
    return float(min(max(beta * cal_loss / loss_ref, lo), hi))


@dataclass
class RefGRPOSeedOptions:
    """Options of refgrpo-seed (each is a ``reflectrl train --algo refgrpo-seed`` flag)."""

    cal_alpha: float = 0.01
    """Bonus strength alpha in b_cal = -alpha * (f - target)^2 (chosen by measurement, BENCHMARKS.md)."""
    cal_target: Literal["raw", "normalized"] = "normalized"
    """Bonus target: the normalized advantage (the loss's target; chosen by measurement) or the raw one (the seed's
    recommendation)."""
    cal_clip_k: float = 3.0
    """Clip the bonus to +-k * mean|r_t| of the batch."""
    cal_clip_floor: float = 0.0
    """Lower bound of the clip range (0: a batch without rewards gets no bonus)."""
    cal_beta: float = 1.0
    """Weight beta of the clipped bonus in r' = r + beta * b."""
    cal_beta_adaptive: bool = False
    """Adapt beta: beta_t = clip(cal_beta * L_cal / cal_loss_ref, cal_beta_min, cal_beta_max), L_cal before this batch's fit."""
    cal_beta_min: float = 0.1
    """Smallest adaptive beta."""
    cal_beta_max: float = 2.0
    """Largest adaptive beta."""
    cal_loss_ref: float = 1.0
    """L_cal at which the adaptive beta equals cal_beta (1 = the loss of always predicting 0)."""
    cal_credit: Literal["gae", "advantage"] = "gae"
    """gae: add beta*b to the rewards and recompute GAE; advantage: add beta*b to the advantages."""
    reflection_input: Literal["obs_action", "obs_action_hidden", "trunk_head"] = "obs_action"
    """Predictor input: obs + action; obs + action + actor's last hidden layer; or a head on the actor's last hidden
    layer (+ action)."""
    reflection_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the reflection predictor (ReLU)."""
    reflection_epochs: int = 5
    """Passes over each batch that train the predictor."""
    reflection_minibatches: int = 1
    """Minibatches per pass (1: full-batch steps, the cheapest)."""
    reflection_sample: float = 0.25
    """Share of each batch's steps the predictor trains on (a fresh random subset per update; 1: all). The rest give
    L_cal_unseen."""
    reflection_lr_mult: float = 3.0
    """Predictor Adam learning rate = this x the policy's initial learning rate."""
    reflection_weight_decay: float = 0.0
    """L2 penalty (Adam weight decay) of the predictor."""
    reflection_dropout: float = 0.0
    """Dropout on the predictor's hidden layers while it trains."""
    heldout_batches: int = 4
    """Past batches kept (FIFO) to measure the held-out L_cal."""
    heldout_rows: int = 128
    """Steps sampled from each past batch for the held-out L_cal."""

    def validate_refgrpo(self) -> list[tuple[bool, str]]:
        return [
            (self.cal_alpha >= 0, "--cal-alpha must be non-negative"),
            (self.cal_clip_k > 0, "--cal-clip-k must be positive"),
            (self.cal_clip_floor >= 0, "--cal-clip-floor must be non-negative"),
            (0 <= self.cal_beta_min <= self.cal_beta_max, "--cal-beta-min must be in [0, --cal-beta-max]"),
            (self.cal_loss_ref > 0, "--cal-loss-ref must be positive"),
            (self.reflection_epochs >= 1, "--reflection-epochs must be at least 1"),
            (self.reflection_minibatches >= 1, "--reflection-minibatches must be at least 1"),
            (0 < self.reflection_sample <= 1, "--reflection-sample must be in (0, 1]"),
            (self.reflection_lr_mult > 0, "--reflection-lr-mult must be positive"),
            (0 <= self.reflection_dropout < 1, "--reflection-dropout must be in [0, 1)"),
            (self.heldout_batches >= 0 and self.heldout_rows >= 1, "--heldout-batches/--heldout-rows out of range"),
        ]


class RefGRPOSeed:
    """The reflection predictor, its fit on Â_n and the calibration bonus, on generic features."""

    fit_first = True  # the bonus uses the predictor after this batch's fit (docs/methods.md)

    def __init__(self, in_dim: int, opts: RefGRPOSeedOptions, policy_lr: float, seed: int):
        self.o = opts
        self.gen = torch.Generator().manual_seed(seed)
        self.net = ScalarMLP(in_dim, tuple(opts.reflection_hidden), 1, 0.01, opts.reflection_dropout, generator=self.gen)
        self.net.eval()
        self.opt = adam_for(self.net, opts.reflection_lr_mult * policy_lr, opts.reflection_weight_decay)
        self.heldout: deque[tuple[Tensor, Tensor]] = deque(maxlen=max(1, opts.heldout_batches))
        self._cache: tuple[StepBatch, Tensor, Tensor] | None = None
        self._metrics: dict[str, float] = {}

    @staticmethod
    def _real(batch: StepBatch, x: Tensor) -> Tensor:
        """The entries of a ``[R, T, ...]`` tensor at real steps, flattened."""
        return x.reshape(-1, *x.shape[2:]) if batch.mask is None else x[batch.mask.bool()]

    def fit(self, batch: StepBatch) -> None:
        """Train the predictor on (features, Â_n) of a random share of the steps; log L_cal before
        and after, on the steps it did not train on, and on older batches."""
        x = self._real(batch, batch.features)
        y = self._real(batch, normalized_advantages(batch.advantages, batch.mask))
        n = x.shape[0]
        perm = torch.randperm(n, generator=self.gen)
        k = max(1, int(round(self.o.reflection_sample * n)))
        train = perm[:k] if k < n else None
        xt, yt = (x, y) if train is None else (x[train], y[train])
        pre, _ = fit_regression(self.net, self.opt, xt, yt, self.o.reflection_epochs, self.o.reflection_minibatches, self.gen)
        with torch.no_grad():
            f = self.net(x)[:, 0]
            err = (f - y).pow(2)
            m = {"refgrpo-seed/L_cal_pre": pre,
                 "refgrpo-seed/L_cal_train": float(err.mean() if train is None else err[train].mean())}
            if train is not None:
                m["refgrpo-seed/L_cal_unseen"] = float(err[perm[k:]].mean())
            if self.heldout and self.o.heldout_batches > 0:
                hx = torch.cat([h[0] for h in self.heldout])
                hy = torch.cat([h[1] for h in self.heldout])
                m["refgrpo-seed/L_cal_heldout"] = float((self.net(hx)[:, 0] - hy).pow(2).mean())
        if self.o.heldout_batches > 0:
            keep = perm[-self.o.heldout_rows:]
            self.heldout.append((x[keep].clone(), y[keep].clone()))
        self._cache = (batch, f, y)
        self._metrics = m

    def shape(self, batch: StepBatch) -> Shaping:
        """beta * clip(b_cal) as a reward change (GAE recomputed) or an advantage change."""
        if self._cache is not None and self._cache[0] is batch:
            _, f, y = self._cache
        else:
            with torch.no_grad():
                f = self.net(self._real(batch, batch.features))[:, 0]
            y = self._real(batch, normalized_advantages(batch.advantages, batch.mask))
        self._cache = None
        adv, rew = self._real(batch, batch.advantages), self._real(batch, batch.rewards)
        b = calibration_bonus(f, adv if self.o.cal_target == "raw" else y, self.o.cal_alpha)
        bc, c = clip_bonus(b, rew, self.o.cal_clip_k, self.o.cal_clip_floor)
        beta = self.o.cal_beta
        if self.o.cal_beta_adaptive:
            beta = adaptive_beta(beta, self._metrics.get("refgrpo-seed/L_cal_pre", self.o.cal_loss_ref), self.o.cal_loss_ref,
                                 self.o.cal_beta_min, self.o.cal_beta_max)
        delta = beta * bc
        mean_r = float(rew.abs().mean())
        self._metrics.update({
            "refgrpo-seed/b_cal_mean": float(b.mean()), "refgrpo-seed/b_cal_std": float(b.std()) if b.numel() > 1 else 0.0,
            "refgrpo-seed/bonus_clip_frac": float((b.abs() > c).float().mean()), "refgrpo-seed/clip_c": c,
            "refgrpo-seed/beta": beta, "refgrpo-seed/bonus_to_reward": float(delta.abs().mean()) / mean_r if mean_r > 0 else 0.0,
        })
        full = torch.zeros_like(batch.rewards)
        if batch.mask is None:
            full = delta.reshape(batch.rewards.shape)
        else:
            full[batch.mask.bool()] = delta
        return Shaping(reward_delta=full) if self.o.cal_credit == "gae" else Shaping(advantage_delta=full)

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors = pack_state_dict("net", self.net.state_dict())
        opt_t, opt_meta = pack_optimizer("opt", self.opt)
        tensors.update(opt_t)
        tensors["gen"] = self.gen.get_state()
        lengths = [int(h[0].shape[0]) for h in self.heldout]
        if lengths:
            tensors["heldout/x"] = torch.cat([h[0] for h in self.heldout])
            tensors["heldout/y"] = torch.cat([h[1] for h in self.heldout])
        return tensors, {"opt": opt_meta, "heldout_lengths": lengths}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.net.load_state_dict(unpack_state_dict("net", tensors))
        self.opt.load_state_dict(unpack_optimizer("opt", tensors, meta["opt"]))
        self.gen.set_state(tensors["gen"])
        self.heldout.clear()
        start = 0
        for n in meta["heldout_lengths"]:
            self.heldout.append((tensors["heldout/x"][start:start + n].clone(), tensors["heldout/y"][start:start + n].clone()))
            start += n
