"""The LLM policy: any ``transformers`` causal LM + tokenizer, optional LoRA, heads, a frozen reference.

:class:`Policy` turns a :class:`~reflectrl.llm.batch.TokenBatch` into per-token quantities on the
batch's response axis ``[rows, steps]``: log-probabilities of the tokens in the batch, entropies, and
the last hidden state that *predicts* each token (the features methods' heads read). Heads are small
modules on that hidden state (``add_head("value")``); they are saved and restored with the policy.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from ..core import entropy_from_logits
from ..errors import ConfigError, ReflectRLError
from .decode import checked_llama, lean_step

if TYPE_CHECKING:
    from .batch import TokenBatch
    from .chat import ChatFormat

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HEADS_FILE = "reflectrl_heads.safetensors"


@dataclass
class TokenOutputs:
    """Per-token outputs on the response axis ``[rows, steps]`` (``hidden``: ``[rows, steps, H]``)."""

    logp: Tensor
    entropy: Tensor | None = None
    hidden: Tensor | None = None
    logprobs: Tensor | None = None
    """``[rows, steps, vocab]`` next-token log-probabilities (only when asked for: memory-heavy)."""


class Policy(nn.Module):
    """A causal LM (``model``, possibly a PEFT model), its tokenizer, heads and an optional reference."""

    def __init__(self, model: nn.Module, tokenizer: Any, ref_model: nn.Module | None = None,
                 use_adapter_as_ref: bool = False, source: str = "", chat: ChatFormat | None = None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.chat = chat  # episodes as conversations (a chat template), or None: raw prompts
        self.heads = nn.ModuleDict()
        self._ref = [ref_model]  # a list keeps the frozen copy out of parameters() and state_dict()
        self.use_adapter_as_ref = use_adapter_as_ref
        self.source = source
        self.base_folder = ""
        """The model folder this policy was loaded from, absolute (what a LoRA adapter export names as its base)."""
        self.base_name = ""
        """The name that folder was given as: a named model or a GGUF file, else empty."""
        self._cache_kw = _cache_kwarg(model)
        self._lean: tuple[nn.Module, nn.Module | None] | None = None  # (the model, its checked lean-step base)
        self.attention: Literal["padded", "causal", "shared-prompt"] = "padded"
        """How :meth:`forward_batch` lays out a batch: ``padded`` (left-padded prompts under an attention mask),
        ``causal`` (each row's real tokens moved to its start, right-padded, under the plain causal kernel with no
        mask: a real token never attends to a later pad) or ``shared-prompt`` (each distinct prompt run once, the
        responses on its keys and values; :meth:`_on_shared_prompts`). The log-probs are the same up to float
        rounding."""

    # ----------------------------------------------------------------------------- properties
    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def hidden_size(self) -> int:
        cfg = self.config
        return int(getattr(cfg, "hidden_size", None) or cfg.n_embd)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        pid = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return int(pid if pid is not None else 0)

    @property
    def eos_ids(self) -> list[int]:
        """Token ids that end a completion (the tokenizer's and the generation config's eos)."""
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        for e in (eos if isinstance(eos, (list, tuple)) else [eos]):
            if e is not None:
                ids.add(int(e))
        if self.chat is not None:
            ids.add(self.chat.end_of_turn)
        return sorted(ids)

    # ----------------------------------------------------------------------------- text to ids
    def encode_prompt(self, text: str) -> list[int]:
        """A first turn's ids: the chat template's user turn and the opening of the answer with a chat model,
        else the text with the tokenizer's special tokens (bos)."""
        if self.chat is not None:
            return self.chat.prompt_ids(text)
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def encode_reply(self, text: str, closed: bool = True) -> list[int]:
        """An environment reply's ids after an agent turn (``closed``: the turn ended with its end-of-turn token):
        with a chat model the reply as a user turn (its chat form and prefill, for a
        :class:`~reflectrl.tasks.base.Reply`) and the opening of the next answer, or a continuation's prefill alone (the
        agent's message goes on); else the text alone."""
        if getattr(text, "continuation", False):  # the agent's own message goes on
            return list(self.tokenizer(getattr(text, "prefill", ""), add_special_tokens=False)["input_ids"])
        if self.chat is None:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        from ..tasks.base import chat_reply

        content, prefill = chat_reply(text)
        return self.chat.reply_ids(content, closed, prefill)

    # ----------------------------------------------------------------------------- heads
    def add_head(self, name: str, out_dim: int = 1, init_std: float = 0.01,
                 module: nn.Module | None = None) -> nn.Module:
        """Attach a head on the last hidden state (default: a linear layer, weights ~N(0, init_std²), bias 0).

        Add heads before the trainer builds its optimizer (a method's ``setup`` hook) so they train
        with the policy; they are checkpointed with it either way."""
        if name in self.heads:
            return self.heads[name]
        if module is None:
            module = nn.Linear(self.hidden_size, out_dim)
            nn.init.normal_(module.weight, std=init_std)
            nn.init.zeros_(module.bias)
        module = module.to(self.device)
        self.heads[name] = module
        return module

    def head(self, name: str, hidden: Tensor) -> Tensor:
        """Apply head ``name`` to features ``[..., H]``; a 1-wide head returns ``[...]``."""
        out = self.heads[name](hidden.to(next(self.heads[name].parameters()).dtype))
        return out.squeeze(-1) if out.shape[-1] == 1 else out

    # ----------------------------------------------------------------------------- forward
    def forward_batch(self, batch: TokenBatch, with_entropy: bool = False, with_hidden: bool = False,
                      temperature: float = 1.0, model: nn.Module | None = None,
                      entropy_grad: bool = False, with_logprobs: bool = False) -> TokenOutputs:
        """Log-prob (under ``logits / temperature``) of every response token of ``batch``, aligned to
        ``batch.response_ids``; positions outside the response hold 0. Gradients flow unless called
        under ``torch.no_grad`` (through the entropy only with ``entropy_grad``). On a model with a large vocabulary
        the logits, log-softmax and entropy are computed at the response's real tokens only (:meth:`packs`), never at
        its padding: the same numbers at those tokens, up to float rounding."""
        model = self.model if model is None else model
        P, C = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
        resp = batch.response_attention.to(self.device)
        keep = resp.bool() if self.packs(model) and not with_hidden and not with_logprobs else None
        if self.attention == "causal" and bool(batch.prompt_mask.any(1).all()):
            logits, hidden = self._causal_forward(batch, model, with_hidden, keep)
        elif self.attention == "shared-prompt" and C > 0 and bool(batch.prompt_mask.any(1).all()):
            logits, hidden = self._on_shared_prompts(batch.prompt_tokens(), batch.response_ids,
                                                     batch.response_attention, model, with_hidden, keep)
        else:
            ids, attn, pos = (t.to(self.device) for t in (batch.input_ids, batch.attention_mask, batch.position_ids))
            if keep is None:
                out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                            output_hidden_states=with_hidden, logits_to_keep=C + 1)
                logits = out.logits[:, :-1].float()  # position P-1+t predicts response token t
                hidden = out.hidden_states[-1][:, P - 1:P + C - 1] if with_hidden else None
            else:
                at = torch.zeros(ids.shape, dtype=torch.bool, device=self.device)
                at[:, P - 1:P + C - 1] = keep
                logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                               logits_to_keep=at).logits.float()
                hidden = None
        if temperature != 1.0:
            logits = logits / temperature
        tgt = batch.response_ids.to(self.device)
        all_logp = torch.log_softmax(logits, -1)
        if keep is not None:  # [N, V] at the real tokens, row by row: spread back over [R, C], 0 elsewhere
            picked = all_logp.gather(-1, tgt[keep].unsqueeze(-1)).squeeze(-1)
            logp = torch.zeros(keep.shape, dtype=picked.dtype, device=self.device).masked_scatter(keep, picked)
        else:
            logp = all_logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) * resp
        ent = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = entropy_from_logits(logits if entropy_grad else logits.detach())
                ent = ent * resp if keep is None else torch.zeros(keep.shape, dtype=ent.dtype,
                                                                  device=self.device).masked_scatter(keep, ent)
        return TokenOutputs(logp, ent, hidden, all_logp if with_logprobs else None)

    def packs(self, model: nn.Module | None = None) -> bool:
        """Whether :meth:`forward_batch` computes the logits at the response's real tokens only: where the vocabulary
        is at least :data:`PACK_VOCAB` (below it the projection is cheap, and the tiny models' runs stay bit for bit
        what they were) and the model takes a boolean ``logits_to_keep`` (transformers' ``slice_logits_to_keep``)."""
        import sys

        model = self.model if model is None else model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        vocab = getattr(getattr(base, "config", None), "vocab_size", 0) or 0
        return vocab >= PACK_VOCAB and hasattr(sys.modules.get(type(base).__module__), "slice_logits_to_keep")

    def _causal_forward(self, batch: TokenBatch, model: nn.Module, with_hidden: bool, keep: Tensor | None = None
                        ) -> tuple[Tensor, Tensor | None]:
        """The ``causal`` layout of :meth:`forward_batch`: each row shifted left by its prompt's padding (its real
        tokens at positions 0, 1, ..., its end padded with copies), one forward with no attention mask, and the
        logits ``[R, C, V]`` (float) that predict each response token, with the last hidden states ``[R, C, H]``
        before them when asked; given ``keep`` (``[R, C]``), only the logits of its tokens, ``[N, V]`` row by row."""
        dev = self.device
        ids = batch.input_ids.to(dev)
        R, L = ids.shape
        P, C = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
        lens = batch.prompt_mask.to(dev).sum(1)  # real prompt tokens per row
        src = (torch.arange(L, device=dev)[None] + (P - lens)[:, None]).clamp_max(L - 1)  # [R, L]
        if keep is not None:  # row r's token t is predicted from its position lens - 1 + t
            at = torch.zeros((R, L), dtype=torch.bool, device=dev).scatter_(
                1, ((lens - 1)[:, None] + torch.arange(C, device=dev)[None]).clamp_max(L - 1), keep)
            return model(input_ids=ids.gather(1, src), use_cache=False, logits_to_keep=at).logits.float(), None
        first = int(lens.min()) - 1  # the first position any row's response is predicted from
        out = model(input_ids=ids.gather(1, src), use_cache=False, output_hidden_states=with_hidden,
                    logits_to_keep=L - first)
        at = (lens - 1 - first)[:, None] + torch.arange(C, device=dev)[None]  # [R, C]: row r's token t
        logits = out.logits.gather(1, at[..., None].expand(R, C, out.logits.shape[-1])).float()
        if not with_hidden:
            return logits, None
        h = out.hidden_states[-1][:, first:]
        return logits, h.gather(1, at[..., None].expand(R, C, h.shape[-1]))

    def prefill_shared(self, prompts: Sequence[Sequence[int]], append: bool = True
                       ) -> tuple[Tensor, Tensor, Tensor, Any]:
        """Prefill a KV cache for ``prompts`` (left-padded), running each distinct prompt once and copying its cache
        to every row that repeats it (the G rows of a group); the cache appends in place unless not ``append``
        (:mod:`~reflectrl.llm.kv_cache`). Returns per row the last prompt position's logits
        ``[R, V]`` (they predict the first new token), the prompt mask and positions ``[R, P]`` and the cache."""
        logits, _, mask, pos, cache = self._prefill(prompts, append)
        return logits, mask, pos, cache

    def _prefill(self, prompts: Sequence[Sequence[int]], append: bool, model: nn.Module | None = None,
                 with_hidden: bool = False) -> tuple[Tensor, Tensor | None, Tensor, Tensor, Any]:
        """:meth:`prefill_shared` with ``model`` (default: the policy's) and, ``with_hidden``, the last prompt
        position's hidden state ``[R, H]`` after the logits. Differentiable when called with gradients and not
        ``append``: the rows that share a prompt sum their gradients through the copy."""
        from .batch import left_pad
        from .kv_cache import new_cache

        dev = self.device
        first: dict[tuple[int, ...], int] = {}
        inverse = torch.as_tensor([first.setdefault(tuple(q), len(first)) for q in prompts], device=dev)
        ids, mask = left_pad([list(q) for q in first], self.pad_id)
        ids, mask = ids.to(dev), mask.long().to(dev)
        pos = (mask.cumsum(1) - 1).clamp_min(0)
        cache = new_cache(self.config, append=append)
        out = (self.model if model is None else model)(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
            output_hidden_states=with_hidden, **{self._cache_kw: cache})
        logits, hidden = out.logits[:, -1], out.hidden_states[-1][:, -1] if with_hidden else None
        if len(first) < len(prompts):
            cache.batch_select_indices(inverse)
            logits, mask, pos = logits[inverse], mask[inverse], pos[inverse]
            hidden = hidden[inverse] if hidden is not None else None
        return logits, hidden, mask, pos, cache

    def _on_shared_prompts(self, prompts: Sequence[Sequence[int]], response_ids: Tensor, response_attention: Tensor,
                           model: nn.Module | None = None, with_hidden: bool = False, keep: Tensor | None = None
                           ) -> tuple[Tensor, Tensor | None]:
        """The logits ``[R, C, V]`` (float) that predict each response token of rows whose prompts repeat (the G rows
        of a group), with the last hidden states ``[R, C, H]`` before them when asked: each distinct prompt runs
        once (:meth:`prefill_shared`), then the responses run on its keys and values. With gradients, a prompt's
        forward and backward run once for all the rows that share it. Given ``keep`` (``[R, C]``), only the logits
        of its tokens, ``[N, V]`` row by row."""
        dev = self.device
        head, h0, mask, _, cache = self._prefill(prompts, False, model, with_hidden)
        resp = response_attention.to(dev).long()
        attn = torch.cat([mask, resp], 1)
        pos = mask.sum(1)[:, None] + (resp.cumsum(1) - 1).clamp_min(0)
        rest: dict[str, Any] = {}
        if keep is not None:  # position t predicts token t + 1; the prompt's last position, token 0
            rest["logits_to_keep"] = torch.cat([keep[:, 1:], torch.zeros_like(keep[:, :1])], 1)
        out = (self.model if model is None else model)(
            input_ids=response_ids.to(dev), attention_mask=attn, position_ids=pos, use_cache=True,
            output_hidden_states=with_hidden, **{self._cache_kw: cache}, **rest)
        if keep is not None:
            at = keep.flatten().cumsum(0).view(keep.shape) - 1  # each kept token's row in the packed logits
            later = keep.clone()
            later[:, 0] = False
            order = torch.cat([at[:, 0][keep[:, 0]], at[later]]).argsort()
            return torch.cat([head[keep[:, 0]], out.logits]).float()[order], None
        logits = torch.cat([head[:, None], out.logits[:, :-1]], 1).float()
        if h0 is None:
            return logits, None
        return logits, torch.cat([h0[:, None], out.hidden_states[-1][:, :-1]], 1)

    @torch.no_grad()
    def shared_prompt_logp(self, prompts: list[list[int]], response_ids: Tensor, response_attention: Tensor,
                           temperature: float = 1.0, with_logprobs: bool = False) -> tuple[Tensor, Tensor | None]:
        """No-grad log-probs ``[R, C]`` of each row's response tokens after its prompt, where rows repeat prompts
        (:meth:`_on_shared_prompts`). The same numbers as :meth:`forward_batch` on the concatenated rows, up to float
        rounding; with ``with_logprobs`` also the full log-distributions ``[R, C, V]``."""
        dev = self.device
        logits, _ = self._on_shared_prompts(prompts, response_ids, response_attention)
        resp = response_attention.to(dev).long()
        if temperature != 1.0:
            logits = logits / temperature
        all_logp = torch.log_softmax(logits, -1)
        logp = all_logp.gather(-1, response_ids.to(dev).unsqueeze(-1)).squeeze(-1) * resp
        return logp, (all_logp if with_logprobs else None)

    @torch.no_grad()
    def ref_logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> Tensor:
        """Log-probs under the frozen reference (the base model with LoRA adapters disabled, or a copy)."""
        if self._ref[0] is not None:
            return self.forward_batch(batch, temperature=temperature, model=self._ref[0]).logp
        if self.use_adapter_as_ref:
            with self.model.disable_adapter():
                return self.forward_batch(batch, temperature=temperature).logp
        raise ConfigError("this policy was loaded without a reference model; load it with ref=True")

    def step_logits(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: Any,
                    keep_last: bool = True, lean: bool = True) -> Tensor:
        """One incremental forward with a KV cache (generation); returns the last position's logits. One token per
        row on a Llama-architecture model runs :func:`~reflectrl.llm.decode.lean_step` (the same logits bit for bit,
        less Python around them) unless not ``lean``."""
        if lean and input_ids.shape[1] == 1:
            if self._lean is None or self._lean[0] is not self.model:
                self._lean = (self.model, checked_llama(self.model, self._forward_step, self.device))
            if self._lean[1] is not None:
                return lean_step(self._lean[1], input_ids, attention_mask, position_ids, cache)
        return self._forward_step(input_ids, attention_mask, position_ids, cache, keep_last)

    def _forward_step(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: Any,
                      keep_last: bool = True) -> Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1 if keep_last else 0, **{self._cache_kw: cache})
        return out.logits[:, -1]

    # ----------------------------------------------------------------------------- state
    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimizer updates: the trainable LM weights (all, or LoRA's) and the heads."""
        return [p for p in self.parameters() if p.requires_grad]

    def trainable_state(self) -> dict[str, Tensor]:
        """Tensors that differ from the base checkpoint: trainable LM weights and every head."""
        names = {n for n, p in self.named_parameters() if p.requires_grad}
        state = {k: v for k, v in self.state_dict().items() if k in names or k.startswith("heads.")}
        return state

    def load_trainable_state(self, state: dict[str, Tensor]) -> None:
        """Restore :meth:`trainable_state` output (strict about missing keys)."""
        own = self.state_dict()
        missing = [k for k in self.trainable_state() if k not in state]
        unknown = [k for k in state if k not in own]
        if missing or unknown:
            raise ReflectRLError(f"policy state does not match this model "
                                 f"(missing {missing[:3]}, unknown {unknown[:3]})")
        with torch.no_grad():
            for k, v in state.items():
                own[k].copy_(v)

    def save_pretrained(self, out_dir: str | Path, merge: bool = False, base_name: str | None = None) -> Path:
        """Write the policy and its heads into ``out_dir``: for a LoRA policy (unless ``merge``) the adapter alone,
        with :data:`~reflectrl.llm.folders.ADAPTER_INFO` and its ``adapter_config.json`` naming the base model by
        its absolute folder (:attr:`base_folder`, and ``base_name``: default :attr:`base_name`); else a standard
        Hugging Face model directory (LoRA merged into the weights). The files of the other kind are removed; the
        tokenizer is written either way. :func:`load_policy` loads both."""
        import json

        from safetensors.torch import save_file

        from .folders import ADAPTER_CONFIG, ADAPTER_FILES, ADAPTER_INFO, FULL_FILES

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model = self.model
        adapter = hasattr(model, "merge_and_unload") and not merge
        for stale in [*(FULL_FILES if adapter else ADAPTER_FILES), HEADS_FILE]:
            (out / stale).unlink(missing_ok=True)
        for shard in out.glob("model-*-of-*.safetensors"):
            shard.unlink()
        if adapter:
            model.save_pretrained(out)
            (out / "README.md").unlink(missing_ok=True)  # peft's empty model card
            base = self.base_folder or str(model.peft_config["default"].base_model_name_or_path or "")
            cfg = json.loads((out / ADAPTER_CONFIG).read_text())
            cfg["base_model_name_or_path"] = base  # peft alone finds the base from any folder
            (out / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            name = self.base_name if base_name is None else base_name
            (out / ADAPTER_INFO).write_text(json.dumps({"base_model": base, "base_name": name or None}, indent=2)
                                            + "\n")
        else:
            if hasattr(model, "merge_and_unload"):
                model = copy.deepcopy(model).merge_and_unload()
            model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        if len(self.heads):
            save_file({k: v.contiguous() for k, v in self.heads.state_dict().items()}, str(out / HEADS_FILE),
                      metadata={"heads": ",".join(f"{n}:{self.heads[n].__class__.__name__}" for n in self.heads)})
        return out


PACK_VOCAB = 4096
"""The vocabulary from which :meth:`Policy.forward_batch` computes logits at the response's real tokens only."""


def _cache_kwarg(model: nn.Module) -> str:
    """``cache`` (transformers >= 5.x) or ``past_key_values`` (4.x), whichever the model's forward takes."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def load_policy(path: str | Path, lora_r: int = 0, lora_alpha: int = 16, lora_dropout: float = 0.0,
                lora_targets: tuple[str, ...] | None = None, ref: bool = False, dtype: str = "float32",
                device: str = "cpu", trust_remote_code: bool = False, chat: str = "auto",
                savable: bool = False) -> Policy:
    """Load a causal LM + tokenizer from a local directory (or a hub id where a hub is reachable), a named model
    or a GGUF file (:func:`reflectrl.llm.models.resolve_model`: converted once into the cache).

    ``chat``: ``auto`` frames episodes as conversations when the tokenizer has a chat template
    (:mod:`reflectrl.llm.chat`), ``off`` keeps raw prompts, ``on`` requires a template. With ``savable`` (a trainer
    or warm-up, which will write the model) a model that could not be saved (still quantized) is refused here,
    before any work.

    ``lora_r > 0`` wraps the model in a PEFT LoRA adapter (only the adapter trains); ``ref=True`` keeps
    a frozen reference (the adapter-free base under LoRA, otherwise a copy of the initial weights).
    Heads saved next to the model (``reflectrl_heads.safetensors``) are attached again. A LoRA adapter folder (a
    LoRA run's ``model/``) loads as its base model with the adapter merged in (:mod:`reflectrl.llm.folders`)."""
    from .models import quiet_transformers

    quiet_transformers()
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if lora_r < 0:
        raise ConfigError(f"lora_r must be >= 0 (0 trains every weight), got {lora_r}")
    from .chat import chat_format
    from .models import given_name, resolve_model, resolve_source

    src = resolve_source(resolve_model(str(path)))
    model, tok, plain = _load_model_and_tokenizer(src, DTYPES[dtype], trust_remote_code)
    if savable:
        _check_savable(model, src)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    fmt = chat_format(tok, chat)
    model.to(device)
    model.config.use_cache = False
    ref_model = None
    if lora_r > 0:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise ConfigError("LoRA needs peft: pip install 'reflectrl[llm]'") from None
        targets = list(lora_targets) if lora_targets else "all-linear"
        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
    elif ref:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    policy = Policy(model, tok, ref_model, use_adapter_as_ref=ref and lora_r > 0,
                    source=str(path) if plain == src else plain, chat=fmt)
    policy.base_folder = str(Path(src).resolve()) if Path(src).exists() else src
    policy.base_name = given_name(str(path))
    heads_file = Path(src) / HEADS_FILE
    if heads_file.is_file():
        _load_heads(policy, heads_file)
    return policy


def load_lm(src: str, dtype: torch.dtype, trust_remote_code: bool = False) -> tuple[nn.Module, str]:
    """The causal LM of a model directory (or hub id) ``src``, and the plain model directory its weights start from:
    ``src`` itself, or for a LoRA adapter folder its base (loaded the same way, so a base that is an adapter folder
    too works) with the adapter merged in."""
    from transformers import AutoModelForCausalLM

    from .folders import is_adapter_dir
    from .models import adapter_base, resolve_model, resolve_source

    if not is_adapter_dir(src):
        return AutoModelForCausalLM.from_pretrained(src, dtype=dtype, trust_remote_code=trust_remote_code), src
    base_src = resolve_source(resolve_model(adapter_base(src)))
    base, plain = load_lm(base_src, dtype, trust_remote_code)
    try:
        from peft import PeftModel
    except ImportError:
        raise ConfigError(f"{src} holds a LoRA adapter; loading it needs peft: pip install 'reflectrl[llm]'") from None
    try:
        model = PeftModel.from_pretrained(base, src).merge_and_unload().requires_grad_(True)  # as a loaded model
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ReflectRLError(f"cannot apply the LoRA adapter in {src} to its base model {base_src}: {first}") from None
    return model, plain


def _load_model_and_tokenizer(src: str, dtype: torch.dtype, trust_remote_code: bool) -> tuple[nn.Module, Any, str]:
    """:func:`load_lm` of ``src`` and its tokenizer (an adapter folder saved without one: its base's), with the plain
    model directory the weights start from; one clear error when either cannot be loaded."""
    from transformers import AutoTokenizer

    from .folders import is_adapter_dir

    try:
        model, plain = load_lm(src, dtype, trust_remote_code)
        tok_src = src if not is_adapter_dir(src) or (Path(src) / "tokenizer_config.json").is_file() else plain
        tok = AutoTokenizer.from_pretrained(tok_src, trust_remote_code=trust_remote_code)
    except ReflectRLError:
        raise
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ReflectRLError(f"cannot load a causal LM and tokenizer from {src}: {first}") from None
    return model, tok, plain


def _check_savable(model: nn.Module, src: str) -> None:
    """ConfigError when the loaded model could not be written back (a quantizer that cannot serialize, such as a
    folder whose config still carries a GGUF ``quantization_config``): refused before a run spends its budget."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", "?")
    method = getattr(method, "value", method)
    serializable = getattr(quantizer, "is_serializable", None)
    ok = serializable() if callable(serializable) else bool(serializable)
    if not ok:
        raise ConfigError(f"{src} loads as a {method}-quantized model, which cannot be saved: a run could not write "
                          f"its checkpoint. Remove quantization_config from its config.json, or convert a GGUF file "
                          f"with `reflectrl llm get-model FILE.gguf`")


def _load_heads(policy: Policy, path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    state = load_file(str(path))
    with safe_open(str(path), framework="pt") as fh:
        spec = (fh.metadata() or {}).get("heads", "")
    for item in filter(None, spec.split(",")):
        name, kind = item.split(":")
        if kind == "Linear":
            w = state[f"{name}.weight"]
            policy.add_head(name, w.shape[0])
    policy.heads.load_state_dict({k: v for k, v in state.items() if k.split(".")[0] in policy.heads}, strict=False)
