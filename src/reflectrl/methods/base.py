"""What every method sees and returns, plus the tensor helpers the methods share.

A method is a small class with a narrow protocol (:class:`Method`): ``fit(batch)`` trains its
learned part, ``shape(batch)`` returns a :class:`Shaping` (a change of rewards, of advantages, or
per-step advantage weights) without touching the batch, ``metrics()``, and ``state()`` /
``load_state()`` for checkpoints. A front end builds the :class:`StepBatch` (``[rows, steps]``
tensors plus per-step ``states`` and ``features``), applies the shaping and re-estimates what
depends on the rewards; the control front end's adapter is :mod:`reflectrl.methods.control_algos`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass
class StepBatch:
    """One batch in the ``[rows, steps]`` layout. ``states [R, T, Fs]`` describe where the agent
    was (observations, or an LLM's hidden states); ``features [R, T, F]`` add what it did
    (observation + action). ``episode_end`` cuts rows into trajectories (control rows are env
    streams that hold several episodes and may end mid-episode)."""

    states: Tensor
    features: Tensor
    rewards: Tensor
    values: Tensor
    advantages: Tensor
    returns: Tensor
    episode_end: Tensor
    terminated: Tensor
    next_values: Tensor
    mask: Tensor | None = None
    progress: float = 0.0
    """Fraction of training done, in [0, 1] (for schedules)."""
    group_size: int = 1
    """Rows r and s hold trajectories of one group when r // group_size == s // group_size."""


@dataclass
class Shaping:
    """What a method changes: ``reward_delta`` (the front end re-estimates advantages and returns
    from the shaped rewards), ``advantage_delta`` (added to the advantages as they are), and
    ``weights`` (multiply the advantages in the policy loss). ``None`` leaves a field alone."""

    reward_delta: Tensor | None = None
    advantage_delta: Tensor | None = None
    weights: Tensor | None = None


class Method(Protocol):
    """The protocol of a method class."""

    fit_first: bool
    """True: ``fit`` runs before ``shape`` on the same batch; False: after it."""

    def fit(self, batch: StepBatch) -> None: ...

    def shape(self, batch: StepBatch) -> Shaping: ...

    def metrics(self) -> dict[str, float]: ...

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]: ...

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None: ...


_POW_CACHE: dict[tuple, Tensor] = {}
_MATRIX_LIMIT = 4_000_000  # rows * steps^2 above which discounted_cumsum loops instead


def discounted_cumsum(x: Tensor, episode_end: Tensor, discount: float) -> Tensor:
    """``y_t = x_t + discount * (1 - end_t) * y_{t+1}`` along the steps of ``[rows, steps]``.

    GAE is linear in the rewards, so adding ``d`` to the rewards adds
    ``discounted_cumsum(d, episode_end, gamma * lambda)`` to the GAE advantages: re-estimating
    after a reward shaping costs one batched matmul instead of a second step-by-step recursion."""
    rows, steps = x.shape
    if rows * steps * steps > _MATRIX_LIMIT:
        return _discounted_cumsum_loop(x, episode_end, discount)
    key = (steps, float(discount), x.dtype)
    if key not in _POW_CACHE:
        idx = torch.arange(steps, dtype=torch.float64)
        diff = idx[None, :] - idx[:, None]
        _POW_CACHE[key] = torch.where(diff >= 0, torch.tensor(float(discount), dtype=torch.float64) ** diff.clamp_min(0),
                                      torch.zeros(())).to(x.dtype)
    end = episode_end.to(torch.int64)
    seg = end.cumsum(1) - end  # episode ends strictly before each step
    same = seg.unsqueeze(2) == seg.unsqueeze(1)
    return torch.bmm(_POW_CACHE[key] * same, x.unsqueeze(-1)).squeeze(-1)


def _discounted_cumsum_loop(x: Tensor, episode_end: Tensor, discount: float) -> Tensor:
    out = torch.zeros_like(x)
    run = torch.zeros_like(x[:, 0])
    keep = discount * (1.0 - episode_end.to(x.dtype))
    for t in range(x.shape[1] - 1, -1, -1):
        run = x[:, t] + keep[:, t] * run
        out[:, t] = run
    return out


def returns_to_go(rewards: Tensor, gamma: float, bootstrap: float = 0.0) -> Tensor:
    """``G_t = sum_k gamma^(k-t) r_k + gamma^(L-t) * bootstrap`` of one trajectory ``[L]``
    (``bootstrap``: the value of the state after the last step, 0 if it terminated)."""
    n = rewards.shape[0]
    r = rewards.to(torch.float64)
    if n == 0:
        return rewards.clone()
    if gamma <= 0.0 or n * math.log(gamma) < -600.0:
        g = torch.zeros_like(r)
        run = float(bootstrap)
        for t in range(n - 1, -1, -1):
            run = float(r[t]) + gamma * run
            g[t] = run
        return g.to(rewards.dtype)
    powers = torch.tensor(float(gamma), dtype=torch.float64) ** torch.arange(n + 1, dtype=torch.float64)
    tail = torch.flip(torch.cumsum(torch.flip(powers[:n] * r, [0]), 0), [0])
    g = tail / powers[:n] + powers.flip(0)[:n] * float(bootstrap)
    return g.to(rewards.dtype)


@dataclass
class Episode:
    """A completed trajectory cut out of a ``[rows, steps]`` stream: its row, its episode number
    in that row (0, 1, ...), each field's per-step values ``[L, ...]``, and the step of the batch
    it ended at (its earlier steps may lie in earlier batches)."""

    row: int
    index: int
    data: dict[str, Tensor]
    end_step: int = -1

    def __len__(self) -> int:
        return int(next(iter(self.data.values())).shape[0])


class EpisodeAssembler:
    """Cuts ``[rows, steps]`` streams at episode ends and joins the pieces of episodes that cross
    batch boundaries. :meth:`add` returns the episodes completed in a batch; the unfinished tail
    of each row waits (copied, so the batch can be freed) for the next batch."""

    def __init__(self, rows: int, fields: tuple[str, ...]):
        self.rows, self.fields = rows, tuple(fields)
        self.parts: list[dict[str, list[Tensor]]] = [{f: [] for f in self.fields} for _ in range(rows)]
        self.episode = [0] * rows

    def add(self, episode_end: Tensor, **data: Tensor) -> list[Episode]:
        """Feed one batch (every field ``[rows, steps, ...]``); return the episodes it completed."""
        steps = episode_end.shape[1]
        ends: list[list[int]] = [[] for _ in range(self.rows)]
        for r, t in episode_end.nonzero().tolist():
            ends[r].append(t)
        out = []
        for r in range(self.rows):
            start = 0
            for t in ends[r]:
                ep = {f: torch.cat([*self.parts[r][f], data[f][r, start:t + 1]]) for f in self.fields}
                self.parts[r] = {f: [] for f in self.fields}
                out.append(Episode(r, self.episode[r], ep, t))
                self.episode[r] += 1
                start = t + 1
            if start < steps:
                for f in self.fields:
                    self.parts[r][f].append(data[f][r, start:].clone())
        return out

    def pending_length(self, row: int) -> int:
        """Steps of ``row``'s unfinished episode seen so far."""
        first = self.fields[0]
        return sum(int(p.shape[0]) for p in self.parts[row][first])

    def state(self, prefix: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Tensors and JSON metadata of the unfinished episodes."""
        tensors = {}
        for f in self.fields:
            pieces = [torch.cat(self.parts[r][f]) for r in range(self.rows) if self.parts[r][f]]
            if pieces:
                tensors[f"{prefix}/{f}"] = torch.cat(pieces)
        return tensors, {"lengths": [self.pending_length(r) for r in range(self.rows)], "episode": list(self.episode)}

    def load_state(self, prefix: str, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        self.episode = [int(e) for e in meta["episode"]]
        offsets = [0]
        for n in meta["lengths"]:
            offsets.append(offsets[-1] + int(n))
        for r in range(self.rows):
            n = int(meta["lengths"][r])
            self.parts[r] = {f: ([tensors[f"{prefix}/{f}"][offsets[r]:offsets[r] + n].clone()] if n else [])
                             for f in self.fields}
