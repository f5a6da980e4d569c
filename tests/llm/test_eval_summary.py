"""`llm eval` ends with a summary in words: the accuracy with its interval and, where self-reports were asked for,
their calibration with a sentence on what it means; on stderr beside --json (stdout stays one JSON object), else as
the output."""

import json

import pytest

from reflectrl.cli import main
from reflectrl.cli.eval_report import confidence_meaning, reflection_meaning, summary_lines

BASE = {"task": "arith", "split": "heldout", "n": 200, "mode": "greedy", "ci_level": 0.95, "accuracy": 0.6,
        "ci": [0.53, 0.66], "confidence_missing_rate": 0.0, "mean_confidence": 0.9, "ece": 0.31, "auroc": 0.7}


@pytest.mark.parametrize("ci, words", [
    ([0.61, 0.79], "the confidence tells right answers from wrong better than chance (AUROC 0.70, its interval above 0.5)"),
    ([0.45, 0.95], "the confidence does not tell right answers from wrong (AUROC 0.70, its interval holds 0.5"),
    ([0.2, 0.45], "the confidence is higher on wrong answers than on right ones"),
    (None, "AUROC 0.70, without an interval: 0.5 means the confidence does not tell right answers from wrong"),
])
def test_the_sentence_follows_the_auroc_interval(ci, words):
    text = confidence_meaning({**BASE, "auroc_ci": ci})
    assert text.startswith("in words: " + words), text
    assert "it states 0.90 on average against an accuracy of 0.60: overconfident by 30 points on average" in text
    assert "ECE 0.31 is the mean gap" in text and "missing" not in text


def test_the_sentence_names_underconfidence_missing_reports_and_an_undefined_auroc():
    text = confidence_meaning({**BASE, "auroc": None, "mean_confidence": 0.45, "confidence_missing_rate": 0.25})
    assert "no AUROC: it needs stated confidences on both right and wrong answers" in text
    assert "underconfident by 15 points" in text and "25% of the confidences asked for are missing or malformed" in text
    assert "none of the confidences" in confidence_meaning({**BASE, "confidence_missing_rate": 1.0})
    assert "no better than always giving the more common verdict (70%)" in reflection_meaning(
        {"reflection_accuracy": 0.65, "best_constant": 0.7, "reflection_missing_rate": 0.0})
    assert "better than always" in reflection_meaning({"reflection_accuracy": 0.8, "best_constant": 0.7})


def test_the_summary_is_the_accuracy_then_each_report_and_its_meaning():
    res = {**BASE, "auroc_ci": [0.61, 0.79], "reflection_missing_rate": 0.1, "reflection_accuracy": 0.75,
           "best_constant": 0.6}
    lines = summary_lines(res, "runs/x")
    assert lines[0] == "runs/x on arith/heldout: accuracy 0.600 [0.530, 0.660] (greedy, n=200, 95% Wilson interval)"
    assert lines[1].startswith("  reflection: accuracy 0.750") and lines[2].startswith("  in words: the reflections")
    assert lines[3].startswith("  confidence: mean 0.900, ECE 0.310") and lines[-1] == f"  {confidence_meaning(res)}"
    assert summary_lines({k: v for k, v in BASE.items() if k != "confidence_missing_rate"}, "m") == \
        ["m on arith/heldout: accuracy 0.600 [0.530, 0.660] (greedy, n=200, 95% Wilson interval)"]


def test_eval_prints_the_summary_on_stderr_beside_json_and_on_stdout_without(tiny_dir, capsys):
    argv = ["llm", "eval", str(tiny_dir), "--task", "toy-add", "--limit", "12", "--self-report", "confidence",
            "--max-new-tokens", "3", "--no-progress"]
    assert main([*argv, "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)  # stdout: one JSON object, nothing else
    summary = summary_lines(res, str(tiny_dir))
    err = [line for line in cap.err.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert err == summary and summary[-1].startswith("  in words: ") and len(summary) <= 24
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert cap.out.splitlines() == summary and not [line for line in cap.err.splitlines()
                                                    if line.strip() and not line.startswith("warning: ")]
