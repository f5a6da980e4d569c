"""The lean decoding step (:mod:`reflectrl.llm.decode`) gives a Llama model's own logits bit for bit: step by step over
left-padded rows, rows dropped from the cache, the mask-free case, grouped-query attention, LoRA adapters and the
sampler's whole draw; it checks itself before it is used, and anything it does not cover runs the forward."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from reflectrl.llm import decode
from reflectrl.llm.engines import TorchLogprobSampler
from reflectrl.llm.kv_cache import new_cache
from reflectrl.llm.policy import Policy, load_policy


def _llama(kv_heads: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=kv_heads, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def _steps(policy: Policy, lean: bool | None, steps: int = 6) -> list[torch.Tensor]:
    """The logits of ``steps`` one-token steps after a prefill of 5 left-padded rows, rows 1 and 3 dropped from the
    cache after the third step; the lean step (``lean``), the model's forward (not ``lean``) or whichever the policy's
    ``step_logits`` takes (None) at every step."""
    g = torch.Generator().manual_seed(1)
    V = policy.model.config.vocab_size
    lens = [3, 7, 5, 7, 2]
    ids = torch.stack([torch.cat([torch.zeros(7 - n, dtype=torch.long), torch.randint(1, V, (n,), generator=g)])
                       for n in lens])
    mask = (torch.arange(7)[None] >= 7 - torch.tensor(lens)[:, None]).long()
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cache = new_cache(policy.model.config)
    out = []
    with torch.inference_mode():
        policy._forward_step(ids, mask, pos, cache)
        last = pos[:, -1:]
        for s in range(steps):
            if s == 3:
                keep = torch.tensor([0, 2, 4])
                cache.batch_select_indices(keep)
                mask, last = mask[keep], last[keep]
            nxt = torch.randint(1, V, (mask.shape[0], 1), generator=g)
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
            last = last + 1
            if lean is None:
                step = policy.step_logits(nxt, mask, last, cache)
            elif lean:
                step = decode.lean_step(decode._llama(policy.model), nxt, mask, last, cache)
            else:
                step = policy._forward_step(nxt, mask, last, cache)
            out.append(step)
    return out


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_the_lean_step_is_the_forward_bit_for_bit(kv_heads):
    policy = Policy(_llama(kv_heads), tokenizer=None)
    forward, lean = _steps(policy, False), _steps(policy, True)
    assert all(torch.equal(a, b) for a, b in zip(forward, lean))
    assert not torch.equal(forward[0], forward[1])  # the steps differ: the comparison can fail


def test_the_mask_free_case(tiny_policy):
    """Rows with no padding: the model passes no mask to attention, and neither does the lean step."""
    pol = tiny_policy
    ids = torch.randint(3, pol.model.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(2))
    mask, pos = torch.ones(3, 4, dtype=torch.long), torch.arange(4).expand(3, 4)
    caches = [new_cache(pol.model.config) for _ in range(2)]
    with torch.inference_mode():
        for c in caches:
            pol._forward_step(ids, mask, pos, c)
        m, p, nxt = torch.ones(3, 5, dtype=torch.long), pos[:, -1:] + 1, ids[:, :1]
        a = pol._forward_step(nxt, m, p, caches[0])
        b = decode.lean_step(decode._llama(pol.model), nxt, m, p, caches[1])
    assert torch.equal(a, b)


def test_lora_adapters_are_in_the_step(tiny_dir):
    pol = load_policy(tiny_dir, lora_r=4)
    with torch.no_grad():  # a nonzero adapter, so that leaving it out would change the logits
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(3))
    assert decode._llama(pol.model) is not None
    forward, lean = _steps(pol, False), _steps(pol, True)
    assert all(torch.equal(a, b) for a, b in zip(forward, lean))
    with pol.model.disable_adapter():
        without = _steps(pol, False)
    assert not torch.equal(without[0], forward[0])


@pytest.mark.parametrize("greedy", [False, True])
def test_the_sampler_draws_the_same(tiny_policy, greedy):
    """A whole multi-turn draw (the kept cache, rows finishing early) with the lean step and with the forward."""
    g = torch.Generator().manual_seed(0)
    V = tiny_policy.model.config.vocab_size
    prompts = [torch.randint(3, V, (int(n),), generator=g).tolist() for n in torch.randint(5, 30, (4,), generator=g)]
    prompts = [p for p in prompts for _ in range(3)]

    def draw():
        engine = TorchLogprobSampler(tiny_policy, temperature=1.0, reuse_cache=True)
        gen, out, ps = torch.Generator().manual_seed(5), [], prompts
        for _ in range(2):
            ids, lps = engine.generate_with_logprobs(ps, [4 + 8 * (i % 2) for i in range(len(ps))], gen, greedy=greedy)
            out.append((ids, lps))
            ps = [p + i + [7, 8] for p, i in zip(ps, ids)]
        return out

    tiny_policy._lean = None
    lean = draw()
    assert tiny_policy._lean is not None and tiny_policy._lean[1] is not None  # the lean step ran
    tiny_policy._lean = (tiny_policy.model, None)  # the forward at every step
    try:
        assert draw() == lean
    finally:
        tiny_policy._lean = None


def test_what_it_does_not_cover_runs_the_forward(tiny_policy, monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=64, n_embd=32, n_layer=1, n_head=2))
    assert decode._llama(gpt2) is None
    # the policy's step takes the lean step where the check passes
    pol = Policy(_llama(4), tokenizer=None)
    forward = _steps(pol, False)
    assert all(torch.equal(a, b) for a, b in zip(_steps(pol, None), forward))
    assert pol._lean is not None and pol._lean[1] is not None
    # a lean step whose logits differ from the forward's in the last bits: the check refuses it, and the policy runs
    # the forward
    real = decode.lean_step
    monkeypatch.setattr(decode, "lean_step", lambda *a: real(*a) * (1 + 1e-6))
    assert decode.checked_llama(pol.model, pol._forward_step, pol.device) is None
    pol._lean = None
    assert all(torch.equal(a, b) for a, b in zip(_steps(pol, None), forward))
    assert pol._lean is not None and pol._lean[1] is None
    assert not torch.equal(_steps(pol, True)[0], forward[0])  # the patched step would have changed them


def test_the_check_leaves_the_random_state_as_it_was():
    """A model in training mode with attention dropout draws from the global generator in its forward: the check
    forks the random state, so a run draws the same numbers after it (and the random forward fails the check)."""
    model = _llama(4)
    model.config.attention_dropout = 0.5
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    pol = Policy(model.train(), tokenizer=None)
    state = torch.random.get_rng_state()
    assert decode.checked_llama(pol.model, pol._forward_step, pol.device) is None
    assert torch.equal(torch.random.get_rng_state(), state)
