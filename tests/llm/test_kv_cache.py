"""The KV cache that appends in place (:mod:`reflectrl.llm.kv_cache`) holds what transformers' concatenating cache
holds, so the sampler draws the same tokens with the same log-probs, bit for bit, with it as without it."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from reflectrl.llm import kv_cache
from reflectrl.llm.engines import TorchLogprobSampler
from reflectrl.llm.kv_cache import GrowingLayer, new_cache, reserve


def _plain(config, past=None, append=True):
    return DynamicCache(ddp_cache_data=past, config=config) if past is not None else DynamicCache(config=config)


def _sample(policy, prompts, reuse, greedy, turns=2, append=True):
    engine = TorchLogprobSampler(policy, temperature=1.0, reuse_cache=reuse, append_cache=append)
    g = torch.Generator().manual_seed(5)
    out = []
    budgets = [4 + 8 * (i % 2) for i in range(len(prompts))]  # rows that finish early are dropped from the batch
    for _ in range(turns):  # a second call continues each row's transcript (from the kept cache with reuse)
        ids, lps = engine.generate_with_logprobs(prompts, budgets, g, greedy=greedy)
        out.append((ids, lps))
        prompts = [p + i + [7, 8, 9] for p, i in zip(prompts, ids)]
    return out


@pytest.mark.parametrize("reuse,greedy", [(False, False), (True, False), (True, True)])
def test_the_sampler_draws_the_same_tokens_and_log_probs_bit_for_bit(tiny_policy, monkeypatch, reuse, greedy):
    g = torch.Generator().manual_seed(0)
    V = tiny_policy.model.config.vocab_size
    prompts = [torch.randint(3, V, (int(n),), generator=g).tolist() for n in torch.randint(5, 40, (6,), generator=g)]
    prompts = [p for p in prompts for _ in range(3)]  # groups share a prompt: its cache is copied to each row
    growing = _sample(tiny_policy, prompts, reuse, greedy)
    assert _sample(tiny_policy, prompts, reuse, greedy, append=False) == growing  # append_cache=false
    monkeypatch.setattr(kv_cache, "new_cache", _plain)
    plain = _sample(tiny_policy, prompts, reuse, greedy)
    assert growing == plain  # tokens and float log-probs, exactly
    assert max(len(i) for i in growing[0][0]) > 4  # rows went on after others had finished


def test_the_layer_holds_what_the_concatenating_layer_holds():
    torch.manual_seed(0)
    grow, cat = GrowingLayer(), DynamicLayer()
    views = []
    for width in (5, 1, 1, 3, 1):
        k, v = torch.randn(4, 2, width, 8), torch.randn(4, 2, width, 8)
        a, b = grow.update(k, v), cat.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        views.append((a[0], a[0].clone()))
        if width == 1:
            grow.reserve(2)
    assert grow.get_seq_length() == cat.get_seq_length() == 11
    for view, copy in views:  # a view taken earlier is never written again
        assert torch.equal(view, copy)
    idx = torch.tensor([2, 0])
    grow.batch_select_indices(idx)
    cat.batch_select_indices(idx)
    k = torch.randn(2, 2, 1, 8)
    assert torch.equal(grow.update(k, k)[0], cat.update(k, k)[0])
    grow.crop(-3)
    cat.crop(-3)
    assert torch.equal(grow.update(k, k)[1], cat.update(k, k)[1])


def test_the_sampler_s_caches_are_growing_ones_unless_turned_off(tiny_policy):
    prompts = [[5, 6, 7], [5, 6, 7], [8, 9]]  # a shared prompt's cache is copied to its rows
    with torch.inference_mode():
        grown = tiny_policy.prefill_shared(prompts)[3]
        plain = tiny_policy.prefill_shared(prompts, append=False)[3]
    assert grown.layers and all(isinstance(layer, GrowingLayer) for layer in grown.layers)
    assert not any(isinstance(layer, GrowingLayer) for layer in plain.layers)
    for a, b in zip(grown.layers, plain.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_cache_built_from_kept_keys_and_values_grows_in_place(tiny_policy):
    cfg = tiny_policy.config
    L = cfg.num_hidden_layers
    past = [(torch.randn(2, cfg.num_key_value_heads, 4, 16), torch.randn(2, cfg.num_key_value_heads, 4, 16))
            for _ in range(L)]
    cache = new_cache(cfg, past)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert cache.get_seq_length() == 4 and torch.equal(cache.layers[0].keys, past[0][0])
    reserve(cache, 6)
    assert cache.layers[0]._kb.shape[2] == 10  # room for six more columns
