"""benchmarks/real_equal.py's table: per arm the means over seeds, each seed's AUROC, and the verdicts of the one rule
against GRPO (paired by seed), from the results file as the runs write it."""

import json

from .helpers import benchmark_script


def test_the_table_and_its_verdicts(tmp_path):
    mod = benchmark_script("real_equal")
    runs = {}
    for arm, acc, auroc in (("grpo", 0.40, 0.50), ("rlcr-inline", 0.38, 0.70)):
        for seed in range(1, 9):
            runs[f"base|12|{arm}|{seed}|validation"] = {
                "start": "base", "updates": 12, "arm": arm, "seed": seed, "split": "validation", "n": 200,
                "accuracy": acc + 0.01 * seed, "auroc": auroc + 0.01 * seed, "ece": 0.2, "mean_confidence": 0.5,
                "confidence_missing_rate": 0.0, "selective_accuracy@0.5": acc, "cpu_s_per_update": 30.0}
    runs["base|0|start|0|validation"] = {"start": "base", "updates": 0, "arm": "start", "seed": 0,
                                         "split": "validation", "n": 200, "accuracy": 0.2, "auroc": 0.5}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"runs": runs}))
    text = mod.render([str(path)])
    assert "| start (no training) | 1 | 0.200 |" in text
    assert "| rlcr-inline | 8 | 0.425 | 0.745 (s1 0.71; s2 0.72;" in text  # the mean over seeds 1-8, and each seed
    # chosen: within 3 points of GRPO's accuracy, the higher AUROC; 4 points below, GRPO's only rival is not chosen
    assert "of GRPO's): rlcr-inline." in text
    rows = [dict(r) for r in runs.values()]
    assert mod.chosen(rows) == "rlcr-inline"
    assert mod.chosen([dict(r, accuracy=r["accuracy"] - 0.02) if r["arm"] == "rlcr-inline" else r for r in rows]) is None
    auroc = next(line for line in text.splitlines() if line.startswith("- rlcr-inline against grpo, auroc"))
    # +0.20 in each of 8 paired seeds: the exact test's smallest p, 2/256, times 3 hypotheses of the setting's family
    # (accuracy's difference, AUROC's; ECE is equal, accuracy's non-inferiority p is 0) stays below 0.05
    assert auroc.endswith(": better")
    acc = next(line for line in text.splitlines() if line.startswith("- rlcr-inline against grpo, accuracy"))
    assert acc.endswith(": worse")


def test_the_reliability_table_pools_the_seeds(tmp_path):
    """On held-out problems each arm's reliability table counts its stated confidences per bin, seeds pooled, with
    the accuracy of the answers in each bin; a missing report is left out."""
    mod = benchmark_script("real_equal")
    reports = {1: {"correct": [1, 0, 1], "confidence": [0.95, 0.1, None]}, 2: {"correct": [1, 1], "confidence": [0.9, 0.3]}}
    runs = {f"r3|base|12|grpo|{s}|heldout": {"start": "base", "updates": 12, "arm": "grpo", "seed": s,
                                              "split": "heldout", "n": 3, "accuracy": 0.5, "report_tokens": 3,
                                              "reports": rep} for s, rep in reports.items()}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"runs": runs}))
    text = mod.render([str(path)])
    assert "| grpo | 0.00 (1) | 1.00 (1) | - (0) | - (0) | 1.00 (2) |" in text
    assert "the report cut after 3 tokens" in text
