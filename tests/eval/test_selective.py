"""What a calibrated confidence buys: selective accuracy at a coverage (ties averaged, a missing confidence an
abstention) on hand-worked cases and against every tie-break order; the abstention threshold picked on validation
rows and applied to held-out ones."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from reflectrl.eval.calibration import (
    apply_threshold,
    pick_threshold,
    selective_accuracies,
    selective_accuracy,
    transfer_threshold,
)

nan = float("nan")


def test_selective_accuracy_hand_worked_without_ties():
    q = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
    y = [1, 1, 0, 1, 1, 0, 1, 0, 0, 0]
    # top 5: 1 1 0 1 1 -> 4/5; top 8: 1 1 0 1 1 0 1 0 -> 5/8; all ten: 5/10
    assert selective_accuracies(q, y) == pytest.approx({"selective_accuracy@0.5": 0.8, "selective_accuracy@0.8": 0.625,
                                                        "selective_accuracy@1.0": 0.5})
    shuffled = np.random.default_rng(0).permutation(10)
    assert selective_accuracy(np.array(q)[shuffled], np.array(y)[shuffled], 0.5) == pytest.approx(0.8)


def test_ties_at_the_cut_are_averaged():
    # 0.9 (right) is kept; the cut (k = 3) falls among the three rows at 0.7 (one right): each is kept in the share
    # 2/3, adding 2 * 1/3 right answers -> (1 + 2/3) / 3 = 5/9, whatever the order of the tied rows
    q, y = [0.9, 0.7, 0.7, 0.7, 0.2, 0.2], [1, 1, 0, 0, 1, 0]
    assert selective_accuracy(q, y, 0.5) == pytest.approx(5 / 9)
    assert selective_accuracy([0.9, 0.7, 0.7, 0.7, 0.2, 0.2], [1, 0, 0, 1, 0, 1], 0.5) == pytest.approx(5 / 9)
    # coverage 1: plain accuracy 3/6; k = 4.8: the four rows above 0.2 (2 right) and 0.8 of the tied pair (1/2)
    assert selective_accuracy(q, y, 1.0) == pytest.approx(0.5)
    assert selective_accuracy(q, y, 0.8) == pytest.approx((2 + 0.8 * 0.5) / 4.8)


def test_a_fractional_cut_keeps_that_share_of_the_next_row():
    # five rows at coverage 0.5: k = 2.5, the two best (both right) and half of the third (wrong): 2 / 2.5
    assert selective_accuracy([0.9, 0.8, 0.7, 0.6, 0.5], [1, 1, 0, 0, 1], 0.5) == pytest.approx(0.8)


@pytest.mark.parametrize("seed", range(5))
def test_averaging_ties_is_the_mean_over_every_tie_break(seed):
    """Against brute force: with k a whole number, the mean over every order of the rows (ties broken every way) of
    the accuracy of the first k rows by confidence."""
    rng = np.random.default_rng(seed)
    q = rng.choice([0.2, 0.5, 0.5, 0.8], 7)
    y = rng.integers(0, 2, 7)
    for k in range(1, 8):
        orders = [sorted(p, key=lambda i: -q[i]) for p in itertools.permutations(range(7))]  # sorted() is stable
        brute = np.mean([y[o[:k]].mean() for o in orders])
        assert selective_accuracy(q, y, k / 7) == pytest.approx(brute), k


def test_a_missing_confidence_abstains():
    # four rows, two stated: coverage 0.5 keeps both stated rows (0.9 right, 0.5 wrong); 0.8 and 1.0 would have to
    # answer a row that abstained: out of reach
    q, y = [0.9, None, 0.5, nan], [1, 1, 0, 0]
    got = selective_accuracies(q, y)
    assert got["selective_accuracy@0.5"] == 0.5
    assert math.isnan(got["selective_accuracy@0.8"]) and math.isnan(got["selective_accuracy@1.0"])
    assert selective_accuracy(q, y, 0.25) == 1.0
    assert math.isnan(selective_accuracy([], [], 0.5)) and math.isnan(selective_accuracy([None], [1], 0.5))


def test_coverage_must_lie_in_the_unit_interval():
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="coverage must lie in"):
            selective_accuracy([0.5], [1], bad)


# rows with a dip in accuracy: at t = 0.9 1/1 right, at 0.8 2/3, at 0.5 3/4, at 0.2 3/5 (a sixth row states nothing)
VAL_Q, VAL_Y = [0.9, 0.8, 0.8, 0.5, None, 0.2], [1, 0, 1, 1, 0, 0]


def test_threshold_for_a_coverage():
    # q >= 0.8 answers 3 of 6 rows (0.5); q >= 0.5 answers 4 (0.667); q >= 0.2 answers 5 (0.833)
    assert pick_threshold(VAL_Q, VAL_Y, coverage=0.5) == 0.8
    assert pick_threshold(VAL_Q, VAL_Y, coverage=0.51) == 0.5
    assert pick_threshold(VAL_Q, VAL_Y, coverage=0.1) == 0.9
    with pytest.raises(ValueError, match="out of reach: 5 of 6 rows state a confidence"):
        pick_threshold(VAL_Q, VAL_Y, coverage=0.9)


def test_threshold_for_an_accuracy_answers_the_most_rows_that_reach_it():
    assert pick_threshold(VAL_Q, VAL_Y, accuracy=0.75) == 0.5  # past the dip at 0.8 (2/3): 3/4 answering four rows
    assert pick_threshold(VAL_Q, VAL_Y, accuracy=0.6) == 0.2
    assert pick_threshold(VAL_Q, VAL_Y, accuracy=1.0) == 0.9
    with pytest.raises(ValueError, match="no threshold reaches accuracy 1: the best is 0.500"):
        pick_threshold([0.9, 0.1], [0, 1], accuracy=1.0)
    for kwargs in ({}, {"coverage": 0.5, "accuracy": 0.5}):
        with pytest.raises(ValueError, match="one target"):
            pick_threshold(VAL_Q, VAL_Y, **kwargs)
    with pytest.raises(ValueError, match="no row states a confidence"):
        pick_threshold([None, None], [1, 0], coverage=0.5)


def test_apply_and_transfer_a_threshold():
    # held out: 0.95 (right) and 0.8 (wrong) reach 0.8; 0.79 does not; the missing one abstains
    held_q, held_y = [0.95, 0.8, 0.79, None, 0.1], [1, 0, 1, 1, 0]
    assert apply_threshold(0.8, held_q, held_y) == {"coverage": 0.4, "accuracy": 0.5, "answered": 2, "rows": 5}
    none = apply_threshold(0.99, held_q, held_y)
    assert none["coverage"] == 0.0 and math.isnan(none["accuracy"])
    out = transfer_threshold(VAL_Q, VAL_Y, held_q, held_y, coverage=0.5)
    assert out["threshold"] == 0.8 and out["coverage"] == 0.4 and out["accuracy"] == 0.5
    assert out["validation"] == pytest.approx({"coverage": 0.5, "accuracy": 2 / 3, "answered": 3, "rows": 6})
    assert transfer_threshold(VAL_Q, VAL_Y, held_q, held_y, accuracy=0.75)["threshold"] == 0.5
