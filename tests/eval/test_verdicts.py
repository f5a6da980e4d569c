"""The verdict rule of reflectrl.eval.stats: exact tests at few seeds, Holm over a table, non-inferiority with a
margin; "better" or "worse" on null data in at most 5% of comparisons, and power that grows with the seeds."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from reflectrl.eval.stats import compare_samples, decide, holm, permutation_p, sign_flip_p, t_interval


def test_sign_flip_is_exact_against_hand_counts():
    # n = 3, all positive: only the all-plus and all-minus patterns reach |mean| = the observed: 2/8
    assert sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
    # n = 5 cannot go below 2/32 = 0.0625: five seeds never decide a paired claim at 0.05, whatever the effect
    assert sign_flip_p([5, 6, 7, 8, 9]) == pytest.approx(2 / 32)
    assert sign_flip_p([1.0, -1.0]) == 1.0 and sign_flip_p([]) == 1.0


def test_permutation_p_is_exact_where_it_enumerates():
    # 3 vs 3 separated: 2 of the C(6, 3) = 20 splits are as extreme
    assert permutation_p([4, 5, 6], [1, 2, 3]) == pytest.approx(2 / 20)
    # agrees with scipy's exact permutation test of |mean(x) - mean(y)| (the two-sided test on the absolute
    # difference; scipy's own "two-sided" doubles the smaller tail instead, which differs for unequal sizes)
    x, y = [3.1, 2.2, 5.0, 4.1], [1.0, 2.5, 0.3, 1.9, 2.0]
    ref = sps.permutation_test((x, y), lambda a, b, axis=-1: np.abs(np.mean(a, axis) - np.mean(b, axis)),
                               permutation_type="independent", alternative="greater", n_resamples=math.inf,
                               vectorized=True).pvalue
    assert permutation_p(x, y) == pytest.approx(ref)


def test_intervals_are_not_degenerate_at_three_seeds():
    mean, lo, hi = t_interval([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and lo < 0.1 and hi > 0.3  # wider than [min, max], which a bootstrap gives
    ref = sps.ttest_1samp([0.1, 0.2, 0.3], 0).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ref.low, ref.high))
    d, lo, hi = t_interval([1.0, 2.0, 3.0], [0.0, 0.5, 1.0, 1.5])
    ref = sps.ttest_ind([1.0, 2.0, 3.0], [0.0, 0.5, 1.0, 1.5], equal_var=False).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ref.low, ref.high))


def test_holm_against_a_hand_worked_table():
    assert holm([0.01, 0.04, 0.03]).tolist() == pytest.approx([0.03, 0.06, 0.06])


def test_verdicts_of_one_table():
    rng = np.random.default_rng(1)
    base = rng.normal(0, 1, 10)
    claims = [compare_samples(base + 3, base, paired=True),  # a large effect at 10 seeds
              compare_samples(base - 3, base, paired=True),
              compare_samples(base + 0.001 * rng.normal(size=10), base, paired=True, margin=0.1),
              compare_samples(base + 0.5 * rng.normal(size=10), base, paired=True)]
    v = [c["verdict"] for c in decide(claims)]
    assert v[:3] == ["better", "worse", "not lower"] and v[3] == "inconclusive (10 seeds)"
    lower_is_better = decide([compare_samples(base - 3, base, paired=True, higher_is_better=False)])[0]
    assert lower_is_better["verdict"] == "better" and lower_is_better["effect"] == pytest.approx(3)


@pytest.mark.parametrize("n", [3, 5, 10])
@pytest.mark.parametrize("paired", [True, False])
def test_null_comparisons_decide_rarely(n, paired):
    """Equal distributions: "better" or "worse" in at most 5% of comparisons (plus three Monte-Carlo errors)."""
    rng = np.random.default_rng(n * 2 + paired)
    trials = 300
    decided = 0
    for _ in range(trials):
        x, y = rng.normal(0, 1, n), rng.normal(0, 1, n)
        decided += decide([compare_samples(x, y, paired=paired)])[0]["verdict"] in ("better", "worse")
    assert decided / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


def test_power_grows_with_the_seeds():
    rng = np.random.default_rng(7)
    power = []
    for n in (3, 5, 10):
        wins = sum(decide([compare_samples(rng.normal(1.5, 1, n), rng.normal(0, 1, n), paired=False)])[0]["verdict"]
                   == "better" for _ in range(200))
        power.append(wins / 200)
    assert power[0] < power[1] < power[2] and power[2] > 0.8


def test_too_few_runs_stay_out_of_the_holm_family():
    """A claim below ``min_n`` runs reads "too few seeds (n)" and does not raise the others' Holm correction."""
    base = np.arange(10.0)
    strong = compare_samples(base + 3, base, paired=True)  # p = 2/1024
    single = compare_samples([5.0], [1.0], paired=True)
    alone = decide([strong])[0]
    with_single = decide([strong, single], min_n=3)
    assert with_single[1]["verdict"] == "too few seeds (1)" and "p_holm" not in with_single[1]
    assert with_single[0]["p_holm"] == alone["p_holm"] == pytest.approx(2 / 1024)
    assert decide([strong, single])[0]["p_holm"] == pytest.approx(2 * 2 / 1024)  # counted when allowed
