"""Keeping each row's KV cache across the turns of its episode (``--engine-options reuse_cache=true``) gives the
re-prefill path's episodes, greedy and sampled with the same generator, while prefilling only what each turn
added."""

from __future__ import annotations

import pytest
import torch

from reflectrl.llm.engines import TorchSampler, make_engine
from reflectrl.llm.kv_reuse import Kept, KeptContexts
from reflectrl.llm.rollout import Rollout
from reflectrl.tasks.base import get_task


def _episodes(policy, reuse: bool, greedy: bool, seed: int = 0):
    task = get_task("toy-guess")
    engine = make_engine("torch", policy, temperature=1.0, reuse_cache=reuse)
    ro = Rollout(policy, engine, task, max_new_tokens=4, max_turns=3, max_response_tokens=64, gen_batch=16)
    problems = task.problems("train")[:6]
    batch, stats = (ro.run(problems, 4, torch.Generator().manual_seed(seed)) if not greedy else
                    ro.run(problems, 1, torch.Generator().manual_seed(seed), greedy=True))
    ro.close()
    return batch, engine


@pytest.mark.parametrize("greedy", [True, False])
def test_the_same_episodes_as_prefilling_every_turn_again(tiny_policy, greedy):
    plain, _ = _episodes(tiny_policy, False, greedy)
    kept, engine = _episodes(tiny_policy, True, greedy)
    assert plain.transcripts == kept.transcripts
    assert torch.equal(plain.response_ids, kept.response_ids)
    assert max(len(t) for t in plain.transcripts) > 3  # some episode took more than one turn
    assert engine.reused_tokens > 0  # and its next turn started from the kept cache


def test_the_kept_cache_gives_the_prefill_logits(tiny_policy):
    """After a call, the next turn's first logits from the kept keys and values equal a fresh prefill's."""
    g = torch.Generator().manual_seed(3)
    prompts = [[5, 6, 7], [8, 9], [5, 6, 7, 1, 2]]
    engine = TorchSampler(tiny_policy, reuse_cache=True)
    outs = engine.generate(prompts, 4, g, greedy=True)
    nexts = [p + o + [3, 4] for p, o in zip(prompts, outs)]  # the reply appended, as the rollout does
    assert len(engine.kept) == 3
    with torch.inference_mode():
        logits, *_ = engine._start(nexts)
        fresh, *_ = tiny_policy.prefill_shared(nexts)
    assert len(engine.kept) == 0  # each kept row is used once
    torch.testing.assert_close(logits, fresh, rtol=1e-4, atol=1e-4)


def test_new_weights_drop_what_was_kept(tiny_policy):
    engine = TorchSampler(tiny_policy, reuse_cache=True)
    engine.generate([[5, 6]], 2, torch.Generator().manual_seed(0))
    assert len(engine.kept) == 1
    engine.sync(tiny_policy)
    assert len(engine.kept) == 0


def test_a_kept_context_is_found_only_as_an_exact_prefix():
    store = KeptContexts()
    store.keep([1, 2, 3], Kept([1, 2, 3, 9, 8], [(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))], 0,
                               torch.arange(5)))
    assert store.take([1, 2, 4, 9]) == (0, None)  # not a prefix
    m, hit = store.take([1, 2, 3, 9, 7, 7])
    assert hit is not None and m == 4  # the kept tokens agree up to 9, then the new context differs
    assert store.take([1, 2, 3, 9, 8, 7]) == (0, None)  # used once
    assert len(store) == 0 and store.lengths == {}


@pytest.fixture(scope="module")
def char_policy(tmp_path_factory):
    """A random-init tiny model with the tasks' character set: its turns run to the token limit."""
    from reflectrl.llm.policy import load_policy
    from reflectrl.llm.tiny import init_tiny

    return load_policy(init_tiny(tmp_path_factory.mktemp("kv") / "tiny", layers=1, width=32, heads=2, seed=1))


@pytest.mark.parametrize("name", ["text2sql", "rag"])
def test_every_multi_turn_task_gives_the_same_episodes(char_policy, name):
    task = get_task(name)
    out = {}
    for reuse in (False, True):
        engine = make_engine("torch", char_policy, reuse_cache=reuse)
        ro = Rollout(char_policy, engine, task, max_new_tokens=12, max_turns=4, max_response_tokens=256, gen_batch=8)
        batch, _ = ro.run(task.problems("train")[:2], 4, torch.Generator().manual_seed(5))
        ro.close()
        out[reuse] = (batch.transcripts, batch.response_ids, getattr(engine, "reused_tokens", 0))
    assert out[False][0] == out[True][0] and torch.equal(out[False][1], out[True][1])
    assert out[True][2] > 0


def test_the_trainer_keeps_the_cache_where_an_episode_has_several_turns(tiny_dir, tmp_path):
    from reflectrl.algos import config_for_algo
    from reflectrl.llm.grpo import GRPO

    def engine(**kw):
        cfg = config_for_algo("grpo", model=str(tiny_dir), run_dir=str(tmp_path / "_".join(map(str, kw.values()))),
                              progress=False, tensorboard=False, **kw)
        trainer = GRPO(cfg)
        trainer.rollout.close()
        return trainer.engine

    assert engine(task="toy-add").kept is None  # one turn: nothing to keep
    assert engine(task="toy-guess").kept is not None
    assert engine(task="toy-add", self_report="confidence").kept is None  # a single-turn task's report: not kept
    assert engine(task="toy-add", self_report="confidence", engine_options=("reuse_cache=true",)).kept is not None
    assert engine(task="toy-guess", engine_options=("reuse_cache=false",)).kept is None


def test_the_rows_of_a_group_each_keep_their_own_cache():
    """Rows that were given the same context (a group) are kept side by side; each new context takes the one whose
    tokens it continues."""
    store = KeptContexts()
    blank = [(torch.zeros(1, 1, 6, 2), torch.zeros(1, 1, 6, 2))]
    store.keep([1, 2], Kept([1, 2, 5, 5, 5], blank, 0, torch.ones(6, dtype=torch.bool)))
    store.keep([1, 2], Kept([1, 2, 7, 7, 7], blank, 0, torch.ones(6, dtype=torch.bool)))
    assert len(store) == 2
    m, hit = store.take([1, 2, 7, 7, 7, 9, 9])
    assert hit is not None and hit.tokens[2] == 7 and m == 5
    m, hit = store.take([1, 2, 5, 5, 5, 9])
    assert hit is not None and hit.tokens[2] == 5 and m == 5
    assert len(store) == 0
