"""Logits at the response's real tokens only (``Policy.packs``: a large vocabulary): every layout gives the log-probs,
entropies and gradients of the full logits up to float32 rounding, 0 off the real tokens; below the vocabulary
threshold (the tiny models) nothing changes."""

from __future__ import annotations

import pytest
import torch

from reflectrl.llm import policy as policy_mod
from reflectrl.llm.policy import load_policy

from .test_causal_layout import _batch
from .test_shared_prompt_layout import PROMPTS, RESPONSES


@pytest.fixture()
def policy(tiny_dir):
    return load_policy(tiny_dir)


def _forward(policy, batch, layout, pack, monkeypatch, **kw):
    monkeypatch.setattr(policy_mod, "PACK_VOCAB", 1 if pack else 10**9)
    policy.attention = layout
    try:
        assert policy.packs() == pack
        return policy.forward_batch(batch, **kw)
    finally:
        policy.attention = "padded"


@pytest.mark.parametrize("layout", ["padded", "causal", "shared-prompt"])
def test_packed_logits_give_the_full_numbers(policy, layout, monkeypatch):
    batch = _batch(PROMPTS, RESPONSES)
    resp = batch.response_attention
    want = _forward(policy, batch, layout, False, monkeypatch, with_entropy=True, temperature=0.7)
    got = _forward(policy, batch, layout, True, monkeypatch, with_entropy=True, temperature=0.7)
    assert resp.sum() > 0 and bool((want.logp[resp] != 0).all())
    torch.testing.assert_close(got.logp, want.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.entropy, want.entropy, rtol=1e-5, atol=1e-5)
    assert (got.logp[~resp] == 0).all() and (got.entropy[~resp] == 0).all()


@pytest.mark.parametrize("layout", ["padded", "shared-prompt"])
def test_packed_logits_give_the_full_gradient(policy, layout, monkeypatch):
    batch = _batch(PROMPTS, RESPONSES)
    grads = []
    for pack in (False, True):
        policy.zero_grad()
        out = _forward(policy, batch, layout, pack, monkeypatch, with_entropy=True, entropy_grad=True)
        (out.logp.sum() + 0.1 * out.entropy.sum()).backward()
        grads.append([p.grad.clone() for p in policy.parameters() if p.grad is not None])
    assert grads[0] and len(grads[0]) == len(grads[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_a_wrong_order_would_be_caught(policy, monkeypatch):
    """The check can fail: the packed logits spread back over the rows in another order change the log-probs."""
    batch = _batch(PROMPTS, RESPONSES)
    want = _forward(policy, batch, "shared-prompt", False, monkeypatch).logp
    real = policy_mod.Policy._on_shared_prompts

    def reversed_rows(self, *a, **kw):
        logits, hidden = real(self, *a, **kw)
        return (logits.flip(0) if kw.get("keep") is not None or len(a) > 5 else logits), hidden

    monkeypatch.setattr(policy_mod.Policy, "_on_shared_prompts", reversed_rows)
    got = _forward(policy, batch, "shared-prompt", True, monkeypatch).logp
    assert not torch.allclose(got, want, atol=1e-3)


def test_the_tiny_models_keep_the_full_logits(policy):
    assert policy.config.vocab_size < policy_mod.PACK_VOCAB and not policy.packs()
