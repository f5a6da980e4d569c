"""Generation engines and the (multi-turn) rollout."""

import torch

from reflectrl.llm.batch import TokenBatch
from reflectrl.llm.engines import HFGenerate, TorchSampler, make_engine
from reflectrl.llm.rollout import Rollout
from reflectrl.tasks.base import get_task


def prompts(policy, texts):
    return [policy.tokenizer(t)["input_ids"] for t in texts]


def test_kv_cache_sampler_matches_generate_and_full_forward(tiny_policy):
    """Greedy decoding of the KV-cache loop equals ``model.generate``, with or without dropping finished
    rows, and a sampled completion's log-probs from one full forward match the sampling distribution."""
    ps = prompts(tiny_policy, ["1+2=", "33+4=", "7-15=", "9=", "33+4="])  # a repeated prompt shares its prefill
    g = torch.Generator().manual_seed(0)
    a = TorchSampler(tiny_policy).generate(ps, [6, 3, 6, 1, 6], g, greedy=True)
    b = TorchSampler(tiny_policy, prune_frac=2.0).generate(ps, [6, 3, 6, 1, 6], g, greedy=True)
    c = HFGenerate(tiny_policy).generate(ps, [6, 3, 6, 1, 6], g, greedy=True)
    assert a == b == c
    assert [len(x) for x in a][1] <= 3 and len(a[3]) == 1 and a[4][:len(a[1])] == a[1]
    s1 = TorchSampler(tiny_policy).generate(ps, 5, torch.Generator().manual_seed(1))
    s2 = TorchSampler(tiny_policy).generate(ps, 5, torch.Generator().manual_seed(1))
    assert s1 == s2


def test_multi_turn_feedback_is_context_not_loss(tiny_policy):
    task = get_task("toy-guess")
    ro = Rollout(tiny_policy, make_engine("torch", tiny_policy), task, max_new_tokens=3, max_turns=3,
                 max_response_tokens=64, gen_batch=2)
    batch, stats = ro.run(task.problems("train")[:2], 3, torch.Generator().manual_seed(0), index_offset=10)
    ro.close()
    assert batch.rows == 6 and batch.index.tolist() == [10, 10, 10, 11, 11, 11]
    fb_ids = tiny_policy.tokenizer(" no;", add_special_tokens=False)["input_ids"]
    for r in range(batch.rows):
        turns = [k for k, _ in batch.transcripts[r]]
        n_env = turns.count("env")
        assert turns.count("policy") == n_env + 1 and n_env <= 2
        assert int(batch.feedback_mask[r].sum()) == n_env * len(fb_ids)
        fb = batch.response_ids[r][batch.feedback_mask[r]].tolist()
        assert fb == fb_ids * n_env
        assert not (batch.completion_mask[r] & batch.feedback_mask[r]).any()
        # one reward per turn on its last policy token; the sum is the episode score
        assert float(batch.token_rewards[r].sum()) == float(batch.scores[r])
        assert set(batch.turn_ids[r][batch.completion_mask[r]].tolist()) == set(range(n_env + 1))
    assert stats.generated_tokens == int(batch.completion_mask.sum())
    # the env's info of every turn stays with its row, through storage (JSON-able entries) and selection
    for r in range(batch.rows):
        n_turns = [k for k, _ in batch.transcripts[r]].count("policy")
        assert [i["try"] for i in batch.infos[r]] == list(range(1, n_turns + 1))
        assert batch.infos[r][-1]["correct"] == bool(batch.correct[r])
    stored = TokenBatch.from_records(batch.to_records())
    assert stored.infos == [[{k: v for k, v in i.items() if k != "opaque"} for i in row] for row in batch.infos]
    assert batch.select([4, 1]).infos == [batch.infos[4], batch.infos[1]]
    assert TokenBatch.cat([batch.select([0]), batch.select([5])]).infos == [batch.infos[0], batch.infos[5]]
    out = tiny_policy.forward_batch(batch, with_entropy=True, with_hidden=True)
    assert out.logp.shape == batch.response_ids.shape and out.hidden.shape[:2] == batch.response_ids.shape
    assert (out.logp[~batch.response_attention] == 0).all()


def test_stop_sequences_cut_completion(tiny_policy):
    class Stops(type(get_task("toy-add"))):
        stop_sequences = ("3", "+")

    task = Stops()
    ro = Rollout(tiny_policy, make_engine("torch", tiny_policy), task, max_new_tokens=12, gen_batch=8)
    batch, _ = ro.run(task.problems("train")[:4], 4, torch.Generator().manual_seed(2))
    ro.close()
    stop_ids = set(ro.stop_ids)
    assert len(stop_ids) == 2
    for r in range(batch.rows):
        ids = batch.response_ids[r][batch.completion_mask[r]].tolist()
        assert not any(t in stop_ids for t in ids[:-1])  # nothing is generated past a stop
        text = batch.transcripts[r][-1][1]
        assert "3" not in text and "+" not in text


def test_single_turn_scores_are_computed_once(tiny_policy):
    """Duplicates within a rollout and completions seen in an earlier rollout reuse their score."""
    calls = []

    class Counting(type(get_task("toy-add"))):
        def score(self, problem, completion):
            calls.append((problem.id, completion))
            return super().score(problem, completion)

    task = Counting()
    ro = Rollout(tiny_policy, make_engine("torch", tiny_policy), task, max_new_tokens=1, gen_batch=4)
    probs = task.problems("train")[:2]
    b1, s1 = ro.run(probs, 8, torch.Generator().manual_seed(0))
    b2, s2 = ro.run(probs, 8, torch.Generator().manual_seed(1))
    ro.close()
    assert len(calls) == len(set(calls))  # never the same (problem, text) twice
    distinct = {(p.id, t[-1][1]) for b in (b1, b2) for p, t in zip(b.problems, b.transcripts)}
    assert len(calls) == len(distinct) and s1.cache_hits + s2.cache_hits == 32 - len(distinct)


def test_batch_scoring_one_call_per_chunk_same_rewards(tiny_policy):
    """A task with score_batch is called once per generated chunk (new completions only) and gives the
    same rewards, infos and cache behaviour as one env step per completion."""
    calls = []

    class Batched(type(get_task("toy-add"))):
        def score_batch(self, problems, texts):
            calls.append([(p.id, t) for p, t in zip(problems, texts)])
            return [(self.score(p, t), {"outcome": self.score(p, t), "batched": True}) for p, t in zip(problems, texts)]

    task = Batched()
    probs = task.problems("train")[:4]
    ro = Rollout(tiny_policy, make_engine("torch", tiny_policy), task, max_new_tokens=2, gen_batch=8)
    b1, s1 = ro.run(probs, 4, torch.Generator().manual_seed(0))
    b2, s2 = ro.run(probs, 4, torch.Generator().manual_seed(1))
    ro.close()
    assert 1 <= len(calls) <= 4  # 16 rows in chunks of 8, two rollouts; a chunk already scored makes no call
    flat = [x for c in calls for x in c]
    assert len(flat) == len(set(flat))
    distinct = {(p.id, t[-1][1]) for b in (b1, b2) for p, t in zip(b.problems, b.transcripts)}
    assert len(flat) == len(distinct) and s1.cache_hits + s2.cache_hits == 32 - len(distinct)
    assert all(info[-1].get("batched") for info in b1.infos)
    # the scoring calls were timed (an untimed path would leave the 0.0 defaults)
    assert s1.as_metrics()["time/reward"] > 0 and s1.as_metrics()["time/reward_wait"] > 0

    plain = Rollout(tiny_policy, make_engine("torch", tiny_policy), task, max_new_tokens=2, gen_batch=8,
                    batch_scoring=False)
    p1, _ = plain.run(probs, 4, torch.Generator().manual_seed(0))
    plain.close()
    assert torch.equal(p1.scores, b1.scores) and torch.equal(p1.response_ids, b1.response_ids)
    assert len(calls) <= 4  # the per-step path does not call score_batch


def test_batch_scoring_error_names_the_task(tiny_policy):
    import pytest

    from reflectrl.errors import ReflectRLError

    class Broken(type(get_task("toy-add"))):
        def score_batch(self, problems, texts):
            raise RuntimeError("verifier down")

    task = Broken()
    ro = Rollout(tiny_policy, make_engine("torch", tiny_policy), task, max_new_tokens=1, gen_batch=4)
    with pytest.raises(ReflectRLError, match=r"\(score_batch\) raised RuntimeError: verifier down"):
        ro.run(task.problems("train")[:2], 2, torch.Generator().manual_seed(0))
    ro.close()


def test_start_returns_before_last_rewards_and_finish_equals_run(tiny_policy):
    """``Rollout.start`` hands back the batch's final tokens while the last chunk's rewards are still
    computing; ``finish`` fills them into that batch, equal to a plain ``run`` with the same seed."""
    import threading

    gate = threading.Event()

    class Gated(type(get_task("toy-add"))):
        def score_batch(self, problems, texts):
            gate.wait(10)
            return [(self.score(p, t), {"n": len(t)}) for p, t in zip(problems, texts)]

    task = Gated()
    probs = task.problems("train")[:3]
    ro = Rollout(tiny_policy, make_engine("torch", tiny_policy), task, max_new_tokens=3, gen_batch=4,
                 reward_cache=0)
    pending = ro.start(probs, 4, torch.Generator().manual_seed(3))
    assert not pending.finished  # the gate is closed: no reward can have arrived
    early = pending.tokens()
    early.old_logp = torch.zeros(early.rows, early.steps)  # what the trainer sets in between is kept
    opener = threading.Timer(0.2, gate.set)  # the rewards arrive 0.2 s after finish() starts waiting for them
    opener.start()
    batch, stats = pending.finish()
    opener.join()
    assert batch is early and pending.finished and batch.old_logp is not None
    assert stats.env_wait_s >= 0.1  # the wait for the gate is counted as time waiting for rewards
    ref, _ = ro.run(probs, 4, torch.Generator().manual_seed(3))
    ro.close()
    for name in ("response_ids", "completion_mask", "token_rewards", "scores", "correct", "truncated"):
        assert torch.equal(getattr(batch, name), getattr(ref, name)), name
    assert batch.infos == ref.infos and all(len(i) == 1 for i in batch.infos)


def test_start_multi_turn_defers_only_the_last_turn(tiny_policy):
    task = get_task("toy-guess")
    probs = task.problems("train")[:2]
    ro = Rollout(tiny_policy, make_engine("torch", tiny_policy), task, max_new_tokens=2, max_turns=3, gen_batch=3)
    pending = ro.start(probs, 3, torch.Generator().manual_seed(5))
    batch, _ = pending.finish()
    ref, _ = ro.run(probs, 3, torch.Generator().manual_seed(5))
    ro.close()
    for name in ("response_ids", "completion_mask", "feedback_mask", "token_rewards", "scores", "truncated"):
        assert torch.equal(getattr(batch, name), getattr(ref, name)), name
