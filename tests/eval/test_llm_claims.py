"""benchmarks/llm_claims.py: the unpaired verdicts and the paired reading, on synthetic eval.json files."""

import json
import sys
from pathlib import Path

import pytest

from .helpers import benchmark_script


@pytest.fixture(scope="module")
def claims():
    return benchmark_script("llm_claims")


def _write_evals(root: Path, task: str, method: str, evals: list[dict]) -> None:
    """One finished run per seed (1, 2, ...) of ``method`` with the given eval.json contents."""
    for s, ev in enumerate(evals, 1):
        d = root / "runs" / task / method / f"seed_{s}"
        d.mkdir(parents=True)
        (d / "eval.json").write_text(json.dumps(ev))
        (d / "metrics.jsonl").write_text("")


def _write(root: Path, method: str, accs: list[float], ece: float) -> None:
    _write_evals(root, "arith", method, [{"accuracy": a, "ece": ece, "auroc": 0.5, "coverage": 1.0} for a in accs])


def test_pairing_narrows_a_level_verdict(claims, tmp_path, monkeypatch, capsys):
    """Seeds that differ from each other by more than the method's constant +0.02 per pair: unpaired, P(better) is
    level; paired, every difference is +0.02, so the paired reading says better. The ECE is equal: level both ways."""
    base = [0.1, 0.3, 0.5, 0.7, 0.9]
    _write(tmp_path, "grpo", base, 0.2)
    _write(tmp_path, "m", [a + 0.02 for a in base], 0.2)
    out = tmp_path / "c.json"
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--out", str(tmp_path), "--task", "arith", "--methods", "m",
                                      "--json-out", str(out)])
    claims.main()
    text = capsys.readouterr().out
    res = json.loads(out.read_text())["methods"]["m"]
    acc = res["metrics"]["accuracy"]
    assert res["verdicts"]["accuracy"] == "holds"  # "not lower": holds unless the CI lies below 0.5
    assert acc["p_better"][1] < 0.5 < acc["p_better"][2]  # unpaired: the CI straddles 0.5
    assert acc["paired_diff"][0] == pytest.approx(0.02) and acc["paired_diff"][1] == pytest.approx(0.02)
    assert claims.paired_verdict(acc, "accuracy", 3) == "better"
    assert claims.paired_verdict(res["metrics"]["ece"], "ece", 3) == "level"
    assert acc["per_seed"]["3"] == pytest.approx([0.52, 0.5])
    assert "+0.020 [+0.020, +0.020]: better" in text
    assert claims.paired_verdict({"n": 2, "paired_diff": [0.1, 0.1, 0.1]}, "accuracy", 3) == "too few seeds (2)"
    # lower is better for ECE: a paired CI entirely below 0 is better, entirely above is worse
    assert claims.paired_verdict({"n": 5, "paired_diff": [-0.1, -0.2, -0.05]}, "ece", 3) == "better"
    assert claims.paired_verdict({"n": 5, "paired_diff": [0.1, 0.05, 0.2]}, "ece", 3) == "worse"


def test_task_metrics_only_where_present(claims, tmp_path, monkeypatch, capsys):
    """rag's premature-answer rate (lower is better) gets a verdict row; searches per episode (no better direction)
    only means and the paired reading; an arith-like run without them gets neither row."""
    for method, prem, calls in (("grpo", [0.4, 0.5, 0.6], [1.0, 1.2, 1.4]), ("m", [0.2, 0.3, 0.4], [1.5, 1.7, 1.9])):
        _write_evals(tmp_path, "rag", method,
                     [{"accuracy": 0.3, "premature_rate": p, "tool_calls": c} for p, c in zip(prem, calls)])
    out = tmp_path / "c.json"
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--out", str(tmp_path), "--task", "rag", "--methods", "m",
                                      "--json-out", str(out)])
    claims.main()
    text = capsys.readouterr().out
    res = json.loads(out.read_text())["methods"]["m"]
    assert res["metrics"]["premature_rate"]["paired_diff"][0] == pytest.approx(-0.2)
    assert "premature_rate" in res["verdicts"] and "tool_calls" not in res["verdicts"]
    assert claims.paired_verdict(res["metrics"]["premature_rate"], "premature_rate", 3) == "better"
    assert claims.paired_verdict(res["metrics"]["tool_calls"], "tool_calls", 3) == "higher"
    assert "| tool_calls (no better direction) | +0.500 [+0.500, +0.500]: higher |" in text
    assert "step_ece" not in text


def test_per_step_auroc_rows_and_self_knowledge(claims, tmp_path, monkeypatch, capsys):
    """step_auroc (higher is better) gets a row, a paired row and a self-knowledge column where runs have it."""
    _write_evals(tmp_path, "rag", "grpo", [{"accuracy": 0.3, "step_auroc": a, "step_ece": 0.4} for a in (0.5, 0.5, 0.5)])
    _write_evals(tmp_path, "rag", "m", [{"accuracy": 0.3, "step_auroc": a, "step_ece": 0.2} for a in (0.7, 0.8, 0.9)])
    out = tmp_path / "c.json"
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--out", str(tmp_path), "--task", "rag", "--methods", "m",
                                      "--json-out", str(out)])
    claims.main()
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["methods"]["m"]["metrics"]["step_auroc"]["paired_diff"][0] == pytest.approx(0.3)
    assert claims.paired_verdict(res["methods"]["m"]["metrics"]["step_auroc"], "step_auroc", 3) == "better"
    assert "| step_auroc (higher is better) | +0.300" in text and "| step_auroc | higher |" in text
    sk = res["self_knowledge"]
    assert sk["m"]["step_auroc"]["verdict"] == "holds" and sk["m"]["step_auroc"]["mean"] == pytest.approx(0.8)
    assert sk["grpo"]["step_auroc"]["verdict"] == "level (within noise)"  # 0.5 exactly: not above
    assert "mean per-step AUROC [95% CI] (> 0.5?)" in text


def test_warmup_table_from_the_comparison_models(claims, tmp_path, monkeypatch, capsys):
    """Each seed's warm-up summary (steps, train accuracy at the stop, target) is read from OUT/models and shown;
    a seed without a model, or with an unreadable summary, is left out."""
    _write(tmp_path, "grpo", [0.1, 0.2, 0.3], 0.2)
    _write(tmp_path, "m", [0.1, 0.2, 0.3], 0.2)
    for s, (steps, acc) in {1: (875, 0.234375), 2: (2000, 0.0625)}.items():
        w = tmp_path / "models" / "arith" / f"seed_{s}" / "warmup"
        w.mkdir(parents=True)
        (w / "warmup.json").write_text(json.dumps({"steps": steps, "train_accuracy": acc,
                                                   "config": {"stop_at_accuracy": 0.2, "steps": 2000}}))
    bad = tmp_path / "models" / "arith" / "seed_3" / "warmup"
    bad.mkdir(parents=True)
    (bad / "warmup.json").write_text("{not json")
    out = tmp_path / "c.json"
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--out", str(tmp_path), "--task", "arith", "--methods", "m",
                                      "--json-out", str(out)])
    claims.main()
    text = capsys.readouterr().out
    assert "| 1 | 875 (2000) | 0.234 (0.2) |" in text and "| 2 | 2000 (2000) | 0.062 (0.2) |" in text
    assert "| 3 |" not in text.split("| metric")[0]
    assert json.loads(out.read_text())["warmups"]["2"] == {"steps": 2000, "train_accuracy": 0.0625, "target": 0.2,
                                                           "max_steps": 2000}
