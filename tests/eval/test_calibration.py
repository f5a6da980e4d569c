"""Calibration metrics on hand-worked cases: Brier, ECE, AUROC, reflection metrics, risk-coverage, plots."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reflectrl.eval.calibration import (
    auroc,
    brier,
    ece,
    reflection_metrics,
    reliability_bins,
    reliability_diagram,
    risk_coverage,
    risk_coverage_curve,
)

nan = float("nan")


def test_brier_hand_worked():
    # (0.9-1)^2 + (0.2-0)^2 + (0.6-0)^2 + (1-1)^2 = 0.01 + 0.04 + 0.36 + 0 = 0.41; / 4 = 0.1025
    assert brier([0.9, 0.2, 0.6, 1.0], [1, 0, 0, 1]) == pytest.approx(0.1025)
    assert brier([0.5] * 4, [1, 0, 1, 0]) == pytest.approx(0.25)
    assert brier([1.0, 0.0], [True, False]) == 0.0


def test_ece_hand_worked_and_confidence_one_in_last_bin():
    q, y = [0.05, 0.15, 0.15, 0.95, 1.0], [0, 1, 0, 1, 0]
    # bin 0: {0.05} acc 0, |0.05 - 0| = 0.05, weight 1/5
    # bin 1: {0.15, 0.15} acc 1/2, |0.15 - 0.5| = 0.35, weight 2/5
    # bin 9: {0.95, 1.0} (1.0 belongs to the last bin) acc 1/2, |0.975 - 0.5| = 0.475, weight 2/5
    # ECE = 0.01 + 0.14 + 0.19 = 0.34 (had 1.0 a bin of its own: 0.01 + 0.14 + 0.01 + 0.2 = 0.36)
    assert ece(q, y) == pytest.approx(0.34)
    b = reliability_bins(q, y)
    assert b["count"].tolist() == [1, 2, 0, 0, 0, 0, 0, 0, 0, 2]
    assert b["confidence"][9] == pytest.approx(0.975) and math.isnan(b["confidence"][5])
    assert len(b["edges"]) == 11
    assert ece([1.0, 1.0], [1, 1]) == 0.0 and ece([1.0], [0], bins=1) == 1.0
    # two bins: [0, 0.5) holds 0.2 and 0.4 (acc 1/2, conf 0.3 -> 0.2), [0.5, 1] holds 0.5, 1.0 (acc 1, conf 0.75 -> 0.25)
    assert ece([0.2, 0.4, 0.5, 1.0], [1, 0, 1, 1], bins=2) == pytest.approx(0.5 * 0.2 + 0.5 * 0.25)


def test_auroc_hand_worked_with_ties():
    # correct: 0.9, 0.6, 0.6; wrong: 0.6, 0.3. Pairs (correct, wrong): (0.9,0.6)=1 (0.9,0.3)=1 (0.6,0.6)=1/2
    # (0.6,0.3)=1, twice over -> (1 + 1 + 0.5 + 1 + 0.5 + 1) / 6 = 5/6
    assert auroc([0.9, 0.6, 0.6, 0.6, 0.3], [1, 1, 1, 0, 0]) == pytest.approx(5 / 6)
    assert auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0
    assert auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 0.0
    assert auroc([0.5] * 4, [1, 0, 1, 0]) == 0.5  # all tied: every pair counts one half


def test_one_class_and_empty_inputs_are_nan():
    assert math.isnan(auroc([0.2, 0.9], [1, 1])) and math.isnan(auroc([0.2, 0.9], [0, 0]))
    for fn in (brier, ece, auroc):
        assert math.isnan(fn([], []))
    cov, risk = risk_coverage([], [])
    assert cov.size == 0 and risk.size == 0
    m = reflection_metrics([], [])
    assert m["n"] == 0 and all(math.isnan(m[k]) for k in m if k not in ("n", "missing"))


def test_missing_confidences_are_left_out():
    assert brier([0.9, None, 0.2], [1, 0, 0]) == pytest.approx(brier([0.9, 0.2], [1, 0]))
    assert ece(np.array([0.9, nan]), np.array([1, 1])) == pytest.approx(0.1)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="same length"):
        brier([0.1, 0.2], [1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ece([1.2], [1])
    with pytest.raises(ValueError, match="binary"):
        auroc([0.5, 0.4], [0.5, 1])
    with pytest.raises(ValueError, match="bins"):
        ece([0.5], [1], bins=0)
    with pytest.raises(ValueError, match="reflection must be"):
        reflection_metrics([2, 1], [1, 1])
    with pytest.raises(ValueError, match="numbers"):
        brier(["high"], [1])


def test_reflection_metrics_hand_worked():
    s = [1, 1, 1, 0, 0, None, 1, 0]
    o = [1, 0, 1, 1, 0, 1, 1, 0]
    m = reflection_metrics(s, o)
    # the 6th rollout has no reflection: kept s = 1 1 1 0 0 1 0, o = 1 0 1 1 0 1 0 (n = 7)
    assert m["n"] == 7 and m["missing"] == 1 and m["missing_rate"] == pytest.approx(1 / 8)
    assert m["task_accuracy"] == pytest.approx(4 / 7)  # o = 1 at kept positions 0, 2, 3, 5
    assert m["reflection_accuracy"] == pytest.approx(5 / 7)  # disagree at positions 1 and 3
    assert m["underconfidence"] == pytest.approx(1 / 3)  # s = 0 at 3, 4, 6 with o = 1, 0, 0
    assert m["overconfidence"] == pytest.approx(1 / 4)  # s = 1 at 0, 1, 2, 5 with o = 1, 0, 1, 1
    assert m["delta"] == pytest.approx(1 / 7)
    assert m["best_constant"] == pytest.approx(4 / 7)  # max(4/7, 3/7)
    assert m["coverage"] == pytest.approx(4 / 7)
    assert m["selective_accuracy"] == pytest.approx(3 / 4)
    assert m["selective_score"] == pytest.approx((3 - 1) / 7)  # 3 committed right, 1 committed wrong, 3 abstain
    assert all(type(v) is float for v in m.values())


def test_reflection_metrics_edge_cases():
    always = reflection_metrics([1, 1, 1, 1], [1, 0, 1, 1])
    assert math.isnan(always["underconfidence"])  # never flagged unsolved: no denominator
    assert always["selective_score"] == pytest.approx(2 * 0.75 - 1) and always["coverage"] == 1.0
    assert always["reflection_accuracy"] == always["best_constant"] == 0.75 and always["delta"] == 0.0
    never = reflection_metrics(np.array([0, 0, nan]), np.array([1, 0, 1]))
    assert never["selective_score"] == 0.0 and math.isnan(never["selective_accuracy"])
    assert math.isnan(never["overconfidence"]) and never["missing_rate"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="same length"):
        reflection_metrics([1, 0], [1])


def test_lists_numpy_and_tensors_agree():
    q = [0.9, 0.6, 0.6, 0.6, 0.3, 1.0, 0.05]
    y = [1, 1, 1, 0, 0, 1, 0]
    forms = [(q, y), (np.array(q), np.array(y, bool)), (torch.tensor(q), torch.tensor(y, dtype=torch.bool)),
             (torch.tensor(q, dtype=torch.float64), torch.tensor(y)), (np.array(q, np.float32), [bool(v) for v in y])]
    for fn in (brier, ece, auroc):
        values = [fn(a, b) for a, b in forms]
        assert all(type(v) is float for v in values)
        assert values == pytest.approx([values[0]] * len(values), abs=1e-6), fn.__name__
    s = [1, 0, 1, None, 0]
    o = [1, 1, 0, 1, 0]
    ref = reflection_metrics(s, o)
    for a, b in ((np.array([1, 0, 1, nan, 0]), np.array(o)), (torch.tensor([1.0, 0, 1, nan, 0]), torch.tensor(o))):
        got = reflection_metrics(a, b)
        assert got.keys() == ref.keys()
        assert all(got[k] == pytest.approx(ref[k], nan_ok=True) for k in ref)


def test_risk_coverage_hand_worked():
    # thresholds 0.9: answer 1/4, no error; 0.8: answer 3/4 (the tie answered together), 1 error of 3;
    # 0.1: answer all, 2 errors of 4
    cov, risk = risk_coverage([0.9, 0.8, 0.8, 0.1], [1, 0, 1, 0])
    assert cov.tolist() == pytest.approx([0.25, 0.75, 1.0])
    assert risk.tolist() == pytest.approx([0.0, 1 / 3, 0.5])


def test_plots_are_written(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.uniform(size=200)
    y = rng.uniform(size=200) < q
    for fn, name in ((reliability_diagram, "rel.png"), (risk_coverage_curve, "rc.png")):
        out = fn(q, y, tmp_path / "sub" / name)
        assert out.exists() and out.stat().st_size > 1000
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert reliability_diagram(q, y, tmp_path / "t.png", bins=5, title="rlcr").stat().st_size > 1000
    assert reliability_diagram([], [], tmp_path / "empty.png").stat().st_size > 0
    assert risk_coverage_curve([], [], tmp_path / "empty_rc.png").stat().st_size > 0
