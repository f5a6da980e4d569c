"""gear-seed: advantage reweighting from a self-distilled value (seed 001; docs/methods.md).

Groups of G trajectories start from one reset seed; the top-K of each group by coarse reward
(the episode return) are the winners. A distilled value head V_d on states is regressed onto the
winners' returns; a target copy of it (the previous iteration's head) gives
``omega = clip(exp((V_d - V_orig) / tau), omega_min, omega_max)`` per step, and ``omega * A``
feeds the policy loss.

Episodes of the control front end cross rollout boundaries. An episode contributes only once it
has ended; it then waits until every episode of its group (same group of envs, same episode
number) has ended, and only whole groups pick winners. Omega needs no complete episode: every
step of every batch is reweighted.
"""

from __future__ import annotations

import copy
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
from ..contract.base import AuxInputs, Episode, EpisodeAssembler, Shaping, StepBatch
from ..contract.nets import ScalarMLP, adam_for, fit_regression
from ..core import RingBuffer, returns_to_go


def winners_per_group(top_frac: float, group_size: int) -> int:
    """K = round(top_frac * G), at least 1 (25% of 4 -> 1)."""
    return max(1, min(group_size, int(round(top_frac * group_size))))


def select_winners(scores: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` highest scores (ties: the lower index wins)."""
    return torch.sort(scores, descending=True, stable=True).indices[:k]


def segment_ids(episode_end: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Cut the rows of ``[R, T]`` at episode ends: per step its segment id (``[R, T]``, numbered row
    by row), and per segment its row and its episode number within that row (0, 1, ...)."""
    R, T = episode_end.shape
    end = episode_end.to(torch.int64)
    k = end.cumsum(1) - end  # episode ends strictly before each step
    per_row = k[:, -1] + 1  # segments in each row
    offset = torch.cumsum(per_row, 0) - per_row
    seg = offset[:, None] + k
    rows = torch.repeat_interleave(torch.arange(R), per_row)
    local = torch.arange(int(per_row.sum())) - torch.repeat_interleave(offset, per_row)
    return seg, rows, local


def ranking_pairs(group: Tensor, score: Tensor) -> Tensor:
    """``[S, S]`` boolean: ``P[i, j]`` when segments i and j are in one group and i scores higher."""
    return (group[:, None] == group[None, :]) & (score[:, None] > score[None, :])


def pairwise_ranking_loss(log_ratio: Tensor, seg: Tensor, pairs: Tensor, scale: float) -> tuple[Tensor, int]:
    """``mean over pairs (i > j) of softplus(-scale * (l_i - l_j))`` with ``l`` a segment's mean
    log-ratio ``log pi - log pi_old`` over the steps given (``log_ratio [M]``, ``seg [M]`` segment ids);
    pairs with a segment absent from these steps are left out. Returns ``(loss, pairs used)``."""
    S = pairs.shape[0]
    sums = torch.zeros(S, dtype=log_ratio.dtype).index_add(0, seg, log_ratio)
    cnt = torch.zeros(S, dtype=log_ratio.dtype).index_add(0, seg, torch.ones_like(log_ratio))
    present = cnt > 0
    use = pairs & present[:, None] & present[None, :]
    n = int(use.sum())
    if n == 0:
        return log_ratio.sum() * 0.0, 0
    mean = sums / cnt.clamp_min(1.0)
    diff = mean[:, None] - mean[None, :]
    return torch.nn.functional.softplus(-scale * diff[use]).mean(), n


def omega_weights(v_d: Tensor, v_orig: Tensor, tau: float, lo: float, hi: float,
                  normalize: bool = False) -> tuple[Tensor, float]:
    """``omega = clip(exp((V_d - V_orig) / tau), lo, hi)``, then (optionally) divided by its mean;
    returns ``(omega, fraction of steps the clip changed)``."""
    raw = torch.exp((v_d - v_orig) / tau)
    omega = raw.clamp(lo, hi)
    clip_frac = float(((raw < lo) | (raw > hi)).float().mean()) if raw.numel() else 0.0
    if normalize and omega.numel():
        omega = omega / omega.mean()
    return omega, clip_frac


@dataclass
class GearSeedOptions:
    """Options of gear-seed (each is a ``reflectrl train --algo gear-seed`` flag)."""

    gear_top_frac: float = 0.25
    """Share K of each group's trajectories that are winners (at least one)."""
    gear_tau: float = 1.0
    """Temperature tau of omega = exp((V_d - V_orig) / tau)."""
    gear_tau_relative: bool = True
    """Multiply tau by the batch's std of the value targets (returns), so tau is scale-free."""
    gear_omega_min: float = 0.5
    """Lower clip of omega."""
    gear_omega_max: float = 2.0
    """Upper clip of omega."""
    gear_omega_normalize: bool = False
    """Divide omega by its batch mean after clipping."""
    gear_distill_target: Literal["return_to_go", "terminal"] = "return_to_go"
    """V_d target: discounted reward-to-go of the winner (bootstrapped at truncation), or gamma^(T-t) * R
    (terminal-only reward)."""
    gear_distill_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of V_d (empty: a linear head)."""
    gear_distill_epochs: int = 3
    """Passes of V_d's regression per update."""
    gear_distill_minibatches: int = 1
    """Minibatches per pass."""
    gear_distill_batch: int = 1024
    """Winner steps sampled from the winner store for each update's regression."""
    gear_distill_lr: float = 1e-3
    """Adam learning rate of V_d."""
    gear_winner_buffer: int = 8192
    """Winner steps kept (FIFO) for V_d's regression."""
    gear_target_sync: int = 1
    """Copy V_d into its target every this many updates (1: omega uses the previous update's head)."""
    gear_max_pending_groups: int = 64
    """Groups waiting for members to finish, at most (the oldest are dropped)."""
    gear_rank_coef: float = 0.0
    """Weight of the seed's pairwise ranking loss (0: off, the token-level weighted loss alone): segments of one group
    ranked by mean omega * A, softplus(-scale * (l_i - l_j)) on their mean log-ratios, added to the PPO loss."""
    gear_rank_scale: float = 1.0
    """Scale of the log-ratio difference inside the ranking loss."""

    def validate_gear(self) -> list[tuple[bool, str]]:
        return [
            (0 < self.gear_top_frac <= 1, "--gear-top-frac must be in (0, 1]"),
            (self.gear_tau > 0, "--gear-tau must be positive"),
            (0 < self.gear_omega_min <= 1 <= self.gear_omega_max, "need 0 < --gear-omega-min <= 1 <= --gear-omega-max"),
            (self.gear_distill_epochs >= 1 and self.gear_distill_minibatches >= 1,
             "--gear-distill-epochs/-minibatches must be at least 1"),
            (self.gear_distill_batch >= 1 and self.gear_winner_buffer >= 1,
             "--gear-distill-batch/--gear-winner-buffer must be at least 1"),
            (self.gear_distill_lr > 0, "--gear-distill-lr must be positive"),
            (self.gear_target_sync >= 1, "--gear-target-sync must be at least 1"),
            (self.gear_max_pending_groups >= 1, "--gear-max-pending-groups must be at least 1"),
            (self.gear_rank_coef >= 0 and self.gear_rank_scale > 0,
             "--gear-rank-coef must be non-negative and --gear-rank-scale positive"),
        ]


class GearSeed:
    """Winners, the distilled value head and omega on generic state features."""

    fit_first = False  # omega comes from the target copy; V_d learns the new winners afterwards

    def __init__(self, state_dim: int, rows: int, group_size: int, gamma: float, opts: GearSeedOptions, seed: int):
        self.o, self.G, self.gamma = opts, int(group_size), float(gamma)
        self.k = winners_per_group(opts.gear_top_frac, self.G)
        self.gen = torch.Generator().manual_seed(seed)
        self.vd = ScalarMLP(state_dim, tuple(opts.gear_distill_hidden), generator=self.gen)
        self.vd.eval()
        self.target = copy.deepcopy(self.vd)
        self.opt = adam_for(self.vd, opts.gear_distill_lr)
        self.assembler = EpisodeAssembler(rows, ("states", "rewards", "boot"))
        self.pending: dict[tuple[int, int], dict[int, Episode]] = {}
        self.store = RingBuffer(opts.gear_winner_buffer, {"x": ((state_dim,), torch.float32), "y": ((), torch.float32)})
        self.target_ready, self.fits = False, 0
        self._metrics: dict[str, float] = {}
        self._rank: tuple[Tensor, Tensor] | None = None  # (segment id per step [R, T], pairs) of this batch
        self._rank_acc: list[float] = []
        if opts.gear_rank_coef > 0:  # the optional ranking loss (seed section 4.2, step four)
            self.aux_loss = self._ranking_loss

    def shape(self, batch: StepBatch) -> Shaping:
        """omega from the target copy of V_d (none until V_d has been fitted once)."""
        sh = self._shape(batch)
        if self.o.gear_rank_coef > 0:
            self._prepare_ranking(batch, sh.weights)
        return sh

    def _prepare_ranking(self, batch: StepBatch, omega: Tensor | None) -> None:
        """Segments of this batch, their groups (row // G, episode number) and scores (mean omega * A)."""
        seg, rows, local = segment_ids(batch.episode_end)
        episode = torch.as_tensor(self.assembler.episode, dtype=torch.long)[rows] + local  # before fit() adds them
        group = (rows // self.G) * (int(episode.max()) + 1) + episode
        a_rew = batch.advantages if omega is None else omega * batch.advantages
        m = torch.ones_like(a_rew) if batch.mask is None else batch.mask.to(a_rew.dtype)
        S = rows.shape[0]
        score = (torch.zeros(S, dtype=a_rew.dtype).index_add(0, seg.reshape(-1), (a_rew * m).reshape(-1))
                 / torch.zeros(S, dtype=a_rew.dtype).index_add(0, seg.reshape(-1), m.reshape(-1)).clamp_min(1.0))
        pairs = ranking_pairs(group, score)
        self._rank = (seg, pairs)
        self._rank_acc = []
        self._metrics["gear-seed/rank_pairs"] = float(pairs.sum())

    def _ranking_loss(self, inputs: AuxInputs) -> Tensor:
        """``gear_rank_coef`` x the ranking loss on the steps of one minibatch of the policy update."""
        if self._rank is None:
            raise RuntimeError("the ranking loss needs the batch's ranking pairs (prepare the batch first)")
        seg, pairs = self._rank
        loss, n = pairwise_ranking_loss(inputs.logp - inputs.old_logp, seg[inputs.rows, inputs.steps], pairs,
                                        self.o.gear_rank_scale)
        if n:
            self._rank_acc.append(float(loss.detach()))
            self._metrics["gear-seed/rank_loss"] = sum(self._rank_acc) / len(self._rank_acc)
        return self.o.gear_rank_coef * loss

    def _shape(self, batch: StepBatch) -> Shaping:
        if not self.target_ready:
            self._metrics = {"gear-seed/omega_mean": 1.0, "gear-seed/omega_std": 0.0, "gear-seed/omega_min": 1.0,
                             "gear-seed/omega_max": 1.0, "gear-seed/omega_clip_frac": 0.0}
            return Shaping()
        states = batch.states.reshape(-1, batch.states.shape[-1])
        with torch.no_grad():
            v_d = self.target(states)[:, 0].reshape(batch.values.shape)
        tau = self.o.gear_tau
        if self.o.gear_tau_relative:
            ret = batch.returns if batch.mask is None else batch.returns[batch.mask.bool()]
            std = float(ret.std()) if ret.numel() > 1 else 0.0
            tau *= std if std > 1e-8 else 1.0
        omega, clip_frac = omega_weights(v_d, batch.values, tau, self.o.gear_omega_min, self.o.gear_omega_max,
                                         self.o.gear_omega_normalize)
        if batch.mask is not None:
            omega = torch.where(batch.mask.bool(), omega, torch.ones_like(omega))
        self._metrics = {"gear-seed/omega_mean": float(omega.mean()), "gear-seed/omega_std": float(omega.std()),
                         "gear-seed/omega_min": float(omega.min()), "gear-seed/omega_max": float(omega.max()),
                         "gear-seed/omega_clip_frac": clip_frac, "gear-seed/tau": tau}
        return Shaping(weights=omega)

    def fit(self, batch: StepBatch) -> None:
        """Collect finished episodes, pick the winners of finished groups, regress V_d, sync the target."""
        boot = torch.where(batch.episode_end & ~batch.terminated, batch.next_values, torch.zeros_like(batch.next_values))
        fast = self._whole_groups(batch)
        if fast is not None:
            groups, winners = fast
        else:
            done = self.assembler.add(batch.episode_end, batch.whole_rows, states=batch.states, rewards=batch.rewards,
                                      boot=boot)
            groups, winners = self._collect(done)
        loss = float("nan")
        if self.store.size:
            n = min(self.store.size, self.o.gear_distill_batch)
            idx = torch.randperm(self.store.size, generator=self.gen)[:n]
            _, loss = fit_regression(self.vd, self.opt, self.store.x[idx], self.store.y[idx],
                                     self.o.gear_distill_epochs, self.o.gear_distill_minibatches, self.gen)
            self.fits += 1
            if self.fits % self.o.gear_target_sync == 0:
                self.target.load_state_dict(self.vd.state_dict())
                self.target_ready = True
        self._metrics.update({"gear-seed/vd_loss": loss, "gear-seed/groups_completed": groups, "gear-seed/winners": winners,
                              "gear-seed/winner_steps": self.store.size, "gear-seed/pending_groups": len(self.pending)})

    def _whole_groups(self, batch: StepBatch) -> tuple[int, int] | None:
        """The LLM case in one pass: whole-row episodes, every row ended, complete groups, none pending, terminal
        targets. Picks the same winners and stores the same steps and targets as :meth:`_collect` on the
        assembler's episodes; None where that case does not apply."""
        end = batch.episode_end
        R, T = end.shape
        if not (batch.whole_rows and self.o.gear_distill_target == "terminal" and not self.pending and R % self.G == 0):
            return None
        whole = self.assembler.add_whole(end)
        if whole is None:
            return None
        last, inside = whole  # [R], [R, T]
        steps = torch.arange(T)
        score = torch.where(inside, batch.rewards, torch.zeros_like(batch.rewards)).sum(1)
        order = torch.sort(score.reshape(-1, self.G), dim=1, descending=True, stable=True).indices[:, :self.k]
        rows = (order + torch.arange(R // self.G)[:, None] * self.G).reshape(-1)  # group-major, as _collect adds them
        take = inside[rows]
        x = batch.states[rows][take]
        power = (last[rows][:, None] - steps[None, :]).clamp_min(0).to(torch.float64)
        y = (self.gamma ** power * score[rows].to(torch.float64)[:, None])[take].to(batch.rewards.dtype)
        if x.shape[0] <= self.store.capacity:
            self.store.add(x=x, y=y)
        else:  # one winner at a time, so the ring keeps the layout of successive adds
            n = inside[rows].sum(1).tolist()
            for xs, ys in zip(x.split(n), y.split(n)):
                self.store.add(x=xs, y=ys)
        return R // self.G, int(rows.numel())

    def _collect(self, episodes: list[Episode]) -> tuple[int, int]:
        """File episodes under their group; return (groups completed, winners added)."""
        completed = winners = 0
        for ep in episodes:
            key = (ep.row // self.G, ep.index)
            self.pending.setdefault(key, {})[ep.row] = ep
            if len(self.pending[key]) == self.G:
                members = [m for _, m in sorted(self.pending.pop(key).items())]
                scores = torch.stack([m.data["rewards"].sum() for m in members])
                for i in select_winners(scores, self.k).tolist():
                    self.store.add(x=members[i].data["states"], y=self.value_targets(members[i]))
                    winners += 1
                completed += 1
        while len(self.pending) > self.o.gear_max_pending_groups:
            self.pending.pop(next(iter(self.pending)))
        return completed, winners

    def value_targets(self, ep: Episode) -> Tensor:
        """G_t of one winner: reward-to-go (bootstrapped if truncated) or gamma^(T-t) * R."""
        r = ep.data["rewards"]
        if self.o.gear_distill_target == "terminal":
            n = r.shape[0]
            return (self.gamma ** torch.arange(n - 1, -1, -1, dtype=torch.float64) * float(r.sum())).to(r.dtype)
        return returns_to_go(r, self.gamma, float(ep.data["boot"][-1]))

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors = {**pack_state_dict("vd", self.vd.state_dict()), **pack_state_dict("target", self.target.state_dict())}
        opt_t, opt_meta = pack_optimizer("opt", self.opt)
        tensors.update(opt_t)
        tensors.update({"gen": self.gen.get_state(), "store/x": self.store.x, "store/y": self.store.y})
        asm_t, asm_meta = self.assembler.state("partial")
        tensors.update(asm_t)
        eps = [(k, r, ep) for k, members in self.pending.items() for r, ep in members.items()]
        for f in ("states", "rewards", "boot"):
            if eps:
                tensors[f"pending/{f}"] = torch.cat([ep.data[f] for _, _, ep in eps])
        meta = {"opt": opt_meta, "assembler": asm_meta, "ptr": self.store.ptr, "size": self.store.size,
                "target_ready": self.target_ready, "fits": self.fits,
                "pending": [[k[0], k[1], r, len(ep)] for k, r, ep in eps]}
        return tensors, meta

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.vd.load_state_dict(unpack_state_dict("vd", tensors))
        self.target.load_state_dict(unpack_state_dict("target", tensors))
        self.opt.load_state_dict(unpack_optimizer("opt", tensors, meta["opt"]))
        self.gen.set_state(tensors["gen"])
        self.store.load_state({"x": tensors["store/x"], "y": tensors["store/y"]}, meta)
        self.target_ready, self.fits = bool(meta["target_ready"]), int(meta["fits"])
        self.assembler.load_state("partial", tensors, meta["assembler"])
        self.pending, start = {}, 0
        for g, e, r, n in meta["pending"]:
            data = {f: tensors[f"pending/{f}"][start:start + n].clone() for f in ("states", "rewards", "boot")}
            self.pending.setdefault((int(g), int(e)), {})[int(r)] = Episode(int(r), int(e), data)
            start += n
