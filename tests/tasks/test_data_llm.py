"""The data task and a task class of one's own through the LLM commands: warm-up, a 2-update ``llm train`` that
resumes to the uninterrupted run, ``llm eval --self-report both``; ``--task MODULE:CLASS`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data import word_problems, write_jsonl

from reflectrl.cli import main
from reflectrl.errors import ConfigError
from reflectrl.tasks.base import get_task

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from reflectrl.llm.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny") / "m", layers=1, width=32, heads=2, max_positions=256)


def timing(key: str) -> bool:
    return key.startswith("time/") or key in ("charts/SPS", "charts/samples_per_s", "charts/tokens_per_s")


def records(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not timing(k)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def train_flags(tiny: Path, path: Path, run: Path, updates: int) -> list[str]:
    return ["llm", "train", "--algo", "rlcr", "--task", "data", "--set", f"path={path}", "--set", "checker=number",
            "--model", str(tiny), "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "6",
            "--learning-rate", "1e-3", "--updates", str(updates), "--run-dir", str(run), "--no-progress",
            "--no-tensorboard"]


def test_train_on_a_file_resumes_to_the_uninterrupted_run_and_evaluates(tiny, tmp_path, capsys, monkeypatch):
    data = write_jsonl(tmp_path / "gsm.jsonl", word_problems(200))
    monkeypatch.chdir(tmp_path)
    assert main(["llm", "warmup", "--model", str(tiny), "--task", "data", "--set", "path=gsm.jsonl", "--set",
                 "checker=number", "--out", "warm", "--steps", "3", "--batch-size", "4", "--eval-problems", "2",
                 "--self-report", "both", "--no-progress"]) == 0
    run, ref = tmp_path / "a", tmp_path / "b"
    assert main(train_flags(tmp_path / "warm", Path("gsm.jsonl"), run, 1)) == 0
    assert json.loads((run / "config.json").read_text())["task_options"] == [f"path={data}", "checker=number"]
    monkeypatch.chdir(tmp_path / "a")  # the run recorded its file's absolute path: it resumes from any folder
    assert main(["llm", "train", "--resume", str(run), "--updates", "2", "--no-progress"]) == 0
    assert main(train_flags(tmp_path / "warm", data, ref, 2)) == 0
    assert [r["update"] for r in records(run)] == [1, 2] and records(run) == records(ref)
    capsys.readouterr()
    assert main(["llm", "eval", str(run), "--split", "heldout", "--self-report", "both", "--limit", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["task"] == "data" and report["n"] == 4 and report["self_report"] == "both"


TASK_MODULE = '''
from reflectrl.tasks.base import Problem

CAPITALS = {"France": "Paris", "Italy": "Rome", "Norway": "Oslo", "Peru": "Lima", "Chad": "Ndjamena",
            "Cuba": "Havana"}


class Capitals:
    """Name the capital of a country."""

    def __init__(self, upper: bool = False):
        self.upper = upper

    def problems(self, split):
        names = sorted(CAPITALS)
        chosen = names[:4] if split == "train" else names[4:] if split == "heldout" else names[3:4]
        return [Problem(id=f"capital:{c}", prompt=f"capital of {c}:", answer=CAPITALS[c]) for c in chosen]

    def score(self, problem, completion):
        got = completion.strip().split("\\n")[0].strip()
        return float(got.lower() == problem.answer.lower())

    def demonstration(self, problem):
        return problem.answer.upper() if self.upper else problem.answer

    stop_sequences = ("\\n",)
    max_new_tokens = 10


class NotATask:
    def problems(self, split):
        return []
'''


def test_a_task_class_of_ones_own(tiny, tmp_path, capsys, monkeypatch):
    (tmp_path / "my_capitals_t.py").write_text(TASK_MODULE)
    monkeypatch.chdir(tmp_path)  # the current folder is importable, as with python -m
    assert main(["tasks", "validate", "my_capitals_t:Capitals", "--set", "upper=true"]) == 0
    assert "my_capitals_t:Capitals: 7/7 pass" in capsys.readouterr().out
    task = get_task("my_capitals_t:Capitals")
    assert task.name == "my_capitals_t:Capitals" and task.multi_turn is False
    problem = task.problems("train")[0]
    env = task.make_env()  # filled in: a one-step environment over score
    assert env.reset(problem) == problem.prompt and env.step(problem.answer)[1:3] == (1.0, True)
    with pytest.raises(ConfigError, match=r"task 'my_capitals_t:Capitals' has no option big; options: upper"):
        get_task("my_capitals_t:Capitals", big=1)
    with pytest.raises(ConfigError, match=r"is not a task class: it lacks score, demonstration"):
        get_task("my_capitals_t:NotATask")
    with pytest.raises(ConfigError, match=r"cannot import 'no_module_here_t': ModuleNotFoundError"):
        get_task("no_module_here_t:Task")
    run = tmp_path / "run"
    assert main(["llm", "train", "--task", "my_capitals_t:Capitals", "--model", str(tiny), "--prompts-per-update", "2",
                 "--group-size", "2", "--updates", "1", "--run-dir", str(run), "--no-progress",
                 "--no-tensorboard"]) == 0
    assert json.loads((run / "config.json").read_text())["task"] == "my_capitals_t:Capitals"
    capsys.readouterr()
    assert main(["llm", "eval", str(run), "--split", "heldout", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"] == 2
