"""Group generation and multi-turn rollouts into a :class:`~reflectrl.llm.batch.TokenBatch`.

:class:`Rollout` samples ``group_size`` episodes per problem with a generation engine
(:mod:`reflectrl.llm.engines`) and a task's environments; env steps and reward functions run on a
thread pool while the next chunk of rows generates.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ConfigError, ReflectRLError
from ..tasks.base import Problem, SingleTurnEnv, Task, batch_scorer, chat_prompt, stop_sequences
from .batch import RowResult, Segment, TokenBatch, build_batch, fill_rewards
from .engines import GenerationEngine, engine_logprobs
from .policy import Policy


@dataclass
class RolloutStats:
    """Timings of one rollout (seconds) and token counts."""

    generate_s: float = 0.0
    prefill_s: float = 0.0  # the part of generate_s spent prefilling contexts (engines that report it)
    env_s: float = 0.0  # CPU time of env steps / reward functions, summed over worker threads
    env_wait_s: float = 0.0  # time the rollout sat waiting for them after generating
    generated_tokens: int = 0
    cache_hits: int = 0  # completions whose score was known already (same problem, same text)
    new_steps: set = field(default_factory=set)  # ids of the env-step futures this rollout submitted

    def as_metrics(self) -> dict[str, float]:
        return {"time/generate": self.generate_s, "time/prefill": self.prefill_s, "time/reward": self.env_s,
                "time/reward_wait": self.env_wait_s,
                "rollout/generated_tokens": self.generated_tokens, "rollout/reward_cache_hits": self.cache_hits}


class _Row:
    __slots__ = ("problem", "env", "prompt_ids", "segments", "score", "correct", "truncated", "done", "transcript",
                 "infos", "used", "last_logp", "next_budget")

    def __init__(self, problem: Problem, env: Any):
        self.problem, self.env = problem, env
        self.prompt_ids: list[int] = []
        self.segments: list[Segment] = []
        self.score, self.correct, self.truncated, self.done = 0.0, False, False, False
        self.transcript: list[tuple[str, str]] = []
        self.infos: list[dict[str, Any]] = []
        self.used = 0
        self.last_logp: list[float] | None = None  # the engine's log-probs of the latest completion, if it gave them
        self.next_budget: int | None = None  # the budget the environment's last reply set for the next completion

    def context(self) -> list[int]:
        return self.prompt_ids + [t for s in self.segments for t in s.ids]


def decode_batch(tok: Any, seqs: Sequence[Sequence[int]]) -> list[str]:
    """``tok.batch_decode(seqs)`` (special tokens kept), through the Rust tokenizer directly when that is
    the same thing (a fast tokenizer without clean-up of spaces): it is several times faster."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and not getattr(tok, "clean_up_tokenization_spaces", False):
        return backend.decode_batch([list(s) for s in seqs], skip_special_tokens=False)
    return tok.batch_decode(seqs, skip_special_tokens=False)


def exact_ids(record: dict[str, Any]) -> dict[str, Any]:
    """The token ids of a logged episode (of :meth:`TokenBatch.to_records`): the prompt the model was given, the
    response (its own turns and the environment's replies, prefills included) and which response tokens are its own
    (the ones trained)."""
    return {"prompt_ids": record["prompt_ids"], "response_ids": record["response_ids"],
            "completion_mask": [int(x) for x in record["completion_mask"]]}


def logged_episode(tok: Any, chat: bool, record: dict[str, Any], transcript: list[tuple[str, str]]) -> dict[str, Any]:
    """A logged episode: its :func:`exact_ids` and its transcript. With a chat model each turn is the decoding of the
    exact ids the model was given or sampled (the template's markers, a question in its chat wording with its prefill,
    the end-of-turn token): the prompt, then each run of the agent's own tokens and of the environment's, told apart
    by the completion mask; with raw prompts the rollout's texts (what was encoded). Decoded here, where an episode is
    written, not in the rollout."""
    ids = exact_ids(record)
    if chat:
        runs: list[tuple[str, list[int]]] = []
        for t, own in zip(ids["response_ids"], ids["completion_mask"]):
            kind = "policy" if own else "env"
            if runs and runs[-1][0] == kind:
                runs[-1][1].append(t)
            else:
                runs.append((kind, [t]))
        texts = decode_batch(tok, [ids["prompt_ids"], *(r for _, r in runs)])
        transcript = [("prompt", texts[0]), *((k, t) for (k, _), t in zip(runs, texts[1:]))]
    return {"transcript": transcript, **ids}


def single_token_stops(tok: Any, stops: Sequence[str]) -> list[int]:
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
    instead of one env step per completion, unless ``batch_scoring`` is False.

    With a chat model (``policy.chat``) an episode is a conversation (:mod:`reflectrl.llm.chat`): the first turn is
    the task's chat prompt as the user's message, each env reply a user turn, and a turn also ends at the
    template's end-of-turn token."""

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
        self.chat = policy.chat
        self.encode_prompt = encode_prompt or policy.encode_prompt
        self.encode_feedback = encode_feedback or policy.encode_reply
        limit = getattr(policy.config, "max_position_embeddings", None) or getattr(policy.config, "n_positions", None)
        self.max_positions = int(limit) if limit else None
        self.stop_sequences = stop_sequences(task, chat=self.chat is not None)
        self.stop_ids = single_token_stops(tok, self.stop_sequences)
        self.end_ids = set(policy.eos_ids) | set(self.stop_ids)
        # single-turn scores are pure functions of (problem, completion): remember recent ones (LRU)
        self.reward_cache_size = reward_cache
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        # environment replies repeat (a self-report question, "no results", an error line): encode each once
        self._feedback_ids: dict[str, tuple[int, ...]] = {}

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

    def start(self, problems: Sequence[Problem], group_size: int | Sequence[int], generator: torch.Generator,
              greedy: bool = False, index_offset: int = 0) -> PendingRollout:
        """Generate every turn, but do not wait for the last turn's rewards: the returned
        :class:`PendingRollout` holds the batch (its tokens and masks are final, its rewards not yet
        filled in) and ``finish()`` waits for the rewards and fills them in. The trainer runs its
        no-grad pass (old log-probs) on the batch in between, while the rewards are computed."""
        stats = RolloutStats()
        if not self.reward_cache_size:
            self._cache.clear()  # duplicates within one rollout are still scored once
        sizes = [group_size] * len(problems) if isinstance(group_size, int) else [int(g) for g in group_size]
        rows = [_Row(p, self._make_env()) for p, g in zip(problems, sizes) for _ in range(g)]
        if self.multi_turn:  # env resets may do real work (build a database): run them on the pool
            texts = self._wait([self._submit(r.env.reset, r.problem) for r in rows], stats)
        else:
            texts = [r.env.reset(r.problem) for r in rows]
        if self.chat is not None:  # the user's first message: the task's instruction and problem
            texts = [chat_prompt(self.task, r.problem) for r in rows]
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
        index = [index_offset + i for i, g in enumerate(sizes) for _ in range(g)]
        return PendingRollout(self, rows, index, stats, last)

    @staticmethod
    def _row_results(rows: list[_Row]) -> list[RowResult]:
        return [RowResult(r.prompt_ids, r.segments, None, r.score, r.correct, r.truncated, r.transcript, r.infos)
                for r in rows]

    def _results(self, rows: list[_Row], index: list[int]) -> TokenBatch:
        return build_batch(self._row_results(rows), index, [r.problem for r in rows], self.policy.pad_id)

    def _budget(self, row: _Row) -> int:
        left = self.max_response_tokens - row.used
        if self.max_positions is not None:
            left = min(left, self.max_positions - len(row.prompt_ids) - row.used)
        return min(self.max_new_tokens if row.next_budget is None else row.next_budget, left)

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
            t0, p0 = time.perf_counter(), getattr(self.engine, "prefill_s", 0.0)
            with_lp = engine_logprobs(self.engine)
            if with_lp is not None:
                outs, lps = with_lp([r.context() for r in chunk], budgets, generator, greedy, self.stop_ids)
            else:
                outs = self.engine.generate([r.context() for r in chunk], budgets, generator, greedy, self.stop_ids)
                lps = [None] * len(outs)
            stats.generate_s += time.perf_counter() - t0
            stats.prefill_s += getattr(self.engine, "prefill_s", 0.0) - p0
            eos = set(self.policy.eos_ids)
            bodies = [o[:-1] if o and o[-1] in eos else o for o in outs]
            texts = decode_batch(self.policy.tokenizer, bodies)
            done = []
            for row, ids, body, text, budget, lp in zip(chunk, outs, bodies, texts, budgets, lps):
                stats.generated_tokens += len(ids)
                ids, text, stopped = self._finish_completion(ids, body, text)
                row.last_logp = None if lp is None else [float(x) for x in lp[:len(ids)]]
                done.append((row, ids, budget, stopped, text))
                row.transcript.append(("policy", text))
            futures = self._score_chunk([(d[0], d[-1]) for d in done], stats)
            pending += [(row, ids, budget, stopped, f) for (row, ids, budget, stopped, _), f in zip(done, futures)]
        return pending

    def _apply(self, pending: list[tuple[_Row, list[int], int, bool, Future]], turn: int,
               results: list[tuple[str, float, bool, dict]]) -> None:
        """Record one turn's env results: the policy segment and its reward, the feedback segment."""
        for (row, ids, budget, stopped, _), (feedback, reward, done, info) in zip(pending, results):
            hit_limit = len(ids) >= budget and not stopped
            closed = bool(ids) and self.chat is not None and ids[-1] == self.chat.end_of_turn
            if closed and not done and getattr(feedback, "continuation", False):
                # the environment continues the agent's own message (an inline report's opened tag): the end-of-turn
                # token it sampled is dropped, never trained
                ids, closed = ids[:-1], False
                row.last_logp = None if row.last_logp is None else row.last_logp[:-1]
            row.segments.append(Segment(list(ids), "policy", turn, float(reward), logp=row.last_logp))
            row.used += len(ids)
            row.score += float(reward)
            info = info if isinstance(info, dict) else {}
            row.infos.append(dict(info))
            row.correct = bool(info["correct"]) if "correct" in info else row.score >= 1.0 - 1e-9
            if done or turn == self.max_turns - 1:
                row.done = True
                row.truncated = hit_limit or not done
                continue
            fb = self._encode_feedback(feedback, closed) if feedback or self.chat is not None else []
            if fb and row.used + len(fb) >= self.max_response_tokens:
                row.done = row.truncated = True
                continue
            row.next_budget = getattr(feedback, "max_tokens", None)
            if fb:
                row.segments.append(Segment(fb, "env", turn))
                row.used += len(fb)
                row.transcript.append(("env", feedback))

    def _encode_feedback(self, text: str, closed: bool = True) -> list[int]:
        """``encode_feedback(text)``, remembered: a reply is encoded on its own, so its ids never depend on the
        context (the memo is cleared past 65536 texts). With a chat model the reply is a user turn, opened by the
        end-of-turn token when the agent's turn did not end with it (``closed``)."""
        key: Any = text if self.chat is None else (text, getattr(text, "chat", None), getattr(text, "prefill", ""), closed,
                                                    getattr(text, "continuation", False))
        ids = self._feedback_ids.get(key)
        if ids is None:
            if len(self._feedback_ids) >= 65536:
                self._feedback_ids.clear()
            enc = self.encode_feedback(text) if self.chat is None else self.encode_feedback(text, closed)
            ids = self._feedback_ids[key] = tuple(enc)
        return list(ids)

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
        """The reward future of a (problem, completion) pair scored before (LRU hit), or None. Entries of
        finished rollouts hold their plain result (a Future is several times larger), wrapped again here."""
        hit = self._cache.get(key)
        if hit is None:
            return None
        self._cache.move_to_end(key)
        stats.cache_hits += 1
        if isinstance(hit, Future):
            return hit
        fut: Future = Future()
        fut.set_result(hit)
        return fut

    def compact_cache(self) -> None:
        """Replace the cache's finished futures by their results (called when a rollout is done)."""
        for key, fut in self._cache.items():
            if isinstance(fut, Future) and fut.done() and fut.exception() is None:
                self._cache[key] = fut.result()

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
                row.segments.append(Segment(list(ids), "policy", last[1], logp=row.last_logp))
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
        ro.compact_cache()
        if self._batch is None:
            self._batch = ro._results(self._rows, self._index)
        else:  # the tokens and masks are final: only the rewards came in
            fill_rewards(self._batch, ro._row_results(self._rows))
        return self._batch, self.stats
