"""Generation engines: what the rollout samples completions with.

:class:`TorchSampler` (a KV-cache sampling loop that drops finished rows) is the default,
:class:`HFGenerate` wraps ``model.generate``, ``vllm`` (:mod:`reflectrl.llm.vllm_engine`) runs vLLM where
it is installed and a GPU is present. Another engine (SGLang, a server) plugs in by implementing
:class:`GenerationEngine`'s two methods (and, to give the trainer its log-probs, ``generate_with_logprobs``
of :class:`LogprobEngine`) and registering it with :func:`register_engine`; see docs/llm.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from ..errors import ConfigError
from .batch import left_pad
from .kv_reuse import Kept, KeptContexts, layer_tensors, padded_past
from .policy import Policy


class GenerationEngine(Protocol):
    """What the rollout needs from a generator. ``generate`` returns, per prompt, the sampled token ids
    (ending with an eos id or one of ``stop_ids`` when the model stopped, without padding); ``sync`` is
    called after every optimizer step so an engine holding its own copy of the weights (vLLM) can
    refresh them."""

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int,
                 generator: torch.Generator, greedy: bool = False, stop_ids: Sequence[int] = ()) -> list[list[int]]: ...

    def sync(self, policy: Policy) -> None: ...


class LogprobEngine(GenerationEngine, Protocol):
    """An engine that also returns, per prompt, its log-probability of each sampled token (aligned to the ids;
    under the distribution it sampled from: temperature and top-k applied). The rollout then keeps them as
    ``batch.extras["step/engine_logp"]`` and the trainer corrects for their gap to its own log-probs
    (truncated importance sampling, ``tis_cap``). Optional: an engine without it is used through ``generate``."""

    def generate_with_logprobs(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int,
                               generator: torch.Generator, greedy: bool = False, stop_ids: Sequence[int] = ()
                               ) -> tuple[list[list[int]], list[list[float]]]: ...


class TorchSampler:
    """Batched sampling with the model's KV cache; rows that finished are dropped from the batch (and
    from the cache) as soon as they make up ``prune_frac`` of it. Uses its own ``torch.Generator``. With
    ``reuse_cache`` (``--engine-options reuse_cache=true``) each row's keys and values are kept from one call to the
    next, so that a multi-turn episode's next turn prefills only what was added to its transcript
    (:mod:`reflectrl.llm.kv_reuse`). Its cache appends each step's keys and values in place
    (:mod:`reflectrl.llm.kv_cache`; ``append_cache=false``: transformers' concatenating cache, the same tokens). A
    Llama-architecture model decodes with :mod:`reflectrl.llm.decode`'s lean step (``lean_step=false``: the model's
    forward at every step, the same tokens)."""

    def __init__(self, policy: Policy, temperature: float = 1.0, top_k: int = 0, prune_frac: float = 0.25,
                 reuse_cache: bool = False, append_cache: bool = True, lean_step: bool = True):
        self.policy, self.temperature, self.top_k, self.prune_frac = policy, temperature, top_k, prune_frac
        self.append_cache, self.lean_step = append_cache, lean_step
        self.prefill_s = 0.0  # seconds spent prefilling prompts (and transcripts), summed over calls
        self.kept = KeptContexts() if reuse_cache else None
        self.reused_tokens = 0  # context tokens whose keys and values came from the previous call (reuse_cache)

    def sync(self, policy: Policy) -> None:
        self.policy = policy
        if self.kept is not None:  # new weights: what was kept no longer holds
            self.kept.clear()

    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        return self._sample(prompts, max_new_tokens, generator, greedy, stop_ids, False)[0]

    @torch.inference_mode()
    def _sample(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int,
                generator: torch.Generator, greedy: bool, stop_ids: Sequence[int], with_logp: bool
                ) -> tuple[list[list[int]], list[list[float]] | None]:
        """The sampled ids per prompt and, ``with_logp``, each one's log-prob under the distribution it was drawn
        from (computed beside the draw: the same tokens either way)."""
        pol = self.policy
        dev = pol.device
        R = len(prompts)
        budgets = torch.as_tensor([max_new_tokens] * R if isinstance(max_new_tokens, int) else list(max_new_tokens),
                                  device=dev)
        # the G rows of a group share their prompt: prefill each distinct prompt once, then copy its cache
        t0 = time.perf_counter()
        from .kv_cache import reserve

        logits, mask, pos, cache = self._start(prompts)
        reserve(cache, int(budgets.max()))  # room for the call's new columns: appended without copying the cache
        self.prefill_s += time.perf_counter() - t0
        context_mask, width = mask.clone(), mask.shape[1]
        eos = torch.as_tensor(sorted(set(pol.eos_ids) | set(stop_ids)), device=dev)
        toks = torch.full((R, max(int(budgets.max()), 1)), -1, dtype=torch.long, device=dev)
        lps = torch.zeros(toks.shape, dtype=torch.float32, device=dev) if with_logp else None
        finished = budgets < 1
        alive = torch.arange(R, device=dev)  # the original row of each batch slot
        last_pos = pos[:, -1:]
        step = 0
        while True:
            drawn = self._processed(logits, greedy)
            nxt = self._pick(drawn, generator, greedy)
            live = ~finished[alive]
            toks[alive[live], step] = nxt[live]
            if lps is not None:
                lps[alive[live], step] = torch.log_softmax(drawn, -1).gather(1, nxt[:, None]).squeeze(1)[live]
            step += 1
            finished[alive[live & (torch.isin(nxt, eos) | (step >= budgets[alive]))]] = True
            live = ~finished[alive]
            if not bool(live.any()):
                break
            if float((~live).float().mean()) >= self.prune_frac:  # drop finished rows from batch and cache
                sel = live.nonzero().squeeze(1)
                if self.kept is not None:
                    self._keep(prompts, toks, alive, (~live).nonzero().squeeze(1), cache, context_mask, width)
                cache.batch_select_indices(sel)
                alive, nxt, mask, last_pos = alive[sel], nxt[sel], mask[sel], last_pos[sel]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
            last_pos = last_pos + 1
            logits = pol.step_logits(nxt[:, None], mask, last_pos, cache, lean=self.lean_step)
        if self.kept is not None:
            self._keep(prompts, toks, alive, torch.arange(alive.numel(), device=dev), cache, context_mask, width)
        rows = toks.cpu().tolist()
        ids = [[t for t in row if t >= 0] for row in rows]
        if lps is None:
            return ids, None
        return ids, [lp[:len(i)] for lp, i in zip(lps.cpu().tolist(), ids)]

    def _start(self, prompts: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor, Tensor, Any]:
        """The first logits, the mask, the positions and the cache of a call: a prefill of every prompt, or, with
        kept keys and values, a forward over what each row's context added to its kept one."""
        pol = self.policy
        taken = [self.kept.take(list(p)) for p in prompts] if self.kept is not None and len(self.kept) else []
        if not any(m for m, _ in taken):
            return pol.prefill_shared(prompts, append=self.append_cache)
        from .kv_cache import new_cache

        self.reused_tokens += sum(m for m, _ in taken)

        dev = pol.device
        past, past_mask = padded_past(taken, len(prompts))
        ids, new_mask = left_pad([list(p)[m:] for p, (m, _) in zip(prompts, taken)], pol.pad_id)
        ids, new_mask = ids.to(dev), new_mask.long().to(dev)
        starts = torch.as_tensor([m for m, _ in taken], device=dev)
        pos = starts[:, None] + (new_mask.cumsum(1) - 1).clamp_min(0)
        cache = new_cache(self.policy.config, past, append=self.append_cache)
        mask = torch.cat([past_mask, new_mask], 1)
        return pol.step_logits(ids, mask, pos, cache), mask, pos, cache

    def _keep(self, prompts: Sequence[Sequence[int]], toks: Tensor, alive: Tensor, slots: Tensor, cache: Any,
              context_mask: Tensor, width: int) -> None:
        """Keep the keys and values of the rows in cache ``slots`` (their context's real positions and the generated
        tokens that were fed: all but each row's last)."""
        assert self.kept is not None
        if not slots.numel():
            return
        rows = alive[slots]
        n_gen = (toks[rows] >= 0).sum(1)
        source = layer_tensors(cache)
        extra = source[0][0].shape[2] - width  # the columns the sampling loop appended
        real = torch.cat([context_mask[rows].bool(),
                          torch.arange(extra, device=toks.device)[None, :] < (n_gen - 1)[:, None]], 1)
        gens = toks[rows].tolist()
        for i, (r, g, slot) in enumerate(zip(rows.tolist(), gens, slots.tolist())):
            g = [t for t in g if t >= 0]
            self.kept.keep(list(prompts[r]), Kept(list(prompts[r]) + g[:-1], source, slot, real[i]))

    def _processed(self, logits: Tensor, greedy: bool) -> Tensor:
        """The logits of the distribution a token is drawn from: over the temperature, top-k applied (greedy: as
        they are)."""
        if greedy or self.temperature == 0:
            return logits.float()
        logits = logits.float() / self.temperature
        if self.top_k:
            kth = logits.topk(self.top_k, -1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return logits

    def _pick(self, drawn: Tensor, generator: torch.Generator, greedy: bool) -> Tensor:
        """A token per row from the :meth:`_processed` logits ``drawn``: their argmax (greedy), else a draw."""
        if greedy or self.temperature == 0:
            return drawn.argmax(-1)
        probs = torch.softmax(drawn, -1)
        # an exact draw from probs: argmax of probs / Exp(1) noise (cheaper than multinomial)
        noise = torch.empty(probs.shape, dtype=probs.dtype, device=generator.device).exponential_(generator=generator)
        return (probs / noise.to(probs.device)).argmax(-1)

    @staticmethod
    def _cut(seq: list[int], eos: list[int]) -> list[int]:
        for i, t in enumerate(seq):
            if t in eos:
                return seq[:i + 1]
        return seq


class TorchLogprobSampler(TorchSampler):
    """:class:`TorchSampler` that also returns each drawn token's log-prob (a :class:`LogprobEngine`:
    ``--engine-options logprobs=true``, or ``--old-logp engine``). The same tokens as the plain sampler's."""

    def generate_with_logprobs(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        ids, lps = self._sample(prompts, max_new_tokens, generator, greedy, stop_ids, True)
        assert lps is not None
        return ids, lps


def _torch(policy: Policy, temperature: float = 1.0, top_k: int = 0, logprobs: bool = False,
           **options: Any) -> GenerationEngine:
    """``--engine torch``: the KV-cache sampler, returning its log-probs with ``logprobs``."""
    return (TorchLogprobSampler if logprobs else TorchSampler)(policy, temperature, top_k, **options)


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


def _vllm(policy: Policy, temperature: float = 1.0, top_k: int = 0, **options: Any) -> GenerationEngine:
    """``--engine vllm`` (imported only when used)."""
    from .vllm_engine import make_vllm_engine

    return make_vllm_engine(policy, temperature=temperature, top_k=top_k, **options)


def _vllm_unavailable() -> str | None:
    from .vllm_engine import vllm_unavailable

    return vllm_unavailable()


ENGINES: dict[str, Callable[..., GenerationEngine]] = {"torch": _torch, "hf": HFGenerate, "vllm": _vllm}
ENGINE_CHECKS: dict[str, Callable[[], str | None]] = {"vllm": _vllm_unavailable}
"""Per engine name, a check run before the model loads: why the engine cannot run here, or None."""


def register_engine(name: str, factory: Callable[..., GenerationEngine],
                    unavailable: Callable[[], str | None] | None = None) -> None:
    """Make ``--engine NAME`` build ``factory(policy, temperature=..., top_k=..., **engine_options)``;
    ``unavailable()`` (optional) says why it cannot run here (a missing package or device), or None."""
    ENGINES[name] = factory
    if unavailable is not None:
        ENGINE_CHECKS[name] = unavailable
    else:
        ENGINE_CHECKS.pop(name, None)


def check_engine(name: str) -> None:
    """ConfigError in one line when engine ``name`` is not registered or cannot run in this process."""
    if name not in ENGINES:
        raise ConfigError(f"unknown generation engine {name!r}; available: {', '.join(sorted(ENGINES))}")
    why = ENGINE_CHECKS[name]() if name in ENGINE_CHECKS else None
    if why:
        raise ConfigError(why)


def default_engine_options(name: str, several_turns: bool, chat_report: bool = False) -> dict[str, Any]:
    """The trainer's engine options unless ``--engine-options`` says otherwise: the torch engine keeps each row's KV
    cache between the turns of an episode (``reuse_cache``) on a multi-turn task, and for an inline report's turn (it
    continues the answer's message); with a chat model, for an asked self-report turn too (``chat_report``: the
    question is prefilled on the answer's kept keys and values, the logits equal within float32 rounding). A tiny
    model's asked self-report turn keeps re-prefilling unless asked, so that its golden runs and the results trained
    that way reproduce bit for bit (docs/llm.md)."""
    return {"reuse_cache": True} if name == "torch" and (several_turns or chat_report) else {}


def make_engine(name: str, policy: Policy, temperature: float = 1.0, top_k: int = 0,
                **options: Any) -> GenerationEngine:
    """Build a registered generation engine (``options``: the engine's own keyword arguments)."""
    check_engine(name)
    return ENGINES[name](policy, temperature=temperature, top_k=top_k, **options)


def engine_logprobs(engine: Any) -> Callable[..., tuple[list[list[int]], list[list[float]]]] | None:
    """The engine's ``generate_with_logprobs`` (:class:`LogprobEngine`), or None when it has none."""
    fn = getattr(engine, "generate_with_logprobs", None)
    return fn if callable(fn) else None
