"""Group generation and multi-turn rollouts into the core's ``[rows, steps]`` token batch.

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

Generation goes through a :class:`GenerationEngine`; :class:`TorchSampler` (a KV-cache sampling loop
that drops finished rows) is the default, :class:`HFGenerate` wraps ``model.generate``. A faster engine
(vLLM, SGLang) plugs in by implementing the same two methods and registering it with
:func:`register_engine`; see docs/llm.md.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Protocol, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError, ReflectRLError
from ..tasks.base import Problem, SingleTurnEnv, Task, batch_scorer
from .policy import Policy

# per-token optional fields (all [R, C]) that follow the rows through select / cat / with_prompts
TOKEN_FIELDS = ("old_logp", "ref_logp", "advantages", "returns", "weights", "values", "entropy")


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
    extras: dict[str, Any] = field(default_factory=dict)  # per-row lists/tensors a method keeps with the batch

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
    def select(self, rows: Sequence[int] | Tensor, trim: bool = True) -> "TokenBatch":
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

    def trimmed(self) -> "TokenBatch":
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
        return replace(self, **kw)

    def last_real_response(self) -> Tensor:
        pos = torch.arange(self.steps).expand(self.rows, -1)
        return torch.where(self.response_attention, pos, torch.full_like(pos, -1)).max(1).values

    def with_prompts(self, prompts: Sequence[Sequence[int]], pad_id: int = 0) -> "TokenBatch":
        """The same responses after other prompts (e.g. a teacher context holding the reference answer):
        per-token outputs of a forward pass on it align with this batch's tokens."""
        if len(prompts) != self.rows:
            raise ValueError(f"need one prompt per row ({self.rows}), got {len(prompts)}")
        ids, mask = left_pad(prompts, pad_id)
        return replace(self, prompt_ids=ids, prompt_mask=mask, hidden=None)

    @staticmethod
    def cat(batches: Sequence["TokenBatch"], pad_id: int = 0) -> "TokenBatch":
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
                kw[f.name] = {k: _cat_any([v[k] for v in vals]) for k in keys}
            elif f.name == "hidden":
                kw[f.name] = None
            elif any(v is None for v in vals):
                kw[f.name] = None
            elif vals[0].dim() == 2:
                fill = {"response_ids": pad_id, "turn_ids": -1}.get(f.name, 0)
                kw[f.name] = torch.cat([_pad_to(v, C, fill) for v in vals])
            else:
                kw[f.name] = torch.cat(vals)
        return TokenBatch(**kw)

    # ------------------------------------------------------------------ storage
    def to_records(self) -> list[dict[str, Any]]:
        """One plain dict per row (token lists and masks without padding): a stored trajectory."""
        recs = []
        for r in range(self.rows):
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
                     pad_id: int = 0) -> "TokenBatch":
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


def _cat_any(vals: list) -> Any:
    return torch.cat(vals) if torch.is_tensor(vals[0]) else [x for v in vals for x in v]


def build_batch(rows: Sequence[RowResult], index: Sequence[int], problems: list[Problem], pad_id: int) -> TokenBatch:
    """Pad finished episodes into a :class:`TokenBatch`."""
    prompt_ids, prompt_mask = left_pad([r.prompt_ids for r in rows], pad_id)
    C = max((sum(len(s.ids) for s in r.segments) for r in rows), default=0)
    resp, kind, turn, rew = [], [], [], []
    for row in rows:
        ids, k, tn, rw = [], [], [], []
        for seg in row.segments:
            n = len(seg.ids)
            if n == 0:
                continue
            ids += seg.ids
            k += [1 if seg.kind == "policy" else 2] * n
            tn += [seg.turn] * n
            rw += [0.0] * (n - 1) + [seg.reward if seg.kind == "policy" else 0.0]
        if row.token_rewards is not None:
            rw = list(row.token_rewards) + [0.0] * (len(ids) - len(row.token_rewards))
        pad = C - len(ids)
        resp.append(ids + [pad_id] * pad)
        kind.append(k + [0] * pad)
        turn.append(tn + [-1] * pad)
        rew.append(rw + [0.0] * pad)
    kinds = torch.tensor(kind, dtype=torch.int8).reshape(len(rows), C)
    return TokenBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        response_ids=torch.tensor(resp, dtype=torch.long).reshape(len(rows), C),
        completion_mask=kinds == 1, feedback_mask=kinds == 2,
        turn_ids=torch.tensor(turn, dtype=torch.long).reshape(len(rows), C),
        token_rewards=torch.tensor(rew, dtype=torch.float32).reshape(len(rows), C),
        index=torch.as_tensor(list(index), dtype=torch.long),
        scores=torch.tensor([r.score for r in rows], dtype=torch.float32),
        correct=torch.tensor([r.correct for r in rows], dtype=torch.bool),
        truncated=torch.tensor([r.truncated for r in rows], dtype=torch.bool),
        problems=list(problems), transcripts=[r.transcript for r in rows], infos=[list(r.infos) for r in rows])


# ====================================================================== generation engines
class GenerationEngine(Protocol):
    """What the rollout needs from a generator. ``generate`` returns, per prompt, the sampled token ids
    (ending with an eos id or one of ``stop_ids`` when the model stopped, without padding); ``sync`` is
    called after every optimizer step so an engine holding its own copy of the weights (vLLM) can
    refresh them."""

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int,
                 generator: torch.Generator, greedy: bool = False, stop_ids: Sequence[int] = ()) -> list[list[int]]: ...

    def sync(self, policy: Policy) -> None: ...


class TorchSampler:
    """Batched sampling with the model's KV cache; rows that finished are dropped from the batch (and
    from the cache) as soon as they make up ``prune_frac`` of it. Uses its own ``torch.Generator``."""

    def __init__(self, policy: Policy, temperature: float = 1.0, top_k: int = 0, prune_frac: float = 0.25):
        self.policy, self.temperature, self.top_k, self.prune_frac = policy, temperature, top_k, prune_frac

    def sync(self, policy: Policy) -> None:
        self.policy = policy

    @torch.inference_mode()
    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        from transformers import DynamicCache

        pol = self.policy
        dev = pol.device
        R = len(prompts)
        budgets = torch.as_tensor([max_new_tokens] * R if isinstance(max_new_tokens, int) else list(max_new_tokens),
                                  device=dev)
        # the G rows of a group share their prompt: prefill each distinct prompt once, then copy its cache
        first: dict[tuple[int, ...], int] = {}
        inverse = torch.as_tensor([first.setdefault(tuple(p), len(first)) for p in prompts], device=dev)
        ids, mask = left_pad([list(p) for p in first], pol.pad_id)
        ids, mask = ids.to(dev), mask.long().to(dev)
        pos = (mask.cumsum(1) - 1).clamp_min(0)
        cache = DynamicCache(config=pol.config) if _cache_takes_config() else DynamicCache()
        logits = pol.step_logits(ids, mask, pos, cache)
        if len(first) < R:
            cache.batch_select_indices(inverse)
            logits, mask, pos = logits[inverse], mask[inverse], pos[inverse]
        eos = torch.as_tensor(sorted(set(pol.eos_ids) | set(stop_ids)), device=dev)
        toks = torch.full((R, max(int(budgets.max()), 1)), -1, dtype=torch.long, device=dev)
        finished = budgets < 1
        alive = torch.arange(R, device=dev)  # the original row of each batch slot
        last_pos = pos[:, -1:]
        step = 0
        while True:
            nxt = self._pick(logits, generator, greedy)
            live = ~finished[alive]
            toks[alive[live], step] = nxt[live]
            step += 1
            finished[alive[live & (torch.isin(nxt, eos) | (step >= budgets[alive]))]] = True
            live = ~finished[alive]
            if not bool(live.any()):
                break
            if float((~live).float().mean()) >= self.prune_frac:  # drop finished rows from batch and cache
                sel = live.nonzero().squeeze(1)
                cache.batch_select_indices(sel)
                alive, nxt, mask, last_pos = alive[sel], nxt[sel], mask[sel], last_pos[sel]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
            last_pos = last_pos + 1
            logits = pol.step_logits(nxt[:, None], mask, last_pos, cache)
        rows = toks.cpu().tolist()
        return [[t for t in row if t >= 0] for row in rows]

    def _pick(self, logits: Tensor, generator: torch.Generator, greedy: bool) -> Tensor:
        if greedy or self.temperature == 0:
            return logits.argmax(-1)
        logits = logits.float() / self.temperature
        if self.top_k:
            kth = logits.topk(self.top_k, -1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, -1)
        # an exact draw from probs: argmax of probs / Exp(1) noise (cheaper than multinomial)
        noise = torch.empty(probs.shape, dtype=probs.dtype, device=generator.device).exponential_(generator=generator)
        return (probs / noise.to(probs.device)).argmax(-1)

    @staticmethod
    def _cut(seq: list[int], eos: list[int]) -> list[int]:
        for i, t in enumerate(seq):
            if t in eos:
                return seq[:i + 1]
        return seq


def _cache_takes_config() -> bool:
    import inspect

    from transformers import DynamicCache

    return "config" in inspect.signature(DynamicCache.__init__).parameters


class HFGenerate:
    """``model.generate`` (sampling or greedy, KV cache) seeded from the rollout's generator."""

    def __init__(self, policy: Policy, temperature: float = 1.0, top_k: int = 0):
        self.policy, self.temperature, self.top_k = policy, temperature, top_k

    def sync(self, policy: Policy) -> None:
        self.policy = policy

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        pol = self.policy
        ends = sorted(set(pol.eos_ids) | set(stop_ids))
        budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        ids, mask = left_pad(prompts, pol.pad_id)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        sample = not (greedy or self.temperature == 0)
        kw = dict(do_sample=sample, max_new_tokens=max(budgets), pad_token_id=pol.pad_id, eos_token_id=ends)
        if sample:
            kw.update(temperature=self.temperature, top_k=self.top_k or None, top_p=1.0)
        with torch.random.fork_rng(devices=[] if pol.device.type == "cpu" else [pol.device]):
            torch.manual_seed(seed)
            gen = pol.model.generate(input_ids=ids.to(pol.device), attention_mask=mask.long().to(pol.device), **kw)
        new = gen[:, ids.shape[1]:].tolist()
        return [TorchSampler._cut(seq, ends)[:b] for seq, b in zip(new, budgets)]


ENGINES: dict[str, Callable[..., GenerationEngine]] = {"torch": TorchSampler, "hf": HFGenerate}


def register_engine(name: str, factory: Callable[..., GenerationEngine]) -> None:
    """Make ``--engine NAME`` build ``factory(policy, temperature=..., top_k=...)``."""
    ENGINES[name] = factory


def make_engine(name: str, policy: Policy, temperature: float = 1.0, top_k: int = 0) -> GenerationEngine:
    """Build a registered generation engine."""
    if name not in ENGINES:
        hint = ("; vLLM is a plug point, not a dependency: wrap vllm.LLM in a GenerationEngine and "
                "register_engine('vllm', ...) (docs/llm.md)") if name == "vllm" else ""
        raise ConfigError(f"unknown generation engine {name!r}; available: {', '.join(sorted(ENGINES))}{hint}")
    return ENGINES[name](policy, temperature=temperature, top_k=top_k)


# ====================================================================== rollout
@dataclass
class RolloutStats:
    """Timings of one rollout (seconds) and token counts."""

    generate_s: float = 0.0
    env_s: float = 0.0  # CPU time of env steps / reward functions, summed over worker threads
    env_wait_s: float = 0.0  # time the rollout sat waiting for them after generating
    generated_tokens: int = 0
    cache_hits: int = 0  # completions whose score was known already (same problem, same text)
    new_steps: set = field(default_factory=set)  # ids of the env-step futures this rollout submitted

    def as_metrics(self) -> dict[str, float]:
        return {"time/generate": self.generate_s, "time/reward": self.env_s, "time/reward_wait": self.env_wait_s,
                "rollout/generated_tokens": self.generated_tokens, "rollout/reward_cache_hits": self.cache_hits}


class _Row:
    __slots__ = ("problem", "env", "prompt_ids", "segments", "score", "correct", "truncated", "done", "transcript",
                 "infos", "used")

    def __init__(self, problem: Problem, env: Any):
        self.problem, self.env = problem, env
        self.prompt_ids: list[int] = []
        self.segments: list[Segment] = []
        self.score, self.correct, self.truncated, self.done = 0.0, False, False, False
        self.transcript: list[tuple[str, str]] = []
        self.infos: list[dict[str, Any]] = []
        self.used = 0

    def context(self) -> list[int]:
        return self.prompt_ids + [t for s in self.segments for t in s.ids]


def decode_batch(tok: Any, seqs: Sequence[Sequence[int]]) -> list[str]:
    """``tok.batch_decode(seqs)`` (special tokens kept), through the Rust tokenizer directly when that is
    the same thing (a fast tokenizer without clean-up of spaces): it is several times faster."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and not getattr(tok, "clean_up_tokenization_spaces", False):
        return backend.decode_batch([list(s) for s in seqs], skip_special_tokens=False)
    return tok.batch_decode(seqs, skip_special_tokens=False)


def _single_token_stops(tok: Any, stops: Sequence[str]) -> list[int]:
    """Ids of the stop sequences that are a single token (the sampler ends rows on them directly)."""
    out = []
    for s in stops:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        if len(ids) == 1 and tok.decode(ids) == s:
            out.append(int(ids[0]))
    return out


def _timed_batch(fn: Callable, problems: list[Problem], texts: list[str]) -> tuple[list[tuple[float, dict]], float]:
    """A task's ``score_batch`` on one chunk, timed; errors become one clear ReflectRLError."""
    t0 = time.perf_counter()
    try:
        res = list(fn(problems, texts))
    except ReflectRLError:
        raise
    except Exception as exc:
        raise ReflectRLError(f"the task's batch reward (score_batch) raised {type(exc).__name__}: {exc}") from exc
    if len(res) != len(texts):
        raise ReflectRLError(f"the task's score_batch returned {len(res)} results for {len(texts)} completions")
    return res, time.perf_counter() - t0


def _resolve(batch: Future, futures: list[Future]) -> None:
    """Hand each completion of a finished batch its step result ``(("", reward, True, info), share of time)``."""
    exc = batch.exception()
    if exc is not None:
        for f in futures:
            f.set_exception(exc)
        return
    res, dt = batch.result()
    for f, (reward, info) in zip(futures, res):
        f.set_result((("", float(reward), True, dict(info) if isinstance(info, dict) else {}), dt / len(futures)))


def _timed_step(env: Any, text: str) -> tuple[tuple[str, float, bool, dict], float]:
    t0 = time.perf_counter()
    try:
        res = env.step(text)
    except ReflectRLError:
        raise
    except Exception as exc:  # a reward function that raises: one clear error naming the task
        raise ReflectRLError(f"the task's environment/reward raised {type(exc).__name__}: {exc}") from exc
    return res, time.perf_counter() - t0


class Rollout:
    """Samples ``group_size`` episodes per problem with a generation engine and a task's environments.

    Single-turn tasks use :class:`~reflectrl.tasks.base.SingleTurnEnv` (the reward is ``task.score``);
    multi-turn tasks use ``task.make_env()``: each turn's completion goes to ``env.step``, and the
    returned feedback text is appended to the context as feedback tokens (masked out of the loss).
    Env steps run on a thread pool while the next chunk of rows is generating. A single-turn task with
    ``score_batch`` (see :func:`~reflectrl.tasks.base.batch_scorer`) gets one call per generated chunk
    instead of one env step per completion, unless ``batch_scoring`` is False."""

    def __init__(self, policy: Policy, engine: GenerationEngine, task: Task, max_new_tokens: int = 64,
                 max_turns: int = 1, max_response_tokens: int | None = None, gen_batch: int = 128,
                 reward_workers: int = 4, encode_prompt: Callable[[str], list[int]] | None = None,
                 encode_feedback: Callable[[str], list[int]] | None = None, reward_cache: int = 100_000,
                 batch_scoring: bool = True):
        if max_new_tokens < 1 or max_turns < 1 or gen_batch < 1:
            raise ConfigError("max_new_tokens, max_turns and gen_batch must be >= 1")
        self.policy, self.engine, self.task = policy, engine, task
        self.max_new_tokens, self.max_turns, self.gen_batch = max_new_tokens, max_turns, gen_batch
        self.max_response_tokens = max_response_tokens or max_new_tokens * max_turns
        self.multi_turn = bool(getattr(task, "multi_turn", False)) and max_turns > 1
        self.score_batch = batch_scorer(task) if batch_scoring and not self.multi_turn else None
        self.pool = ThreadPoolExecutor(reward_workers) if reward_workers > 0 else None
        tok = policy.tokenizer
        self.encode_prompt = encode_prompt or (lambda s: tok(s, add_special_tokens=True)["input_ids"])
        self.encode_feedback = encode_feedback or (lambda s: tok(s, add_special_tokens=False)["input_ids"])
        limit = getattr(policy.config, "max_position_embeddings", None) or getattr(policy.config, "n_positions", None)
        self.max_positions = int(limit) if limit else None
        self.stop_sequences = tuple(getattr(task, "stop_sequences", ()) or ())
        self.stop_ids = _single_token_stops(tok, self.stop_sequences)
        self.end_ids = set(policy.eos_ids) | set(self.stop_ids)
        # single-turn scores are pure functions of (problem, completion): remember recent ones (LRU)
        self.reward_cache_size = reward_cache
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def _submit(self, fn, *args) -> Future:
        if self.pool is None:
            f: Future = Future()
            try:
                f.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - re-raised by result()
                f.set_exception(exc)
            return f
        return self.pool.submit(fn, *args)

    def _make_env(self) -> Any:
        return self.task.make_env() if self.multi_turn else SingleTurnEnv(self.task)

    def run(self, problems: Sequence[Problem], group_size: int, generator: torch.Generator,
            greedy: bool = False, index_offset: int = 0) -> tuple[TokenBatch, RolloutStats]:
        """``group_size`` episodes of each problem; rows ``g*i .. g*i+g-1`` form group ``index_offset + i``."""
        return self.start(problems, group_size, generator, greedy, index_offset).finish()

    def start(self, problems: Sequence[Problem], group_size: int, generator: torch.Generator,
              greedy: bool = False, index_offset: int = 0) -> "PendingRollout":
        """Generate every turn, but do not wait for the last turn's rewards: the returned
        :class:`PendingRollout` holds the batch (its tokens and masks are final, its rewards not yet
        filled in) and ``finish()`` waits for the rewards and fills them in. The trainer runs its
        no-grad pass (old log-probs) on the batch in between, while the rewards are computed."""
        stats = RolloutStats()
        if not self.reward_cache_size:
            self._cache.clear()  # duplicates within one rollout are still scored once
        rows = [_Row(p, self._make_env()) for p in problems for _ in range(group_size)]
        if self.multi_turn:  # env resets may do real work (build a database): run them on the pool
            texts = self._wait([self._submit(r.env.reset, r.problem) for r in rows], stats)
        else:
            texts = [r.env.reset(r.problem) for r in rows]
        encoded: dict[str, list[int]] = {}
        for row, text in zip(rows, texts):
            if text not in encoded:
                encoded[text] = list(self.encode_prompt(text))
            row.prompt_ids = encoded[text]
            row.transcript.append(("prompt", text))
        last: tuple[list, int] | None = None
        for turn in range(self.max_turns):
            active = [r for r in rows if not r.done]
            if not active:
                break
            pending = self._generate(active, generator, greedy, stats)
            if turn == self.max_turns - 1:  # every row ends here, whatever its env says: rewards can wait
                last = (pending, turn)
                break
            self._apply(pending, turn, self._wait([p[-1] for p in pending], stats, timed=True))
        index = [index_offset + i // group_size for i in range(len(rows))]
        return PendingRollout(self, rows, index, stats, last)

    def _results(self, rows: list[_Row], index: list[int]) -> TokenBatch:
        results = [RowResult(r.prompt_ids, r.segments, None, r.score, r.correct, r.truncated, r.transcript, r.infos)
                   for r in rows]
        return build_batch(results, index, [r.problem for r in rows], self.policy.pad_id)

    def _budget(self, row: _Row) -> int:
        left = self.max_response_tokens - row.used
        if self.max_positions is not None:
            left = min(left, self.max_positions - len(row.prompt_ids) - row.used)
        return min(self.max_new_tokens, left)

    def _generate(self, active: list[_Row], generator: torch.Generator, greedy: bool,
                  stats: RolloutStats) -> list[tuple[_Row, list[int], int, bool, Future]]:
        """Generate one completion for each active row (in chunks), submitting each chunk's env steps
        (or batch reward) as soon as it is generated; return ``(row, ids, budget, stopped, future)``."""
        pending: list[tuple[_Row, list[int], int, bool, Future]] = []
        live = []
        for row in active:
            if self._budget(row) < 1:
                row.done = row.truncated = True
            else:
                live.append(row)
        for start in range(0, len(live), self.gen_batch):
            chunk = live[start:start + self.gen_batch]
            budgets = [self._budget(r) for r in chunk]
            t0 = time.perf_counter()
            outs = self.engine.generate([r.context() for r in chunk], budgets, generator, greedy, self.stop_ids)
            stats.generate_s += time.perf_counter() - t0
            eos = set(self.policy.eos_ids)
            bodies = [o[:-1] if o and o[-1] in eos else o for o in outs]
            texts = decode_batch(self.policy.tokenizer, bodies)
            done = []
            for row, ids, body, text, budget in zip(chunk, outs, bodies, texts, budgets):
                stats.generated_tokens += len(ids)
                ids, text, stopped = self._finish_completion(ids, body, text)
                done.append((row, ids, budget, stopped, text))
                row.transcript.append(("policy", text))
            futures = self._score_chunk([(d[0], d[-1]) for d in done], stats)
            pending += [(row, ids, budget, stopped, f) for (row, ids, budget, stopped, _), f in zip(done, futures)]
        return pending

    def _apply(self, pending: list[tuple[_Row, list[int], int, bool, Future]], turn: int,
               results: list[tuple[str, float, bool, dict]]) -> None:
        """Record one turn's env results: the policy segment and its reward, the feedback segment."""
        for (row, ids, budget, stopped, _), (feedback, reward, done, info) in zip(pending, results):
            row.segments.append(Segment(list(ids), "policy", turn, float(reward)))
            row.used += len(ids)
            row.score += float(reward)
            info = info if isinstance(info, dict) else {}
            row.infos.append(dict(info))
            row.correct = bool(info["correct"]) if "correct" in info else row.score >= 1.0 - 1e-9
            hit_limit = len(ids) >= budget and not stopped
            if done or turn == self.max_turns - 1:
                row.done = True
                row.truncated = hit_limit or not done
                continue
            fb = list(self.encode_feedback(feedback)) if feedback else []
            if fb and row.used + len(fb) >= self.max_response_tokens:
                row.done = row.truncated = True
                continue
            if fb:
                row.segments.append(Segment(fb, "env", turn))
                row.used += len(fb)
                row.transcript.append(("env", feedback))

    def _score_chunk(self, pairs: list[tuple[_Row, str]], stats: RolloutStats) -> list[Future]:
        """One future per completion of a chunk: per completion through the env, or, for a task with
        ``score_batch``, every completion not scored before in one submitted call."""
        if self.score_batch is None:
            return [self._score(row, text, stats) for row, text in pairs]
        out, todo = [], []
        for row, text in pairs:
            fut = self._cached((row.problem.id, text), stats)
            if fut is None:
                fut = Future()
                fut.set_running_or_notify_cancel()
                todo.append((row.problem, text, fut))
                self._remember((row.problem.id, text), fut, stats)
            out.append(fut)
        if todo:
            batch = self._submit(_timed_batch, self.score_batch, [p for p, _, _ in todo], [t for _, t, _ in todo])
            batch.add_done_callback(lambda b, fs=[f for _, _, f in todo]: _resolve(b, fs))
        return out

    def _score(self, row: _Row, text: str, stats: RolloutStats) -> Future:
        """Submit the env step of a completion; a single-turn completion scored before reuses its result."""
        if self.multi_turn:
            fut = self._submit(_timed_step, row.env, text)
            stats.new_steps.add(id(fut))
            return fut
        key = (row.problem.id, text)
        fut = self._cached(key, stats)
        if fut is None:
            fut = self._submit(_timed_step, row.env, text)
            self._remember(key, fut, stats)
        return fut

    def _cached(self, key: tuple[str, str], stats: RolloutStats) -> Future | None:
        """The reward future of a (problem, completion) pair scored before (LRU hit), or None."""
        fut = self._cache.get(key)
        if fut is not None:
            self._cache.move_to_end(key)
            stats.cache_hits += 1
        return fut

    def _remember(self, key: tuple[str, str], fut: Future, stats: RolloutStats) -> None:
        """Keep a newly submitted reward future in the LRU cache; this rollout counts its time."""
        stats.new_steps.add(id(fut))
        self._cache[key] = fut
        while self.reward_cache_size and len(self._cache) > self.reward_cache_size:
            self._cache.popitem(last=False)

    def _finish_completion(self, ids: list[int], body: list[int], text: str) -> tuple[list[int], str, bool]:
        """Cut a completion (``body``: without eos, ``text``: its decoding) at the task's first stop
        sequence; return its tokens, the text the env sees (without eos and stop sequence) and whether
        it ended by itself."""
        stopped = bool(ids) and ids[-1] in self.end_ids
        found = [(i, s) for s in self.stop_sequences if (i := text.find(s)) >= 0]
        if not found:
            return ids, text, stopped
        cut, stop = min(found)
        if stopped and ids[-1] in self.stop_ids and cut + len(stop) == len(text):
            return ids, text[:cut], True  # ended on a single-token stop sequence: nothing to cut
        tok = self.policy.tokenizer
        for n in range(1, len(body) + 1):  # shortest token prefix whose text holds the stop sequence
            head = tok.decode(body[:n], skip_special_tokens=False)
            if any(s in head for s in self.stop_sequences):
                return list(body[:n]), text[:cut], True
        return ids, text[:cut], True

    def _wait(self, futures: list[Future], stats: RolloutStats, timed: bool = False) -> list[Any]:
        t0 = time.perf_counter()
        out = []
        for f in futures:
            res = f.result()
            if timed:
                res, dt = res
                if id(f) in stats.new_steps:  # count each env step once, in the rollout that ran it
                    stats.env_s += dt
                    stats.new_steps.discard(id(f))
            out.append(res)
        if timed:
            stats.env_wait_s += time.perf_counter() - t0
        return out


class PendingRollout:
    """A rollout whose last turn's rewards may still be computing (see :meth:`Rollout.start`).

    ``tokens()`` is the batch with its final tokens and masks; ``finish()`` waits for the rewards and
    fills ``token_rewards``, ``scores``, ``correct``, ``truncated`` and ``infos`` of that same batch in
    place (whatever was set on it in between, such as ``old_logp``, is kept)."""

    def __init__(self, rollout: Rollout, rows: list[_Row], index: list[int], stats: RolloutStats,
                 last: tuple[list, int] | None):
        self._rollout, self._rows, self._index, self.stats, self._last = rollout, rows, index, stats, last
        self._batch: TokenBatch | None = None

    @property
    def finished(self) -> bool:
        return self._last is None

    def tokens(self) -> TokenBatch:
        if self._batch is None:
            last = self._last or ([], 0)
            for row, ids, *_ in last[0]:  # the last turn's completions, their rewards not yet known
                row.segments.append(Segment(list(ids), "policy", last[1]))
            try:
                self._batch = self._rollout._results(self._rows, self._index)
            finally:
                for row, *_ in last[0]:
                    row.segments.pop()
        return self._batch

    def finish(self) -> tuple[TokenBatch, RolloutStats]:
        """Wait for the last turn's rewards; return the complete batch and the rollout's timings."""
        ro = self._rollout
        if self._last is not None:
            pending, turn = self._last
            self._last = None
            ro._apply(pending, turn, ro._wait([p[-1] for p in pending], self.stats, timed=True))
        full = ro._results(self._rows, self._index)
        if self._batch is None:
            self._batch = full
        else:
            b = self._batch
            b.token_rewards, b.scores, b.correct, b.truncated = full.token_rewards, full.scores, full.correct, full.truncated
            b.infos = full.infos
        return self._batch, self.stats
