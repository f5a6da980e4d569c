"""reflectrl inside TRL's GRPOTrainer: the example runs a few steps on the CPU, and the calibration it logs equals
reflectrl.eval.calibration recomputed from the same completions; the reward functions against hand-worked values."""

import json
import math
import runpy
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")

from reflectrl.eval.calibration import self_report_metrics  # noqa: E402
from reflectrl.integrations import trl as R  # noqa: E402
from reflectrl.tasks.base import get_task, parse_confidence  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def confident_tiny(tmp_path_factory):
    """A tiny model warmed up on arith to end its answers with <confidence>q</confidence> (raw prompts)."""
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.llm.warmup import WarmupConfig, warmup

    root = tmp_path_factory.mktemp("trl")
    tiny = init_tiny(root / "tiny", layers=1, width=32, heads=2, max_positions=256, seed=0)
    warmup(WarmupConfig(model=str(tiny), task="arith", out=str(root / "warm"), steps=300, batch_size=32,
                        learning_rate=3e-3, self_report="inline", progress=False))
    return root / "warm"


def test_the_example_logs_the_calibration_of_its_completions(confident_tiny, tmp_path):
    mod = runpy.run_path(str(ROOT / "examples" / "trl_rlcr.py"))
    history = mod["main"](["--model", str(confident_tiny), "--steps", "3", "--out", str(tmp_path)])
    assert [h["step"] for h in history] == [1, 2, 3]
    kept = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    task = get_task("arith")
    problems = {p.id: p for s in ("train", "heldout") for p in task.problems(s)}
    stated = 0
    for h in history:  # recompute each step's metrics from its completions' texts, independently of the rewards
        rows = [r for r in kept if r["step"] == h["step"]]
        assert len(rows) == h["calibration/completions"] == 8
        y = [float(task.score(problems[r["problem_id"]], r["completion"]) >= 1.0) for r in rows]
        q = [parse_confidence(r["completion"]) for r in rows]
        stated += sum(v is not None for v in q)
        want = self_report_metrics(np.array(y), None, np.array([math.nan if v is None else v for v in q]))
        assert h["calibration/accuracy"] == pytest.approx(want["accuracy"])
        for key in ("ece", "brier", "auroc", "mean_confidence"):
            if math.isfinite(want[key]):
                assert h[f"calibration/{key}"] == pytest.approx(want[key]), key
            else:
                assert f"calibration/{key}" not in h
    assert stated > 0  # the warmed-up model states confidences: the check is not of empty reports
    logged = [json.loads(line) for line in (tmp_path / "calibration.jsonl").read_text().splitlines()]
    assert logged == history


def test_rewards_against_hand_worked_values():
    task = get_task("arith")
    p = next(p for p in task.problems("train") if p.meta["ops"] == ["+"])
    right, wrong = str(p.meta["value"]), str(p.meta["value"] + 1)
    completions = [f"{right}<confidence>0.8</confidence>", f"{wrong}<confidence>0.8</confidence>", right,
                   [{"role": "assistant", "content": f"{right}<reflect>solved</reflect>"}]]
    ids = [p.id] * 4
    log = R.RewardLog()
    rlcr = R.rlcr_reward("arith", log=log)(completions=completions, problem_id=ids)
    assert rlcr == pytest.approx([1 - 0.2 ** 2, -(0.8 ** 2), -2.0, -2.0])
    assert R.brier_reward("arith")(completions=completions, problem_id=ids) == pytest.approx([-0.04, -0.64, 0, 0])
    assert R.reflection_reward("arith")(completions=completions, problem_id=ids) == pytest.approx([0, 0, 0, 0.1])
    assert R.format_reward("arith")(completions=completions, problem_id=ids) == [1.0, 1.0, 0.0, 0.0]
    assert R.outcome_reward("arith")(completions=completions, problem_id=ids) == [1.0, 0.0, 1.0, 1.0]
    assert [r["confidence"] for r in log.take()][:2] == [0.8, 0.8]
    with pytest.raises(Exception, match="not a problem of task 'arith'"):
        R.outcome_reward("arith")(completions=["1"], problem_id=["nope"])


def test_dataset_rows_and_the_collapse_alarm():
    ds = R.task_dataset("arith", self_report="confidence", limit=2)
    row = ds[0]
    assert row["problem_id"].startswith("arith:") and row["prompt"][0]["role"] == "user"
    assert "Reply with only the number" in row["prompt"][0]["content"] and "<confidence>P</confidence>" in \
        row["prompt"][0]["content"]
    same = [{"acc": float(i % 2), "reflection": math.nan, "confidence": 0.9} for i in range(8)]
    assert R.calibration_of(same)["calibration/collapse"] == 1.0
    varied = [dict(r, confidence=0.1 + 0.1 * i) for i, r in enumerate(same)]
    assert R.calibration_of(varied)["calibration/collapse"] == 0.0


@pytest.mark.slow
def test_the_example_on_the_real_model(tmp_path):
    """The example with SmolLM2-135M-Instruct through its chat template and a LoRA adapter, one step: TRL trains it
    and the callback logs the calibration of its completions (skipped where the model's package is missing)."""
    from reflectrl.errors import ConfigError
    from reflectrl.llm.models import resolve_model

    try:
        resolve_model("smollm2-135m-instruct")
    except ConfigError as exc:
        pytest.skip(str(exc))
    mod = runpy.run_path(str(ROOT / "examples" / "trl_rlcr.py"))
    history = mod["main"](["--model", "smollm2-135m-instruct", "--lora-r", "16", "--steps", "1", "--out", str(tmp_path)])
    assert [h["step"] for h in history] == [1] and history[0]["calibration/completions"] == 8
    assert 0.0 <= history[0]["calibration/accuracy"] <= 1.0
