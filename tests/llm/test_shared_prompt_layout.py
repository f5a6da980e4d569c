"""The ``shared-prompt`` training layout (each distinct prompt run once, the responses on its keys and values) gives
the padded layout's log-probs, entropies, hidden states and gradients up to float32 rounding, and runs each
distinct prompt through the model once."""

from __future__ import annotations

import pytest
import torch

from reflectrl.llm.policy import load_policy

from .test_causal_layout import _batch, assert_same_outputs


def _forward(policy, batch, layout, **kw):
    policy.attention = layout
    try:
        return policy.forward_batch(batch, **kw)
    finally:
        policy.attention = "padded"


@pytest.fixture()
def policy(tiny_dir):
    return load_policy(tiny_dir)


# rows 0, 1 and 3 share a prompt; row 2's is shorter; multi-turn rows have env tokens between policy turns
PROMPTS = [[5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [11, 12], [5, 6, 7, 8, 9]]
RESPONSES = [[([7, 8], "policy"), ([9, 3], "env"), ([10], "policy")], [([7], "policy")],
             [([4, 4, 4, 4, 4, 4], "policy")], [([2, 3, 4], "policy"), ([6], "env"), ([8, 8], "policy")]]


def test_repeated_prompts_and_multi_turn_rows_give_the_padded_numbers(policy):
    batch = _batch(PROMPTS, RESPONSES)
    kw = {"with_entropy": True, "with_hidden": True, "with_logprobs": True}
    want, got = _forward(policy, batch, "padded", **kw), _forward(policy, batch, "shared-prompt", **kw)
    resp = batch.response_attention
    assert resp.sum() > 0 and got.logp.shape == want.logp.shape
    assert_same_outputs(got, want, resp)


def test_the_gradient_is_the_padded_one(policy):
    batch = _batch(PROMPTS, RESPONSES)
    grads = []
    for layout in ("padded", "shared-prompt"):
        policy.zero_grad()
        _forward(policy, batch, layout).logp.sum().backward()
        grads.append([p.grad.clone() for p in policy.parameters() if p.grad is not None])
    assert grads[0] and len(grads[0]) == len(grads[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_each_distinct_prompt_runs_once(policy):
    batch = _batch(PROMPTS, RESPONSES)
    seen: list[tuple[int, ...]] = []
    hook = policy.model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    try:
        _forward(policy, batch, "shared-prompt")
    finally:
        hook.remove()
    # the two distinct prompts at the batch's prompt width, then every row's response on their keys and values
    assert seen == [(2, batch.prompt_ids.shape[1]), (4, batch.response_ids.shape[1])]


def test_a_wrong_prompt_assignment_would_be_caught(policy):
    """The check can fail: giving row 2 the shared prompt's keys and values changes its log-probs."""
    batch = _batch(PROMPTS, RESPONSES)
    want = _forward(policy, batch, "padded").logp
    prompts = [PROMPTS[0]] * 4
    logits, _ = policy._on_shared_prompts(prompts, batch.response_ids, batch.response_attention)
    wrong = torch.log_softmax(logits, -1).gather(-1, batch.response_ids[..., None]).squeeze(-1)
    wrong = wrong * batch.response_attention
    assert not torch.allclose(wrong[2], want[2], atol=1e-4)
    torch.testing.assert_close(wrong[0], want[0], rtol=1e-5, atol=1e-5)


def test_an_update_on_a_rollout_is_the_padded_one(tiny_dir, tmp_path):
    """A trainer's whole update (a multi-turn rollout, groups sharing their prompts): the same gradient and logged
    losses as the padded layout's, up to float32 rounding."""
    from .test_micro_batch_tokens import _batch as rollout
    from .test_micro_batch_tokens import _grad

    batch = rollout(tiny_dir, tmp_path)
    assert batch.rows > len({tuple(r.tolist()) for r in batch.prompt_ids})  # the groups' rows repeat their prompt
    w, padded = _grad(tiny_dir, tmp_path, batch, attention="padded")
    t, shared = _grad(tiny_dir, tmp_path, batch, attention="shared-prompt")
    assert shared.abs().sum() > 0
    torch.testing.assert_close(shared, padded, atol=1e-7, rtol=1e-4)
    assert w.stats.keys() == t.stats.keys()
    for k, v in w.stats.items():
        assert t.stats[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
