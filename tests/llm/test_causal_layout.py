"""The ``causal`` training layout (no attention mask, rows right-padded) gives the padded layout's log-probs,
entropies and hidden states up to float32 rounding, on hand-built batches and on a real rollout."""

from __future__ import annotations

import pytest
import torch

from reflectrl.llm.batch import RowResult, Segment, build_batch
from reflectrl.llm.policy import load_policy

PAD = 0


def _batch(prompts: list[list[int]], responses: list[list[tuple[list[int], str]]]):
    rows = [RowResult(p, [Segment(t, kind, i, 0.0) if kind == "policy" else Segment(t, kind, i)
                          for i, (t, kind) in enumerate(r)], None, 0.0, False, False, [])
            for p, r in zip(prompts, responses)]
    return build_batch(rows, list(range(len(rows))), [], PAD)


def _both(policy, batch, **kw):
    policy.attention = "padded"
    want = policy.forward_batch(batch, **kw)
    policy.attention = "causal"
    try:
        got = policy.forward_batch(batch, **kw)
    finally:
        policy.attention = "padded"
    return want, got


def assert_same_outputs(got, want, resp) -> None:
    """Log-probs, entropies, hidden states and distributions within float32 rounding on the real response tokens
    ``resp``; log-probs 0 off them."""
    torch.testing.assert_close(got.logp, want.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.entropy, want.entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.hidden[resp], want.hidden[resp], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.logprobs[resp], want.logprobs[resp], rtol=1e-5, atol=1e-5)
    assert (got.logp[~resp] == 0).all()


@pytest.fixture()
def policy(tiny_dir):
    return load_policy(tiny_dir)


def test_uneven_prompts_and_multi_turn_rows_give_the_padded_numbers(policy):
    batch = _batch([[5, 6, 7, 8, 9], [5], [11, 12, 13]],
                   [[([7, 8], "policy"), ([9, 3], "env"), ([10], "policy")], [([7], "policy")],
                    [([4, 4, 4, 4, 4, 4], "policy")]])
    want, got = _both(policy, batch, with_entropy=True, with_hidden=True, with_logprobs=True)
    resp = batch.response_attention
    assert resp.sum() > 0 and not torch.equal(batch.prompt_mask.sum(1), batch.prompt_mask.sum(1)[:1].expand(3))
    assert_same_outputs(got, want, resp)


def test_the_gradient_is_the_padded_one(policy):
    batch = _batch([[5, 6, 7], [9]], [[([7, 8, 1], "policy")], [([2], "policy"), ([3], "env"), ([4], "policy")]])
    grads = []
    for layout in ("padded", "causal"):
        policy.attention = layout
        policy.zero_grad()
        policy.forward_batch(batch).logp.sum().backward()
        grads.append([p.grad.clone() for p in policy.parameters() if p.grad is not None])
    policy.attention = "padded"
    assert grads[0] and len(grads[0]) == len(grads[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_a_layout_that_changed_the_attention_would_be_caught(policy):
    """The check can fail: dropping the shift (so left pads sit before real tokens, unmasked) changes the numbers."""
    batch = _batch([[5, 6, 7, 8, 9], [5]], [[([7, 8], "policy")], [([7, 2], "policy")]])
    policy.attention = "padded"
    want = policy.forward_batch(batch).logp
    ids = batch.input_ids
    out = policy.model(input_ids=ids, use_cache=False).logits[:, batch.prompt_ids.shape[1] - 1:-1].float()
    wrong = torch.log_softmax(out, -1).gather(-1, batch.response_ids[..., None]).squeeze(-1) * batch.response_attention
    assert not torch.allclose(wrong[1], want[1], atol=1e-4)
