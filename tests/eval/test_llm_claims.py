"""benchmarks/llm_claims.py: the unpaired verdicts and the paired reading, on synthetic eval.json files."""

import json
import re
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


def test_accuracy_not_lower_needs_its_margin_and_pairing(claims, tmp_path, monkeypatch, capsys):
    """Seeds that differ from each other far more than the method's constant +0.02 per pair: unpaired, P(better)
    straddles 0.5; paired, every difference is +0.02, so the one-sided bound clears the 2-point margin: "not
    lower". Five pairs can never be "better" (the exact sign-flip p is 2/32 at best). The ECE is equal: inconclusive."""
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
    assert res["verdicts"]["accuracy"] == "not lower"
    assert acc["p_better"][1] < 0.5 < acc["p_better"][2]  # unpaired: the CI straddles 0.5
    assert acc["claim"]["effect"] == pytest.approx(0.02) and acc["claim"]["p"] == pytest.approx(2 / 32)
    assert res["verdicts"]["ece"] == "inconclusive (5 seeds)"
    assert acc["per_seed"]["3"] == pytest.approx([0.52, 0.5])
    assert re.search(r"\| accuracy \(higher is better\) \| \+0\.020 \[\+0\.020, \+0\.020\], p = [0-9.e-]+, NI p = [0-9.e-]+: "
                     r"not lower \|", text)


def test_a_loss_is_not_lower_and_ten_seeds_decide(claims, tmp_path, monkeypatch, capsys):
    """An accuracy 5 points below the baseline in every pair is never "not lower"; at ten pairs it is "worse"
    (p = 2/1024, Holm over the family's three hypotheses: accuracy's difference and non-inferiority, ECE's
    difference), and an ECE 0.1 lower in every pair "better"."""
    base = [0.1 + 0.07 * i for i in range(10)]
    _write_evals(tmp_path, "arith", "grpo", [{"accuracy": a, "ece": 0.3 + 0.01 * i} for i, a in enumerate(base)])
    _write_evals(tmp_path, "arith", "m", [{"accuracy": a - 0.05, "ece": 0.2 + 0.01 * i} for i, a in enumerate(base)])
    out = tmp_path / "c.json"
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--out", str(tmp_path), "--task", "arith", "--methods", "m",
                                      "--json-out", str(out)])
    claims.main()
    res = json.loads(out.read_text())["methods"]["m"]
    assert res["verdicts"]["accuracy"] == "worse" and res["verdicts"]["ece"] == "better"
    assert res["metrics"]["accuracy"]["claim"]["p_holm"] == pytest.approx(3 * 2 / 1024)


def test_task_metrics_only_where_present(claims, tmp_path, monkeypatch, capsys):
    """rag's premature-answer rate (lower is better) gets a verdict row; searches per episode (no better direction)
    only means and the paired difference; an arith-like run without them gets neither row."""
    for method, prem, calls in (("grpo", [0.4, 0.5, 0.6], [1.0, 1.2, 1.4]), ("m", [0.2, 0.3, 0.4], [1.5, 1.7, 1.9])):
        _write_evals(tmp_path, "rag", method,
                     [{"accuracy": 0.3, "premature_rate": p, "tool_calls": c} for p, c in zip(prem, calls)])
    out = tmp_path / "c.json"
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--out", str(tmp_path), "--task", "rag", "--methods", "m",
                                      "--json-out", str(out)])
    claims.main()
    text = capsys.readouterr().out
    res = json.loads(out.read_text())["methods"]["m"]
    assert res["metrics"]["premature_rate"]["claim"]["effect"] == pytest.approx(0.2)  # oriented: lower is better
    assert "premature_rate" in res["verdicts"] and "tool_calls" not in res["verdicts"]
    assert res["verdicts"]["premature_rate"] == "inconclusive (3 seeds)"
    assert "| premature_rate (lower is better) | -0.200 [-0.200, -0.200], p = " in text
    assert "| tool_calls (no better direction) | +0.500 [+0.500, +0.500] |" in text
    assert "step_ece" not in text


def test_per_step_auroc_rows_and_self_knowledge(claims, tmp_path, monkeypatch, capsys):
    """step_auroc (higher is better) gets a row, a paired row and a self-knowledge column where runs have it; the
    self-knowledge checks use each seed's value (three seeds decide nothing: 0.8 on average is inconclusive)."""
    _write_evals(tmp_path, "rag", "grpo", [{"accuracy": 0.3, "step_auroc": a, "step_ece": 0.4} for a in (0.5, 0.5, 0.5)])
    _write_evals(tmp_path, "rag", "m", [{"accuracy": 0.3, "step_auroc": a, "step_ece": 0.2} for a in (0.7, 0.8, 0.9)])
    out = tmp_path / "c.json"
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--out", str(tmp_path), "--task", "rag", "--methods", "m",
                                      "--json-out", str(out)])
    claims.main()
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["methods"]["m"]["metrics"]["step_auroc"]["claim"]["effect"] == pytest.approx(0.3)
    assert "| step_auroc (higher is better) | +0.300" in text and "| step_auroc | higher |" in text
    sk = res["self_knowledge"]
    assert sk["m"]["step_auroc"]["per_seed"] == {"1": 0.7, "2": 0.8, "3": 0.9}
    assert sk["m"]["step_auroc"]["mean"] == pytest.approx(0.8) and sk["m"]["step_auroc"]["p"] == pytest.approx(0.25)
    assert sk["m"]["step_auroc"]["verdict"] == "inconclusive (3 seeds)"
    assert "mean per-step AUROC [95% t CI], Holm p (> 0.5?)" in text


def test_rerender_equals_the_first_render(claims, tmp_path, monkeypatch, capsys):
    """A results file decided and rendered again from its per-seed values alone gives the same tables."""
    _write(tmp_path, "grpo", [0.1, 0.3, 0.5, 0.7], 0.2)
    _write(tmp_path, "m", [0.2, 0.3, 0.6, 0.7], 0.1)
    out, md = tmp_path / "c.json", tmp_path / "c.md"
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--out", str(tmp_path), "--task", "arith", "--methods", "m",
                                      "--json-out", str(out), "--md-out", str(md)])
    claims.main()
    first = md.read_text()
    monkeypatch.setattr(sys, "argv", ["llm_claims.py", "--rerender", str(out), "--json-out", str(out), "--md-out", str(md)])
    claims.main()
    assert md.read_text() == first


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
