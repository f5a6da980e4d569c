"""``reflectrl tasks``: list, show, validate (exit 0 when every reference passes, 1 when one fails, 2 on bad input)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reflectrl import cli as top
from reflectrl.cli.tasks import main
from reflectrl.tasks.arith import ArithTask

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(120)]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_list(capsys):
    assert main(["list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"arith", "codegen", "humaneval", "text2sql"} <= set(rows)  # other tests may register toy tasks
    assert rows["humaneval"]["train"] + rows["humaneval"]["heldout"] == 164
    assert rows["text2sql"]["multi_turn"] and not rows["arith"]["multi_turn"]
    assert top.main(["tasks", "list"]) == 0
    assert "text2sql" in capsys.readouterr().out


def test_show(capsys):
    assert main(["show", "arith", "-n", "2", "--set", "digits=1"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- arith:") == 2 and ">>> " in out


@pytest.mark.parametrize("name, split", [("arith", "all"), ("text2sql", "heldout")])
def test_validate_passes(capsys, name, split):
    assert main(["validate", name, "--split", split, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["passed"] == report["total"] > 0
    assert set(report["splits"]) == ({"train", "validation", "heldout"} if split == "all" else {split})


def test_validate_codegen_subset(capsys):
    assert main(["validate", "codegen", "--split", "heldout", "--set", 'families=["add","srev","lsort"]',
                 "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "codegen heldout:" in out and " pass in " in out


def test_validate_reports_failures(capsys, monkeypatch):
    monkeypatch.setattr(ArithTask, "demonstration", lambda self, p: "0" if p.meta["value"] % 2 else p.answer)
    assert main(["validate", "arith", "--split", "heldout", "--set", "digits=1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL arith:" in out and "reference solutions pass" in out


@pytest.mark.parametrize("argv, pattern", [
    (["validate", "nope"], "unknown task 'nope'"),
    (["validate", "arith", "--set", "digitz=3"], "no option digitz"),
    (["validate", "arith", "--set", "digits=9"], "digits must be"),
    (["validate", "arith", "--set", "novalue"], "KEY=VALUE"),
    (["validate", "arith", "--workers", "0"], "--workers"),
])
def test_bad_input_is_one_line(capsys, argv, pattern):
    assert main(argv) == 2
    assert pattern in _one_error_line(capsys.readouterr().err)


def test_bad_split_is_a_usage_error(capsys):
    assert main(["validate", "arith", "--split", "test"]) == 2
    assert "invalid choice" in capsys.readouterr().err


DIGEST = """
import hashlib, sys
from reflectrl.tasks.base import get_task
h = hashlib.sha256()
for name in ("arith", "codegen", "text2sql"):
    task = get_task(name)
    for split in ("train", "heldout"):
        for p in task.problems(split):
            h.update((p.id + p.prompt + (p.answer or "") + str(p.meta.get("tests", ""))).encode())
print(h.hexdigest())
"""


def test_problems_are_identical_in_a_fresh_process():
    here = subprocess.run([sys.executable, "-c", DIGEST], capture_output=True, text=True, timeout=60,
                          env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"})
    there = subprocess.run([sys.executable, "-c", DIGEST], capture_output=True, text=True, timeout=60,
                           env={"PYTHONHASHSEED": "456", "PATH": "/usr/bin:/bin"})
    assert here.returncode == 0, here.stderr
    assert here.stdout == there.stdout and len(here.stdout.strip()) == 64


@pytest.mark.slow
def test_validate_humaneval_all_164(capsys):
    assert main(["validate", "humaneval", "--split", "all", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] == report["total"] == 164


def test_show_opens_with_the_options_and_token_budgets(capsys):
    from reflectrl.cli.tasks import main as tasks_main

    assert tasks_main(["show", "arith", "-n", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "task arith: single-turn"
    assert out[1].startswith("options (--set KEY=VALUE): digits=2, ops='+-'")
    assert out[2] == "tokens per turn (--max-new-tokens default): 10 with raw prompts, 24 with a chat model"


def test_show_prints_the_options_as_given(tmp_path, capsys):
    """``--set`` values replace the defaults on the options line (a rag corpus and questions file, not None)."""
    corpus, questions = tmp_path / "corpus.jsonl", tmp_path / "questions.jsonl"
    corpus.write_text(json.dumps({"id": 1, "text": "Ada Lovelace was born in London."}) + "\n")
    questions.write_text(json.dumps({"id": "q1", "question": "Where was Ada Lovelace born?", "answers": ["London"]})
                         + "\n")
    assert main(["show", "rag", "-n", "1", "--set", f"corpus={corpus}", "--set", f"questions={questions}",
                 "--set", "k=3"]) == 0
    options = capsys.readouterr().out.splitlines()[1]
    assert f"corpus={str(corpus)!r}" in options and f"questions={str(questions)!r}" in options, options
    assert "k=3," in options and "None" not in options
