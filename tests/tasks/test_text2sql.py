"""text2sql: databases, splits, the result-set verifier, the multi-turn protocol and the read-only guard."""

from __future__ import annotations

import time

import pytest

from reflectrl.errors import ConfigError
from reflectrl.tasks.base import get_task
from reflectrl.tasks.text2sql import (
    REFLECT_QUESTION,
    ROW_CAP,
    Database,
    Text2SQLTask,
    database_script,
    parse_turn,
    same_result,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def task() -> Text2SQLTask:
    return get_task("text2sql")


def _find(task, template, split="train"):
    return next(p for p in task.problems(split) if p.meta["template"] == template)


def test_databases_are_deterministic():
    assert database_script("0/train/0") == database_script("0/train/0")
    assert database_script("0/train/0") != database_script("0/train/1")
    db = Database("0/train/0")
    _, rows, err = db.run("SELECT COUNT(*) FROM departments")
    assert err is None and 3 <= rows[0][0] <= 5
    db.close()


def test_splits_deterministic_and_disjoint(task):
    train, held = task.problems("train"), task.problems("heldout")
    assert len(train) > 400 and len(held) > 100
    assert not {p.id for p in train} & {p.id for p in held}
    assert not {p.meta["db_seed"] for p in train} & {p.meta["db_seed"] for p in held}
    assert len({p.id for p in train}) == len(train)
    again = Text2SQLTask()
    assert [(p.id, p.prompt, p.answer) for p in again.problems("heldout")] == [(p.id, p.prompt, p.answer) for p in held]


def test_prompt_format():
    short = Text2SQLTask(instructions=False, schema=False, n_train_dbs=1, n_heldout_dbs=1)
    p = short.problems("train")[0]
    assert p.prompt.startswith("question: ") and p.prompt.endswith("\n") and p.prompt.count("\n") == 1
    full = Text2SQLTask(n_train_dbs=1, n_heldout_dbs=1, reflect="inline").problems("train")[0].prompt
    assert "<sql>" in full and "<answer>" in full and "<reflect>" in full and "tables: departments(" in full


def test_demonstrations_pass_their_verifier(task):
    problems = task.problems("heldout") + task.problems("train")[:150]
    assert task.score_many(problems, [task.demonstration(p) for p in problems]) == [1.0] * len(problems)


def test_score_right_wrong_and_junk(task):
    p = _find(task, "names_older")
    age = p.answer.rsplit(" ", 1)[1]
    assert task.score(p, f"<answer>SELECT name FROM employees WHERE {age} < age</answer>") == 1.0
    assert task.score(p, f"<answer>SELECT name FROM employees WHERE age > {age} ORDER BY name DESC</answer>") == 1.0
    assert task.score(p, f"<answer> {p.answer}") == 1.0  # closing tag dropped by a stop sequence
    assert task.score(p, f"<answer>SELECT name FROM employees WHERE age >= {age}</answer>") == 0.0
    assert task.score(p, f"<answer>SELECT name, age FROM employees WHERE age > {age}</answer>") == 0.0
    assert task.score(p, "<answer>SELECT nme FROM employees</answer>") == 0.0
    assert task.score(p, f"<sql>{p.answer}</sql>") == 0.0  # a query is not an answer
    assert task.score(p, f"<sql>SELECT 1</sql>\nrows: 1\n<answer>{p.answer}</answer>") == 1.0  # a whole transcript
    for junk in ("", p.answer, "<answer></answer>", "<answer>" + "x" * 100_000, "\x00<answer>\x00</answer>",
                 "<answer>\ud800</answer>", None, 42):
        assert task.score(p, junk) == 0.0


def test_ordered_questions_need_the_order(task):
    p = next(p for p in task.problems("train") if p.meta["template"] == "rich_sorted"
             and len(Database(p.meta["db_seed"]).run(p.answer)[1]) > 1)
    assert p.meta["ordered"]
    salary = p.answer.split(">")[1].split()[0]
    assert task.score(p, f"<answer>{p.answer}</answer>") == 1.0
    assert task.score(p, f"<answer>SELECT name FROM employees WHERE salary > {salary} ORDER BY salary</answer>") == 0.0
    unordered = _find(task, "names_older")
    assert not unordered.meta["ordered"]


def test_same_result_tolerates_float_noise_and_types():
    assert same_result([(0.1 + 0.2,)], [(0.3,)], ordered=False)
    assert same_result([(5.0,)], [(5,)], ordered=True)
    assert same_result([(1,), (2,)], [(2,), (1,)], ordered=False)
    assert not same_result([(1,), (2,)], [(2,), (1,)], ordered=True)
    assert not same_result([(1,), (1,)], [(1,)], ordered=False)


def test_parse_turn():
    assert parse_turn("think <sql> SELECT 1 </sql> trailing") == ("sql", "SELECT 1")
    assert parse_turn("<ANSWER>SELECT 2</ANSWER><reflect>solved</reflect>") == ("answer", "SELECT 2")
    assert parse_turn("<answer>SELECT 1</answer><sql>SELECT 2</sql>")[0] == "answer"
    assert parse_turn("nothing") == (None, "") and parse_turn(None) == (None, "")


# ------------------------------------------------------------------ episodes
def test_episode_query_feedback_then_right_answer(task):
    p = _find(task, "count_in_dept")
    env = task.make_env()
    assert env.reset(p) == p.prompt
    obs, reward, done, info = env.step("<sql>SELECT name FROM departments</sql>")
    assert obs.startswith("\nrows: ") and "name" in obs and not done and reward == 0.0
    assert info == {"kind": "sql", "error": False, "turns": 1}
    obs, reward, done, info = env.step("<sql>SELECT nope FROM employees</sql>")
    assert obs == "\nerror: no such column: nope\n" and not done and info["error"]
    obs, reward, done, info = env.step("I am not sure")
    assert obs.startswith("\nerror: write <sql>") and not done and info["kind"] == "invalid"
    obs, reward, done, info = env.step(f"<answer>{p.answer}</answer>\n<reflect>unsolved</reflect>")
    assert (obs, reward, done) == ("", 1.0, True)
    assert info["outcome"] == 1.0 and info["reflection"] == 0 and info["turns"] == 4 and info["answered"]
    with pytest.raises(RuntimeError):
        env.step("<sql>SELECT 1</sql>")
    env.reset(p)  # as a generator that stops on "</sql>" / "</reflect>" and drops them sends the turns
    assert env.step("<sql>SELECT name FROM departments")[0].startswith("\nrows: ")
    obs, reward, done, info = env.step(f"<answer>{p.answer}</answer><reflect>solved")
    assert (reward, done, info["reflection"]) == (1.0, True, 1)


def test_episode_wrong_and_erroring_answers(task):
    p = _find(task, "count_in_dept")
    env = task.make_env()
    env.reset(p)
    obs, reward, done, info = env.step("<answer>SELECT COUNT(*) FROM departments</answer><reflect>solved</reflect>")
    assert (obs, reward, done) == ("", 0.0, True) and info["outcome"] == 0.0 and info["reflection"] == 1
    env.reset(p)
    obs, reward, done, info = env.step("<answer>SELECT FROM WHERE</answer>")
    assert (obs, reward, done) == ("", 0.0, True) and "error" in info and "reflection" not in info


def test_feedback_never_reveals_the_outcome(task):
    a = _find(task, "count_all")
    b = next(p for p in task.problems("train") if p.meta["db"] == a.meta["db"] and p.meta["template"] == "max_salary")
    texts = []
    for problem in (a, b):  # the same query on the same database, one right and one wrong for the question
        env = task.make_env()
        env.reset(problem)
        texts.append(env.step(f"<sql>{a.answer}</sql>")[0])
        texts.append(env.step(f"<answer>{a.answer}</answer>")[0])
    assert texts[0] == texts[2] and texts[1] == texts[3] == ""


def test_max_turns_truncates(task):
    env = task.make_env(max_turns=2)
    env.reset(task.problems("heldout")[0])
    assert not env.step("<sql>SELECT 1</sql>")[2]
    obs, reward, done, info = env.step("<sql>SELECT 1</sql>")
    assert done and reward == 0.0 and info["truncated"] and not info["answered"]


def test_reflection_turn_mode():
    t = Text2SQLTask(reflect="turn", n_train_dbs=1, n_heldout_dbs=1)
    p = t.problems("train")[0]
    assert "<reflect>" not in p.prompt
    env = t.make_env()
    env.reset(p)
    obs, reward, done, _ = env.step(f"<answer>{p.answer}</answer>")
    assert obs == REFLECT_QUESTION and reward == 0.0 and not done
    obs, reward, done, info = env.step("solved")
    assert (obs, reward, done) == ("", 1.0, True) and info["reflection"] == 1 and info["outcome"] == 1.0


def test_demonstration_turns(task):
    p = _find(task, "names_in_dept")
    (q, feedback), (answer, last) = task.demonstration_turns(p)
    assert q == f"<sql>{p.answer}</sql>" and feedback.startswith("\nrows: ") and answer == task.demonstration(p)
    assert last == ""


# ------------------------------------------------------------------ the read-only guard
@pytest.mark.parametrize("sql", [
    "DROP TABLE employees", "DELETE FROM employees", "INSERT INTO sales VALUES (999, 1, 1, 2021)",
    "UPDATE employees SET salary = 0", "PRAGMA query_only = OFF", "ATTACH DATABASE 'x.db' AS x",
    "VACUUM INTO 'copy.db'", "SELECT 1; DROP TABLE employees", "CREATE TEMP TABLE t(a)",
    "/* hi */ DELETE FROM sales", "WITH x AS (SELECT 1) DELETE FROM sales", "SELECT load_extension('x')",
    "SELECT randomblob(100000000)", "SELECT zeroblob(100000000)", "BEGIN",
])
def test_writes_and_escapes_are_refused(sql, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = Database("0/train/0")
    cols, rows, err = db.run(sql)
    assert err is not None and rows == []
    assert db.run("SELECT COUNT(*) FROM employees")[1][0][0] > 0
    assert list(tmp_path.iterdir()) == []
    db.close()


def test_slow_functions_are_refused_and_values_capped():
    db = Database("0/train/0")
    start = time.monotonic()
    _, _, err = db.run("SELECT printf('%.*c', 2000000000, 'x')")  # one call, seconds of CPU: not allowed
    assert err == "not authorized to use function: printf" and time.monotonic() - start < 1
    _, _, err = db.run("WITH RECURSIVE c(s) AS (SELECT 'ab' UNION ALL SELECT s || s FROM c) SELECT length(s) FROM c")
    assert err is not None and "too big" in err
    assert db.run("SELECT upper(name), round(avg(salary), 1) FROM employees WHERE name LIKE '%a%'")[2] is None
    db.close()


def test_runaway_query_is_interrupted():
    db = Database("0/train/0", timeout_s=0.3)
    start = time.monotonic()
    _, _, err = db.run("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT MAX(x) FROM c")
    assert err == "query took too long" and time.monotonic() - start < 3
    assert db.run("SELECT 1")[1] == [(1,)]  # the connection still works
    db.close()


def test_row_cap():
    db = Database("0/train/0")
    _, rows, err = db.run("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) "
                          "SELECT x FROM c")
    assert err is None and len(rows) == ROW_CAP + 1
    db.close()


def test_result_size_cap():
    db = Database("0/train/0")
    big = "WITH RECURSIVE c(x, s) AS (SELECT 1, 'ab' UNION ALL SELECT x + 1, s FROM c WHERE x < 900) "
    assert len(db.run(big + "SELECT x, s FROM c")[1]) == 900
    wide = ", ".join(["(SELECT group_concat(name, '-----') FROM employees)"] * 20)
    _, rows, err = db.run(big.replace("900", "999") + f"SELECT x, {wide} FROM c")
    assert err == "result larger than 1 MiB" and rows == []
    db.close()


def test_bad_options():
    for kwargs in ({"reflect": "maybe"}, {"max_turns": 0}, {"templates": ["nope"]}, {"n_train_dbs": 0}):
        with pytest.raises(ConfigError):
            Text2SQLTask(**kwargs)
