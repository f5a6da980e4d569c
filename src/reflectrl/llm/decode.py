"""One decoding step of a Llama-architecture model, without transformers' per-call machinery around its modules.

A sampling step feeds one token per row through the model. On a small model at a few hundred cached columns, much of
that step is Python around the arithmetic: the model's decorators and output capturing, the mask builder (it makes
the same ``[rows, 1, 1, columns]`` padding mask every step), the hub-kernel wrappers of the norms. :func:`lean_step`
runs the same modules in the same order (the embedding, each layer's norms, projections, LoRA adapters where there
are any, rotary embedding, cache update and the attention function the model is configured with, the final norm and
the head), so its logits are bit for bit the model's own (``tests/llm/test_decode.py``).

It applies only where that holds by construction: a ``LlamaForCausalLM`` (PEFT-wrapped or not) whose layers are
transformers' Llama layers, fed one token per row with a cache. Before it is first used for a model,
:func:`checked_llama` checks the step against the model's forward on a small input, and the forward is used for good
if the two differ in a single bit (another transformers version, a patched module). Anything else runs the forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

Step = Callable[[Tensor, Tensor, Tensor, Any], Tensor]
"""A model's own step: ``(input_ids, attention_mask, position_ids, cache) -> the last position's logits [R, V]``."""


def _llama(model: nn.Module) -> nn.Module | None:
    """The ``LlamaForCausalLM`` under ``model`` (a PEFT model's base), if its modules are transformers' Llama ones."""
    try:
        from transformers.models.llama import modeling_llama as ml
    except ImportError:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(base) is not ml.LlamaForCausalLM or type(getattr(base, "model", None)) is not ml.LlamaModel:
        return None
    inner = base.model
    if not all(type(layer) is ml.LlamaDecoderLayer and type(layer.self_attn) is ml.LlamaAttention
               and type(layer.mlp) is ml.LlamaMLP for layer in inner.layers):
        return None
    if len(inner.layers) != base.config.num_hidden_layers or not hasattr(ml, "ALL_ATTENTION_FUNCTIONS"):
        return None
    return base


def lean_step(base: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: Any) -> Tensor:
    """The last position's logits ``[R, V]`` of one token per row ``input_ids [R, 1]`` at ``position_ids [R, 1]``,
    the rows' mask over the cache's columns and the new one ``attention_mask [R, W]``; appends to ``cache``."""
    from transformers.models.llama import modeling_llama as ml

    inner = base.model
    attend = ml.ALL_ATTENTION_FUNCTIONS.get_interface(base.config._attn_implementation, ml.eager_attention_forward)
    h = inner.embed_tokens(input_ids)
    # one query per row at the last column: causality allows every column, so the mask is the rows' padding
    mask = None if bool(attention_mask.all()) else attention_mask[:, None, None, :].bool()
    cos, sin = inner.rotary_emb(h, position_ids=position_ids)
    rows = input_ids.shape[0]
    for layer in inner.layers:
        attn = layer.self_attn
        residual = h
        x = layer.input_layernorm(h)
        shape = (rows, 1, -1, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = ml.apply_rotary_pos_emb(q, k, cos, sin)
        k, v = cache.update(k, v, attn.layer_idx)
        out, _ = attend(attn, q, k, v, mask, dropout=0.0 if not attn.training else attn.attention_dropout,
                        scaling=attn.scaling)
        h = residual + attn.o_proj(out.reshape(rows, 1, -1).contiguous())
        residual = h
        h = residual + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    return base.lm_head(h[:, -1:, :])[:, -1]


def checked_llama(model: nn.Module, forward: Step, device: torch.device) -> nn.Module | None:
    """The ``LlamaForCausalLM`` that :func:`lean_step` runs for ``model``, or None where it does not apply or does
    not give ``model``'s own logits (see the module docstring). ``forward(input_ids, attention_mask, position_ids,
    cache)``: the model's own step (last position's logits), what the check compares with."""
    base = _llama(model)
    return base if base is not None and _matches(base, forward, device) else None


def _matches(base: nn.Module, forward: Step, device: torch.device) -> bool:
    """Whether the lean step's logits equal the forward's bit for bit on two rows (one left-padded) after a
    three-token prefill, and on the next step with no padding left; the global random state is left as it was."""
    from .kv_cache import new_cache

    vocab = int(base.config.vocab_size)
    prompt = torch.tensor([[0, 1, 2], [0, 3, 4]], device=device) % vocab
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]], device=device)
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    nxt = torch.tensor([[5], [6]], device=device) % vocab
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.inference_mode():
        caches = []
        for _ in range(2):
            cache = new_cache(base.config)
            forward(prompt, mask, pos, cache)
            caches.append(cache)
        step_mask = torch.cat([mask, mask.new_ones(2, 1)], 1)
        step_pos = pos[:, -1:] + 1
        a = forward(nxt, step_mask, step_pos, caches[0])
        b = lean_step(base, nxt, step_mask, step_pos, caches[1])
        full = torch.cat([step_mask[1:], step_mask[1:]])  # both rows unpadded: the mask-free case
        a2 = forward(nxt, torch.cat([full, full.new_ones(2, 1)], 1), step_pos + 1, caches[0])
        b2 = lean_step(base, nxt, torch.cat([full, full.new_ones(2, 1)], 1), step_pos + 1, caches[1])
    return bool(torch.equal(a, b) and torch.equal(a2, b2))
