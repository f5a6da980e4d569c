"""exgrpo-seed: a reflection memory (seed 003; docs/methods.md).

Completed trajectories go to a memory buffer. A reflector scores a trajectory in [-1, 1] from its
mean-pooled states; the default one is an MLP with output ``sigmoid(z) * 2 - 1`` regressed onto
the trajectory's normalized return rank in the buffer (the seed leaves the learning signal open;
this is our choice). Its training samples come from the buffer with priority on high return,
high uncertainty, or a mix. A trajectory's return becomes ``R(tau) + coef * scale * r_refl(tau)``
with ``coef`` on a schedule (low early, higher later): for PPO the term is added to the reward of
the trajectory's last step (GAE spreads it back) or to the advantage of each of its steps; for DQN
``coef * Q_refl(s, a)`` joins the TD target, Q_refl(s, a) being the reflection of the trajectory
the transition belongs to.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from ..checkpoint import (
    pack_optimizer,
    pack_state_dict,
    unpack_optimizer,
    unpack_state_dict,
)
from ..contract.base import EpisodeAssembler, Shaping, StepBatch
from ..contract.nets import ScalarMLP, adam_for, fit_regression
from ..control.dqn import DQN, DQNHook
from ..core import RingBuffer


# ----------------------------------------------------------------------------- the math
def rank_targets(returns: Tensor) -> Tensor:
    """Normalized return rank in [-1, 1]: lowest -1, highest +1, ties share their mean rank; 0 for one item."""
    n = returns.shape[0]
    if n < 2:
        return torch.zeros_like(returns)
    s = torch.sort(returns).values
    lo = torch.searchsorted(s, returns, right=False).to(returns.dtype)
    hi = torch.searchsorted(s, returns, right=True).to(returns.dtype)
    rank = (lo + hi - 1.0) / 2.0
    return 2.0 * rank / (n - 1) - 1.0


def priority_probs(returns: Tensor, uncertainty: Tensor | None, kind: str, mix: float = 0.5,
                   alpha: float = 1.0, eps: float = 0.01) -> Tensor:
    """Sampling probabilities over the memory: score = return rank in [0, 1] ("return"),
    uncertainty / max uncertainty ("uncertainty"), or ``(1 - mix) * return + mix * uncertainty``;
    ``p = (score + eps)^alpha``, normalized."""
    ret_score = (rank_targets(returns) + 1.0) / 2.0
    if kind == "return" or uncertainty is None:
        score = ret_score
    else:
        unc = uncertainty / uncertainty.max().clamp_min(1e-12)
        score = unc if kind == "uncertainty" else (1.0 - mix) * ret_score + mix * unc
    p = (score + eps).pow(alpha)
    return p / p.sum()


def aggregate_reflection(members: Tensor, confidence: float = 0.0, vote: float = 0.0) -> tuple[Tensor, Tensor]:
    """Combine ``[N, E]`` reflections into one signal per trajectory: the members' mean, set to 0
    where ``|mean| < confidence`` or where fewer than ``vote`` of the members share the mean's
    sign. Returns ``(signal [N], kept [N] bool)``."""
    mean = members.mean(1)
    agree = (torch.sign(members) == torch.sign(mean)[:, None]).float().mean(1)
    kept = (mean.abs() >= confidence) & (agree >= vote)
    return torch.where(kept, mean, torch.zeros_like(mean)), kept


@dataclass
class CoefSchedule:
    """Linear ramp from ``start`` to ``end`` over the first ``ramp`` fraction of training, then flat."""

    start: float
    end: float
    ramp: float

    def __call__(self, progress: float) -> float:
        if self.ramp <= 0:
            return self.end
        frac = min(max(progress / self.ramp, 0.0), 1.0)
        return self.start + (self.end - self.start) * frac


# ----------------------------------------------------------------------------- reflectors
class Reflector(Protocol):
    """What exgrpo-seed needs from a reflector; an LLM judge can implement the same two calls."""

    members: int

    def reflect(self, pooled: Tensor) -> Tensor:
        """``[N, F]`` mean-pooled trajectory states -> ``[N, members]`` scores in [-1, 1]."""

    def fit(self, pooled: Tensor, targets: Tensor) -> float:
        """Learn from trajectories with targets in [-1, 1]; return the training loss (NaN if it does not learn)."""


class MLPReflector:
    """An ensemble of MLPs ``[F -> hidden -> 1]`` with output ``sigmoid(z) * 2 - 1``."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], members: int, lr: float, epochs: int, seed: int):
        self.members, self.epochs = int(members), int(epochs)
        self.gen = torch.Generator().manual_seed(seed)
        self.net = ScalarMLP(in_dim, tuple(hidden), self.members, out_std=0.01, squash="sym_sigmoid", generator=self.gen)
        self.net.eval()
        self.opt = adam_for(self.net, lr)

    def reflect(self, pooled: Tensor) -> Tensor:
        with torch.no_grad():
            return self.net(pooled)

    def fit(self, pooled: Tensor, targets: Tensor) -> float:
        return fit_regression(self.net, self.opt, pooled, targets, self.epochs, 1, self.gen)[1]

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        opt_t, opt_meta = pack_optimizer("opt", self.opt)
        return {**pack_state_dict("net", self.net.state_dict()), **opt_t, "gen": self.gen.get_state()}, {"opt": opt_meta}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.net.load_state_dict(unpack_state_dict("net", tensors))
        self.opt.load_state_dict(unpack_optimizer("opt", tensors, meta["opt"]))
        self.gen.set_state(tensors["gen"])


def trajectory_memory(capacity: int, dim: int) -> RingBuffer:
    """A FIFO ring of trajectories: mean-pooled states ``pooled [cap, F]`` and ``returns [cap]``."""
    return RingBuffer(capacity, {"pooled": ((dim,), torch.float32), "returns": ((), torch.float32)})


# ----------------------------------------------------------------------------- options
@dataclass
class ExGRPOSeedOptions:
    """Options of exgrpo-seed and exgrpo-seed-dqn (each is a ``reflectrl train`` flag)."""

    refl_memory: int = 1024
    """Trajectories kept in the memory buffer (FIFO)."""
    refl_priority: Literal["return", "uncertainty", "mix"] = "return"
    """What the reflector's training samples favour: high return, high uncertainty, or a mix."""
    refl_priority_mix: float = 0.5
    """Weight of uncertainty in the mix priority."""
    refl_priority_alpha: float = 1.0
    """Priority exponent (0: uniform sampling)."""
    refl_priority_eps: float = 0.01
    """Added to every priority score, so nothing has probability 0."""
    refl_coef_start: float = 0.0
    """Weight of the reflection term at the start (lambda for PPO, eta for DQN)."""
    refl_coef_end: float = 0.2
    """Weight of the reflection term after the ramp."""
    refl_coef_ramp: float = 0.5
    """Fraction of training over which the weight ramps linearly from start to end."""
    refl_scale: Literal["return_std", "none"] = "return_std"
    """Multiply the reflection term by the std of the memory's returns (return_std) or by 1 (none)."""
    refl_credit: Literal["terminal", "advantage"] = "terminal"
    """PPO: add the trajectory term to its last step's reward (GAE recomputed) or to each of its steps' advantage."""
    refl_every: int = 1
    """Train the reflector every this many updates (a language-model reflector: grade the batch)."""
    refl_epochs: int = 2
    """Passes over each sampled batch of trajectories when the reflector trains."""
    refl_batch: int = 256
    """Trajectories sampled (with priority, with replacement) for each reflector training."""
    refl_lr: float = 1e-3
    """Adam learning rate of the reflector."""
    refl_hidden: tuple[int, ...] = (128,)
    """Hidden widths of the reflection network (the seed's sketch: one layer of 128)."""
    refl_min_memory: int = 16
    """Trajectories in memory before the reflector trains and its signal is used."""
    refl_confidence: float = 0.0
    """Ignore reflections with |r_refl| below this (noise control)."""
    refl_ensemble: int = 1
    """Members of the reflector ensemble; the signal is their mean."""
    refl_vote: float = 0.0
    """Ignore reflections unless at least this share of members agrees with the mean's sign (ensemble vote)."""
    refl_background: bool = False
    """Train the reflector on a background thread: each training fits a copy of the reflector on a
    snapshot of the memory while the agent collects, and that copy becomes the live reflector at the
    next training (one training interval later than in the foreground; runs stay reproducible and
    resumable bit for bit)."""

    def budget_exgrpo(self) -> list[str]:
        """``--refl-coef-ramp`` when the reflection weight ramps over a fraction of the budget."""
        return ["--refl-coef-ramp"] if self.refl_coef_ramp > 0 and self.refl_coef_start != self.refl_coef_end else []

    def validate_exgrpo(self) -> list[tuple[bool, str]]:
        return [
            (self.refl_memory >= 2, "--refl-memory must be at least 2"),
            (0 <= self.refl_priority_mix <= 1, "--refl-priority-mix must be in [0, 1]"),
            (self.refl_priority_alpha >= 0 and self.refl_priority_eps > 0,
             "--refl-priority-alpha >= 0 and --refl-priority-eps > 0"),
            (0 <= self.refl_coef_ramp <= 1, "--refl-coef-ramp must be in [0, 1]"),
            (self.refl_every >= 1 and self.refl_epochs >= 1 and self.refl_batch >= 1,
             "--refl-every/-epochs/-batch must be at least 1"),
            (self.refl_lr > 0, "--refl-lr must be positive"),
            (self.refl_min_memory >= 2, "--refl-min-memory must be at least 2"),
            (self.refl_ensemble >= 1, "--refl-ensemble must be at least 1"),
            (0 <= self.refl_vote <= 1 and self.refl_confidence >= 0, "--refl-vote in [0, 1], --refl-confidence >= 0"),
        ]


class ReflectionMemory:
    """Memory + reflector + schedule: the part of exgrpo-seed both PPO and DQN use."""

    def __init__(self, dim: int, opts: ExGRPOSeedOptions, seed: int, reflector: Reflector | None = None):
        self.o = opts
        self.memory = trajectory_memory(opts.refl_memory, dim)
        self.reflector = reflector or MLPReflector(dim, opts.refl_hidden, opts.refl_ensemble, opts.refl_lr,
                                                   opts.refl_epochs, seed)
        self.sample_gen = torch.Generator().manual_seed(seed + 1)
        self.schedule = CoefSchedule(opts.refl_coef_start, opts.refl_coef_end, opts.refl_coef_ramp)
        self.fits = 0
        self.last: dict[str, float] = {}
        self._job: Future | None = None  # background fit in flight: -> (reflector, metrics)
        self._done: tuple[Reflector, dict[str, float]] | None = None  # finished background fit, not yet live
        self._executor: ThreadPoolExecutor | None = None

    @property
    def ready(self) -> bool:
        """The reflector has trained at least once, so its signal is used."""
        return self.fits > 0

    def scale(self) -> float:
        if self.o.refl_scale == "none" or self.memory.size < 2:
            return 1.0
        std = float(self.memory.view("returns").std())
        return std if std > 1e-8 else 1.0

    def signal(self, pooled: Tensor, progress: float) -> tuple[Tensor, dict[str, float]]:
        """``coef(progress) * scale * r_refl`` per trajectory (zeros until the reflector is ready)."""
        if not self.ready or pooled.shape[0] == 0:
            return torch.zeros(pooled.shape[0]), {}
        return self.weigh(self.reflector.reflect(pooled), progress)

    def weigh(self, members: Tensor, progress: float) -> tuple[Tensor, dict[str, float]]:
        """``coef(progress) * scale * r_refl`` of reflections ``[N, E]`` in [-1, 1] (NaN: none; its term is 0)."""
        sig, kept = aggregate_reflection(members, self.o.refl_confidence, self.o.refl_vote)
        coef = self.schedule(progress)
        return coef * self.scale() * sig, {"exgrpo-seed/refl_mean": float(sig.mean()),
                                           "exgrpo-seed/refl_std": float(sig.std()) if sig.numel() > 1 else 0.0,
                                           "exgrpo-seed/refl_kept_frac": float(kept.float().mean()),
                                           "exgrpo-seed/coef": coef}

    def train(self) -> dict[str, float]:
        """Sample trajectories by priority and fit the reflector to their return ranks. In the
        background mode: make the last background fit live (its metrics are returned) and start the
        next one on a copy of the reflector and a snapshot of the memory."""
        if not self.o.refl_background:
            metrics = self._fit(self.reflector, self.memory.view("pooled"), self.memory.view("returns"))
            self.fits += 1
            return metrics
        metrics = self._swap()
        pooled, returns = (self.memory.view(n).clone() for n in ("pooled", "returns"))
        worker = copy.deepcopy(self.reflector)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="reflectrl-reflector")
        self._job = self._executor.submit(lambda: (worker, self._fit(worker, pooled, returns)))
        return metrics

    def _fit(self, reflector: Reflector, pooled: Tensor, returns: Tensor) -> dict[str, float]:
        targets = rank_targets(returns)
        unc = None
        if self.o.refl_priority != "return":
            members = reflector.reflect(pooled)
            unc = members.std(1) if members.shape[1] > 1 else (members[:, 0] - targets).abs()
        probs = priority_probs(returns, unc, self.o.refl_priority, self.o.refl_priority_mix,
                               self.o.refl_priority_alpha, self.o.refl_priority_eps)
        idx = torch.multinomial(probs, self.o.refl_batch, replacement=True, generator=self.sample_gen)
        loss = reflector.fit(pooled[idx], targets[idx])
        return {"exgrpo-seed/refl_loss": loss, "exgrpo-seed/priority_max": float(probs.max() * probs.numel()),
                "exgrpo-seed/priority_min": float(probs.min() * probs.numel()),
                "exgrpo-seed/priority_entropy": float(-(probs * probs.clamp_min(1e-30).log()).sum())}

    def _wait(self) -> None:
        """Finish the background fit in flight (its result stays pending until the next training)."""
        if self._job is not None:
            self._done, self._job = self._job.result(), None

    def _swap(self) -> dict[str, float]:
        self._wait()
        if self._done is None:
            return {}
        (self.reflector, metrics), self._done = self._done, None
        self.fits += 1
        return metrics

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        self._wait()
        mt, mm = self.memory.state()
        rt, rm = self.reflector.state() if hasattr(self.reflector, "state") else ({}, {})
        tensors = {**{f"memory/{k}": v for k, v in mt.items()}, **{f"reflector/{k}": v for k, v in rt.items()},
                   "sample_gen": self.sample_gen.get_state()}
        meta = {"memory": mm, "reflector": rm, "fits": self.fits}
        if self._done is not None:  # a finished background fit that goes live at the next training
            pt, pm = self._done[0].state() if hasattr(self._done[0], "state") else ({}, {})
            tensors.update({f"pending/{k}": v for k, v in pt.items()})
            meta["pending"] = {"reflector": pm, "metrics": self._done[1]}
        return tensors, meta

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self._wait()
        self.memory.load_state(unpack_state_dict("memory", tensors), meta["memory"])
        if hasattr(self.reflector, "load_state"):
            self.reflector.load_state(unpack_state_dict("reflector", tensors), meta["reflector"])
        self.sample_gen.set_state(tensors["sample_gen"])
        self.fits = int(meta["fits"])
        self._done = None
        if meta.get("pending") is not None:
            pending = copy.deepcopy(self.reflector)
            if hasattr(pending, "load_state"):
                pending.load_state(unpack_state_dict("pending", tensors), meta["pending"]["reflector"])
            self._done = (pending, dict(meta["pending"]["metrics"]))


# ----------------------------------------------------------------------------- PPO form
class ExGRPOSeed:
    """exgrpo-seed on top of a policy-gradient trainer: reflect on the trajectories a batch
    completed (one batched forward), shape them, then store them and (every N updates) train."""

    metric_labels = {"exgrpo-seed/coef": "reflection coefficient"}
    """What its metrics mean, for tables."""

    fit_first = False  # a trajectory is reflected on before it joins the memory the reflector learns from

    def __init__(self, state_dim: int, rows: int, opts: ExGRPOSeedOptions, seed: int, reflector: Reflector | None = None,
                 external: str | None = None):
        """``external``: the ``StepBatch.info`` key of reflections in [-1, 1] computed outside (a language-model
        reflector's grades, NaN where it gave none); the memory then only keeps returns for the scale and
        nothing is trained. A batch without that key gets no reflection term."""
        self.o, self.external = opts, external
        self.reads = (external,) if external is not None else ()
        self.rm = ReflectionMemory(state_dim, opts, seed, reflector)
        self.assembler = EpisodeAssembler(rows, ("states", "rewards"))
        self.updates = 0
        self._new: tuple[Tensor, Tensor] | None = None
        self._metrics: dict[str, float] = {}

    def _episodes(self, batch: StepBatch) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The trajectories the batch completed (the assembler joins a control stream's episodes across batches):
        ``rows [N]``, first and last ``steps [N]`` in the batch, mean-pooled ``states [N, F]`` and ``returns [N]``."""
        episodes = self.assembler.add(batch.episode_end, batch.whole_rows, states=batch.states, rewards=batch.rewards)
        rows = torch.tensor([ep.row for ep in episodes], dtype=torch.long)
        ends = torch.tensor([ep.end_step for ep in episodes], dtype=torch.long)
        starts = (ends - torch.tensor([len(ep) for ep in episodes], dtype=torch.long) + 1).clamp_min(0)
        if not episodes:
            return rows, starts, ends, torch.zeros(0, batch.states.shape[-1]), torch.zeros(0)
        return (rows, starts, ends, torch.stack([ep.data["states"].mean(0) for ep in episodes]),
                torch.stack([ep.data["rewards"].sum() for ep in episodes]))

    def shape(self, batch: StepBatch) -> Shaping:
        rows, starts, ends, pooled, returns = self._episodes(batch)
        if rows.numel() == 0:
            self._new = None
            self._metrics = {}
            return Shaping()
        self._new = (pooled, returns)
        if self.external is not None:
            if self.external not in batch.info:  # not graded this update
                self._metrics = {}
                return Shaping()
            term, self._metrics = self.rm.weigh(batch.info[self.external][rows][:, None], batch.progress)
        else:
            term, self._metrics = self.rm.signal(pooled, batch.progress)
            if not self.rm.ready:
                return Shaping()
        term = term.to(batch.rewards.dtype)
        delta = torch.zeros_like(batch.rewards)
        if self.o.refl_credit == "terminal":
            delta.index_put_((rows, ends), term, accumulate=True)
            return Shaping(reward_delta=delta)
        steps = torch.arange(batch.rewards.shape[1])
        span = (steps >= starts[:, None]) & (steps <= ends[:, None])  # [N, T]: each trajectory's steps in this batch
        delta.index_add_(0, rows, term[:, None] * span.to(delta.dtype))
        return Shaping(advantage_delta=delta)

    def fit(self, batch: StepBatch) -> None:
        if self._new is not None:
            self.rm.memory.add(pooled=self._new[0], returns=self._new[1])
        self.updates += 1
        if self.external is None and self.rm.memory.size >= self.o.refl_min_memory and self.updates % self.o.refl_every == 0:
            self._metrics.update(self.rm.train())
        self._metrics["exgrpo-seed/buffer_size"] = self.rm.memory.size

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors, meta = self.rm.state()
        at, am = self.assembler.state("partial")
        return {**tensors, **at}, {**meta, "assembler": am, "updates": self.updates}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.rm.load_state(tensors, meta)
        self.assembler.load_state("partial", tensors, meta["assembler"])
        self.updates = int(meta["updates"])


# ----------------------------------------------------------------------------- DQN form
class ExGRPOSeedDQNHook(DQNHook):
    """exgrpo-seed-dqn: adds ``eta * Q_refl(s, a)`` to the TD target, Q_refl(s, a) being the
    reflection of the finished trajectory the transition belongs to (0 while it is unfinished).

    Each replay slot remembers the mean-pooled states of its transition's trajectory once that
    trajectory ends; the reflection is recomputed with the current reflector at every TD target."""

    def __init__(self, obs_dim: int, num_envs: int, buffer_size: int, opts: ExGRPOSeedOptions, seed: int,
                 reflector: Reflector | None = None):
        self.o, self.num_envs = opts, num_envs
        self.rm = ReflectionMemory(obs_dim, opts, seed, reflector)
        self.slot_feat = torch.zeros(buffer_size, obs_dim)
        self.slot_has = torch.zeros(buffer_size, dtype=torch.bool)
        self.slot_stamp = torch.full((buffer_size,), -1, dtype=torch.int64)
        self.writes = 0
        self.sums = torch.zeros(num_envs, obs_dim)
        self.lengths = [0] * num_envs
        self.returns = [0.0] * num_envs
        self.slots: list[list[tuple[int, int]]] = [[] for _ in range(num_envs)]
        self._metrics: dict[str, float] = {}

    def after_step(self, trainer: DQN, slots: Tensor, obs: Tensor, rewards: Tensor, done: Tensor) -> None:
        """Account one vector step: ``obs`` are the states the actions were taken in."""
        stamps = self.writes + torch.arange(len(slots))
        self.writes += len(slots)
        self.slot_stamp[slots], self.slot_has[slots] = stamps, False
        self.sums += obs
        for i, (s, st, r) in enumerate(zip(slots.tolist(), stamps.tolist(), rewards.tolist())):
            self.lengths[i] += 1
            self.returns[i] += r
            self.slots[i].append((s, st))
        for i in torch.nonzero(done).flatten().tolist():
            pooled = self.sums[i] / self.lengths[i]
            self.rm.memory.add(pooled=pooled[None], returns=torch.tensor([self.returns[i]]))
            s, st = (torch.tensor(v) for v in zip(*self.slots[i]))
            live = s[self.slot_stamp[s] == st]
            self.slot_feat[live], self.slot_has[live] = pooled, True
            self.sums[i], self.lengths[i], self.returns[i], self.slots[i] = 0.0, 0, 0.0, []
        every = max(1, self.o.refl_every // self.num_envs)
        if trainer.vstep % every == 0 and self.rm.memory.size >= self.o.refl_min_memory:
            self._metrics.update(self.rm.train())

    def td_extra(self, trainer: DQN, idx: Tensor) -> Tensor | None:
        """eta(progress) * scale * Q_refl for the sampled transitions."""
        if not self.rm.ready:
            return None
        term, m = self.rm.signal(self.slot_feat[idx], trainer.progress)
        self._metrics.update(m)
        return term * self.slot_has[idx]

    def metrics(self) -> dict[str, float]:
        out = {**self._metrics, "exgrpo-seed/buffer_size": self.rm.memory.size}
        self._metrics = {}
        return out

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors, meta = self.rm.state()
        flat = [(i, s, st) for i in range(self.num_envs) for s, st in self.slots[i]]
        tensors.update({"slot_feat": self.slot_feat, "slot_has": self.slot_has, "slot_stamp": self.slot_stamp,
                        "sums": self.sums, "open_slots": torch.tensor(flat, dtype=torch.int64).reshape(-1, 3)})
        return tensors, {**meta, "writes": self.writes, "lengths": self.lengths, "returns": self.returns}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.rm.load_state(tensors, meta)
        self.slot_feat, self.slot_has = tensors["slot_feat"].clone(), tensors["slot_has"].clone()
        self.slot_stamp, self.sums = tensors["slot_stamp"].clone(), tensors["sums"].clone()
        self.writes = int(meta["writes"])
        self.lengths, self.returns = [int(v) for v in meta["lengths"]], [float(v) for v in meta["returns"]]
        self.slots = [[] for _ in range(self.num_envs)]
        for i, s, st in tensors["open_slots"].tolist():
            self.slots[i].append((s, st))
