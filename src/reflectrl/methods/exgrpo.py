"""exgrpo: learning to reason from experience (arXiv 2510.02245, ExGRPO), as its released launch script sets it.

After each rollout (K samples per question), the successful trajectories of questions solved k of K times
with 0 < k <= K-1 are kept (text and the log-probs they were sampled with, deduplicated by text), keyed by
the latest k; a question solved K of K is retired and no longer sampled. Once the batch's solve rate first
exceeds ``exgrpo_start_rate``, a share rho of each batch's questions comes from experience: a bucket of
success counts drawn with weights from a normal density around K/2 (sigma 1, in counts; other weightings
as options), then a question uniformly without replacement inside it. A replayed question gets one stored
trajectory (the one with the lowest mean token entropy under the current policy, or a random one) and K-1
fresh samples in one group; fresh tokens take the clipped loss and the stored ones the shaped ratio
``f(w) = w / (w + 0.1)`` against their stored log-probs, unclipped (the ``exgrpo`` policy loss of
:mod:`reflectrl.core.losses`). Advantages are Dr.GRPO's (mean-centred, no std, no length normalization).
The buffer, the buckets, the retired set and the replay switch live in the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..contract.fields import register_field
from ..llm.batch import REPLAYED, TokenBatch
from ..llm.grpo import GRPO, GRPOHook
from ..tasks.base import Problem

STORED = register_field("stored_logp", "token", "loss", "a replayed trajectory's log-probs when it was stored")
OFFPOLICY = register_field("offpolicy", "token", "loss", "1 on the tokens of a replayed stored trajectory")


@dataclass
class ExGRPOOptions:
    """Options of exgrpo (each a ``reflectrl llm train --algo exgrpo`` flag)."""

    exgrpo_rho: float = 0.5
    """Share of each batch's questions drawn from experience (the paper's 0.5)."""
    exgrpo_start_rate: float = 0.35
    """Replay starts the first time a batch's solve rate exceeds this."""
    exgrpo_weighting: Literal["normal", "linear", "sqrt", "uniform"] = "normal"
    """Bucket weights over success counts k: N(k; K/2, sigma), k/K, sqrt(k/K), or equal."""
    exgrpo_sigma: float = 1.0
    """sigma of the normal weighting, in success counts (the released code's 1)."""
    exgrpo_pick: Literal["entropy", "random"] = "entropy"
    """Which stored trajectory of a question is replayed: the lowest mean token entropy under the current policy, or random."""
    exgrpo_shape_beta: float = 0.1
    """beta in f(w) = w / (w + beta)."""
    exgrpo_retire: bool = True
    """Retire a question solved K of K (never sampled again), as the paper does; off: it only leaves the buffer
    and stays in the fresh draws (an ablation)."""

    def validate_exgrpo_paper(self) -> list[tuple[bool, str]]:
        return [(0 <= self.exgrpo_rho < 1, "--exgrpo-rho must be in [0, 1)"),
                (0 <= self.exgrpo_start_rate <= 1, "--exgrpo-start-rate must be in [0, 1]"),
                (self.exgrpo_sigma > 0 and self.exgrpo_shape_beta > 0, "--exgrpo-sigma and --exgrpo-shape-beta must be positive")]


def bucket_weights(counts: list[int], K: int, kind: str, sigma: float = 1.0) -> torch.Tensor:
    """Unnormalized weights of the buckets with success counts ``counts`` (each in 1..K-1)."""
    k = torch.tensor(counts, dtype=torch.float64)
    if kind == "normal":
        return torch.exp(-0.5 * ((k - K / 2) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    if kind == "linear":
        return k / K
    if kind == "sqrt":
        return (k / K).sqrt()
    if kind == "uniform":
        return torch.ones_like(k)
    raise ValueError(f"unknown bucket weighting {kind!r}")


def sample_from_buckets(buckets: dict[int, list[str]], n: int, K: int, kind: str, sigma: float,
                        gen: torch.Generator) -> list[str]:
    """``n`` questions: a bucket drawn by weight (multinomial), then a question uniformly without replacement
    inside it; an exhausted bucket leaves the draw. Fewer than ``n`` when the buffer holds fewer questions."""
    left = {k: list(v) for k, v in buckets.items() if v}
    out: list[str] = []
    while len(out) < n and left:
        keys = sorted(left)
        w = bucket_weights(keys, K, kind, sigma)
        k = keys[int(torch.multinomial(w / w.sum(), 1, generator=gen))]
        qs = left[k]
        out.append(qs.pop(int(torch.randint(len(qs), (1,), generator=gen))))
        if not qs:
            del left[k]
    return out


class ExGRPO(GRPOHook):
    """The experience buffer, question sampling and mixed batches of exgrpo (see the module docstring)."""

    metric_labels = {"exgrpo/retired": "retired questions", "exgrpo/replay_share": "replayed share",
                     "exgrpo/buffer_questions": "stored questions", "exgrpo/bucket_": "stored questions solved {} of K"}
    """What its metrics mean, for tables (a key ending in ``_`` stands for its numbered family)."""
    count_metrics = ("exgrpo/retired", "exgrpo/buffer_questions", "exgrpo/bucket_")
    """Its metrics that count (shown without decimals)."""

    needs = ("old_logp",)
    provides = (OFFPOLICY, STORED, REPLAYED)
    changes_batch = True

    def __init__(self, opts: ExGRPOOptions, seed: int):
        self.o = opts
        self.gen = torch.Generator().manual_seed(seed)
        self.buffer: dict[str, list[dict[str, Any]]] = {}  # question id -> stored successful trajectories
        self.count: dict[str, int] = {}  # question id -> latest success count (1..K-1)
        self.retired: set[str] = set()
        self.started = False
        self._replayed: dict[str, dict[str, Any]] = {}  # this batch's question id -> its stored trajectory
        self._metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ choosing questions
    def buckets(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for q in sorted(self.buffer):
            out.setdefault(self.count[q], []).append(q)
        return out

    def select_problems(self, trainer: GRPO, n: int) -> list[Problem]:
        self._metrics = {}  # this update's, from here to after_update
        K = trainer.cfg.group_size
        by_id = trainer.problems_by_id
        exp_ids = []
        if self.started and self.buffer:
            exp_ids = sample_from_buckets(self.buckets(), int(round(self.o.exgrpo_rho * n)), K, self.o.exgrpo_weighting,
                                          self.o.exgrpo_sigma, self.gen)
        chosen = set(exp_ids)
        fresh: list[Problem] = []
        while len(fresh) < n - len(exp_ids):
            p = trainer.next_problems(1)[0]
            if p.id in self.retired and len(self.retired) < len(trainer.train_problems):
                continue
            if p.id not in chosen:
                fresh.append(p)
        self._replayed = self.pick(trainer, exp_ids) if exp_ids else {}
        self._sizes = [K] * len(fresh) + [K - 1] * len(exp_ids)
        return fresh + [by_id[q] for q in exp_ids]

    def group_sizes(self, trainer: GRPO, problems: list[Problem]) -> list[int] | None:
        return self._sizes

    @torch.no_grad()
    def pick(self, trainer: GRPO, ids: list[str]) -> dict[str, dict[str, Any]]:
        """The stored trajectory each replayed question uses: lowest mean token entropy under the current
        policy (one batched no-grad forward over their stored trajectories), or random."""
        if self.o.exgrpo_pick == "random":
            return {q: self.buffer[q][int(torch.randint(len(self.buffer[q]), (1,), generator=self.gen))] for q in ids}
        recs = [(q, r) for q in ids for r in self.buffer[q]]
        b = TokenBatch.from_records([r for _, r in recs], pad_id=trainer.policy.pad_id)
        pol = trainer.policy
        was = pol.training
        pol.eval()
        ent = pol.forward_batch(b, with_entropy=True, temperature=trainer.cfg.temperature).entropy.cpu()
        pol.train(was)
        m = b.completion_mask.float()
        mean = (ent * m).sum(1) / m.sum(1).clamp_min(1)
        best: dict[str, tuple[float, dict[str, Any]]] = {}
        for (q, r), h in zip(recs, mean.tolist()):
            if q not in best or h < best[q][0]:
                best[q] = (h, r)
        self._metrics["exgrpo/picked_entropy"] = float(sum(h for h, _ in best.values()) / max(len(best), 1))
        return {q: r for q, (_, r) in best.items()}

    # ------------------------------------------------------------------ mixing and storing
    def after_rollout(self, trainer: GRPO, batch: TokenBatch) -> TokenBatch:
        """Add each replayed question's stored trajectory to its group (as the group's last row) and mark its
        tokens off-policy with their stored log-probs."""
        batch.extras[OFFPOLICY] = torch.zeros(batch.rows, batch.steps)
        batch.extras[STORED] = torch.zeros(batch.rows, batch.steps)
        batch.extras[REPLAYED] = torch.zeros(batch.rows)
        self._fresh_rows = batch.rows
        if not self._replayed:
            return batch
        parts, pid = [], trainer.policy.pad_id
        index_of = {p.id: int(i) for p, i in zip(batch.problems, batch.index.tolist())}
        stored = []
        for q, rec in self._replayed.items():
            rec = {**rec, "index": index_of[q]}
            stored.append(rec)
        sb = TokenBatch.from_records(stored, [trainer.problems_by_id[q] for q in self._replayed], pid)
        C = sb.steps
        logp = torch.zeros(sb.rows, C)
        for r, rec in enumerate(stored):
            v = torch.tensor(rec["logp"], dtype=torch.float32)
            logp[r, :v.numel()] = v[:C]
        sb.extras = {OFFPOLICY: sb.completion_mask.float(), STORED: logp * sb.completion_mask,
                     REPLAYED: torch.ones(sb.rows)}
        sb.infos = [list(r.get("infos", [])) for r in stored]
        parts = [batch, sb]
        out = TokenBatch.cat(parts, pid)
        order = torch.argsort(out.index, stable=True)  # keep each group's rows together
        return out.select(order, trim=False)

    def after_update(self, trainer: GRPO, batch: TokenBatch) -> None:
        """Update the buffer from the fresh rows of this batch; start replay once the solve rate is high enough."""
        K = trainer.cfg.group_size
        fresh = batch.extras[OFFPOLICY].sum(1) == 0
        correct = batch.correct & fresh
        solve = float(correct.sum()) / max(int(fresh.sum()), 1)
        if not self.started and solve > self.o.exgrpo_start_rate:
            self.started = True
        groups: dict[str, list[int]] = {}
        for r in fresh.nonzero().squeeze(1).tolist():
            groups.setdefault(batch.problems[r].id, []).append(r)
        old = batch.old_logp
        todo: list[tuple[str, int, list[int]]] = []  # (question, its solved count of K, its correct rows)
        for q, rows in groups.items():
            k = round(sum(bool(batch.correct[r]) for r in rows) * K / len(rows))
            if k >= K and self.o.exgrpo_retire:
                self.retired.add(q)
            if k >= K or k <= 0:  # solved by every sample, or by none: nothing of it is kept
                self.buffer.pop(q, None)
                self.count.pop(q, None)
            else:
                todo.append((q, k, [r for r in rows if bool(batch.correct[r])]))
        stored = [r for _, _, rows in todo for r in rows]
        records = dict(zip(stored, batch.to_records(stored)))  # only the rows the buffer keeps become records
        for q, k, rows in todo:
            kept = {tuple(x["response_ids"]): x for x in self.buffer.get(q, [])}
            for r in rows:
                rec = records[r]
                n = len(rec["response_ids"])
                rec["logp"] = (old[r, :n] if old is not None else torch.zeros(n)).tolist()
                kept.setdefault(tuple(rec["response_ids"]), rec)
            self.buffer[q], self.count[q] = list(kept.values()), k
        hist = self.buckets()
        self._metrics.update({"exgrpo/buffer_questions": float(len(self.buffer)),
                              "exgrpo/buffer_trajectories": float(sum(len(v) for v in self.buffer.values())),
                              "exgrpo/retired": float(len(self.retired)), "exgrpo/replay_on": float(self.started),
                              "exgrpo/replay_share": float(len(self._replayed)) / max(trainer.cfg.prompts_per_update, 1),
                              "exgrpo/solve_rate": solve,
                              **{f"exgrpo/bucket_{k}": float(len(v)) for k, v in sorted(hist.items())}})

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {"gen": self.gen.get_state()}, {"buffer": self.buffer, "count": self.count,
                                               "retired": sorted(self.retired), "started": self.started}

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.gen.set_state(tensors["gen"])
        self.buffer = {q: [dict(r) for r in v] for q, v in meta["buffer"].items()}
        self.count = {q: int(k) for q, k in meta["count"].items()}
        self.retired, self.started = set(meta["retired"]), bool(meta["started"])
