"""exgrpo on the LLM: bucket weights, sampling, retirement, the entropy pick and f(w) on hand-worked cases;
a replayed group holds exactly one stored row whose tokens take the shaped loss; replay stays off until the
solve rate crosses its threshold; resume equals uninterrupted with a non-empty buffer. And exgrpo-seed."""

import math

import pytest
import torch

from reflectrl.algos import get_algo, resume
from reflectrl.core import PolicyLossConfig, mixed_policy_loss, shaped_ratio
from reflectrl.methods.exgrpo import OFFPOLICY, STORED, ExGRPO, bucket_weights, sample_from_buckets
from reflectrl.runlog import behaviour, read_metrics


def test_bucket_weights_and_sampling():
    w = bucket_weights([1, 4, 7], 8, "normal", 1.0)
    # N(k; 4, 1): the middle bucket weighs most; 1 and 7 are symmetric, exp(-4.5) of the peak
    assert w[1] > w[0] and float(w[0]) == pytest.approx(float(w[2])) and float(w[0] / w[1]) == pytest.approx(math.exp(-4.5))
    torch.testing.assert_close(bucket_weights([2, 4], 8, "linear"), torch.tensor([0.25, 0.5], dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    picked = sample_from_buckets({1: ["a"], 4: ["b", "c", "d"]}, 10, 8, "normal", 1.0, g)
    assert sorted(picked) == ["a", "b", "c", "d"]  # without replacement: at most the buffer's questions
    counts = {"b": 0, "a": 0}
    for s in range(200):  # the heavy bucket is drawn first far more often
        counts[sample_from_buckets({1: ["a"], 4: ["b"]}, 1, 8, "normal", 1.0, torch.Generator().manual_seed(s))[0]] += 1
    assert counts["b"] > 190


def test_shaped_ratio_and_the_mixed_loss_hand_case():
    assert float(shaped_ratio(torch.tensor(1.0))) == pytest.approx(1 / 1.1)
    # row 0 fresh, row 1 stored; A = 1 everywhere; log-ratio 0 against old for fresh, log w = log 2 for stored
    old = torch.zeros(2, 1)
    lp = torch.tensor([[0.0], [0.0]], requires_grad=True)
    stored = torch.tensor([[0.0], [-math.log(2.0)]])
    off = torch.tensor([[0.0], [1.0]])
    loss, st = mixed_policy_loss(old, lp, torch.ones(2, 1), torch.ones(2, 1), "token-mean", PolicyLossConfig(),
                                 offpolicy=off, stored_logp=stored)
    # fresh: -1 * 1 ; stored: -(2 / 2.1) ; token mean
    assert float(loss.detach()) == pytest.approx((-1.0 - 2 / 2.1) / 2)
    assert float(st["stored_ratio"]) == pytest.approx(2.0) and float(st["stored_share"]) == 0.5
    loss.backward()
    # the stored token's gradient is f'(w) * w = 0.1 / (w + 0.1)^2 * w: no clip, damped
    assert float(lp.grad[1, 0]) == pytest.approx(-(0.1 / 2.1 ** 2 * 2.0) / 2)


def _cfg(tiny_dir, tmp_path, name, algo="exgrpo", **kw):
    base = dict(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / name), updates=4, prompts_per_update=4,
                group_size=4, max_new_tokens=3, learning_rate=3e-3, progress=False, tensorboard=False, save_interval=2,
                sample_interval=0, reward_workers=0, gen_batch=8, export_model=False, minibatches=2)
    base.update(kw)
    return get_algo("llm", algo).config(**base)


def _store(trainer, hook, correct_pattern):
    """Run one rollout and feed the hook rows whose correctness follows ``correct_pattern`` per group."""
    batch, _ = trainer.rollout.run(trainer.next_problems(len(correct_pattern)), 4, trainer.gen)
    trainer.prepare(batch)
    batch.extras[OFFPOLICY] = torch.zeros(batch.rows, batch.steps)
    batch.correct = torch.tensor([c for pat in correct_pattern for c in pat])
    hook._replayed = {}
    hook.after_update(trainer, batch)
    return batch


def test_retirement_buckets_and_the_replay_switch(tiny_dir, tmp_path):
    t = get_algo("llm", "exgrpo").make(_cfg(tiny_dir, tmp_path, "r"))
    hook = t.hooks[0]
    batch = _store(t, hook, [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    ids = [batch.problems[4 * g].id for g in range(4)]
    assert ids[0] in hook.retired and ids[0] not in hook.buffer  # solved 4 of 4
    assert hook.count[ids[1]] == 1 and len(hook.buffer[ids[1]]) >= 1  # 1 of 4: its success kept
    assert ids[2] not in hook.buffer  # nothing to keep
    assert hook.count[ids[3]] == 2
    assert hook.started  # solve rate 7 / 16 > 0.35
    rec = hook.buffer[ids[1]][0]
    assert len(rec["logp"]) == len(rec["response_ids"]) and all(v <= 0 for v in rec["logp"])
    hook2 = ExGRPO(hook.o, 0)
    _store(t, hook2, [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert not hook2.started  # 1 / 16: replay stays off until the threshold


def test_without_retirement_a_solved_question_leaves_the_buffer_but_stays_in_the_draws(tiny_dir, tmp_path):
    import dataclasses

    draws = {}
    for retire in (True, False):
        t = get_algo("llm", "exgrpo").make(_cfg(tiny_dir, tmp_path, f"r{retire}"))
        hook = t.hooks[0]
        hook.o = dataclasses.replace(hook.o, exgrpo_retire=retire)
        batch = _store(t, hook, [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
        q = batch.problems[0].id
        assert q not in hook.buffer and q not in hook.count  # solved 4 of 4: out of the buffer either way
        assert (q in hook.retired) == retire
        t.cursor = 0  # the fresh draws start the same permutation again
        draws[retire] = [p.id for p in hook.select_problems(t, 4)]
    assert q not in draws[True] and q in draws[False]


def test_a_replayed_group_holds_one_stored_row_on_the_shaped_loss(tiny_dir, tmp_path):
    t = get_algo("llm", "exgrpo").make(_cfg(tiny_dir, tmp_path, "m"))
    hook = t.hooks[0]
    _store(t, hook, [[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0]])  # 7 / 16: replay on
    problems = hook.select_problems(t, 4)
    sizes = hook.group_sizes(t, problems)
    assert sizes == [4, 4, 3, 3] and len(hook._replayed) == 2  # rho 0.5: two of four questions from experience
    batch, _ = t.rollout.run(problems, sizes, t.gen)
    mixed = hook.after_rollout(t, batch)
    off = mixed.extras[OFFPOLICY]
    stored_rows = (off.sum(1) > 0).nonzero().squeeze(1).tolist()
    assert len(stored_rows) == 2 and mixed.rows == 16
    for g in mixed.index.unique().tolist():
        rows = (mixed.index == g).nonzero().squeeze(1).tolist()
        assert len(rows) == 4 and sum(r in stored_rows for r in rows) <= 1
    for r in stored_rows:
        assert torch.equal(off[r].bool(), mixed.completion_mask[r])
        assert (mixed.extras[STORED][r][mixed.completion_mask[r]] < 0).all()
        assert bool(mixed.correct[r])
    # the picked stored trajectory is the one of lowest mean token entropy among its question's
    assert "exgrpo/picked_entropy" in hook.metrics()


def test_the_entropy_pick_takes_the_lowest_mean_not_the_lowest_sum(tiny_dir, tmp_path, monkeypatch):
    """Hand case: trajectory A has 3 tokens of entropy 1.0 (mean 1.0, sum 3.0), B 1 token of 1.5 (mean 1.5, sum 1.5),
    C 2 tokens of 2.0; the pick is A (lowest mean token entropy); with --exgrpo-pick random it follows the hook's
    own generator."""
    t = get_algo("llm", "exgrpo").make(_cfg(tiny_dir, tmp_path, "pick"))
    hook = t.hooks[0]
    base = {"prompt_ids": [5, 6], "turn_ids": None, "score": 1.0, "correct": True, "truncated": False, "index": 0,
            "transcript": [], "infos": []}

    def rec(n: int, tag: int) -> dict:
        return {**base, "response_ids": [tag] * n, "completion_mask": [True] * n, "turn_ids": [0] * n,
                "token_rewards": [0.0] * (n - 1) + [1.0], "logp": [-1.0] * n}

    hook.buffer["q"] = [rec(3, 7), rec(1, 8), rec(2, 9)]
    level = {7: 1.0, 8: 1.5, 9: 2.0}

    class Out:
        def __init__(self, entropy):
            self.entropy = entropy

    def fake_forward(batch, with_entropy=False, **kw):
        first = batch.response_ids[:, 0].tolist()
        return Out(torch.tensor([level[f] for f in first])[:, None] * batch.completion_mask.float())

    monkeypatch.setattr(t.policy, "forward_batch", fake_forward)
    picked = hook.pick(t, ["q"])
    assert picked["q"]["response_ids"] == [7, 7, 7]
    assert hook._metrics["exgrpo/picked_entropy"] == pytest.approx(1.0)
    hook.o.exgrpo_pick = "random"
    state = hook.gen.get_state()
    draw = int(torch.randint(3, (1,), generator=torch.Generator().set_state(state)))
    assert hook.pick(t, ["q"])["q"] is hook.buffer["q"][draw]


@pytest.fixture(scope="module")
def warm_dir(tiny_dir, tmp_path_factory):
    """The tiny model after a short warm-up on toy-add: it solves some problems, so experience accumulates."""
    from reflectrl.llm.warmup import WarmupConfig, warmup

    out = tmp_path_factory.mktemp("warm") / "m"
    warmup(WarmupConfig(model=str(tiny_dir), task="toy-add", out=str(out), steps=120, batch_size=32, learning_rate=3e-3,
                        progress=False, max_new_tokens=3))
    return out


def test_exgrpo_resume_equals_uninterrupted_with_a_buffer(warm_dir, tmp_path):
    a = get_algo("llm", "exgrpo")
    a.make(_cfg(warm_dir, tmp_path, "full", exgrpo_start_rate=0.0)).learn()
    a.make(_cfg(warm_dir, tmp_path, "cut", updates=2, exgrpo_start_rate=0.0)).learn()
    cut = resume(tmp_path / "cut", 4)
    assert cut.hooks[0].buffer or cut.hooks[0].retired  # the checkpoint carried the experience
    cut.learn()
    strip = behaviour
    full = strip(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    assert strip(read_metrics(tmp_path / "cut" / "metrics.jsonl")) == full and full[-1]["exgrpo/replay_on"] == 1.0


def test_exgrpo_seed_llm_resume(tiny_dir, tmp_path):
    a = get_algo("llm", "exgrpo-seed")
    kw = dict(algo="exgrpo-seed", refl_min_memory=4, refl_coef_ramp=0.0)  # a flat coefficient: no schedule follows the budget
    a.make(_cfg(tiny_dir, tmp_path, "full", **kw)).learn()
    a.make(_cfg(tiny_dir, tmp_path, "cut", updates=2, **kw)).learn()
    resume(tmp_path / "cut", 4).learn()
    strip = behaviour
    full = strip(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    assert strip(read_metrics(tmp_path / "cut" / "metrics.jsonl")) == full
    assert "exgrpo-seed/refl_mean" in full[-1]
