"""arith: splits, verifier on right / wrong / junk answers, knobs; the shared self-report parsers."""

from __future__ import annotations

import pytest

from reflectrl.errors import ConfigError
from reflectrl.tasks.arith import ArithTask, evaluate, parse_answer
from reflectrl.tasks.base import (
    Problem,
    SingleTurnEnv,
    get_task,
    parse_confidence,
    parse_reflection,
    self_report,
    strip_self_report,
    teacher_prompt,
)


@pytest.fixture(scope="module")
def task() -> ArithTask:
    return get_task("arith")


def test_splits_deterministic_disjoint_and_sized(task):
    train, held = task.problems("train"), task.problems("heldout")
    assert len(train) == 5000 and len(held) == 500
    assert not {p.id for p in train} & {p.id for p in held}
    assert len({p.id for p in train}) == len(train)
    again = ArithTask()
    assert [p.id for p in again.problems("train")] == [p.id for p in train]
    assert [p.prompt for p in again.problems("heldout")] == [p.prompt for p in held]
    other = ArithTask(seed=1)
    assert [p.id for p in other.problems("heldout")] != [p.id for p in held]


def test_sampled_space_is_disjoint_too():
    big = ArithTask(digits=4, ops="+-*", terms=3, n_train=300, n_heldout=100)
    train, held = big.problems("train"), big.problems("heldout")
    assert len(train) == 300 and len(held) == 100
    assert not {p.id for p in train} & {p.id for p in held}
    assert all(p.meta["value"] == evaluate(p.meta["operands"], p.meta["ops"]) for p in train)


def test_small_space_yields_what_exists():
    tiny = ArithTask(digits=1, ops="+", terms=2)
    train, held = tiny.problems("train"), tiny.problems("heldout")
    assert len(train) + len(held) == 100 and len(held) > 0
    assert sorted(p.prompt for p in train + held) == sorted(f"{a}+{b}=" for a in range(10) for b in range(10))


def test_precedence():
    assert evaluate([2, 3, 4], ["+", "*"]) == 14
    assert evaluate([2, 3, 4], ["*", "-"]) == 2
    assert evaluate([10, 3, 4, 2], ["-", "*", "+"]) == 0


def test_demonstrations_pass_their_verifier(task):
    for split in ("train", "heldout"):
        problems = task.problems(split)
        assert task.score_many(problems, [task.demonstration(p) for p in problems]) == [1.0] * len(problems)


@pytest.mark.parametrize("completion, reward", [
    ("19", 1.0), (" 19", 1.0), ("19\n", 1.0), ("19 because 12+7", 1.0), ("+19", 1.0), ("19.0", 1.0),
    ("answer: 19", 1.0), ("19<confidence>0.7</confidence>", 1.0), ("<confidence>0.7</confidence>19", 1.0),
    ("19\n<reflect>solved</reflect>", 1.0),
    ("18", 0.0), ("-19", 0.0), ("190", 0.0), ("19.5", 0.0), ("1 9", 0.0), ("\n19", 0.0), ("", 0.0),
    ("nineteen", 0.0), ("x" * 1_000_000, 0.0), ("9" * 100_000, 0.0), ("\x00\ud800", 0.0),
])
def test_score(task, completion, reward):
    problem = Problem(id="arith:12+7", prompt="12+7=", answer="19", meta={"value": 19})
    assert task.score(problem, completion) == reward


@pytest.mark.parametrize("junk", [None, 19, b"19", ["19"], object()])
def test_score_never_raises_on_non_text(task, junk):
    problem = Problem(id="arith:12+7", prompt="12+7=", answer="19", meta={"value": 19})
    assert task.score(problem, junk) == 0.0


def test_negative_answers(task):
    problem = Problem(id="arith:3-20", prompt="3-20=", answer="-17", meta={"value": -17})
    assert task.score(problem, "-17") == 1.0 and task.score(problem, "17") == 0.0


def test_parse_answer():
    assert parse_answer("  -42 and 7") == -42
    assert parse_answer("no digits") is None
    assert parse_answer("1" * 65) is None


def test_env_reports_outcome_and_self_report(task):
    env = task.make_env()
    assert isinstance(env, SingleTurnEnv)
    problem = task.problems("heldout")[0]
    assert env.reset(problem) == problem.prompt
    obs, reward, done, info = env.step(f"{problem.answer} <confidence>0.25</confidence>\n<reflect>solved</reflect>")
    assert (obs, reward, done) == ("", 1.0, True)
    assert info == {"outcome": 1.0, "confidence": 0.25, "reflection": 1}
    env.reset(problem)
    assert env.step("oops")[1:] == (0.0, True, {"outcome": 0.0})


def test_teacher_prompt_holds_the_answer(task):
    problem = task.problems("train")[0]
    assert problem.answer in teacher_prompt(task, problem) and teacher_prompt(task, problem).endswith(problem.prompt)


@pytest.mark.parametrize("kwargs", [{"digits": 0}, {"digits": 7}, {"ops": "/"}, {"ops": ""}, {"terms": 1},
                                    {"heldout_fraction": 0.0}, {"n_train": -1}])
def test_bad_knobs(kwargs):
    with pytest.raises(ConfigError):
        ArithTask(**kwargs)


def test_unknown_split(task):
    with pytest.raises(ConfigError, match="unknown split"):
        task.problems("test")


# ------------------------------------------------------------------ self-report parsing (base.py)
def test_parse_reflection():
    assert parse_reflection("x <reflect>solved</reflect>") == 1
    assert parse_reflection("<REFLECT> Unsolved </REFLECT>") == 0
    assert parse_reflection("<reflect>solved</reflect> <reflect>unsolved</reflect>") == 0  # the last one counts
    assert parse_reflection("<reflect>maybe</reflect>") is None
    assert parse_reflection("solved") is None and parse_reflection(None) is None
    assert parse_reflection("<answer>x</answer><reflect>solved") == 1  # closing tag dropped by a stop sequence
    assert parse_reflection("<reflect>solved and more") is None


def test_parse_confidence():
    assert parse_confidence("<confidence>0.8</confidence>") == 0.8
    assert parse_confidence("<confidence>1</confidence>") == 1.0
    assert parse_confidence("<confidence>1.5</confidence>") is None
    assert parse_confidence("<confidence>-0.1</confidence>") is None
    assert parse_confidence("0.8") is None and parse_confidence(3) is None
    assert parse_confidence("19 <confidence>0.6") == 0.6


def test_strip_and_collect():
    text = "42 <confidence>0.9</confidence>\n<reflect>unsolved</reflect>"
    assert strip_self_report(text) == "42 \n"
    assert self_report(text) == {"confidence": 0.9, "reflection": 0}
    assert self_report("42") == {}
    assert strip_self_report("<answer>q</answer><reflect>unsolved") == "<answer>q</answer>"
    assert strip_self_report("a <reflect>x</reflect> b <reflect>y") == "a  b "
