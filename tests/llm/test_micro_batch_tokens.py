"""``--micro-batch-tokens N``: a minibatch's rows packed into micro-batches of at most N tokens as the layout computes
them (sorted by length; under the shared-prompt layout a prompt's rows kept together). The gradient equals the unsplit
minibatch's within float rounding (every layout, each loss aggregation), every row is in exactly one micro-batch, and a
micro-batch exceeds N only when it is one row."""

import pytest
import torch

from reflectrl.errors import ConfigError
from reflectrl.llm.grpo import GRPO

from .test_trainer import cfg


def _batch(tiny_dir, tmp_path):
    t = GRPO(cfg(tiny_dir, tmp_path, "roll", task="toy-guess", max_turns=3, max_new_tokens=4, prompts_per_update=4))
    problems, group, offset, gen = t.draw_problems()
    batch, _ = t.rollout.run(problems, group, gen, index_offset=offset)
    t.rollout.close()
    return batch


def _grad(tiny_dir, tmp_path, batch, **kw):
    t = GRPO(cfg(tiny_dir, tmp_path, "g", task="toy-guess", max_turns=3, max_new_tokens=4, prompts_per_update=4,
                 dedupe=False, **kw))
    t.advantages(batch)  # an untrained model's groups are all wrong: give the rows advantages of their own
    batch.advantages = torch.linspace(-1, 1, batch.rows)[:, None] * batch.completion_mask.float()
    t.update_idx = 1
    t.stats = t.update(batch)
    t.rollout.close()
    return t, torch.cat([p.grad.flatten() for p in t.policy.trainable_parameters()])


@pytest.mark.parametrize("attention", ["padded", "causal", "shared-prompt"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_the_gradient_is_the_unsplit_minibatch(tiny_dir, tmp_path, attention, mode):
    batch = _batch(tiny_dir, tmp_path)
    lengths = batch.prompt_mask.sum(1) + batch.last_real_response() + 1
    assert int(lengths.max()) > int(lengths.min())  # rows of unequal length
    w, whole = _grad(tiny_dir, tmp_path, batch, attention=attention, loss_agg_mode=mode)
    t, packed = _grad(tiny_dir, tmp_path, batch, attention=attention, loss_agg_mode=mode, micro_batch_tokens=60)
    assert len(t._micro_splits(batch)) > 2
    torch.testing.assert_close(packed, whole, atol=1e-7, rtol=1e-4)
    assert packed.abs().sum() > 0
    # the logged loss and token means too (entropy, clip fractions, KL: token shares, whatever the aggregation)
    assert w.stats.keys() == t.stats.keys() and "losses/entropy" in w.stats
    for k, v in w.stats.items():
        assert t.stats[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k


def test_the_packing(tiny_dir, tmp_path):
    batch = _batch(tiny_dir, tmp_path)
    for attention in ("padded", "causal"):
        t = GRPO(cfg(tiny_dir, tmp_path, "p", task="toy-guess", micro_batch_tokens=60, attention=attention))
        splits = t._micro_splits(batch)
        t.rollout.close()
        rows = torch.cat(splits)
        assert sorted(rows.tolist()) == list(range(batch.rows))
        lengths = (batch.prompt_mask.sum(1) + batch.last_real_response() + 1)[rows]
        assert torch.equal(lengths, lengths.sort().values)  # rows of like length together
        for s in splits:
            mb = batch.select(s)
            width = int((mb.prompt_mask.sum(1) + mb.last_real_response() + 1).max()) if attention == "causal" else \
                mb.prompt_ids.shape[1] + mb.steps
            assert s.numel() == 1 or s.numel() * width <= 60


def test_the_shared_prompt_packing(tiny_dir, tmp_path):
    """Under the shared-prompt layout a micro-batch costs its distinct prompts times the longest prompt plus its rows
    times the longest response: a prompt's rows are consecutive (split only where the cap falls inside them), and every
    micro-batch of more than one row costs at most N."""
    batch = _batch(tiny_dir, tmp_path)
    keys = [tuple(ids[m].tolist()) for ids, m in zip(batch.prompt_ids, batch.prompt_mask.bool())]
    response = batch.last_real_response() + 1
    for cap in (30, 60, 120):
        t = GRPO(cfg(tiny_dir, tmp_path, "s", task="toy-guess", micro_batch_tokens=cap, attention="shared-prompt"))
        splits = t._micro_splits(batch)
        t.rollout.close()
        order = torch.cat(splits).tolist()
        assert sorted(order) == list(range(batch.rows))
        runs = [keys[r] for i, r in enumerate(order) if i == 0 or keys[r] != keys[order[i - 1]]]
        assert len(runs) == len(set(keys))  # each prompt's rows in one run
        for s in splits:
            prompts = {keys[r] for r in s.tolist()}
            cost = len(prompts) * max(map(len, prompts)) + s.numel() * int(response[s].max())
            assert s.numel() == 1 or cost <= cap
    # a cap that holds every row at the shared cost but not at the padded one: one micro-batch against several
    whole = len(set(keys)) * max(map(len, keys)) + batch.rows * int(response.max())
    shared = GRPO(cfg(tiny_dir, tmp_path, "w", task="toy-guess", micro_batch_tokens=whole, attention="shared-prompt"))
    padded = GRPO(cfg(tiny_dir, tmp_path, "q", task="toy-guess", micro_batch_tokens=whole))
    assert len(shared._micro_splits(batch)) == 1 < len(padded._micro_splits(batch))
    order = torch.cat(padded._micro_splits(batch)).tolist()  # sorting by length alone splits a prompt's rows
    assert sum(i == 0 or keys[r] != keys[order[i - 1]] for i, r in enumerate(order)) > len(set(keys))
    shared.rollout.close()
    padded.rollout.close()


def test_it_replaces_grad_accum(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="--micro-batch-tokens replaces --grad-accum"):
        cfg(tiny_dir, tmp_path, micro_batch_tokens=100, grad_accum=2).validate()
    with pytest.raises(ConfigError, match="--micro-batch-tokens must be >= 0"):
        cfg(tiny_dir, tmp_path, micro_batch_tokens=-1).validate()


def test_the_no_grad_pass_packs_the_same_way(tiny_dir, tmp_path):
    """The old, reference and entropy outputs of the length-packed pass, put back in row order at the batch's width,
    equal the one-chunk pass's within float rounding, with 0 where a row has no response token."""
    batch = _batch(tiny_dir, tmp_path)
    outs = []
    for kw in ({}, {"micro_batch_tokens": 60}):
        t = GRPO(cfg(tiny_dir, tmp_path, "n", task="toy-guess", minibatches=2, kl_coef=0.1, **kw))
        t.needs = {*t.needs, "entropy"}
        b = batch.select(range(batch.rows), trim=False)
        t.prepare(b)
        outs.append(b)
        t.rollout.close()
    whole, packed = outs
    for name in ("old_logp", "ref_logp", "entropy"):
        a, b = getattr(whole, name), getattr(packed, name)
        assert a.shape == b.shape
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert torch.equal(packed.old_logp[~packed.response_attention], torch.zeros(int((~packed.response_attention).sum())))
