"""The data task on the real model (slow; ``make test-slow``): a GSM-style word-problem file and a multiple-choice
file, made here from test_data's generators, through SmolLM2-135M-Instruct: ``tasks validate`` scores every reference
1, ``llm eval --self-report both`` reports accuracy and calibration, and a 3-update GRPO run with LoRA trains and
resumes to the uninterrupted run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_data import choice_rows, word_problems, write_jsonl

from reflectrl.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
MODEL = "smollm2-135m-instruct"
FILES = {"number": (word_problems, 300), "choice": (choice_rows, 200)}


@pytest.fixture(scope="module")
def model_dir():
    from reflectrl.llm.models import get_model

    return get_model(MODEL)


def data_file(tmp_path: Path, checker: str) -> list[str]:
    make, n = FILES[checker]
    path = write_jsonl(tmp_path / f"{checker}.jsonl", make(n))
    return ["--task", "data", "--set", f"path={path}", "--set", f"checker={checker}"]


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def behaviour(run: Path) -> list[dict]:
    """The records of a run without its timings (what a resumed run must repeat)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "charts/"))} for r in rows]


@pytest.mark.parametrize("checker", sorted(FILES))
def test_validate_and_eval_with_self_reports(model_dir, tmp_path, capsys, checker):
    task = data_file(tmp_path, checker)
    assert main(["tasks", "validate", *task[1:], "--json"]) == 0
    report = last_json(capsys)
    assert report["ok"] and report["passed"] == report["total"] == FILES[checker][1]
    assert main(["llm", "eval", MODEL, *task, "--split", "heldout", "--limit", "12", "--self-report", "both",
                 "--json", "--no-progress"]) == 0
    res = last_json(capsys)
    assert res["task"] == "data" and res["n"] == 12 and res["self_report"] == "both"
    assert 0.0 <= res["accuracy"] <= 1.0 and res["ci"][0] <= res["accuracy"] <= res["ci"][1]
    for key in ("reflection_accuracy", "reflection_missing_rate", "confidence_missing_rate"):
        assert 0.0 <= res[key] <= 1.0, key
    if res["confidence_missing_rate"] < 1.0:  # some confidence stated: its calibration is measured
        assert 0.0 <= res["ece"] <= 1.0 and 0.0 <= res["brier"] <= 1.0


@pytest.mark.parametrize("checker", sorted(FILES))
def test_grpo_with_lora_trains_three_updates_and_resumes(model_dir, tmp_path, checker):
    task = data_file(tmp_path, checker)

    def train(run: str, updates: int) -> list[str]:
        return ["llm", "train", "--algo", "grpo", *task, "--model", MODEL, "--lora-r", "16", "--prompts-per-update",
                "2", "--group-size", "4", "--max-new-tokens", "24", "--threads", "1", "--attention", "shared-prompt",
                "--updates", str(updates), "--run-dir", str(tmp_path / run), "--seed", "3", "--no-progress",
                "--no-tensorboard"]

    assert main(train("full", 3)) == 0
    assert main(train("cut", 2)) == 0
    assert main(["llm", "train", "--resume", str(tmp_path / "cut"), "--updates", "3", "--no-progress"]) == 0
    full, cut = behaviour(tmp_path / "full"), behaviour(tmp_path / "cut")
    assert [r["update"] for r in full] == [1, 2, 3] and cut == full
    assert all(math.isfinite(r["losses/policy_loss"]) and 0.0 <= r["groups/zero_std_frac"] <= 1.0 for r in full)
