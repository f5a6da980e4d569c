"""DAPO's dynamic sampling (``--filter-zero-std --max-gen-batches N``): flat groups are refilled with
groups of new problems until the update holds ``prompts_per_update`` informative groups."""

import pytest

from reflectrl.algos import build, config_for_algo
from reflectrl.errors import ConfigError
from reflectrl.llm.batch import RowResult, Segment, build_batch
from reflectrl.llm.rollout import RolloutStats


class _Done:
    """A finished rollout whose scores are scripted per call."""

    finished = True

    def __init__(self, batch, tokens):
        self.batch, self.stats = batch, RolloutStats(generated_tokens=tokens)

    def finish(self):
        return self.batch, self.stats


def scripted(trainer, script):
    """Replace the rollout by one that returns, at its k-th call, groups scored ``script[k]``; records the
    problems and group ids of each call."""
    calls = []

    def start(problems, group, gen, greedy=False, index_offset=0):
        scores = script[len(calls)]
        calls.append(([p.id for p in problems], index_offset))
        assert len(scores) == len(problems) * group
        rows = [RowResult([5], [Segment([7, 8], "policy", 0, s)], None, s, s >= 1, False, []) for s in scores]
        idx = [index_offset + i // group for i in range(len(scores))]
        probs = [p for p in problems for _ in range(group)]
        return _Done(build_batch(rows, idx, probs, trainer.policy.pad_id), 2 * len(rows))

    trainer.rollout.start = start
    return calls


FLAT = [0.0] * 4 + [1.0] * 4 + [0.0] * 4  # 3 groups of 2, every one flat
TWO = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]  # groups 0 and 2 informative


def make(tiny_dir, tmp_path, **kw):
    base = dict(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / "run"), updates=2, prompts_per_update=3,
                group_size=2, max_new_tokens=3, progress=False, tensorboard=False, save_interval=0,
                filter_zero_std=True)
    base.update(kw)
    algo = base.pop("algo", "grpo")
    return build("llm", algo, config_for_algo(algo, **base))


def test_refills_until_the_quota_and_drops_the_surplus(tiny_dir, tmp_path):
    t = make(tiny_dir, tmp_path, max_gen_batches=0)
    flat3 = [0.0] * 6
    calls = scripted(t, [flat3, TWO, TWO])
    rec = t.iteration()
    assert rec["groups/gen_batches"] == 3  # 0, then 2, then 4 informative groups: 3 are kept
    assert rec["groups/kept_rows"] == 3 * 2
    assert t.cursor == 9  # three batches of three new problems
    assert [off for _, off in calls] == [0, 3, 6]  # group ids distinct within the update
    assert len({p for ids, _ in calls for p in ids}) == 9  # new problems each round, not the same again
    assert rec["rollout/generated_tokens"] == 3 * 12  # every round's tokens are counted
    assert rec["groups/zero_std_frac"] == pytest.approx(5 / 9)  # over all sampled groups


def test_stops_at_max_gen_batches(tiny_dir, tmp_path):
    t = make(tiny_dir, tmp_path, max_gen_batches=2)
    scripted(t, [FLAT[:6], FLAT[:6], TWO])
    rec = t.iteration()
    assert rec["groups/gen_batches"] == 2 and rec["groups/kept_rows"] == 0 and t.cursor == 6


def test_one_batch_is_the_plain_filter(tiny_dir, tmp_path):
    t = make(tiny_dir, tmp_path)
    calls = scripted(t, [TWO, TWO])
    rec = t.iteration()
    assert len(calls) == 1 and rec["groups/kept_rows"] == 4 and "groups/gen_batches" not in rec


def test_needs_the_filter_and_a_count(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="--filter-zero-std"):
        make(tiny_dir, tmp_path, filter_zero_std=False, max_gen_batches=3)
    with pytest.raises(ConfigError, match="--max-gen-batches must be >= 0"):
        make(tiny_dir, tmp_path, max_gen_batches=-1)
    with pytest.raises(ConfigError, match="composes its own batches"):
        make(tiny_dir, tmp_path, algo="exgrpo", max_gen_batches=3)


def test_real_rollouts_concatenate(tiny_dir, tmp_path):
    """Unscripted: an untrained model scores 0 on toy-add, so every round is flat and all are sampled."""
    t = make(tiny_dir, tmp_path, algo="dapo", max_gen_batches=2, updates=1)
    rec = t.iteration()
    assert rec["groups/gen_batches"] == 2 and t.cursor == 6 and t.last_batch.rows == 12
    assert len(set(t.last_batch.index.tolist())) == 6
    assert all(v == v for v in rec.values() if isinstance(v, float))


def test_no_grad_pass_runs_on_the_kept_rows_only(tiny_dir, tmp_path):
    """With nothing but the loss reading the batch, the old log-probs come from a pass over the kept rows: the
    same numbers, bit for bit, as the pass over the whole refilled batch."""
    import torch

    t = make(tiny_dir, tmp_path, max_gen_batches=0, minibatches=2)  # two minibatches: old log-probs are needed
    scripted(t, [[0.0] * 6, TWO, TWO])
    seen, trained = [], []
    prepare = t.prepare
    t.prepare = lambda b: (seen.append(b.rows), prepare(b))[1]
    t.update = lambda b: (trained.append(b), {"losses/optimizer_steps": 0})[1]
    t.iteration()
    (train,) = trained
    assert seen == [6] and train.rows == 6 and train.old_logp.shape == train.response_ids.shape
    whole = t.last_batch  # 18 rows; the weights are unchanged (the update was replaced)
    prepare(whole)
    keep = torch.isin(whole.index, train.index.unique())
    assert torch.equal(whole.old_logp[keep][:, :train.steps], train.old_logp)
