"""The GRPO trainer: zero-variance groups, gradient accumulation, end-to-end train and bitwise resume."""

import json

import pytest
import torch
from safetensors.torch import load_file

from reflectrl.algos import config_for_algo, resume
from reflectrl.llm.batch import RowResult, Segment, build_batch
from reflectrl.llm.episodes import reward_metrics
from reflectrl.llm.grpo import GRPO, GRPOHook
from reflectrl.runlog import behaviour, read_metrics
from reflectrl.trainer import CHECKPOINT


def cfg(tiny_dir, tmp_path, name="run", **kw):
    base = dict(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / name), updates=4, prompts_per_update=3,
                group_size=4, max_new_tokens=3, learning_rate=3e-3, progress=False, tensorboard=False,
                save_interval=1, sample_interval=2, reward_workers=2, gen_batch=5)
    base.update(kw)
    return config_for_algo(base.pop("algo", "grpo"), **base)


def scored_batch(scores, group_size):
    rows = [RowResult([5], [Segment([7, 8], "policy", 0, s)], None, s, s >= 1, False, []) for s in scores]
    return build_batch(rows, [i // group_size for i in range(len(scores))], [], 0)


@pytest.mark.parametrize("algo", ["grpo", "drgrpo"])
def test_zero_variance_groups_get_zero_advantage(tiny_dir, tmp_path, algo):
    trainer = GRPO(cfg(tiny_dir, tmp_path, algo=algo, prompts_per_update=3, group_size=2))
    b = scored_batch([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2)
    trainer.advantages(b)
    adv = b.advantages[:, 0]
    assert adv[[0, 1, 4, 5]].abs().max() == 0
    if algo == "grpo":  # (s - mean) / (std + eps), unbiased std of [0, 1] is 0.7071
        assert adv[2].item() == pytest.approx(-0.5 / (2 ** -0.5 + 1e-6)) and adv[3] == -adv[2]
    else:
        assert adv[2].item() == pytest.approx(-0.5) and adv[3].item() == pytest.approx(0.5)
    assert (b.advantages[~b.completion_mask] == 0).all() and (b.advantages[:, 1] == b.advantages[:, 0]).all()
    m = reward_metrics(b)
    assert m["groups/zero_std_frac"] == pytest.approx(2 / 3) and m["accuracy"] == 0.5


def test_all_zero_variance_batch_trains_without_nan(tiny_dir, tmp_path):
    """An untrained model on toy-add scores 0 everywhere: every group has zero variance, the update is a
    no-op step (zero advantages), and with filter_zero_std it is skipped; nothing becomes nan."""
    for algo in ("grpo", "dapo"):
        t = GRPO(cfg(tiny_dir, tmp_path, name=algo, algo=algo, updates=1))
        before = {k: v.clone() for k, v in t.policy.trainable_state().items()}
        rec = t.iteration()
        assert rec["groups/zero_std_frac"] == 1.0 and rec["reward/std"] == 0.0
        assert all(v == v for v in rec.values() if isinstance(v, float))
        after = t.policy.trainable_state()
        assert all(torch.equal(before[k], after[k]) for k in before)


def test_grad_accumulation_equals_one_batch(tiny_dir, tmp_path):
    b = scored_batch([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], 3)
    b.response_ids[:, 1] = torch.tensor([8, 9, 10, 11, 12, 13])
    b.completion_mask[4, 1] = False  # rows of unequal length
    params = []
    for accum, mode in [(1, "token-mean"), (3, "token-mean"), (1, "seq-mean-token-mean"), (2, "seq-mean-token-mean")]:
        t = GRPO(cfg(tiny_dir, tmp_path, grad_accum=accum, loss_agg_mode=mode, prompts_per_update=2, group_size=3))
        t.advantages(b)
        t.update_idx = 1
        t.update(b)
        params.append(torch.cat([p.grad.flatten() for p in t.policy.trainable_parameters()]))
    assert torch.allclose(params[0], params[1], atol=1e-7, rtol=1e-4)  # the gradients (Adam amplifies noise)
    assert torch.allclose(params[2], params[3], atol=1e-7, rtol=1e-4)
    assert not torch.allclose(params[0], params[2], atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_identical_rows_merged_exactly(tiny_dir, tmp_path, mode):
    """Training once per distinct row, weighted by its count, gives the update of the full batch."""
    b = scored_batch([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 3)
    b.response_ids[:, 1] = torch.tensor([8, 8, 9, 10, 11, 11])  # rows 0-1 and 4-5 are identical
    b.completion_mask[2, 1] = False
    params, stats = [], []
    for dedupe in (False, True):
        t = GRPO(cfg(tiny_dir, tmp_path, dedupe=dedupe, loss_agg_mode=mode, prompts_per_update=2, group_size=3,
                     kl_coef=0.1, entropy_coef=0.01))
        t.prepare(b)
        t.advantages(b)
        if dedupe:
            rows, counts = t.distinct_rows(b)
            assert rows.rows == 4 and counts.tolist() == [2, 1, 1, 2]
        t.update_idx = 1
        stats.append(t.update(b))
        params.append(torch.cat([p.grad.flatten() for p in t.policy.trainable_parameters()]))
    assert torch.allclose(params[0], params[1], atol=1e-7, rtol=1e-4)  # the gradients (Adam amplifies noise)
    for k in ("losses/policy_loss", "losses/entropy", "losses/kl", "losses/clipfrac"):
        assert stats[0][k] == pytest.approx(stats[1][k], abs=1e-6), k


class Interrupt(GRPOHook):
    changes_batch = True

    def __init__(self, at):
        self.at = at

    def after_rollout(self, trainer, batch):
        if trainer.update_idx == self.at:
            raise KeyboardInterrupt


def strip_timing(recs):
    return behaviour(recs)


def test_train_then_resume_equals_uninterrupted(tiny_dir, tmp_path):
    extra = dict(ppo_epochs=2, minibatches=2, grad_accum=2, kl_coef=0.05, clip_high=0.28)
    full = GRPO(cfg(tiny_dir, tmp_path, "full", **extra))
    summary = full.learn()
    assert summary["updates"] == 4 and summary["global_step"] == 4 * 12
    cut = GRPO(cfg(tiny_dir, tmp_path, "cut", **extra), hooks=[Interrupt(3)])
    with pytest.raises(KeyboardInterrupt):
        cut.learn()
    assert len(read_metrics(tmp_path / "cut" / "metrics.jsonl")) == 2
    cut_cfg = json.loads((tmp_path / "cut" / "config.json").read_text())
    assert cut_cfg["kind"] == "llm" and cut_cfg["algo"] == "grpo"
    resume(tmp_path / "cut").learn()
    a = strip_timing(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    b = strip_timing(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
    assert len(a) == 4 and a == b
    ta, tb = load_file(str(tmp_path / "full" / CHECKPOINT)), load_file(str(tmp_path / "cut" / CHECKPOINT))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    rec = a[-1]
    for key in ("reward/mean", "reward/std", "accuracy", "groups/zero_std_frac", "completion/mean_length",
                "losses/clipfrac", "losses/kl", "losses/entropy", "losses/approx_kl", "losses/grad_norm"):
        assert key in rec, key
    samples = [json.loads(l) for l in (tmp_path / "cut" / "samples.jsonl").read_text().splitlines()]
    assert [s["update"] for s in samples] == [1, 1, 1, 2, 2, 2, 4, 4, 4]
    assert (tmp_path / "full" / "model" / "config.json").is_file()


def test_extending_a_finished_run_equals_a_fresh_run_and_a_linear_lr_warns(tiny_dir, tmp_path, recwarn):
    GRPO(cfg(tiny_dir, tmp_path, "fresh")).learn()
    GRPO(cfg(tiny_dir, tmp_path, "short", updates=2)).learn()
    resume(tmp_path / "short", 4).learn()
    assert not [w for w in recwarn if "follow the budget" in str(w.message)]
    a = strip_timing(read_metrics(tmp_path / "fresh" / "metrics.jsonl"))
    b = strip_timing(read_metrics(tmp_path / "short" / "metrics.jsonl"))
    assert len(a) == 4 and a == b
    GRPO(cfg(tiny_dir, tmp_path, "linear", updates=2, lr_schedule="linear")).learn()
    with pytest.warns(UserWarning, match="--updates from 2 to 4 moves the schedule of --lr-schedule linear"):
        resume(tmp_path / "linear", 4)


class DoubleReward:
    """A stand-in method (fit/shape protocol): doubles each reward and halves every advantage weight."""

    fit_first = True

    def __init__(self):
        self.seen = None

    def fit(self, sb):
        self.seen = sb

    def shape(self, sb):
        from reflectrl.contract.base import Shaping

        return Shaping(reward_delta=sb.rewards, weights=torch.full_like(sb.rewards, 0.5))

    def metrics(self):
        return {"double/fits": 1.0}


def test_method_shapes_rewards_and_weights(tiny_dir, tmp_path):
    from reflectrl.contract.base import MethodRunner

    m = DoubleReward()
    t = GRPO(cfg(tiny_dir, tmp_path, prompts_per_update=2, group_size=3, updates=1), methods=[MethodRunner(m)])
    b = scored_batch([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], 3)
    t.prepare(b)
    t.advantages(b)
    ref = b.advantages.clone()
    t.apply_methods(b)
    sb = m.seen
    assert sb.states.shape == (6, 2, t.policy.hidden_size) and sb.mask.tolist() == [[1.0, 1.0]] * 6
    assert sb.episode_end.int().tolist() == [[0, 1]] * 6 and sb.group_size == 3
    assert torch.equal(b.token_rewards[:, 1], 2 * torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0]))
    assert torch.allclose(b.advantages, ref, atol=1e-5)  # GRPO's std normalization absorbs the doubling
    assert (b.weights == 0.5).all()


def test_prepare_overlaps_last_rewards_with_same_numbers(tiny_dir, tmp_path):
    """The old-log-prob pass runs while the last chunk's rewards are computing; with a hook that reads
    the rollout first, it runs after them. Both orders train to the same numbers."""
    import time

    def run(name, hooks):
        t = GRPO(cfg(tiny_dir, tmp_path, name=name, updates=2, minibatches=2, learning_rate=1e-2), hooks=hooks)
        starts, ends = [], []
        task = t.rollout.task
        score = task.score

        def slow(problem, completion):
            time.sleep(0.15)
            out = score(problem, completion)
            ends.append(time.perf_counter())
            return out

        task.score = slow  # the single-turn env calls task.score on the reward threads
        prepare = t.prepare

        def watched(batch):
            started = time.perf_counter()
            prepare(batch)
            starts.append(started)

        t.prepare = watched

        def one():
            ends.clear()
            rec = t.iteration()
            return rec, starts[-1] < max(ends)  # did prepare start before the last reward came in?

        out = [one() for _ in range(2)]
        recs = [r for r, _ in out]
        seen = [o for _, o in out]
        t.rollout.close()
        return seen, recs, t.policy.trainable_state()

    class Reader(GRPOHook):  # after_rollout: sees the finished batch before prepare
        changes_batch = True

        def after_rollout(self, trainer, batch):
            assert batch.scores.shape[0] == batch.rows
            return None

    seen_early, recs_early, state_early = run("early", [])
    seen_late, recs_late, state_late = run("late", [Reader()])
    assert seen_early == [True, True] and seen_late == [False, False]
    numbers = lambda r: {k: v for k, v in r.items() if not k.startswith("time/") and k != "charts/tokens_per_s"}
    assert [numbers(r) for r in recs_early] == [numbers(r) for r in recs_late]
    assert all(torch.equal(state_early[k], state_late[k]) for k in state_early)


def test_an_update_logs_where_its_time_went(tiny_dir, tmp_path):
    """The phases of benchmarks/llm_profile.py: prefill is part of generation, and the named phases fit in the update."""
    trainer = GRPO(cfg(tiny_dir, tmp_path, updates=1))
    rec = trainer.iteration()
    trainer.rollout.close()
    assert 0 < rec["time/prefill"] <= rec["time/generate"]
    named = rec["time/generate"] + rec["time/reward_wait"] + rec["time/prepare"] + rec["time/update"]
    assert 0 < named <= rec["time/iteration"] + 1e-9
