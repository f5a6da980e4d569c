"""codegen and humaneval: completion assembly, splits, sandboxed verifier on right / partial / wrong / junk code."""

from __future__ import annotations

import time

import pytest

from reflectrl.errors import ConfigError
from reflectrl.tasks.base import Problem, get_task
from reflectrl.tasks.codegen import FAMILIES, MAX_COMPLETION_CHARS, CodegenTask, assemble, body_lines
from reflectrl.tasks.humaneval import N_PROBLEMS, HumanEvalTask, load_rows, split_tests

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(120)]

PROMPT = "# add 7 to x\ndef f(x):\n"


# ------------------------------------------------------------------ assembling the program (no sandbox)
def test_body_form():
    assert assemble(PROMPT, "    return x + 7\n", "f") == PROMPT + "    return x + 7\n"
    assert assemble(PROMPT, "    y = x\n\n    return y + 7\n# add 3 to x\ndef f(x):\n", "f") == \
        PROMPT + "    y = x\n\n    return y + 7\n"
    assert assemble(PROMPT, "    return x + 7<reflect>solved</reflect>", "f") == PROMPT + "    return x + 7\n"
    assert assemble(PROMPT, "return x + 7", "f") == PROMPT  # unindented: no body (a syntax error when run)
    assert assemble(PROMPT, None, "f") == PROMPT


def test_whole_function_and_fenced_forms():
    whole = "def f(x):\n    return x + 7\n\nprint(f(1))\nassert f(1) == 8\n"
    assert assemble(PROMPT, whole, "f") == "# add 7 to x\ndef f(x):\n    return x + 7\n\n"
    fenced = "Here it is:\n```python\ndef f(x):\n    return x + 7\n```\nIt adds 7."
    assert assemble(PROMPT, fenced, "f") == "# add 7 to x\ndef f(x):\n    return x + 7\n"
    fenced_body = "```\n    return x + 7\n```"
    assert assemble(PROMPT, fenced_body, "f") == PROMPT + "    return x + 7\n"
    he_prompt = ("from typing import List\n\ndef helper(a):\n    return a\n\n"
                 "def g(xs: List[int]) -> int:\n    \"\"\"Doc.\"\"\"\n")
    got = assemble(he_prompt, "def g(xs):\n    return helper(len(xs))\n", "g")
    assert got.startswith("from typing import List\n\ndef helper(a):") and got.count("def g(") == 1


def test_huge_completion_is_cut():
    program = assemble(PROMPT, "    " + "x" * (3 * MAX_COMPLETION_CHARS), "f")
    assert len(program) <= len(PROMPT) + MAX_COMPLETION_CHARS + 1


def test_body_lines():
    assert body_lines("  a\n\tb\n\nc\n  d") == "  a\n\tb\n"
    assert body_lines("") == "" and body_lines("top") == ""


# ------------------------------------------------------------------ synthetic problems
@pytest.fixture(scope="module")
def task() -> CodegenTask:
    return get_task("codegen", workers=2)


def test_splits_deterministic_and_disjoint(task):
    train, held = task.problems("train"), task.problems("heldout")
    assert len(train) > 500 and len(held) > 100
    assert not {p.id for p in train} & {p.id for p in held}
    assert len({p.id for p in train + held}) == len(train) + len(held)
    again = CodegenTask()
    assert [(p.id, p.prompt, p.meta["tests"]) for p in again.problems("heldout")] == \
        [(p.id, p.prompt, p.meta["tests"]) for p in held]
    assert {p.meta["family"] for p in train + held} == {f.name for f in FAMILIES}


def test_problem_format(task):
    p = next(p for p in task.problems("train") + task.problems("heldout") if p.id == "codegen:add:k=7")
    assert p.prompt == PROMPT and p.answer == "    return x + 7\n" and p.meta["entry_point"] == "f"
    asserts = p.meta["tests"].strip().splitlines()
    assert len(asserts) == 5 and all(line.startswith("assert f(") for line in asserts)


def test_sample_of_demonstrations_pass(task):
    problems = task.problems("train")
    families = ("affine", "lgt", "lsort", "srepl", "stail")
    sample = [next(p for p in problems if p.meta["family"] == fam) for fam in families]
    sample += task.problems("heldout")[:3]
    assert task.score_many(sample, [task.demonstration(p) for p in sample]) == [1.0] * len(sample)


def test_partial_credit_wrong_and_junk(task):
    p = Problem(id="t", prompt="def f(x):\n", meta={"entry_point": "f",
                                                    "tests": "assert f(1) == 2\nassert f(2) == 4\nassert f(3) == 4\n"})
    completions = ["    return x * 2\n", "    return -1\n", "", "garbage ((", "    raise SystemExit\n",
                   "    return x * 2\n" * 5000, "\x00\ud800", "```python\ndef f(x):\n    return 2 * x\n```"]
    assert task.score_many([p] * len(completions), completions) == [2 / 3, 0.0, 0.0, 0.0, 0.0, 2 / 3, 0.0, 2 / 3]
    assert task.score(p, None) == 0.0


def test_batch_and_per_job_verdicts_agree(task):
    p = Problem(id="t", prompt="def f(x):\n", meta={"entry_point": "f",
                                                    "tests": "assert f(1) == 2\nassert f(2) == 4\nassert f(3) == 4\n"})
    completions = ["    return x * 2\n", "    return -1\n", "garbage ((", "    while True:\n        pass\n",
                   "    return x * 2\n<reflect>solved</reflect>", "\x00\ud800", "    return 2 * x\n"]
    batched = CodegenTask(workers=2, sandbox_batch=4)
    single = CodegenTask(workers=2, sandbox_batch=1)
    key = [(v.status, v.passed, v.total) for v in batched.verdicts_many([p] * len(completions), completions)]
    assert key == [(v.status, v.passed, v.total) for v in single.verdicts_many([p] * len(completions), completions)]
    assert [k[0] for k in key] == ["failed", "failed", "error", "timeout", "failed", "error", "failed"]
    scored = batched.score_batch([p] * 2, completions[4:5] + completions[1:2])
    assert scored == [(2 / 3, {"outcome": 2 / 3, "reflection": 1}), (0.0, {"outcome": 0.0})]
    with pytest.raises(ConfigError, match="sandbox_batch"):
        CodegenTask(sandbox_batch=0)


def test_infinite_loop_times_out(task):
    p = task.problems("train")[0]
    start = time.monotonic()
    assert task.score(p, "    while True:\n        pass\n") == 0.0
    assert time.monotonic() - start < task.timeout_s + 5


def test_env_and_teacher(task):
    p = task.problems("heldout")[0]
    env = task.make_env()
    assert env.reset(p) == p.prompt
    assert env.step(p.answer)[1:3] == (1.0, True)
    assert task.teacher_prompt(p) == p.prompt + p.answer + "\n\n" + p.prompt


def test_bad_options():
    with pytest.raises(ConfigError, match="unknown codegen families"):
        CodegenTask(families=["nope"])
    with pytest.raises(ConfigError):
        CodegenTask(n_tests=0)
    assert {p.meta["family"] for p in CodegenTask(families="add,srev").problems("train")} <= {"add", "srev"}


# ------------------------------------------------------------------ HumanEval
@pytest.fixture(scope="module")
def he() -> HumanEvalTask:
    return get_task("humaneval", workers=2)


def test_humaneval_loads_and_splits(he):
    rows = load_rows()
    assert len(rows) == N_PROBLEMS and rows[0]["task_id"] == "HumanEval/0"
    train, held = he.problems("train"), he.problems("heldout")
    assert len(train) + len(held) == N_PROBLEMS and len(held) == 82
    assert not {p.id for p in train} & {p.id for p in held}
    assert [p.id for p in HumanEvalTask().problems("heldout")] == [p.id for p in held]
    assert len(HumanEvalTask(heldout_fraction=1.0).problems("heldout")) == N_PROBLEMS


def test_split_tests_one_per_assert():
    src = ("METADATA = {}\n\ndef check(candidate):\n    import math\n    assert candidate(1) == 2\n"
           "    assert True\n    for i in range(3):\n        assert candidate(i) == i + 1\n    xs = [1]\n"
           "    assert candidate(xs[0]) == 2\n")
    out = split_tests(src, "inc")
    assert out.count("\nassert _reflectrl_he_part_") == 3  # the constant assert is dropped
    assert "assert _reflectrl_he_part_2(inc)" in out
    part2 = out.split("def _reflectrl_he_part_2(candidate):")[1]
    assert "import math" in part2 and "xs = [1]" in part2  # set-up statements are replayed
    compile(out, "<tests>", "exec")


def test_humaneval_sample_canonical_pass_and_wrong_fail(he):
    by_id = {p.id: p for p in he.problems("train") + he.problems("heldout")}
    sample = [by_id[f"HumanEval/{i}"] for i in (0, 10, 32, 38, 53, 129)]  # helpers in prompt, loops and set-up in check
    scores = he.score_many(sample + sample[:2], [p.answer for p in sample] + ["    return None\n", "  junk("])
    assert scores[:6] == [1.0] * 6 and scores[6:] == [0.0, 0.0]


def test_humaneval_whole_function_completion(he):
    p = next(p for p in he.problems("train") + he.problems("heldout") if p.id == "HumanEval/0")
    header = p.prompt[p.prompt.index("def has_close_elements"):]
    assert he.score(p, "```python\n" + header + p.answer + "```\n") == 1.0


@pytest.mark.slow
def test_humaneval_all_canonical_solutions_pass(he):
    problems = he.problems("train") + he.problems("heldout")
    verdicts = he.verdicts_many(problems, [p.answer for p in problems])
    assert [(p.id, v.status) for p, v in zip(problems, verdicts) if v.status != "passed"] == []
