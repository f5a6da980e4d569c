"""gear and gear-seed on the LLM: segments and weights on hand-made divergences, the teacher's context (the
reference, and only there), no gradient through the teacher pass, the winners and omega of a hand-worked
group, and resume equals uninterrupted."""

import math

import pytest
import torch

from reflectrl.algos import get_algo, resume
from reflectrl.contract.base import MethodRunner, StepBatch
from reflectrl.contract.turns import GroupBaselineView
from reflectrl.llm.teacher import TeacherPass
from reflectrl.methods.gear import GEAR, GEAROptions, departures, segment_sources, teacher_weights
from reflectrl.methods.gear_seed import GearSeed, GearSeedOptions
from reflectrl.runlog import behaviour, read_metrics


def test_departures_by_each_rule():
    d = torch.tensor([[0.0, 0.1, 3.0, 0.2, -0.1, 0.0]])
    m = torch.ones(1, 6)
    assert departures(d, m, "absolute", 1.0).tolist() == [[False, False, True, False, False, False]]
    # z-scores within the row: 3.0 is the only one more than 2 std from the mean
    assert departures(d, m, "zscore", 2.0).tolist() == [[False, False, True, False, False, False]]
    assert departures(d, m, "quantile", 0.8).tolist() == [[False, False, True, False, False, False]]
    masked = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0, 1.0]])
    assert not departures(d, masked, "absolute", 1.0).any()  # a step outside the mask is never a departure


def test_segments_extend_by_entropy_and_end_at_a_boundary():
    dep = torch.tensor([[False, True, False, False, False, True, False]])
    ent = torch.tensor([[0.1, 2.0, 1.5, 0.2, 3.0, 1.0, 0.1]])
    m = torch.ones(1, 7)
    # departure at 1; 2 has high entropy (extends), 3 is sure (ends the segment, keeps its own step);
    # 4 is outside any segment; the departure at 5 starts a new one, 6 is sure and ends it
    assert segment_sources(dep, m, ent, 0.5).tolist() == [[0, 1, 1, 3, 4, 5, 6]]
    # without the entropy rule a segment runs to the next departure
    assert segment_sources(dep, m, ent, None).tolist() == [[0, 1, 1, 1, 1, 5, 5]]
    # a change of turn ends a segment
    turn = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    assert segment_sources(dep, m, ent, None, turn).tolist() == [[0, 1, 1, 3, 4, 5, 5]]


def test_weights_keep_the_sign_of_the_advantage():
    d = torch.tensor([[1.0, -1.0, 0.0, 5.0]])
    for a in (1.0, -2.0):
        adv = torch.full((1, 4), a)
        w = teacher_weights(d, adv, 0.5, 0.2)
        assert (w > 0).all() and torch.equal(torch.sign(w * adv), torch.sign(adv))
    # A > 0: exp(d) clipped to [0.8, 1.2]: d = 1 -> 1.2, d = -1 -> 0.8; lam 0.5: 0.5 + 0.5 * x
    w = teacher_weights(d, torch.ones(1, 4), 0.5, 0.2)
    torch.testing.assert_close(w, torch.tensor([[1.1, 0.9, 1.0, 1.1]]))
    # A < 0 flips the divergence's effect: a token the teacher likes less gets more weight on a bad answer
    w = teacher_weights(d, -torch.ones(1, 4), 0.5, 0.2)
    torch.testing.assert_close(w, torch.tensor([[0.9, 1.1, 1.0, 0.9]]))


def test_gear_shapes_segment_weights_from_the_departure_token():
    R, T = 1, 5
    adv = torch.ones(R, T)
    logp = torch.zeros(R, T)
    teacher = torch.tensor([[0.0, 0.0, 2.0, 0.0, 0.0]])  # a spike at 2
    z = torch.zeros(R, T)
    sb = StepBatch(states=z[..., None], features=z[..., None], rewards=z, values=z, advantages=adv, returns=adv,
                   episode_end=z.bool(), terminated=z.bool(), next_values=z, mask=torch.ones(R, T),
                   per_step={"logp": logp, "teacher_logp": teacher, "entropy": torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.1]])})
    sh = MethodRunner(GEAR(GEAROptions(gear_departure="absolute", gear_threshold=1.0))).run(sb)
    # tokens 2 and 3 share the departure's weight 0.5 + 0.5 * 1.2; the others read their own d = 0
    torch.testing.assert_close(sh.weights, torch.tensor([[1.0, 1.0, 1.1, 1.1, 1.0]]))


def _cfg(algo, tiny_dir, tmp_path, name, **kw):
    base = dict(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / name), updates=4, prompts_per_update=3,
                group_size=4, max_new_tokens=3, learning_rate=3e-3, progress=False, tensorboard=False, save_interval=2,
                sample_interval=0, reward_workers=0, gen_batch=6, export_model=False, minibatches=2)
    base.update(kw)
    return get_algo("llm", algo).config(**base)


def test_the_teacher_sees_the_reference_and_the_student_does_not(tiny_dir, tmp_path):
    t = get_algo("llm", "gear").make(_cfg("gear", tiny_dir, tmp_path, "g", updates=1))
    teacher = next(h for h in t.hooks if isinstance(h, TeacherPass))
    batch, _ = t.rollout.run(t.next_problems(3), 4, t.gen)
    tok = t.policy.tokenizer
    for r in range(batch.rows):
        p = batch.problems[r]
        student = tok.decode(batch.prompt_ids[r][batch.prompt_mask[r]].tolist(), skip_special_tokens=True)
        teach = tok.decode(teacher.prompts(t, batch)[r], skip_special_tokens=True)
        assert p.answer in teach and teach.endswith(p.prompt) and student == p.prompt
    t.prepare(batch)
    with torch.enable_grad():
        teacher.after_prepare(t, batch)
    tl = batch.extras["teacher_logp"]
    assert not tl.requires_grad and tl.shape == batch.completion_mask.shape
    assert (tl[~batch.completion_mask] == 0).all() and (tl[batch.completion_mask] < 0).all()


def test_a_method_whose_field_no_hook_provides_is_refused(tiny_dir, tmp_path):
    """gear reads the teacher pass's log-probs: built without that hook, the run is refused in one line, before
    it trains."""
    from reflectrl.contract.base import MethodRunner
    from reflectrl.errors import ConfigError
    from reflectrl.llm.grpo import GRPO
    from reflectrl.methods.gear import GEAR

    cfg = _cfg("gear", tiny_dir, tmp_path, "refused", updates=1)
    with pytest.raises(ConfigError, match="GEAR reads 'teacher_logp', which no hook of this run provides"):
        GRPO(cfg, hooks=[], methods=[MethodRunner(GEAR(cfg))])
    assert not (tmp_path / "refused" / "metrics.jsonl").exists()


@pytest.mark.parametrize("kl", [False, True])
def test_the_shared_prompt_teacher_pass_equals_a_full_forward(tiny_dir, tmp_path, kl):
    """The teacher pass runs each group's teacher prompt once into a KV cache its rows share: its log-probs (and
    KL) equal a plain forward over every row's teacher prompt and response, on rows of different lengths; also on
    a multi-turn batch, whose responses hold feedback tokens."""
    for task in ("toy-add", "toy-guess"):
        t = get_algo("llm", "gear").make(_cfg("gear", tiny_dir, tmp_path, f"g{kl}{task}", updates=1, task=task,
                                               gear_divergence="kl" if kl else "logratio"))
        teacher = next(h for h in t.hooks if isinstance(h, TeacherPass))
        batch, _ = t.rollout.run(t.next_problems(3), 4, t.gen)
        t.prepare(batch)
        teacher.after_prepare(t, batch)
        teach = batch.with_prompts(teacher.prompts(t, batch), t.policy.pad_id)
        with torch.no_grad():
            t.policy.eval()
            full = t.policy.forward_batch(teach, temperature=t.cfg.temperature, with_logprobs=True)
        mask = batch.completion_mask
        assert len({tuple(q) for q in teacher.prompts(t, batch)}) == 3 and batch.rows == 12
        assert bool(batch.feedback_mask.any()) == (task == "toy-guess")  # the multi-turn rows carry feedback
        torch.testing.assert_close(batch.extras["teacher_logp"], full.logp * mask, atol=2e-5, rtol=1e-5)
        if kl:
            with torch.no_grad():
                s_out = t.policy.forward_batch(batch, temperature=t.cfg.temperature, with_logprobs=True)
            want = (s_out.logprobs.exp() * (s_out.logprobs - full.logprobs)).sum(-1) * batch.response_attention * mask
            torch.testing.assert_close(batch.extras["teacher_kl"], want, atol=2e-5, rtol=1e-4)


def test_gear_seed_winners_and_omega_of_a_hand_worked_group():
    """One group of 4: rewards 1, 0, 0.5, 0 (at each row's last token). The winner (top 1 of 4) is row 0;
    V_orig is the group mean 0.375 on every token; with V_d = 1 everywhere omega = exp((1 - 0.375) / tau)."""
    R, T, H = 4, 3, 2
    rewards = torch.zeros(R, T)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.5, 0.0])
    end = torch.zeros(R, T, dtype=torch.bool)
    end[:, -1] = True
    states = torch.randn(R, T, H, generator=torch.Generator().manual_seed(0))
    sb = StepBatch(states=states, features=states, rewards=rewards, values=torch.zeros(R, T), advantages=torch.ones(R, T),
                   returns=torch.ones(R, T), episode_end=end, terminated=end, next_values=torch.zeros(R, T),
                   mask=torch.ones(R, T), group_size=4)
    seen = GroupBaselineView().to_view(sb)
    assert torch.allclose(seen.values, torch.full((R, T), 0.375))
    opts = GearSeedOptions(gear_distill_hidden=(), gear_distill_target="terminal", gear_tau=0.5, gear_tau_relative=False,
                           gear_omega_max=5.0)
    m = GearSeed(H, R, 4, 1.0, opts, seed=0)
    m.fit(seen)
    assert m.store.size == T and torch.equal(m.store.view("x"), states[0]) and (m.store.view("y") == 1.0).all()
    with torch.no_grad():  # V_d = 1 everywhere: weights 0, bias 1 (and the target copy with it)
        for net in (m.vd, m.target):
            net.weights[0].zero_()
            net.biases[0].fill_(1.0)
    sh = m.shape(seen)
    torch.testing.assert_close(sh.weights, torch.full((R, T), math.exp(0.625 / 0.5)))


@pytest.mark.parametrize("capacity", [8192, 10])
def test_gear_seed_whole_row_pass_equals_the_episode_loop(capacity):
    """On whole-row LLM batches (rows of different lengths, tied scores, two groups) the one-pass collection stores the
    same winner steps and targets, in the same ring layout, as the per-episode loop; over two batches, so a second
    batch's episodes must not start with the first one's padding."""
    R, T, H, G = 8, 5, 3, 4
    gen = torch.Generator().manual_seed(3)
    opts = GearSeedOptions(gear_distill_hidden=(), gear_distill_target="terminal", gear_winner_buffer=capacity,
                           gear_top_frac=0.5)
    fast, loop = GearSeed(H, R, G, 0.9, opts, seed=0), GearSeed(H, R, G, 0.9, opts, seed=0)
    loop._whole_groups = lambda batch: None
    taken = []
    one_pass = fast._whole_groups
    fast._whole_groups = lambda batch: taken.append(one_pass(batch)) or taken[-1]
    for _ in range(2):
        last = torch.randint(0, T, (R,), generator=gen)
        end = torch.zeros(R, T, dtype=torch.bool)
        end[torch.arange(R), last] = True
        rewards = torch.zeros(R, T)
        rewards[torch.arange(R), last] = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.25, 0.0])
        states = torch.randn(R, T, H, generator=gen)
        sb = StepBatch(states=states, features=states, rewards=rewards, values=torch.zeros(R, T),
                       advantages=torch.ones(R, T), returns=torch.ones(R, T), episode_end=end, terminated=end,
                       next_values=torch.zeros(R, T), mask=torch.ones(R, T), group_size=G, whole_rows=True)
        fast.fit(sb)
        loop.fit(sb)
        assert (fast.store.ptr, fast.store.size) == (loop.store.ptr, loop.store.size)
        assert torch.equal(fast.store.x, loop.store.x) and torch.equal(fast.store.y, loop.store.y)
        assert fast.assembler.episode == loop.assembler.episode and not fast.pending and not loop.pending
        assert fast.metrics() == loop.metrics()
    assert taken == [(2, 4), (2, 4)]  # the one pass ran on both batches: 2 groups, 2 winners each


@pytest.mark.parametrize("algo,extra", [("gear-seed", {}), ("gear", {})])
def test_resume_equals_uninterrupted(tiny_dir, tmp_path, algo, extra):
    a = get_algo("llm", algo)
    a.make(_cfg(algo, tiny_dir, tmp_path, "full", **extra)).learn()
    a.make(_cfg(algo, tiny_dir, tmp_path, "cut", updates=2, **extra)).learn()
    resume(tmp_path / "cut", 4).learn()
    strip = behaviour
    assert strip(read_metrics(tmp_path / "cut" / "metrics.jsonl")) == strip(read_metrics(tmp_path / "full" / "metrics.jsonl"))
