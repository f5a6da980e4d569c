"""The token batch of the LLM front end: sequences of a rollout in the core's ``[rows, steps]`` layout.

Layout of a :class:`TokenBatch` (R rows = G samples x prompts; P prompt width; C response width)::

    prompt_ids    [R, P]  left-padded prompt tokens             prompt_mask     [R, P]
    response_ids  [R, C]  right-padded response tokens          completion_mask [R, C]  policy tokens (in the loss)
                          (turn 1, feedback 1, turn 2, ...)     feedback_mask   [R, C]  env tokens (context only)
    input_ids = cat(prompt_ids, response_ids)  [R, P + C]; the model sees prompt_mask | completion | feedback.

The *steps* of the core are the response positions: every per-token tensor (``token_rewards``,
``old_logp``, ``ref_logp``, ``advantages``, ``weights``, ...) is ``[R, C]`` and aligned to
``response_ids``, so a second pass with another prompt (a teacher with extra context,
:meth:`TokenBatch.with_prompts`) yields tensors aligned to the same tokens. Real tokens are contiguous in
each row (``pad.. prompt | response ..pad``), so positions are ``cumsum(attention_mask) - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

from ..contract.fields import is_per_token, register_field
from ..tasks.base import Problem

# per-token optional fields (all [R, C]) that follow the rows through select / cat / with_prompts
TOKEN_FIELDS = ("old_logp", "ref_logp", "advantages", "returns", "weights", "values", "entropy")
ENGINE_LOGP = register_field("engine_logp", "token", "method",
                             "the generation engine's log-prob of each policy token (0 elsewhere), when every policy "
                             "segment of the batch came with them (an engine with generate_with_logprobs)")
REPLAYED = register_field("replayed", "row", "trainer",
                          "1 on the rows a hook mixed in from storage (exgrpo's replay): the rollout's reward and "
                          "self-report metrics leave them out")


@dataclass
class TokenBatch:
    """Sequences of a rollout in the ``[rows, steps]`` layout; see the module docstring."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    completion_mask: Tensor
    feedback_mask: Tensor
    turn_ids: Tensor
    token_rewards: Tensor
    index: Tensor
    scores: Tensor
    correct: Tensor
    truncated: Tensor
    problems: list[Problem] = field(default_factory=list)
    transcripts: list[list[tuple[str, str]]] = field(default_factory=list)
    infos: list[list[dict[str, Any]]] = field(default_factory=list)
    """Per row, the ``info`` dict the env returned at each of its turns (e.g. a reflection or
    confidence tag a method reads); JSON-able values are kept in stored trajectories."""
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    weights: Tensor | None = None  # per-token advantage multipliers set by a method (GEAR, gear-seed)
    values: Tensor | None = None
    entropy: Tensor | None = None
    hidden: Tensor | None = None  # [R, C, H] features from the pre-update pass, when a hook asked for them
    extras: dict[str, Any] = field(default_factory=dict)
    """Registered fields (:mod:`reflectrl.contract.fields`) a hook, an engine or the trainer attached, by key."""

    # ------------------------------------------------------------------ derived views
    @property
    def rows(self) -> int:
        return self.response_ids.shape[0]

    @property
    def steps(self) -> int:
        return self.response_ids.shape[1]

    @property
    def response_attention(self) -> Tensor:
        """Real response tokens (policy or feedback): what the model attends to after the prompt."""
        return self.completion_mask | self.feedback_mask

    @property
    def input_ids(self) -> Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], 1)

    @property
    def attention_mask(self) -> Tensor:
        return torch.cat([self.prompt_mask, self.response_attention], 1).long()

    @property
    def position_ids(self) -> Tensor:
        return (self.attention_mask.cumsum(1) - 1).clamp_min(0)

    @property
    def completion_lengths(self) -> Tensor:
        return self.completion_mask.sum(1)

    def full_masks(self) -> dict[str, Tensor]:
        """``prompt``, ``completion``, ``feedback`` masks over the whole sequence ``[R, P + C]``."""
        zp, zc = torch.zeros_like(self.prompt_mask), torch.zeros_like(self.completion_mask)
        return {"prompt": torch.cat([self.prompt_mask, zc], 1),
                "completion": torch.cat([zp, self.completion_mask], 1),
                "feedback": torch.cat([zp, self.feedback_mask], 1)}

    def last_completion_index(self) -> Tensor:
        """``[R]`` response position of each row's last policy token (-1 for a row without one)."""
        pos = torch.arange(self.steps).expand(self.rows, -1)
        return torch.where(self.completion_mask, pos, torch.full_like(pos, -1)).max(1).values

    # ------------------------------------------------------------------ row operations
    def select(self, rows: Sequence[int] | Tensor, trim: bool = True) -> TokenBatch:
        """The batch restricted to ``rows`` (padding trimmed to the new widths when ``trim``)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if torch.is_tensor(v):
                kw[f.name] = v[idx]
            elif f.name in ("problems", "transcripts", "infos"):
                kw[f.name] = [v[i] for i in idx.tolist()] if v else []
            elif f.name == "extras":
                kw[f.name] = {k: (x[idx] if torch.is_tensor(x) else [x[i] for i in idx.tolist()]) for k, x in v.items()}
        out = TokenBatch(**kw)
        return out.trimmed() if trim else out

    def trimmed(self) -> TokenBatch:
        """Drop all-padding prompt columns on the left and response columns on the right."""
        p_keep = int(self.prompt_mask.sum(1).max()) if self.rows else 0
        c_keep = int(self.last_real_response().max()) + 1 if self.rows else 0
        P, C = self.prompt_ids.shape[1], self.steps
        if p_keep == P and c_keep == C:
            return self
        kw = {"prompt_ids": self.prompt_ids[:, P - p_keep:], "prompt_mask": self.prompt_mask[:, P - p_keep:]}
        for name in ("response_ids", "completion_mask", "feedback_mask", "turn_ids", "token_rewards", *TOKEN_FIELDS):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v[:, :c_keep]
        if self.hidden is not None:
            kw["hidden"] = self.hidden[:, :c_keep]
        kw["extras"] = {k: v[:, :c_keep] if torch.is_tensor(v) and is_per_token(k) else v
                        for k, v in self.extras.items()}
        return replace(self, **kw)

    def last_real_response(self) -> Tensor:
        pos = torch.arange(self.steps).expand(self.rows, -1)
        return torch.where(self.response_attention, pos, torch.full_like(pos, -1)).max(1).values

    def prompt_tokens(self) -> list[list[int]]:
        """Each row's prompt ids without their padding."""
        return [ids[m].tolist() for ids, m in zip(self.prompt_ids, self.prompt_mask.bool())]

    def with_prompts(self, prompts: Sequence[Sequence[int]], pad_id: int = 0) -> TokenBatch:
        """The same responses after other prompts (e.g. a teacher context holding the reference answer):
        per-token outputs of a forward pass on it align with this batch's tokens."""
        if len(prompts) != self.rows:
            raise ValueError(f"need one prompt per row ({self.rows}), got {len(prompts)}")
        ids, mask = left_pad(prompts, pad_id)
        return replace(self, prompt_ids=ids, prompt_mask=mask, hidden=None)

    @staticmethod
    def cat(batches: Sequence[TokenBatch], pad_id: int = 0) -> TokenBatch:
        """Stack batches row-wise (re-padding prompts on the left, responses on the right); keeps ``index``."""
        batches = [b for b in batches if b.rows]
        if len(batches) == 1:
            return batches[0]
        P = max(b.prompt_ids.shape[1] for b in batches)
        C = max(b.steps for b in batches)
        kw: dict[str, Any] = {}
        for f in fields(TokenBatch):
            vals = [getattr(b, f.name) for b in batches]
            if f.name in ("prompt_ids", "prompt_mask"):
                fill = pad_id if f.name == "prompt_ids" else False
                kw[f.name] = torch.cat([_pad_to(v, P, fill, left=True) for v in vals])
            elif f.name in ("problems", "transcripts", "infos"):
                kw[f.name] = [x for v in vals for x in v] if all(len(v) == b.rows for v, b in zip(vals, batches)) else []
            elif f.name == "extras":
                keys = set.intersection(*(set(v) for v in vals))
                kw[f.name] = {k: _cat_any([v[k] for v in vals], C if is_per_token(k) else None) for k in keys}
            elif f.name == "hidden" or any(v is None for v in vals):
                kw[f.name] = None
            elif vals[0].dim() == 2:
                fill = {"response_ids": pad_id, "turn_ids": -1}.get(f.name, 0)
                kw[f.name] = torch.cat([_pad_to(v, C, fill) for v in vals])
            else:
                kw[f.name] = torch.cat(vals)
        return TokenBatch(**kw)

    # ------------------------------------------------------------------ storage
    def to_records(self, rows: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """One plain dict per row (token lists and masks without padding): a stored trajectory; of the ``rows``
        given (all when None), in their order."""
        recs = []
        for r in range(self.rows) if rows is None else rows:
            pm, ra = self.prompt_mask[r], self.response_attention[r]
            n = int(ra.sum())
            recs.append({
                "problem_id": self.problems[r].id if self.problems else None,
                "prompt_ids": self.prompt_ids[r][pm].tolist(),
                "response_ids": self.response_ids[r, :n].tolist(),
                "completion_mask": self.completion_mask[r, :n].tolist(),
                "turn_ids": self.turn_ids[r, :n].tolist(),
                "token_rewards": self.token_rewards[r, :n].tolist(),
                "score": float(self.scores[r]), "correct": bool(self.correct[r]),
                "truncated": bool(self.truncated[r]), "index": int(self.index[r]),
                "transcript": self.transcripts[r] if self.transcripts else [],
                "infos": [_jsonable(i) for i in self.infos[r]] if self.infos else [],
            })
        return recs

    @staticmethod
    def from_records(records: Sequence[dict[str, Any]], problems: Sequence[Problem] | None = None,
                     pad_id: int = 0) -> TokenBatch:
        """Rebuild rows from :meth:`to_records` output (``problems`` aligned to the records, optional)."""
        rows = []
        for rec in records:
            segs, cur, cur_kind, cur_turn = [], [], None, None
            for tok, m, t in zip(rec["response_ids"], rec["completion_mask"], rec["turn_ids"]):
                kind = "policy" if m else "env"
                if cur and (kind != cur_kind or t != cur_turn):
                    segs.append(Segment(cur, cur_kind, cur_turn))
                    cur = []
                cur.append(tok)
                cur_kind, cur_turn = kind, t
            if cur:
                segs.append(Segment(cur, cur_kind, cur_turn))
            rows.append(RowResult(rec["prompt_ids"], segs, rec["token_rewards"], rec["score"], rec["correct"],
                                  rec["truncated"], [tuple(x) for x in rec.get("transcript", [])],
                                  [dict(i) for i in rec.get("infos", [])]))
        batch = build_batch(rows, [r["index"] for r in records], list(problems or []), pad_id)
        return batch


@dataclass
class Segment:
    """A run of response tokens of one kind: ``policy`` (generated, trained on) or ``env`` (feedback)."""

    ids: list[int]
    kind: str
    turn: int
    reward: float = 0.0  # for a policy segment: the reward of its turn (placed on its last token)
    logp: list[float] | None = None  # for a policy segment: the generation engine's log-prob of each token, if it gave them


@dataclass
class RowResult:
    """One finished episode before padding."""

    prompt_ids: list[int]
    segments: list[Segment]
    token_rewards: list[float] | None
    score: float
    correct: bool
    truncated: bool
    transcript: list[tuple[str, str]]
    infos: list[dict[str, Any]] = field(default_factory=list)


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """The entries of an env ``info`` that a JSON file can hold (numbers, strings, booleans, None, and
    lists/dicts of them); the rest are dropped from stored trajectories."""
    import json

    out = {}
    for k, v in info.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[str(k)] = v
    return out


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """``[R, max_len]`` ids left-padded with ``pad_id`` and the boolean mask of real tokens."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in seqs], dtype=torch.long)
    ids = ids.reshape(len(seqs), width)
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    mask = torch.arange(width).expand(len(seqs), width) >= (width - lens)[:, None]
    return ids, mask


def _pad_to(x: Tensor, width: int, fill, left: bool = False) -> Tensor:
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    pad = torch.full((x.shape[0], extra, *x.shape[2:]), fill, dtype=x.dtype)
    return torch.cat([pad, x] if left else [x, pad], 1)


def _cat_any(vals: list, width: int | None) -> Any:
    """Row-wise concatenation of an extras entry: a per-token entry's tensors ``[R, steps, ...]`` are right-padded
    with 0 to ``width`` first (None: a per-row entry, tensors ``[R, ...]`` or lists, joined as they are)."""
    if not torch.is_tensor(vals[0]):
        return [x for v in vals for x in v]
    if width is not None:
        vals = [_pad_to(v, width, 0) for v in vals]
    return torch.cat(vals)


def build_batch(rows: Sequence[RowResult], index: Sequence[int], problems: list[Problem], pad_id: int) -> TokenBatch:
    """Pad finished episodes into a :class:`TokenBatch`."""
    prompt_ids, prompt_mask = left_pad([r.prompt_ids for r in rows], pad_id)
    C = max((sum(len(s.ids) for s in r.segments) for r in rows), default=0)
    resp, kind, turn = [], [], []
    for row in rows:
        ids, k, tn = [], [], []
        for seg in row.segments:
            n = len(seg.ids)
            if n == 0:
                continue
            ids += seg.ids
            k += [1 if seg.kind == "policy" else 2] * n
            tn += [seg.turn] * n
        pad = C - len(ids)
        resp.append(ids + [pad_id] * pad)
        kind.append(k + [0] * pad)
        turn.append(tn + [-1] * pad)
    kinds = torch.tensor(kind, dtype=torch.int8).reshape(len(rows), C)
    extras = {ENGINE_LOGP: lp} if (lp := _engine_logp(rows, C)) is not None else {}
    batch = TokenBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        response_ids=torch.tensor(resp, dtype=torch.long).reshape(len(rows), C),
        completion_mask=kinds == 1, feedback_mask=kinds == 2,
        turn_ids=torch.tensor(turn, dtype=torch.long).reshape(len(rows), C),
        token_rewards=torch.zeros(len(rows), C), index=torch.as_tensor(list(index), dtype=torch.long),
        scores=torch.zeros(len(rows)), correct=torch.zeros(len(rows), dtype=torch.bool),
        truncated=torch.zeros(len(rows), dtype=torch.bool), problems=list(problems),
        transcripts=[r.transcript for r in rows], infos=[], extras=extras)
    fill_rewards(batch, rows)
    return batch


def fill_rewards(batch: TokenBatch, rows: Sequence[RowResult]) -> None:
    """Set ``batch``'s reward fields (token rewards, scores, correct, truncated, infos) from ``rows``, the
    episodes it was built from (:func:`build_batch`), whose rewards may have come in since."""
    C = batch.response_ids.shape[1]
    rew = []
    for row in rows:
        rw: list[float] = []
        for seg in row.segments:
            if n := len(seg.ids):
                rw += [0.0] * (n - 1) + [seg.reward if seg.kind == "policy" else 0.0]
        if row.token_rewards is not None:
            rw = list(row.token_rewards) + [0.0] * (len(rw) - len(row.token_rewards))
        rew.append(rw + [0.0] * (C - len(rw)))
    batch.token_rewards = torch.tensor(rew, dtype=torch.float32).reshape(len(rows), C)
    batch.scores = torch.tensor([r.score for r in rows], dtype=torch.float32)
    batch.correct = torch.tensor([r.correct for r in rows], dtype=torch.bool)
    batch.truncated = torch.tensor([r.truncated for r in rows], dtype=torch.bool)
    batch.infos = [list(r.infos) for r in rows]


def _engine_logp(rows: Sequence[RowResult], width: int) -> Tensor | None:
    """``[R, width]`` engine log-probs on the policy tokens (0 elsewhere), or None unless every policy segment
    has them."""
    policy = [s for r in rows for s in r.segments if s.kind == "policy" and s.ids]
    if not policy or any(s.logp is None or len(s.logp) != len(s.ids) for s in policy):
        return None
    flat: list[list[float]] = []
    for row in rows:
        lp: list[float] = []
        for seg in row.segments:
            lp += (seg.logp or []) if seg.kind == "policy" and seg.ids else [0.0] * len(seg.ids)
        flat.append(lp + [0.0] * (width - len(lp)))
    return torch.tensor(flat, dtype=torch.float32).reshape(len(rows), width)
