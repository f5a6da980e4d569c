"""The ``data`` task: a user's file of problems in every format, its splits, prompts and demonstrations, ``tasks
validate`` on generated word problems and multiple-choice questions, and one clear line for each kind of bad data."""

from __future__ import annotations

import csv
import gzip
import json
import random
from pathlib import Path

import pytest

from reflectrl.cli.tasks import main
from reflectrl.errors import ConfigError
from reflectrl.tasks.base import SPLITS, get_task

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay"]
ITEMS = ["apples", "pens", "books", "cards", "shells"]


def word_problems(n: int = 300, seed: int = 0) -> list[dict]:
    """GSM-style rows: a short story, a worked answer ending in ``#### N`` (some with thousands and dollars)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        who, what = rng.choice(NAMES), rng.choice(ITEMS)
        a, b, price = rng.randint(2, 40), rng.randint(2, 40), rng.randint(20, 90)
        if i % 3 == 2:
            q = f"{who} sells {a + b} {what} for ${price} each. How many dollars does {who} get?"
            total = (a + b) * price
            ans = f"{who} gets {a + b} * {price} = {total} dollars.\n#### {total:,}"
        else:
            q = f"{who} has {a} {what} and finds {b} more. How many {what} does {who} have now?"
            ans = f"{who} has {a} + {b} = {a + b} {what}.\n#### {a + b}"
        rows.append({"id": f"wp-{i}", "question": q, "answer": ans, "source": "generated"})
    return rows


def choice_rows(n: int = 200, seed: int = 1) -> list[dict]:
    """Multiple-choice rows: four options, the answer as a letter, an index or the option's text."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        options = [str(a + b + d) for d in rng.sample([-2, -1, 0, 1, 2, 3], 4)]
        if str(a + b) not in options:
            options[rng.randrange(4)] = str(a + b)
        k = options.index(str(a + b))
        answer = ["ABCD"[k], k, options[k]][i % 3]
        rows.append({"question": f"What is {a} + {b}?", "choices": options, "answer": answer})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in lines[0], lines
    return lines[0]


# ------------------------------------------------------------------------------------------------ validate
def test_validate_scores_every_word_problem_reference_1(tmp_path, capsys):
    path = write_jsonl(tmp_path / "gsm.jsonl", word_problems())
    assert main(["validate", "data", "--set", f"path={path}", "--set", "checker=number", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["passed"] == report["total"] == 300
    assert all(s["share"] == 1.0 and s["failures"] == [] for s in report["splits"].values())
    # exact reads the reference as it reads an answer (the text after the last ####), so these pass too
    assert main(["validate", "data", "--set", f"path={path}", "--set", "checker=exact"]) == 0
    capsys.readouterr()


def test_validate_scores_every_choice_reference_1_and_lists_failures(tmp_path, capsys):
    rows = choice_rows()
    path = write_jsonl(tmp_path / "mc.jsonl", rows)
    assert main(["validate", "data", "--set", f"path={path}", "--set", "checker=choice", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] == report["total"] == 200
    task = get_task("data", path=str(path), checker="choice")
    p = task.problems("train")[0]
    assert task.chat_prompt(p).startswith(f"{p.meta['question']}\nA. {p.meta['choices'][0]}\nB. ")
    assert task.chat_prompt(p).endswith("\n\nReply with only the letter of the correct option.")
    a, b = (int(x) for x in p.meta["question"][len("What is "):-1].split(" + "))
    right = "ABCD"[p.meta["choices"].index(str(a + b))]
    wrong = next(x for x in "ABCD" if x != right)
    assert [task.score(p, x) for x in (right, f"The answer is ({right}).", wrong, "")] == [1.0, 1.0, 0.0, 0.0]
    # demonstrations the checker does not accept (every fourth one names another option): validate reports the
    # share that passes and shows the first few that fail
    bad = [dict(r, demonstration="E") if i % 4 == 0 else r for i, r in enumerate(choice_rows())]
    path = write_jsonl(tmp_path / "bad.jsonl", bad)
    assert main(["validate", "data", "--set", f"path={path}", "--set", "checker=choice", "--split", "train"]) == 1
    out = capsys.readouterr().out
    passed, total = (int(x) for x in out.split(": ", 1)[1].split(" ", 1)[0].split("/"))
    failing = [p.id for p in get_task("data", path=str(path), checker="choice").problems("train")
               if int(p.id[3:]) % 4 == 1]  # row N is choice_rows()[N - 1]
    assert total - passed == len(failing) > 0 and f"({100 * passed / total:.1f}%," in out
    assert f"FAIL {failing[0]}: the checker scores its reference 'E' 0" in out


# ------------------------------------------------------------------------------------------------ splits
def test_splits_are_deterministic_disjoint_and_follow_the_fractions(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", word_problems(1000))
    task = get_task("data", path=str(path), checker="number")
    ids = {s: [p.id for p in task.problems(s)] for s in SPLITS}
    assert sum(len(v) for v in ids.values()) == len(set().union(*map(set, ids.values()))) == 1000
    assert 0.15 < len(ids["heldout"]) / 1000 < 0.25 and 0.05 < len(ids["validation"]) / 1000 < 0.12
    again = get_task("data", path=str(path), checker="number")
    assert {s: [p.id for p in again.problems(s)] for s in SPLITS} == ids
    more = get_task("data", path=str(path), checker="number", validation_fraction=0.3)
    assert [p.id for p in more.problems("heldout")] == ids["heldout"]  # validation comes out of train only
    assert set(ids["validation"]) <= {p.id for p in more.problems("validation")}
    other = get_task("data", path=str(path), checker="number", seed=1)
    assert [p.id for p in other.problems("heldout")] != ids["heldout"]
    # without ids the row's content is hashed: moving a row in the file does not move it to another split
    rows = [{k: v for k, v in r.items() if k != "id"} for r in word_problems(200)]
    a = get_task("data", path=str(write_jsonl(tmp_path / "a.jsonl", rows)))
    b = get_task("data", path=str(write_jsonl(tmp_path / "b.jsonl", rows[::-1])))
    assert sorted(p.meta["question"] for p in a.problems("heldout")) == \
        sorted(p.meta["question"] for p in b.problems("heldout"))


def test_a_split_column_decides(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i), "split": ["train", "test", "dev", "validation"][i % 4]}
            for i in range(40)]
    task = get_task("data", path=str(write_jsonl(tmp_path / "s.jsonl", rows)))
    assert [p.meta["question"] for p in task.problems("heldout")] == [f"q{i}" for i in range(1, 40, 4)]
    assert len(task.problems("validation")) == 20 and len(task.problems("train")) == 10


# ------------------------------------------------------------------------------------------------ formats
def _write(path: Path, rows: list[dict]) -> Path:
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    elif name.endswith(".json"):
        data = json.dumps(rows, indent=1).encode()
    elif name.endswith((".csv", ".tsv")):
        path.with_suffix(".tmp").unlink(missing_ok=True)
        with open(path.with_suffix(".tmp"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter="\t" if name.endswith(".tsv") else ",")
            w.writeheader()
            w.writerows({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()} for r in rows)
        data = path.with_suffix(".tmp").read_bytes()
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), str(path.with_suffix(".tmp")))
        data = path.with_suffix(".tmp").read_bytes()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("name", ["p.jsonl", "p.json", "p.csv", "p.tsv", "p.parquet", "p.jsonl.gz", "p.csv.gz",
                                  "p.parquet.gz"])
def test_every_format_gives_the_same_problems(tmp_path, name):
    if "parquet" in name:
        pytest.importorskip("pyarrow")
    rows = [dict(r, answer=str(r["answer"])) for r in choice_rows(30)]
    want = get_task("data", path=str(write_jsonl(tmp_path / "ref.jsonl", rows)), checker="choice")
    got = get_task("data", path=str(_write(tmp_path / name, rows)), checker="choice")
    for split in ("train", "heldout"):
        assert [(p.id, p.prompt, p.answer, p.meta) for p in got.problems(split)] == \
            [(p.id, p.prompt, p.answer, p.meta) for p in want.problems(split)]


def test_columns_messages_system_and_meta(tmp_path):
    rows = [{"prompt": "Name a prime.", "solution": "7", "system": "Be brief.", "level": 2, "id": 5},
            {"messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Bonjour"}, {"role": "user", "content": "Capital?"}],
             "solution": "Paris", "id": "m"}]
    path = write_jsonl(tmp_path / "c.jsonl", rows[:1])
    with pytest.raises(ConfigError, match="has no column 'answer'; its columns: prompt, solution, system, level, id"):
        get_task("data", path=str(path))
    task = get_task("data", path=str(path), answer="solution", question="prompt", heldout_fraction=0,
                    validation_fraction=0)
    p = task.problems("train")[0]
    assert p.id == "5" and p.prompt == "Be brief.\nName a prime.\nanswer: " and p.meta["level"] == 2
    assert task.chat_prompt(p) == "Be brief.\n\nName a prime. Reply with only the answer."
    assert task.teacher_prompt(p) == "Reference answer:\n7\n\nBe brief.\nName a prime.\nanswer: "
    msgs = get_task("data", path=str(write_jsonl(tmp_path / "m.jsonl", rows[1:])), answer="solution",
                    heldout_fraction=0, validation_fraction=0).problems("train")[0]
    assert msgs.meta["question"] == "user: Hi\nassistant: Bonjour\nCapital?" and msgs.meta["system"] == "Answer in French."
    raw = get_task("data", path=str(path), answer="solution", question="prompt", raw_instruction=True,
                   instruction="Be exact.", heldout_fraction=0, validation_fraction=0)
    assert raw.problems("train")[0].prompt == "Be brief.\nBe exact.\nName a prime.\nanswer: "


def test_extract_sets_the_instruction_and_the_demonstration(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}])
    task = get_task("data", path=str(path), checker="number", extract="boxed", heldout_fraction=0,
                    validation_fraction=0)
    p = task.problems("train")[0]
    assert task.demonstration(p) == "\\boxed{2}" and task.score(p, "\\boxed{2}") == 1.0 and task.score(p, "2") == 0.0
    assert task.chat_prompt(p) == "1+1? Put the final answer in \\boxed{}."
    assert task.stop_sequences == ("\n",) and task.chat_stop_sequences == ()
    env = task.make_env()
    assert env.reset(p) == p.prompt
    assert env.step("\\boxed{2} <confidence>0.6</confidence>")[1:] == (1.0, True, {"outcome": 1.0, "confidence": 0.6})


# ------------------------------------------------------------------------------------------------ bad data
SCORERS = '''
def good(answer, reference):
    return float(answer.strip().lower() == reference.strip().lower())
def with_meta(answer, reference, meta):
    return 1.0 if answer.strip() == reference and meta["level"] >= 0 else 0.0
def boom(answer, reference):
    raise RuntimeError("no scorer today")
def words(answer, reference):
    return "yes"
def big(answer, reference):
    return 2
def picky(answer, reference):
    if "!" in answer:
        raise ValueError("no shouting")
    return float(answer == reference)
'''

BAD = [  # (file name, file text, extra options, what the one line must say)
    ("missing.jsonl", None, [], "data file {path} does not exist"),
    ("cols.jsonl", '{"q": "a", "a": "1"}\n', [], "data file {path} has no column 'question' (nor 'prompt' or "
                                                  "'messages') and no column 'answer'; its columns: q, a"),
    ("json.jsonl", '{"question": "a", "answer": "1"}\n\n{"question": "b", answer: 2}\n', [],
     "data file {path}, line 3: not JSON"),
    ("noans.jsonl", '{"question": "a", "answer": "1"}\n{"question": "b", "answer": ""}\n', [],
     "data file {path}, line 2: no answer (column 'answer' is empty)"),
    ("noans2.csv", 'question,answer\na,1\n"b\nc",\n', [], "data file {path}, line 3: no answer (column 'answer' is empty)"),
    ("dup.jsonl", '{"id": 1, "question": "a", "answer": "1"}\n{"id": "1", "question": "b", "answer": "2"}\n', [],
     "data file {path}, line 2: duplicate id '1' (first on line 1)"),
    ("nan.jsonl", '{"question": "a", "answer": "1"}\n{"question": "b", "answer": "two"}\n', ["checker=number"],
     "data file {path}, line 2: answer 'two' is not a number (checker number)"),
    ("split.json", '[{"question": "a", "answer": "1", "split": "tets"}]', [],
     "data file {path}, item 1: split 'tets' is not one of train, validation, heldout"),
    ("ok.jsonl", '{"question": "a", "answer": "1"}\n', ["checker=nope"], "unknown checker 'nope'"),
    ("ok.jsonl", '{"question": "a", "answer": "1"}\n', ["checker=data_scorers_t:boom"],
     "data file {path}, line 1: checker data_scorers_t:boom raised RuntimeError: no scorer today"),
    ("ok.jsonl", '{"question": "a", "answer": "1"}\n', ["checker=data_scorers_t:words"],
     "data file {path}, line 1: checker data_scorers_t:words returned 'yes'"),
    ("ok.jsonl", '{"question": "a", "answer": "1"}\n', ["checker=data_scorers_t:big"], "returned 2 "),
    ("ok.jsonl", '{"question": "a", "answer": "1"}\n', ["checker=data_scorers_t:nothing"],
     "checker 'data_scorers_t:nothing': module 'data_scorers_t' has no 'nothing'"),
    ("ok.jsonl", '{"question": "a", "answer": "1"}\n', ["checker=no_such_module_x:f"], "cannot import 'no_such_module_x'"),
    ("mc.jsonl", '{"question": "a", "answer": "E", "choices": ["x", "y"]}\n', ["checker=choice"],
     "data file {path}, line 1: answer 'E' is not an option letter (A-B) (checker choice)"),
    ("empty.jsonl", "\n\n", [], "data file {path} holds no rows"),
    ("data.txt", "question,answer\n", [], "data file {path}: unknown format"),
]


@pytest.mark.parametrize("name, text, options, message", BAD, ids=[f"{b[0]}-{b[3][:24]}" for b in BAD])
def test_bad_data_is_one_clear_line(tmp_path, capsys, monkeypatch, name, text, options, message):
    (tmp_path / "data_scorers_t.py").write_text(SCORERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    argv = ["validate", "data", "--set", f"path={path}", *[x for o in options for x in ("--set", o)]]
    assert message.format(path=path) in one_error(capsys, argv)


def test_an_empty_split_says_how_to_fill_it(tmp_path, capsys):
    path = write_jsonl(tmp_path / "t.jsonl", [{"question": f"q{i}", "answer": "1", "split": "train"} for i in range(5)])
    line = one_error(capsys, ["validate", "data", "--set", f"path={path}", "--split", "heldout"])
    assert f"data file {path} has no heldout problems (train 5, validation 0, heldout 0): raise heldout_fraction" in line
    assert main(["validate", "data", "--set", f"path={path}"]) == 0  # --split all: only the splits it has
    capsys.readouterr()


def test_a_user_scorer(tmp_path, monkeypatch):
    (tmp_path / "data_scorers_u.py").write_text(SCORERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_jsonl(tmp_path / "u.jsonl", [{"question": "Capital?", "answer": "Paris", "level": 1}])
    task = get_task("data", path=str(path), checker="data_scorers_u:good", heldout_fraction=0, validation_fraction=0)
    p = task.problems("train")[0]
    assert task.score(p, "  PARIS ") == 1.0 and task.score(p, "Rome") == 0.0
    meta = get_task("data", path=str(path), checker="data_scorers_u:with_meta", heldout_fraction=0,
                    validation_fraction=0)
    assert meta.score(p, "Paris") == 1.0
    picky = get_task("data", path=str(path), checker="data_scorers_u:picky", heldout_fraction=0, validation_fraction=0)
    with pytest.raises(ConfigError, match=r"checker data_scorers_u:picky raised ValueError: no shouting \(on the "
                                          r"answer 'Paris!'\)"):
        picky.score(p, "Paris!")  # a scorer's own bug is not a wrong answer


def test_bad_data_fails_llm_train_before_any_model_work(tmp_path, capsys):
    from reflectrl.cli import main as cli

    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "answer": "1"}, {"question": "a", "answer": "1",
                                                                                   "id": "row1"}])
    assert cli(["llm", "train", "--task", "data", "--set", f"path={path}", "--model", str(tmp_path / "no-model"),
                "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: data file {path}, line 2: duplicate id 'row1' (first on line 1)"
    assert not (tmp_path / "run").exists()


def test_a_missing_parquet_answer_names_its_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "n.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "a", "answer": 1.0}, {"question": "b", "answer": float("nan")}]),
                   str(path))
    with pytest.raises(ConfigError, match=rf"^data file {path}, row 2: no answer \(column 'answer' is missing\)$"):
        get_task("data", path=str(path), checker="number")
