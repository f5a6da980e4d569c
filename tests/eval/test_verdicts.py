"""The verdict rule of reflectrl.eval.stats: exact tests at few seeds, Holm over a table, non-inferiority with a
margin; "better" or "worse" on null data in at most 5% of comparisons, and power that grows with the seeds."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from reflectrl.eval import stats as stats_module
from reflectrl.eval.stats import (
    compare_samples,
    decide,
    holm,
    non_inferiority_p,
    permutation_p,
    sign_flip_p,
    t_interval,
)


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
    assert decide([compare_samples(base, base, paired=True, higher_is_better=False, margin=0.1)])[0]["verdict"] \
        == "not higher"
    assert lower_is_better["verdict"] == "better" and lower_is_better["effect"] == pytest.approx(3)


def _mc_bound(trials: int, rate: float = 0.05) -> float:
    """``rate`` plus three Monte-Carlo standard errors of a share over ``trials``."""
    return rate + 3 * math.sqrt(rate * (1 - rate) / trials)


@pytest.mark.parametrize("n,paired", [(6, True), (10, True), (4, False), (5, False), (10, False)])
def test_null_comparisons_decide_rarely(n, paired):
    """Equal distributions: "better" or "worse" in at most 5% of comparisons (plus three Monte-Carlo errors), at
    sizes where the test can reject at all (paired: 2/2^n < 0.05 from n = 6; unpaired: 2/C(2n, n) < 0.05 from 4 vs 4),
    so the bound is not met by a test that never decides."""
    best = sign_flip_p(np.arange(1.0, n + 1)) if paired else permutation_p(np.arange(n) + 100.0, np.arange(n))
    assert best < 0.05  # the test can reject at this size
    rng = np.random.default_rng(n * 2 + paired)
    trials = 400
    decided = 0
    for _ in range(trials):
        x, y = rng.normal(0, 1, n), rng.normal(0, 1, n)
        decided += decide([compare_samples(x, y, paired=paired)])[0]["verdict"] in ("better", "worse")
    assert 0 < decided / trials <= _mc_bound(trials)


def _family_error_rate(n: int, k: int, trials: int, margin: float | None, seed: int) -> float:
    """The share of null families of ``k`` paired claims at ``n`` seeds with any decisive verdict: "better" or "worse"
    where the true difference is 0 (no margin), or "not lower" where it is exactly minus the margin."""
    rng = np.random.default_rng(seed)
    shift = -margin if margin is not None else 0.0
    errors = 0
    for _ in range(trials):
        claims = [compare_samples(rng.normal(shift, 1, n), rng.normal(0, 1, n), paired=True, margin=margin)
                  for _ in range(k)]
        words = [c["verdict"] for c in decide(claims)]
        errors += any(w in ("better", "worse") for w in words) if margin is None else "not lower" in words
    return errors / trials


@pytest.mark.parametrize("n", [6, 10])
def test_holm_keeps_the_family_wise_rate_and_removing_it_fails(n, monkeypatch):
    """A family of 10 null claims: with Holm, any "better"/"worse" in at most 5% of families; with the Holm step
    removed (adjusted p = raw p) the same data decide in far more of them, so this test fails without Holm."""
    trials = 300
    assert _family_error_rate(n, 10, trials, None, n) <= _mc_bound(trials)
    monkeypatch.setattr(stats_module, "holm", lambda p: np.asarray(p, float))
    assert _family_error_rate(n, 10, trials, None, n) > _mc_bound(trials)


@pytest.mark.parametrize("n", [6, 10])
def test_non_inferiority_is_adjusted_in_the_family(n, monkeypatch):
    """True difference exactly minus the margin in each of 10 claims: "not lower" in at most 5% of families with
    Holm; without it (each one-sided test at 5%) in far more."""
    trials = 300
    assert _family_error_rate(n, 10, trials, 0.5, 100 + n) <= _mc_bound(trials)
    monkeypatch.setattr(stats_module, "holm", lambda p: np.asarray(p, float))
    assert _family_error_rate(n, 10, trials, 0.5, 100 + n) > _mc_bound(trials)


def test_non_inferiority_p_matches_the_one_sided_bound_and_scipy():
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.1, 1, 8), rng.normal(0, 1, 8)
    for margin in (0.0, 0.3, 1.0):
        p = non_inferiority_p(x, y, margin, paired=True)
        ref = sps.ttest_1samp(x - y + margin, 0, alternative="greater").pvalue
        assert p == pytest.approx(ref)
        lower = t_interval(x, y, paired=True, confidence=0.90)[1]
        assert (p < 0.05) == (lower > -margin)
        ref_welch = sps.ttest_ind(x + margin, y, equal_var=False, alternative="greater").pvalue
        assert non_inferiority_p(x, y, margin) == pytest.approx(ref_welch)


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_non_inferiority_in_both_directions(higher_is_better):
    """The margin guards the worse direction of the metric: for higher-is-better (accuracy) a method may be at most
    the margin lower ("not lower"); for lower-is-better (ECE, Brier) at most the margin higher ("not higher")."""
    rng = np.random.default_rng(11)
    n, margin, trials = 10, 0.02, 300
    worse = -1.0 if higher_is_better else 1.0  # the direction in which the method is worse
    word = "not lower" if higher_is_better else "not higher"
    base = rng.normal(0.3, 0.05, n)
    equal = decide([compare_samples(base + 0.001 * rng.normal(size=n), base, paired=True,
                                    higher_is_better=higher_is_better, margin=margin)])[0]
    assert equal["verdict"] == word  # equal within noise: non-inferior, in the metric's own word
    past = decide([compare_samples(base + worse * 2 * margin + 0.001 * rng.normal(size=n), base, paired=True,
                                   higher_is_better=higher_is_better, margin=margin)])[0]
    assert past["verdict"] == "worse"  # beyond the margin in the worse direction, every pair: decided worse
    at_margin = 0
    for _ in range(trials):  # the true difference exactly at the margin in the worse direction: the null of the test
        y = rng.normal(0.3, 0.01, n)
        x = y + worse * margin + rng.normal(0, 0.01, n)
        c = decide([compare_samples(x, y, paired=True, higher_is_better=higher_is_better, margin=margin)])[0]
        assert c["verdict"] in (word, "worse", f"inconclusive ({n} seeds)")
        at_margin += c["verdict"] == word
    assert at_margin / trials <= _mc_bound(trials)


def test_power_grows_with_the_seeds():
    rng = np.random.default_rng(7)
    power = []
    for n in (3, 5, 10):
        wins = sum(decide([compare_samples(rng.normal(1.5, 1, n), rng.normal(0, 1, n), paired=False)], min_n=1)[0]["verdict"]
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
    assert decide([strong, single], min_n=1)[0]["p_holm"] == pytest.approx(2 * 2 / 1024)  # counted when allowed
