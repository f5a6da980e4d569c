"""The verl reward functions (reflectrl.integrations.verl_rewards) on hand cases, and the verl integration's
behaviour without verl. Nothing here needs verl."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from reflectrl.errors import ConfigError
from reflectrl.integrations import verl_rewards as vr
from reflectrl.methods.rewards import refgrpo_reward, rlcr_reward

KEYS = {"score", "acc", "outcome", "reflection", "confidence", "bonus"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def arith_row():
    return vr.verl_rows("arith", "train", limit=1)[0]


def score(row, text, method="outcome", **kwargs):
    fn = {"outcome": vr.outcome_score, "refgrpo": vr.refgrpo_score, "rlcr": vr.rlcr_score}[method]
    return fn(row["data_source"], text, row["reward_model"]["ground_truth"], dict(row["extra_info"]), **kwargs)


def test_row_layout(arith_row):
    json.dumps(arith_row)  # parquet / jsonl friendly
    assert arith_row["data_source"] == "reflectrl/arith"
    assert arith_row["prompt"] == [{"role": "user", "content": arith_row["extra_info"]["problem_prompt"]}]
    assert json.loads(arith_row["extra_info"]["meta"])["value"] == int(arith_row["reward_model"]["ground_truth"])
    asked = vr.verl_rows("arith", "train", limit=1, self_report="confidence")[0]
    assert asked["prompt"][0]["content"].endswith(vr.SELF_REPORT_INSTRUCTIONS["confidence"] + "\n")
    assert asked["extra_info"]["problem_prompt"] == arith_row["extra_info"]["problem_prompt"]
    with pytest.raises(ConfigError, match="self_report"):
        vr.verl_rows("arith", "train", limit=1, self_report="both")


# ------------------------------------------------------------------------------------------------ refgrpo
@pytest.mark.parametrize("suffix, right, reflection, bonus", [
    (" <reflect>solved</reflect>", True, 1.0, 0.1),
    (" <reflect>unsolved</reflect>", True, 0.0, 0.0),
    (" <reflect>unsolved</reflect>", False, 0.0, 0.1),
    (" <reflect>solved</reflect>", False, 1.0, 0.0),
    ("", True, -1.0, 0.0),                           # missing: no bonus
    (" <reflect>maybe</reflect>", False, -1.0, 0.0),  # malformed: no bonus
    (" <reflect>solved", True, 1.0, 0.1),            # a closing tag cut by a stop sequence still counts
])
def test_refgrpo_hand_cases(arith_row, suffix, right, reflection, bonus):
    answer = arith_row["reward_model"]["ground_truth"] if right else "-1"
    out = score(arith_row, answer + suffix, "refgrpo")
    assert set(out) == KEYS
    outcome = 1.0 if right else 0.0
    assert out["outcome"] == out["acc"] == outcome and out["reflection"] == reflection
    assert out["bonus"] == pytest.approx(bonus) and out["score"] == pytest.approx(outcome + bonus)
    ref = refgrpo_reward(torch.tensor([outcome]), torch.tensor([math.nan if reflection < 0 else reflection]), 0.1)
    assert out["score"] == pytest.approx(float(ref[0]))


def test_refgrpo_coefficient_and_schedule(arith_row):
    text = arith_row["reward_model"]["ground_truth"] + " <reflect>solved</reflect>"
    assert score(arith_row, text, "refgrpo", bonus=0.5)["score"] == pytest.approx(1.5)
    assert score(arith_row, text, "refgrpo", bonus=0.0)["score"] == 1.0
    step = {"bonus_schedule": "step"}
    assert score(arith_row, text, "refgrpo", progress=0.5, **step)["bonus"] == pytest.approx(0.1)
    assert score(arith_row, text, "refgrpo", progress=0.7, **step)["bonus"] == 0.0
    assert score(arith_row, text, "refgrpo", progress=0.7, bonus_until=0.8, **step)["bonus"] == pytest.approx(0.1)
    assert score(arith_row, text, "refgrpo", progress=0.25, bonus_schedule="linear")["bonus"] == pytest.approx(0.075)
    # extra_info settings apply when no keyword argument gives them; keywords win
    row = {**arith_row, "extra_info": {**arith_row["extra_info"], "bonus": 0.3}}
    assert score(row, text, "refgrpo")["bonus"] == pytest.approx(0.3)
    assert score(row, text, "refgrpo", bonus=0.2)["bonus"] == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="progress"):
        score(arith_row, text, "refgrpo", **step)
    with pytest.raises(ConfigError, match="progress"):
        score(arith_row, text, "refgrpo", progress=1.5, **step)
    with pytest.raises(ConfigError, match="schedule"):
        score(arith_row, text, "refgrpo", progress=0.5, bonus_schedule="cosine")
    with pytest.raises(ConfigError, match="bonus"):
        score(arith_row, text, "refgrpo", bonus=-0.1)
    with pytest.raises(ConfigError, match="bonus"):
        score(arith_row, text, "refgrpo", bonus="high")


# ------------------------------------------------------------------------------------------------ rlcr
@pytest.mark.parametrize("suffix, right, confidence, want", [
    (" <confidence>0.8</confidence>", True, 0.8, 1 - 0.04),
    (" <confidence>0.8</confidence>", False, 0.8, -0.64),
    (" <confidence>0</confidence>", False, 0.0, 0.0),
    (" <confidence>1.0</confidence>", True, 1.0, 1.0),
    ("", True, -1.0, -2.0),                               # missing
    (" <confidence>1.5</confidence>", True, -1.0, -2.0),  # out of range
    (" <confidence>high</confidence>", False, -1.0, -2.0),  # malformed
])
def test_rlcr_hand_cases(arith_row, suffix, right, confidence, want):
    answer = arith_row["reward_model"]["ground_truth"] if right else "-1"
    out = score(arith_row, answer + suffix, "rlcr")
    assert set(out) == KEYS and out["confidence"] == confidence
    assert out["score"] == pytest.approx(want) and out["score"] == pytest.approx(out["acc"] + out["bonus"])
    q = math.nan if confidence < 0 else confidence
    assert out["score"] == pytest.approx(float(rlcr_reward(torch.tensor([out["acc"]]), torch.tensor([q]))[0]))


def test_rlcr_format_penalty(arith_row):
    assert score(arith_row, "-1", "rlcr", format_penalty=-1.0)["score"] == -1.0
    with pytest.raises(ConfigError, match="format_penalty"):
        score(arith_row, "-1", "rlcr", format_penalty=float("nan"))


# ------------------------------------------------------------------------------------------------ dispatch, rows
def test_compute_score_dispatch(arith_row):
    text = arith_row["reward_model"]["ground_truth"] + " <reflect>solved</reflect> <confidence>0.5</confidence>"
    args = (arith_row["data_source"], text, arith_row["reward_model"]["ground_truth"])
    assert vr.compute_score(*args, dict(arith_row["extra_info"]))["score"] == 1.0
    assert vr.compute_score(*args, dict(arith_row["extra_info"]), method="refgrpo")["score"] == pytest.approx(1.1)
    info = {**arith_row["extra_info"], "method": "rlcr"}
    assert vr.compute_score(*args, info)["score"] == pytest.approx(0.75)
    assert vr.compute_score(*args, info, method="outcome")["score"] == 1.0  # keywords win
    # verl's reward manager passes more keywords than the four; they are ignored
    assert vr.compute_score(*args, dict(arith_row["extra_info"]), reward_router_address=None)["score"] == 1.0
    with pytest.raises(ConfigError, match="unknown reward method"):
        vr.compute_score(*args, dict(arith_row["extra_info"]), method="ppo")


def test_task_from_data_source_and_a_bare_arith_row():
    assert vr.outcome_score("reflectrl/arith", "19", "19", None)["score"] == 1.0
    assert vr.outcome_score("arith", "18", "19", {})["score"] == 0.0
    with pytest.raises(ConfigError, match="integer ground_truth"):
        vr.outcome_score("arith", "19", "nineteen", {})
    with pytest.raises(ConfigError, match="unknown task"):
        vr.outcome_score("reflectrl/chess", "e4", "e4", {})
    with pytest.raises(ConfigError, match="extra_info"):
        vr.outcome_score(None, "19", "19", {})
    with pytest.raises(ConfigError, match="JSON"):
        vr.outcome_score("arith", "19", "19", {"meta": "{not json"})


def test_text2sql_rows(tmp_path):
    options = {"n_train_dbs": 1, "n_heldout_dbs": 1, "per_template": 1}
    row = vr.verl_rows("text2sql", "train", options, limit=1, self_report="reflect")[0]
    sql = row["reward_model"]["ground_truth"]
    assert "<reflect>solved</reflect>" in row["prompt"][0]["content"]
    right = score(row, f"<answer>{sql}</answer> <reflect>solved</reflect>", "refgrpo")
    assert right["outcome"] == 1.0 and right["score"] == pytest.approx(1.1)
    wrong = score(row, "<answer>SELECT 1 WHERE 0</answer> <reflect>unsolved</reflect>", "refgrpo")
    assert wrong["outcome"] == 0.0 and wrong["score"] == pytest.approx(0.1)
    assert score(row, "no answer at all", "refgrpo")["score"] == 0.0
    with pytest.raises(ConfigError, match="meta"):
        vr.outcome_score(row["data_source"], sql, sql, {"task_options": row["extra_info"]["task_options"]})
    # verl scores responses on threads: one shared task, the same numbers
    texts = [f"<answer>{sql}</answer> <reflect>solved</reflect>", "<answer>SELECT 1</answer>"] * 8
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda t: score(row, t, "refgrpo")["score"], texts))
    assert outs == [pytest.approx(1.1), 0.0] * 8


def test_rag_rows():
    row = vr.verl_rows("rag", "train", limit=1, self_report="confidence")[0]
    answer = json.loads(row["extra_info"]["meta"])["answers"][0]
    out = score(row, f"<answer>{answer}</answer> <confidence>0.9</confidence>", "rlcr")
    assert out["outcome"] == 1.0 and out["score"] == pytest.approx(1 - 0.01)


def test_codegen_rows_run_the_sandbox_once():
    row = vr.verl_rows("codegen", "train", limit=1, self_report="reflect")[0]
    body = row["reward_model"]["ground_truth"]
    out = score(row, body + "\n<reflect>solved</reflect>", "refgrpo")
    assert out["outcome"] == 1.0 and out["reflection"] == 1.0 and out["score"] == pytest.approx(1.1)
    info = {k: v for k, v in row["extra_info"].items() if k != "problem_prompt"}
    with pytest.raises(ConfigError, match="problem_prompt"):
        vr.outcome_score(row["data_source"], body, body, info)


def test_make_data_writes_rows_the_reward_functions_read(tmp_path):
    spec = importlib.util.spec_from_file_location("make_data", ROOT / "examples" / "verl" / "make_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--task", "arith", "--out", str(tmp_path), "--limit", "3", "--format", "jsonl",
                     "--self-report", "reflect"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["extra_info"]["split"] == "heldout" for r in rows)
    gt = rows[0]["reward_model"]["ground_truth"]
    assert score(rows[0], gt + " <reflect>solved</reflect>", "refgrpo")["score"] == pytest.approx(1.1)


# ------------------------------------------------------------------------------------------------ without verl
def test_importing_the_integration_does_not_import_verl_and_registering_without_it_is_one_error():
    code = (
        "import sys\n"
        "import reflectrl.integrations.verl as rv, reflectrl.integrations.verl_rewards\n"
        "assert 'verl' not in sys.modules, 'verl imported'\n"
        "sys.modules['verl'] = None  # as if verl were not installed\n"
        "from reflectrl.errors import ReflectRLError\n"
        "try:\n"
        "    rv.register_with_verl()\n"
        "except ReflectRLError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'reflectrl[verl]'" in out.stdout and len(out.stdout.strip().splitlines()) == 1
