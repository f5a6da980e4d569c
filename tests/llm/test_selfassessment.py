"""refgrpo's and rlcr's rewards on hand-worked cases (malformed self-reports included), the methods through
the shared contract, the self-report turn (trained, and the outcome never in the agent's context), and
resume equals uninterrupted for each LLM self-assessment algo."""

import json
import math

import pytest
import torch

from reflectrl.algos import get_algo, resume
from reflectrl.contract.base import MethodRunner, StepBatch, as_nan
from reflectrl.methods.refgrpo import RefGRPO, RefGRPOOptions
from reflectrl.methods.rewards import (
    RLCR_FORMAT_PENALTY,
    bonus_schedule,
    refgrpo_reward,
    reflection_bonus,
    rlcr_reward,
)
from reflectrl.methods.rlcr import RLCR, RLCROptions
from reflectrl.runlog import behaviour, read_metrics
from reflectrl.tasks.selfreport import QUESTIONS, SelfReportTask, parse_report

NAN = float("nan")


def test_refgrpo_reward_hand_cases():
    outcome = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0])
    reflection = torch.tensor([1.0, 0.0, 0.0, 1.0, NAN])  # agree, underconfident, agree, overconfident, missing
    torch.testing.assert_close(reflection_bonus(outcome, reflection, 0.1), torch.tensor([0.1, 0.0, 0.1, 0.0, 0.0]))
    torch.testing.assert_close(refgrpo_reward(outcome, reflection, 0.1), torch.tensor([1.1, 1.0, 0.1, 0.0, 1.0]))


def test_rlcr_reward_hand_cases():
    correct = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0])
    q = torch.tensor([1.0, 0.5, 0.0, 0.9, NAN])
    # 1 - 0; 1 - 0.25; 0 - 0; 0 - 0.81; missing: the format penalty
    want = torch.tensor([1.0, 0.75, 0.0, -0.81, RLCR_FORMAT_PENALTY])
    torch.testing.assert_close(rlcr_reward(correct, q), want)
    assert float(rlcr_reward(torch.tensor([0.0]), torch.tensor([1.0]))) > RLCR_FORMAT_PENALTY  # below the worst valid


def test_bonus_schedules():
    assert bonus_schedule(0.1, "step", 0.5) == 0.1 and bonus_schedule(0.1, "step", 0.7) == 0.0
    assert bonus_schedule(0.1, "linear", 0.25) == pytest.approx(0.075) and bonus_schedule(0.1, "constant", 0.99) == 0.1
    with pytest.raises(ValueError):
        bonus_schedule(0.1, "cosine", 0.1)


def test_parse_report():
    assert parse_report("reflect", "solved") == 1.0 and parse_report("reflect", " unsolved<eos>") == 0.0
    assert parse_report("reflect", "<reflect>unsolved</reflect>") == 0.0 and parse_report("reflect", "maybe") is None
    assert parse_report("confidence", "0.7") == 0.7 and parse_report("confidence", "<confidence>0.25") == 0.25
    assert parse_report("confidence", "1.5") is None and parse_report("confidence", "high") is None
    assert parse_report("confidence", None) is None


def _llm_batch(outcome, reflection=None, confidence=None, steps=3, progress=0.0):
    R = len(outcome)
    end = torch.zeros(R, steps, dtype=torch.bool)
    end[:, -1] = True
    z = torch.zeros(R, steps)
    info = {"outcome": torch.tensor(outcome), "correct": torch.tensor(outcome)}
    if reflection is not None:
        info["reflection"] = as_nan(reflection)
    if confidence is not None:
        info["confidence"] = as_nan(confidence)
    return StepBatch(states=torch.zeros(R, steps, 2), features=torch.zeros(R, steps, 2), rewards=z, values=z,
                     advantages=z, returns=z, episode_end=end, terminated=end, next_values=z, mask=torch.ones(R, steps),
                     progress=progress, info=info)


def test_refgrpo_and_rlcr_shape_the_last_token_before_normalization():
    sh = MethodRunner(RefGRPO(RefGRPOOptions())).run(_llm_batch([1.0, 0.0, 1.0], [1, 1, None]))
    torch.testing.assert_close(sh.reward_delta, torch.tensor([[0, 0, 0.1], [0, 0, 0.0], [0, 0, 0.0]]))
    late = MethodRunner(RefGRPO(RefGRPOOptions())).run(_llm_batch([1.0], [1], progress=0.9))
    assert float(late.reward_delta.sum()) == 0.0  # the step schedule ends the bonus after 2/3 of training
    m = RLCR(RLCROptions())
    sh = MethodRunner(m).run(_llm_batch([1.0, 0.0, 1.0], confidence=[0.5, 0.5, None]))
    # total = outcome + delta = rlcr reward: 0.75, -0.25, penalty
    torch.testing.assert_close(sh.reward_delta[:, -1], torch.tensor([0.75 - 1.0, -0.25, RLCR_FORMAT_PENALTY - 1.0]))
    assert m.metrics()["rlcr/missing_rate"] == pytest.approx(1 / 3)


def _split_batch(outcome, advantages, **reports):
    """Two-turn rows of 4 tokens: the answer (turn 0, tokens 0-1) and the self-report (turn 1, tokens 2-3)."""
    b = _llm_batch(outcome, steps=4, **reports)
    b.turn_ids = torch.tensor([[0, 0, 1, 1]] * len(outcome))
    b.advantages = torch.tensor(advantages)[:, None].expand(-1, 4).clone()
    b.info["report_asked"] = torch.ones(len(outcome))
    b.group_size = 2
    return b


def test_split_credit_hand_cases():
    """split: the answer keeps the outcome's advantage, the self-report turn takes the group advantage of the
    bonus alone (GRPO-normalized within each group of 2)."""
    # group 0: right + agrees, wrong + disagrees (said solved); group 1: both agree (bonus equal -> 0)
    b = _split_batch([1.0, 0.0, 1.0, 0.0], [0.7, -0.7, 0.7, -0.7], reflection=[1, 1, 1, 0])
    sh = MethodRunner(RefGRPO(RefGRPOOptions(refgrpo_credit="split"))).run(b)
    assert sh.reward_delta is None
    adv = b.advantages + sh.advantage_delta
    g = 0.05 / (0.1 / math.sqrt(2) + 1e-6)  # (0.1 - 0.05) / (unbiased std{0.1, 0} + eps), about 1/sqrt(2)
    torch.testing.assert_close(adv[:, :2], b.advantages[:, :2])  # the answer's tokens: the outcome's advantage
    torch.testing.assert_close(adv[:, 2:], torch.tensor([[g, g], [-g, -g], [0.0, 0.0], [0.0, 0.0]]), atol=1e-5, rtol=0)
    # after the step schedule (c = 0) the reflection turn is not trained at all
    late = _split_batch([1.0, 0.0, 1.0, 0.0], [0.7, -0.7, 0.7, -0.7], reflection=[1, 1, 1, 0])
    late.progress = 0.9
    sh = MethodRunner(RefGRPO(RefGRPOOptions(refgrpo_credit="split"))).run(late)
    torch.testing.assert_close((late.advantages + sh.advantage_delta)[:, 2:], torch.zeros(4, 2))
    # rlcr: the calibration term -(q - y)^2 (format penalty when missing) on the confidence turn
    b = _split_batch([1.0, 0.0, 1.0, 0.0], [0.7, -0.7, 0.0, 0.0], confidence=[0.5, 0.5, 1.0, None])
    sh = MethodRunner(RLCR(RLCROptions(rlcr_credit="split"))).run(b)
    adv = b.advantages + sh.advantage_delta
    torch.testing.assert_close(adv[:, :2], b.advantages[:, :2])
    z = 1.0 / math.sqrt(2)  # group 1: {0, -2} -> +-1/sqrt(2); group 0: {-0.25, -0.25} -> 0
    torch.testing.assert_close(adv[:, 2], torch.tensor([0.0, 0.0, z, -z]), atol=1e-5, rtol=0)
    # a row whose episode did not end with the self-report question keeps its advantage everywhere
    b = _split_batch([1.0, 0.0], [0.7, -0.7], reflection=[0, 0])
    b.info["report_asked"] = torch.tensor([1.0, 0.0])
    sh = MethodRunner(RefGRPO(RefGRPOOptions(refgrpo_credit="split"))).run(b)
    assert float(sh.advantage_delta[1].abs().sum()) == 0.0 and float(sh.advantage_delta[0, :2].abs().sum()) == 0.0


def test_self_report_turn_is_trained_and_the_outcome_never_reaches_the_context(tiny_dir, tmp_path):
    """A refgrpo rollout: the reflection turn's tokens are in the loss mask, and the text the agent sees
    (prompt, environment replies) holds the question only, never the outcome."""
    a = get_algo("llm", "refgrpo")
    cfg = a.config(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / "r"), updates=1, prompts_per_update=3,
                   group_size=2, max_new_tokens=9, progress=False, tensorboard=False, reward_workers=0)
    t = a.make(cfg)
    assert isinstance(t.task, SelfReportTask)
    t.learn()
    b = t.last_batch
    tok = t.policy.tokenizer
    for r in range(b.rows):
        turns = b.turn_ids[r][b.completion_mask[r]].unique().tolist()
        assert turns == [0, 1]  # the answer turn and the reflection turn are both policy tokens
        context = tok.decode(b.response_ids[r][b.feedback_mask[r]].tolist())
        assert context == QUESTIONS["reflect"]
        assert [k for k, _ in b.transcripts[r]] == ["prompt", "policy", "env", "policy"]
        for kind, text in b.transcripts[r]:
            if kind in ("prompt", "env"):
                assert "outcome" not in text and "correct" not in text and "1.0" not in text
        final = b.infos[r][-1]
        assert final["self_report"] == "reflect" and "outcome" in final


class ScriptedAnswers:
    """A generation engine for toy-add with a reflection turn: row i answers right when i is even, wrong otherwise,
    and reflects "solved" for i // 2 even, "unsolved" otherwise (so every group of 4 holds every pair)."""

    def __init__(self, policy):
        self.tok, self.eos = policy.tokenizer, policy.eos_ids[0]

    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        out = []
        for i, ids in enumerate(prompts):
            text = self.tok.decode(ids, skip_special_tokens=True)
            if "unsolved?" in text:
                word = "solved" if (i // 2) % 2 == 0 else "unsolved"
            else:
                a, b = text.strip().rstrip("=").split("+")
                word = str(int(a) + int(b) + (0 if i % 2 == 0 else 1))
            out.append(self.tok(word, add_special_tokens=False)["input_ids"] + [self.eos])
        return out

    def sync(self, policy):
        pass


def test_split_credit_in_a_refgrpo_run(tiny_dir, tmp_path):
    """A refgrpo run with --refgrpo-credit split: the reflection turn's tokens carry the bonus's group advantage
    and the answer's tokens the outcome's (computed here from the batch's own outcomes and reflections)."""
    from reflectrl.core.advantages import group_advantages

    a = get_algo("llm", "refgrpo")
    cfg = a.config(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / "r"), updates=1, prompts_per_update=3,
                   group_size=4, max_new_tokens=9, progress=False, tensorboard=False, reward_workers=0,
                   refgrpo_credit="split")
    t = a.make(cfg)
    t.engine = t.rollout.engine = ScriptedAnswers(t.policy)  # right and wrong answers, both reflections, per group
    t.learn()
    b = t.last_batch
    groups = torch.arange(b.rows) // 4
    outcome = torch.tensor([float(i[-1]["outcome"]) for i in b.infos])
    refl = as_nan([i[-1].get("reflection") for i in b.infos])
    want_report = group_advantages(reflection_bonus(outcome, refl, 0.1), groups)
    want_answer = group_advantages(outcome, groups)
    # not vacuous: both outcomes and both reflections occur, and both advantages move
    assert set(outcome.tolist()) == {0.0, 1.0} and set(refl.tolist()) == {0.0, 1.0}
    assert want_report.abs().sum() > 0 and want_answer.abs().sum() > 0
    for r in range(b.rows):
        m = b.completion_mask[r]
        turn = b.turn_ids[r][m]
        adv = b.advantages[r][m]
        torch.testing.assert_close(adv[turn == 1], want_report[r].expand(int((turn == 1).sum())))
        torch.testing.assert_close(adv[turn == 0], want_answer[r].expand(int((turn == 0).sum())))


@pytest.mark.parametrize("algo", ["refgrpo", "rlcr", "rlcr-inline", "refgrpo-seed"])
def test_llm_self_assessment_resume_equals_uninterrupted(tiny_dir, tmp_path, algo):
    form = {"rlcr-inline": {"self_report": "inline"}}.get(algo, {})
    algo = algo.removesuffix("-inline")
    a = get_algo("llm", algo)

    def cfg(name, updates=4):
        extra = {"reflection_sample": 1.0} if algo == "refgrpo-seed" else dict(form)
        return a.config(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / name), updates=updates,
                        prompts_per_update=3, group_size=4, max_new_tokens=9, learning_rate=3e-3, progress=False,
                        tensorboard=False, save_interval=2, sample_interval=0, reward_workers=0, gen_batch=6,
                        export_model=False, **extra)

    a.make(cfg("full")).learn()
    a.make(cfg("cut", updates=2)).learn()
    resume(tmp_path / "cut", 4).learn()
    strip = behaviour
    full, cut = strip(read_metrics(tmp_path / "full" / "metrics.jsonl")), strip(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
    assert len(full) == 4 and cut == full
    cfgjson = json.loads((tmp_path / "cut" / "config.json").read_text())
    assert cfgjson["algo"] == algo and cfgjson["updates"] == 4
    if algo == "refgrpo-seed":
        assert all(math.isfinite(r["refgrpo-seed/L_cal_train"]) for r in full)
