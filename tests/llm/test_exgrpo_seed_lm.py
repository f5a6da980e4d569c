"""exgrpo-seed's language-model reflector (``--refl-reflector lm``): grades parsed to [-1, 1] on hand cases; the
grader reads the episode as the agent saw it, then the question; the term on a hand-made batch; grading every N
updates; the pass draws no random numbers and sends no gradient (a zero-weight run equals GRPO); resume equals
uninterrupted; bad options give one clear error."""

import math

import pytest
import torch

from reflectrl.algos import get_algo, resume
from reflectrl.contract.base import StepBatch
from reflectrl.errors import ConfigError, ReflectRLError
from reflectrl.llm.judge import LM_REFLECTION, agreement, grade
from reflectrl.methods.exgrpo_seed import ExGRPOSeed, ExGRPOSeedOptions
from reflectrl.runlog import behaviour, read_metrics
from reflectrl.tasks.selfreport import QUESTIONS


def _cfg(model, tmp_path, name, algo="exgrpo-seed", **kw):
    base = dict(task="toy-add", model=str(model), run_dir=str(tmp_path / name), updates=4, prompts_per_update=4,
                group_size=4, max_new_tokens=3, learning_rate=3e-3, progress=False, tensorboard=False, save_interval=2,
                sample_interval=0, reward_workers=0, gen_batch=8, export_model=False, minibatches=2)
    if algo == "exgrpo-seed":
        base.update(refl_reflector="lm", refl_coef_ramp=0.0)
    base.update(kw)
    return get_algo("llm", algo).config(**base)


def test_grades_on_hand_cases():
    assert grade("reflect", "solved") == 1.0 and grade("reflect", " unsolved\n") == -1.0
    assert grade("reflect", "<reflect>unsolved</reflect>") == -1.0
    assert grade("confidence", "0.75") == 0.5 and grade("confidence", "<confidence>0</confidence>") == -1.0
    for kind, text in (("reflect", "maybe"), ("reflect", ""), ("reflect", None), ("confidence", "1.5"),
                       ("confidence", "sure")):
        assert math.isnan(grade(kind, text)), (kind, text)


def test_agreement_with_the_outcome_on_hand_cases():
    grades = torch.tensor([1.0, -1.0, math.nan, 0.5, -0.2, 0.0])
    correct = torch.tensor([True, True, False, False, False, False])
    assert agreement(grades, correct) == pytest.approx(0.6)  # rows 0, 4 and 5 agree, 1 and 3 do not, 2 is not graded
    assert math.isnan(agreement(torch.full((3,), math.nan), torch.ones(3, dtype=torch.bool)))


def test_the_grader_reads_the_episode_then_the_question(tiny_dir, tmp_path):
    t = get_algo("llm", "exgrpo-seed").make(_cfg(tiny_dir, tmp_path, "p", task="toy-guess", max_turns=3))
    hook = t.hooks[0]
    batch, _ = t.rollout.run(t.next_problems(2), 4, t.gen)
    tok = t.policy.tokenizer
    for r, ids in enumerate(hook.prompts(t, batch)):
        text = tok.decode(ids, skip_special_tokens=True)
        episode = batch.problems[r].prompt + "".join(
            tok.decode(batch.response_ids[r][batch.response_attention[r]], skip_special_tokens=True))
        assert text == episode + QUESTIONS["reflect"]
    assert any(" no;" in tok.decode(batch.response_ids[r]) for r in range(batch.rows))  # feedback is in context


def test_an_episode_past_the_graders_position_limit_is_not_graded(tiny_dir, tmp_path):
    t = get_algo("llm", "exgrpo-seed").make(_cfg(tiny_dir, tmp_path, "long"))
    hook = t.hooks[0]
    batch, _ = t.rollout.run(t.next_problems(2), 4, t.gen)
    own = hook.prompts
    hook.prompts = lambda tr, b: [p + p[-1:] * (40 * (i % 2)) for i, p in enumerate(own(tr, b))]  # odd rows longer
    lengths = [len(p) for p in hook.prompts(t, batch)]
    limit = t.policy.config.max_position_embeddings
    hook.max_new_tokens = limit - min(lengths)  # only the shortest prompts still fit
    t.update_idx = 1
    hook.after_prepare(t, batch)
    grades = batch.extras[LM_REFLECTION]
    skipped = torch.tensor([n + hook.max_new_tokens > limit for n in lengths])
    assert bool(skipped.any()) and bool((~skipped).any())
    assert bool(grades[skipped].isnan().all())
    assert hook.metrics()["exgrpo-seed/lm_too_long_frac"] == float(skipped.float().mean())


def test_the_term_of_external_grades_on_a_hand_made_batch():
    opts = ExGRPOSeedOptions(refl_coef_start=0.2, refl_coef_end=0.2, refl_coef_ramp=0.0, refl_scale="none")
    m = ExGRPOSeed(3, 4, opts, seed=0, external="lm_reflection")
    R, T = 4, 3
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float32)
    end = torch.zeros(R, T, dtype=torch.bool)
    end[torch.arange(R), mask.sum(1).long() - 1] = True
    z = torch.zeros(R, T)
    sb = StepBatch(states=torch.randn(R, T, 3), features=torch.randn(R, T, 3), rewards=end.float(), values=z,
                   advantages=z, returns=z, episode_end=end, terminated=end, next_values=z, mask=mask, whole_rows=True,
                   info={"lm_reflection": torch.tensor([1.0, -1.0, math.nan, 0.5])})
    sh = m.shape(sb)
    expected = torch.zeros(R, T)
    expected[end] = torch.tensor([0.2, -0.2, 0.0, 0.1])
    assert torch.allclose(sh.reward_delta, expected)
    assert m.metrics()["exgrpo-seed/refl_kept_frac"] == 0.75
    m.fit(sb)
    assert m.rm.fits == 0 and m.rm.memory.size == 4  # nothing to train: the memory keeps returns for the scale
    sb.info = {}
    assert m.shape(sb).reward_delta is None  # not graded this update: no term


def test_grading_every_n_updates(tiny_dir, tmp_path):
    t = get_algo("llm", "exgrpo-seed").make(_cfg(tiny_dir, tmp_path, "every", refl_every=2))
    t.learn()
    recs = read_metrics(tmp_path / "every" / "metrics.jsonl")
    assert [("exgrpo-seed/lm_graded" in r, "exgrpo-seed/refl_mean" in r) for r in recs] == [(False, False), (True, True)] * 2
    assert recs[1]["exgrpo-seed/lm_graded"] == 16 and 0 <= recs[1]["exgrpo-seed/lm_malformed_frac"] <= 1
    b = t.last_batch
    want = agreement(b.extras[LM_REFLECTION], b.correct)
    assert ("exgrpo-seed/lm_agreement" in recs[-1]) == (not math.isnan(want))  # logged only when something was graded
    assert math.isnan(want) or recs[-1]["exgrpo-seed/lm_agreement"] == want
    assert LM_REFLECTION in t.last_batch.extras


def test_a_zero_weight_grader_leaves_the_run_equal_to_grpo(tiny_dir, tmp_path):
    """Grading draws nothing from the run's random streams and sends no gradient: at weight 0 the policy's metrics
    equal GRPO's bit for bit."""
    get_algo("llm", "grpo").make(_cfg(tiny_dir, tmp_path, "grpo", algo="grpo")).learn()
    get_algo("llm", "exgrpo-seed").make(_cfg(tiny_dir, tmp_path, "lm", refl_coef_start=0.0, refl_coef_end=0.0)).learn()
    # the method's own records, and the trained reward a run with a method logs (equal to the score here)
    skip = ("exgrpo-seed/", "time/", "method/", "reward/trained")
    keys = lambda recs: [{k: v for k, v in r.items() if not k.startswith(skip)} for r in behaviour(recs)]
    lm_recs = read_metrics(tmp_path / "lm" / "metrics.jsonl")
    assert all(r["reward/trained_mean"] == r["reward/mean"] for r in lm_recs)
    grpo, lm = (read_metrics(tmp_path / n / "metrics.jsonl") for n in ("grpo", "lm"))
    assert keys(lm) == keys(grpo) and all("exgrpo-seed/lm_graded" in r for r in lm)


def test_resume_equals_uninterrupted_with_the_lm_reflector(tiny_dir, tmp_path):
    a = get_algo("llm", "exgrpo-seed")
    a.make(_cfg(tiny_dir, tmp_path, "full")).learn()
    a.make(_cfg(tiny_dir, tmp_path, "cut", updates=2)).learn()
    resume(tmp_path / "cut", 4).learn()
    full = behaviour(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    assert behaviour(read_metrics(tmp_path / "cut" / "metrics.jsonl")) == full
    assert "exgrpo-seed/lm_graded" in full[-1]


def test_another_model_grades_through_its_own_tokenizer(tiny_dir, tmp_path):
    from reflectrl.llm.tiny import init_tiny

    other = init_tiny(tmp_path / "other", layers=1, width=32, heads=2, max_positions=128, seed=5)
    t = get_algo("llm", "exgrpo-seed").make(_cfg(tiny_dir, tmp_path, "other_run", reflector_model=str(other),
                                                 updates=1))
    t.learn()
    assert t.hooks[0].judge is not None and t.hooks[0].judge is not t.policy
    assert not any(p.requires_grad for p in t.hooks[0].judge.model.parameters())
    assert t.last_batch.extras[LM_REFLECTION].shape == (16,)


def test_bad_reflector_options_give_one_clear_error(tiny_dir, tmp_path):
    with pytest.raises(ReflectRLError, match="does not exist"):
        get_algo("llm", "exgrpo-seed").make(_cfg(tiny_dir, tmp_path, "x", reflector_model=str(tmp_path / "nowhere")))
    with pytest.raises(ConfigError, match="--refl-reflector lm"):
        _cfg(tiny_dir, tmp_path, "y", refl_reflector="network", reflector_model=str(tiny_dir)).validate()
    with pytest.raises(ConfigError, match="reflector-max-new-tokens"):
        _cfg(tiny_dir, tmp_path, "z", reflector_max_new_tokens=0).validate()


@pytest.mark.parametrize("credit", ["terminal", "advantage"])
def test_whole_rows_give_the_episodes_and_term_of_the_assembler(credit):
    """The assembler's whole-row path (the LLM: padding after an episode is not a next episode) cuts a first batch
    into the same episodes as its stream path, so both give the same pooled states, returns and shaping, bit for
    bit; the term is placed on each episode's steps and nowhere else."""
    g = torch.Generator().manual_seed(3)
    R, T, F = 6, 5, 4
    lengths = torch.tensor([5, 2, 3, 1, 4, 2])
    mask = (torch.arange(T) < lengths[:, None]).float()
    end = torch.zeros(R, T, dtype=torch.bool)
    end[torch.arange(R), lengths - 1] = True
    z = torch.zeros(R, T)
    sb = StepBatch(states=torch.randn(R, T, F, generator=g), features=torch.zeros(R, T, F),
                   rewards=torch.randn(R, T, generator=g) * mask, values=z, advantages=z, returns=z, episode_end=end,
                   terminated=end, next_values=z, mask=mask, info={"lm_reflection": torch.rand(R, generator=g) * 2 - 1})
    out = []
    for whole in (True, False):
        opts = ExGRPOSeedOptions(refl_coef_start=0.3, refl_coef_end=0.3, refl_coef_ramp=0.0, refl_credit=credit)
        m = ExGRPOSeed(F, R, opts, seed=0, external="lm_reflection")
        m.rm.memory.add(pooled=torch.randn(8, F, generator=torch.Generator().manual_seed(1)), returns=torch.arange(8.0))
        sb.whole_rows = whole
        sh = m.shape(sb)
        out.append((m._new, sh.reward_delta if credit == "terminal" else sh.advantage_delta))
    (new_w, delta_w), (new_s, delta_s) = out
    assert torch.equal(new_w[0], new_s[0]) and torch.equal(new_w[1], new_s[1])
    assert torch.equal(delta_w, delta_s) and bool((delta_w != 0).any())
    if credit == "advantage":
        assert torch.equal(delta_w != 0, mask.bool())  # every step of each episode, nothing after it


def test_the_llm_default_credit_enters_after_the_group_normalization():
    """On GRPO a terminal reward is std-normalized with the group (a full-size advantage in a group that scored
    alike), so the LLM form defaults to the advantage credit; the control form keeps the terminal one."""
    llm = get_algo("llm", "exgrpo-seed").config(task="toy-add", model="unused")
    assert llm.refl_credit == "advantage" and get_algo("control", "exgrpo-seed").config().refl_credit == "terminal"
    R, T = 2, 3
    end = torch.zeros(R, T, dtype=torch.bool)
    end[:, 2] = True
    z = torch.zeros(R, T)
    sb = StepBatch(states=torch.randn(R, T, 3), features=z[..., None], rewards=end.float(), values=z, advantages=z,
                   returns=z, episode_end=end, terminated=end, next_values=z, mask=torch.ones(R, T), whole_rows=True,
                   progress=1.0, info={"lm_reflection": torch.tensor([1.0, -1.0])})
    sh = ExGRPOSeed(3, R, llm, seed=0, external="lm_reflection").shape(sb)
    assert sh.reward_delta is None and sh.advantage_delta is not None
    assert torch.equal(sh.advantage_delta[0] > 0, torch.ones(T, dtype=torch.bool))
