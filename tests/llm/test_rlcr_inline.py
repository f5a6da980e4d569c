"""rlcr's inline form (``--self-report inline``): the answer itself ends with ``<confidence>q</confidence>``, no
turn is asked for, and the reward is the paper's R = 1[correct] - (q - 1[correct])^2 on the stated q (the format
penalty without one); the warm-up teaches the tag and ``llm eval --self-report inline`` reads it."""

import pytest
import torch

from reflectrl.algos import get_algo
from reflectrl.errors import ConfigError
from reflectrl.llm.engines import ENGINES, register_engine
from reflectrl.llm.evaluate import evaluate_policy
from reflectrl.llm.warmup import demonstration_rows
from reflectrl.methods.rewards import RLCR_FORMAT_PENALTY, rlcr_reward
from reflectrl.tasks.arith import ArithTask
from reflectrl.tasks.selfreport import QUESTIONS

SCRIPT = ("<confidence>0.8</confidence>", "<confidence>0.3</confidence>", "")  # by problem index mod 3


class _ScriptedEngine:
    """Answers each arith prompt from the problem's reference: right with 0.8, wrong with 0.3, right with no tag,
    by the problem's position in the train split."""

    def __init__(self, policy):
        self.tok = policy.tokenizer
        task = ArithTask()
        self.by_prompt = {p.prompt: (i, p.answer) for split in ("train", "heldout")
                          for i, p in enumerate(task.problems(split))}

    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids, skip_special_tokens=True)
            i, answer = self.by_prompt[text]
            kind = i % 3
            reply = (answer if kind != 1 else str(int(answer) + 1)) + SCRIPT[kind]
            out.append(self.tok(reply, add_special_tokens=False)["input_ids"])
        return out

    def sync(self, policy):
        """Scripted: nothing to follow."""


@pytest.fixture
def scripted():
    register_engine("scripted-inline", lambda policy, temperature=1.0, top_k=0, **kw: _ScriptedEngine(policy))
    yield
    ENGINES.pop("scripted-inline", None)


def _cfg(a, tiny_dir, tmp_path, **kw):
    kw = {"self_report": "inline", "max_new_tokens": 40, **kw}
    return a.config(task="arith", model=str(tiny_dir), run_dir=str(tmp_path / "r"), updates=1, prompts_per_update=6,
                    group_size=2, progress=False, tensorboard=False, reward_workers=0, **kw)


def test_inline_confidence_sets_the_reward_without_a_turn(tiny_dir, tmp_path, scripted):
    a = get_algo("llm", "rlcr")
    t = a.make(_cfg(a, tiny_dir, tmp_path, engine="scripted-inline"))
    assert not getattr(t.task, "multi_turn", False)  # no self-report turn: the task itself
    t.learn()
    b = t.last_batch
    seen = set()
    for r in range(b.rows):
        assert [k for k, _ in b.transcripts[r]] == ["prompt", "policy"]  # nothing asked after the answer
        assert not any(QUESTIONS["confidence"] in text for _, text in b.transcripts[r])
        info = b.infos[r][-1]
        correct, q = float(info["outcome"]), info.get("confidence")
        want = RLCR_FORMAT_PENALTY if q is None else float(rlcr_reward(torch.tensor([correct]), torch.tensor([q]))[0])
        m = b.completion_mask[r]
        assert float(b.token_rewards[r][m].sum()) == pytest.approx(want)  # the shaped reward, before normalization
        seen.add((correct, q))
    assert seen == {(1.0, 0.8), (0.0, 0.3), (1.0, None)}  # right and stated, wrong and stated, unstated


def test_inline_form_validation(tiny_dir, tmp_path):
    a = get_algo("llm", "rlcr")
    with pytest.raises(ConfigError, match="needs --self-report confidence or inline"):
        a.make(_cfg(a, tiny_dir, tmp_path, self_report="off"))
    with pytest.raises(ConfigError, match="--rlcr-credit split needs the confidence in a turn of its own"):
        a.make(_cfg(a, tiny_dir, tmp_path, rlcr_credit="split"))


def test_warmup_teaches_the_inline_tag(tiny_policy):
    """Inline demonstrations: no question; the answer's trained tokens end with a confidence tag, high after the
    reference answer, low after a wrong one (that one in the context only)."""
    task = ArithTask()
    problems = task.problems("train")[:40]
    rows = demonstration_rows(tiny_policy, task, problems, "inline", negatives=0.5,
                              generator=torch.Generator().manual_seed(0))
    tok = tiny_policy.tokenizer
    kinds = set()
    for p, row in zip(problems, rows):
        text = lambda who, row=row: tok.decode([t for s in row.segments if s.kind == who for t in s.ids],
                                               skip_special_tokens=True)
        policy, env = text("policy"), text("env")
        assert QUESTIONS["confidence"] not in env
        q = float(policy.rsplit("<confidence>", 1)[1].split("</confidence>")[0])
        if env:  # a wrong answer shown, not trained on
            assert task.score(p, env) == 0.0 and q < 0.5 and policy.startswith("<confidence>")
            kinds.add("negative")
        else:
            assert task.score(p, policy) == 1.0 and q > 0.5
            kinds.add("positive")
        assert row.segments[-1].ids[-1] in tiny_policy.eos_ids
    assert kinds == {"negative", "positive"}


def test_eval_reads_the_inline_confidence(tiny_policy, scripted):
    task = ArithTask()
    out = evaluate_policy(tiny_policy, task, "train", limit=6, max_new_tokens=40, self_report="inline",
                          engine="scripted-inline")
    assert out["self_report"] == "inline"
    assert out["reports"]["confidence"] == [0.8, 0.3, None, 0.8, 0.3, None]
    assert out["reports"]["correct"] == [1, 0, 1, 1, 0, 1]


def test_calibration_reads_the_inline_transcripts_to_evals_numbers(tiny_policy, scripted, tmp_path, capsys):
    """The transcripts of an inline evaluation say the confidence was asked for, so ``reflectrl calibration`` counts a
    missing one as missing and gives the evaluation's numbers."""
    import json

    from reflectrl.cli import main

    out = evaluate_policy(tiny_policy, ArithTask(), "train", limit=6, max_new_tokens=40, self_report="inline",
                          engine="scripted-inline", transcripts=True)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(ep) + "\n" for ep in out["episodes"]))
    assert main(["calibration", str(path), "--json", "--reps", "20"]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert cal["rows"] == 6 and cal["confidence_missing_rate"]["value"] == pytest.approx(out["confidence_missing_rate"])
    assert out["confidence_missing_rate"] == pytest.approx(2 / 6)
    assert cal["ece"]["value"] == pytest.approx(out["ece"]) and cal["auroc"]["value"] == pytest.approx(out["auroc"])


def test_warmup_all_mixes_the_three_reports(tiny_policy):
    """``all``: each demonstration ends with one of the asked reflection, the asked confidence or the inline tag, so
    one model serves refgrpo, rlcr and rlcr --self-report inline."""
    task = ArithTask()
    rows = demonstration_rows(tiny_policy, task, task.problems("train")[:60], "all",
                              generator=torch.Generator().manual_seed(1))
    tok = tiny_policy.tokenizer
    seen = set()
    for row in rows:
        env = tok.decode([t for s in row.segments if s.kind == "env" for t in s.ids], skip_special_tokens=True)
        policy = tok.decode([t for s in row.segments if s.kind == "policy" for t in s.ids], skip_special_tokens=True)
        kind = ("reflect" if env == QUESTIONS["reflect"] else "confidence" if env == QUESTIONS["confidence"]
                else "inline" if env == "" and "<confidence>" in policy else "?")
        seen.add(kind)
    assert seen == {"reflect", "confidence", "inline"}


def test_inline_budget_has_room_for_the_tag(tiny_dir, tmp_path):
    """arith's default budget (10 tokens) fits an answer, not an answer and its tag: inline adds room for it, an
    explicit --max-new-tokens is kept."""
    from reflectrl.tasks.selfreport import INLINE_TOKENS

    a = get_algo("llm", "rlcr")
    task = ArithTask()
    tag = "-123<confidence>0.75</confidence>"
    assert len(tag) > task.max_new_tokens and len(tag) < task.max_new_tokens + INLINE_TOKENS
    assert _cfg(a, tiny_dir, tmp_path, max_new_tokens=None).resolved(task).max_new_tokens == task.max_new_tokens + INLINE_TOKENS
    assert _cfg(a, tiny_dir, tmp_path, max_new_tokens=12).resolved(task).max_new_tokens == 12
    assert _cfg(a, tiny_dir, tmp_path, max_new_tokens=None, self_report="confidence").resolved(task).max_new_tokens == 10
