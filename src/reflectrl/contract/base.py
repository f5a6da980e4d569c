"""The method contract both front ends share: what a method sees, what it returns, and the one
adapter that runs it.

A method is a small class with a narrow protocol (:class:`Method`): ``fit(batch)`` trains its
learned part, ``shape(batch)`` returns a :class:`Shaping` without touching the batch, optionally
``aux_loss(inputs)`` adds a term to the policy loss, plus ``metrics()`` and ``state()`` /
``load_state()``. A front end (PPO, GRPO) builds the :class:`StepBatch` in the ``[rows, steps]``
layout, :class:`MethodRunner` runs ``fit`` and ``shape`` in the method's declared order, and the
front end applies the result with :func:`apply_shaping`, the same function on both front ends.

What a :class:`Shaping` means, on every front end:

* ``reward_delta [R, T]`` is added to the per-step rewards and the front end re-runs its advantage
  estimator on the shaped rewards (PPO: GAE, exactly; GRPO: the group estimator, so the change enters
  *before* group normalization). The returns (critic targets) follow the shaped rewards.
* ``advantage_delta [R, T]`` is added to the estimator's advantages: after GAE, after group
  normalization. The returns stay as they are.
* ``weights [R, T]`` multiply the advantages (after ``advantage_delta``) token by token; the weights of
  several methods multiply.

The result is what the policy loss receives. A normalization that belongs to the *loss* comes after
all three: PPO's per-minibatch advantage whitening (``--norm-adv``) whitens the shaped, weighted
advantages of each minibatch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass
class StepBatch:
    """One batch in the ``[rows, steps]`` layout. ``states [R, T, Fs]`` describe where the agent
    was (observations, or an LLM's hidden states); ``features [R, T, F]`` add what it did
    (observation + action). ``episode_end`` cuts rows into trajectories (control rows are env
    streams that hold several episodes and may end mid-episode; an LLM row is one episode)."""

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
    turn_ids: Tensor | None = None
    """``[R, T]`` turn of each step of a multi-turn LLM episode (-1 on padding); None elsewhere."""
    per_step: dict[str, Tensor] = field(default_factory=dict)
    """Per-step extras ``[R, T]`` of the LLM front end a method may read: ``logp`` (the sampled tokens' log-prob
    under the policy that sampled them), ``entropy``, ``teacher_logp`` (under a teacher pass, when a hook ran one)."""
    whole_rows: bool = False
    """True on the LLM front end: each row holds one whole episode, which ends at the row's ``episode_end``; the
    steps after it are padding, not the start of the row's next episode."""
    info: dict[str, Tensor] = field(default_factory=dict)
    """Per-row facts of the LLM front end's episodes, ``[R]`` floats: ``outcome`` (the reward the task gave),
    ``correct`` (0 / 1), and the self-reports ``reflection`` (1 / 0) and ``confidence`` (q), NaN when missing, with
    ``report_asked`` (1 where the episode's last turn answered the self-report question); and what a hook graded
    per row (``batch.extras["row/NAME"]`` as ``NAME``: ``lm_reflection``, a language-model reflector's grades)."""


@dataclass
class Shaping:
    """What a method changes (see the module docstring for where each field enters); ``None`` leaves
    a field alone."""

    reward_delta: Tensor | None = None
    advantage_delta: Tensor | None = None
    weights: Tensor | None = None


@dataclass
class AuxInputs:
    """One minibatch of the policy update as a method's auxiliary loss sees it, in the coordinates of
    the :class:`StepBatch` it shaped: step ``i`` is ``(rows[i], steps[i])``, with its log-probability
    under the current policy ``logp[i]`` (with gradient) and the one it was sampled with ``old_logp[i]``.
    A front end may split an update into several such minibatches (PPO's minibatches, GRPO's
    micro-batches); each loss is added to its minibatch's policy loss."""

    rows: Tensor
    steps: Tensor
    logp: Tensor
    old_logp: Tensor
    shape: tuple[int, int]


class Method(Protocol):
    """The protocol of a method class (``aux_loss`` is optional)."""

    fit_first: bool
    """True: ``fit`` runs before ``shape`` on the same batch; False: after it. A method may also declare
    ``reads_states = False`` when neither call reads ``states`` or ``features``: the LLM front end then skips the
    hidden states (and the no-grad pass, when nothing else needs it) for it (:attr:`MethodRunner.reads_states`)."""

    def fit(self, batch: StepBatch) -> None: ...

    def shape(self, batch: StepBatch) -> Shaping: ...

    def metrics(self) -> dict[str, float]: ...

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]: ...

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None: ...


Features = Callable[[Any, Any], tuple[Tensor, Tensor]]
"""``features(trainer, batch) -> (states [R, T, Fs], features [R, T, F])`` of a front end's batch."""


class View(Protocol):
    """Another view of a StepBatch for a method (one step per turn of an LLM episode), and its shaping mapped back."""

    def to_view(self, batch: StepBatch) -> StepBatch: ...

    def from_view(self, shaping: Shaping) -> Shaping: ...


class MethodRunner:
    """The one adapter between a method and a front end: :meth:`run` fits and shapes in the declared
    order on the StepBatch the front end built; :meth:`aux_loss` forwards a minibatch to the method's
    auxiliary loss, if it has one. ``features`` (optional) says what the method's learned parts read."""

    def __init__(self, method: Method, features: Features | None = None, name: str | None = None,
                 view: View | None = None):
        if not hasattr(method, "fit_first"):
            raise TypeError(f"{type(method).__name__} does not declare fit_first (fit before or after shape)")
        self.method, self.features, self.view = method, features, view
        self.name = name or type(method).__name__
        self.reads: tuple[str, ...] = tuple(getattr(method, "reads", ()))
        """The fields a hook must put into the batch for this method (:func:`reflectrl.contract.hooks.check_provided`)."""
        self.reads_states: bool = bool(getattr(method, "reads_states", True))
        """Whether the method reads the batch's ``states`` / ``features`` (unless it says otherwise, it does)."""
        self.seconds = 0.0

    @property
    def has_aux_loss(self) -> bool:
        return callable(getattr(self.method, "aux_loss", None))

    def run(self, batch: StepBatch) -> Shaping:
        """Fit and shape on ``batch`` (through the runner's ``view``, if any: e.g. one step per turn of an
        LLM episode, the shaping mapped back to tokens)."""
        t0 = time.perf_counter()
        m = self.method
        seen = self.view.to_view(batch) if self.view is not None else batch
        if m.fit_first:
            m.fit(seen)
            shaping = m.shape(seen)
        else:
            shaping = m.shape(seen)
            m.fit(seen)
        if self.view is not None:
            shaping = self.view.from_view(shaping)
        self.seconds = time.perf_counter() - t0
        return shaping

    def aux_loss(self, inputs: AuxInputs) -> Tensor | None:
        aux = getattr(self.method, "aux_loss", None)
        return aux(inputs) if callable(aux) else None

    def metrics(self) -> dict[str, float]:
        return {**self.method.metrics(), f"time/method/{self.name}": self.seconds}

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return self.method.state()

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.method.load_state(tensors, meta)


@dataclass
class Shaped:
    """A front end's rewards, advantages, returns and weights after a :class:`Shaping`."""

    rewards: Tensor
    advantages: Tensor
    returns: Tensor
    weights: Tensor | None


Reestimate = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
"""``reestimate(shaped_rewards, reward_delta) -> (advantages, returns)``: the front end's estimator."""


def last_turn_tokens(turn_ids: Tensor, mask: Tensor, asked: Tensor) -> Tensor:
    """``[R, T]`` bool: the ``mask``ed tokens of each row's last agent turn (``turn_ids [R, T]``), in the rows where
    ``asked [R]`` is nonzero (the episode ended with the self-report question, so that turn is the report)."""
    mask = mask.bool()
    turn = torch.where(mask, turn_ids, torch.full_like(turn_ids, -1))
    return mask & (turn == turn.max(1, keepdim=True).values) & asked.bool()[:, None]


def row_groups(batch: StepBatch) -> Tensor:
    """``[R]`` each row's GRPO group: rows ``i // group_size``."""
    return torch.arange(batch.rewards.shape[0]) // max(1, batch.group_size)


def as_nan(values: list[float | int | None]) -> Tensor:
    """A float tensor with NaN for missing values."""
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)


def method_seed(seed: int, salt: int) -> int:
    """A method's own seed, derived from the run seed and the method's ``salt`` (so it never shares the trainer's
    random streams)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, 7919, salt]).generate_state(1)[0])


def apply_shaping(sh: Shaping, rewards: Tensor, advantages: Tensor, returns: Tensor, weights: Tensor | None,
                  mask: Tensor | None, reestimate: Reestimate) -> Shaped:
    """Apply a method's shaping as the module docstring defines it: reward change (re-estimated),
    then advantage change, then weights; deltas are zeroed outside ``mask``."""
    m = (lambda x: x) if mask is None else (lambda x: x * mask.to(x.dtype))
    if sh.reward_delta is not None:
        delta = m(sh.reward_delta)
        rewards = rewards + delta
        advantages, returns = reestimate(rewards, delta)
    if sh.advantage_delta is not None:
        advantages = advantages + m(sh.advantage_delta)
    if sh.weights is not None:
        weights = sh.weights if weights is None else weights * sh.weights
    return Shaped(rewards, advantages, returns, weights)


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

    def add(self, episode_end: Tensor, whole_rows: bool = False, **data: Tensor) -> list[Episode]:
        """Feed one batch (every field ``[rows, steps, ...]``); return the episodes it completed. With
        ``whole_rows`` (:attr:`StepBatch.whole_rows`) each row's episode starts at its first step and ends at its
        episode end, and nothing after it is kept; the episodes' fields are views of ``data``."""
        steps = episode_end.shape[1]
        ends: list[list[int]] = [[] for _ in range(self.rows)]
        for r, t in episode_end.nonzero().tolist():
            ends[r].append(t)
        out = []
        if whole_rows:
            self.parts = [{f: [] for f in self.fields} for _ in range(self.rows)]
            rows = {f: data[f].unbind(0) for f in self.fields}  # per-row views: cheaper to slice than data[f][r, :n]
            for r in range(self.rows):
                if ends[r]:
                    t = ends[r][-1]
                    out.append(Episode(r, self.episode[r], {f: rows[f][r][:t + 1] for f in self.fields}, t))
                    self.episode[r] += 1
            return out
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

    def add_whole(self, episode_end: Tensor) -> tuple[Tensor, Tensor] | None:
        """The whole-row case in one vectorized step (every row holds one episode, from its first step to its one
        end: an LLM batch): each row's last step ``[R]`` and the mask of its episode's steps ``[R, T]``, so that the
        episodes are a field's values under that mask, padded; the episodes are counted as :meth:`add` counts
        them. None, counting nothing, when some row does not end exactly once."""
        if not bool((episode_end.sum(1) == 1).all()):
            return None
        self.parts = [{f: [] for f in self.fields} for _ in range(self.rows)]
        last = episode_end.to(torch.int64).argmax(1)
        inside = torch.arange(episode_end.shape[1])[None, :] <= last[:, None]
        self.episode = [e + 1 for e in self.episode]
        return last, inside

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
