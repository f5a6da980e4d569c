"""Comparison statistics on hand-worked cases, with both bootstrap engines."""

import numpy as np
import pytest

from reflectrl.eval import stats as S

ENGINES = [
    "scipy",
    pytest.param("rliable", marks=pytest.mark.skipif(not S.rliable_available(),
                                                     reason="rliable not importable (pip install rliable 'pandas<3')")),
]


def test_iqm_of_known_arrays():
    assert S.iqm(np.arange(1, 9)) == 4.5  # mean of 3, 4, 5, 6
    assert S.iqm([1, 2, 3, 4, 100]) == 3.0  # one value trimmed from each end: mean of 2, 3, 4
    assert S.iqm([0, 0, 0, 100]) == 0.0
    assert S.iqm([2.0, 4.0]) == 3.0  # too few values to trim


@pytest.mark.parametrize("x,y,expected", [
    ([10, 11, 12], [1, 2, 3], 1.0),      # clearly separated
    ([1, 2, 3], [10, 11, 12], 0.0),
    ([1, 2, 3], [1, 2, 3], 0.5),         # identical
    ([5, 5], [5, 5, 5], 0.5),            # all ties count one half
    ([1, 3, 5, 7], [2, 4, 6], 0.5),      # 6 wins of 12 pairs
    ([2, 3], [1, 2], 0.875),             # 3 wins + 1 tie of 4 pairs
])
def test_probability_of_improvement_hand_cases(x, y, expected):
    assert S.probability_of_improvement(x, y) == pytest.approx(expected)


def test_pairwise_count_equals_mann_whitney():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.integers(0, 5, 7).astype(float), rng.integers(0, 5, 4).astype(float)
        assert S._pairwise_poi(x, y) == pytest.approx(S.probability_of_improvement(x, y))


@pytest.mark.parametrize("engine", ENGINES)
def test_interval_estimates(engine):
    x = np.array([1.0, 2, 3, 4, 5])
    point, low, high = S.iqm_ci(x, n_resamples=500, engine=engine)
    assert point == 3.0 and low <= point <= high and low >= 1.0 and high <= 5.0
    # complete separation: every bootstrap resample gives 1, so the percentile interval is [1, 1]. It describes the
    # sample, it decides nothing: the verdict rule's exact test says how much 3 or 5 runs a side can show
    p, low, high = S.probability_of_improvement_ci(x + 10, x, n_resamples=500, engine=engine)
    assert (p, low, high) == (1.0, 1.0, 1.0)
    assert S.decide([S.compare_samples(x[:3] + 10, x[:3], paired=False)])[0]["verdict"] == "inconclusive (3 seeds)"
    assert S.decide([S.compare_samples(x + 10, x, paired=False)])[0]["verdict"] == "better"  # p = 2/252
    p, low, high = S.probability_of_improvement_ci(x, x, n_resamples=500, engine=engine)
    assert p == 0.5 and low < 0.5 < high
    p, low, high = S.mean_probability_of_improvement_ci([x + 10, x], [x, x], n_resamples=500, engine=engine)
    assert p == 0.75 and low <= p <= high and low >= 0.5  # task 1 is a sure win, task 2 a coin flip
    assert np.isnan(S.iqm_ci([3.0], engine=engine)[1])  # one seed: no interval


@pytest.mark.skipif(not S.rliable_available(), reason="rliable not importable (pip install rliable 'pandas<3')")
def test_engines_agree():
    from rliable import metrics

    rng = np.random.default_rng(1)
    x, y = rng.normal(1.0, 1.0, 10), rng.normal(0.0, 1.0, 10)
    ours = S.probability_of_improvement(x, y)
    assert metrics.probability_of_improvement(x[:, None], y[:, None]) == pytest.approx(ours)
    assert metrics.aggregate_iqm(x[:, None]) == pytest.approx(S.iqm(x))
    a = S.probability_of_improvement_ci(x, y, n_resamples=1000, engine="scipy")
    b = S.probability_of_improvement_ci(x, y, n_resamples=1000, engine="rliable")
    assert a[0] == b[0] and abs(a[1] - b[1]) < 0.08 and abs(a[2] - b[2]) < 0.08


def test_early_auc_on_hand_curves():
    assert S.early_auc([0, 100], [0, 100], total_steps=500) == pytest.approx(50.0)  # R(t) = t on [0, 100]
    # first logged at step 50 (value 10, held before), 20 at step 100: (10*50 + 15*50) / 100
    assert S.early_auc([50, 100, 400], [10, 20, 90], total_steps=500) == pytest.approx(12.5)
    assert S.early_auc([0, 1000], [7, 7], total_steps=1000, fraction=0.5) == pytest.approx(7.0)
    assert np.isnan(S.early_auc([], [], total_steps=100))


def test_interpolation_and_t_band():
    y = S.interpolate_curve([10, 20], [1.0, 3.0], [0, 10, 15, 20, 30])
    assert np.isnan(y[0]) and np.isnan(y[-1]) and list(y[1:4]) == [1.0, 2.0, 3.0]
    assert list(S.interpolate_curve([10, 20], [1.0, 3.0], [0, 30], extrapolate=True)) == [1.0, 3.0]
    mean, low, high = S.mean_t_band(np.array([[1.0, 2.0], [3.0, np.nan]]))
    assert list(mean) == [2.0, 2.0]
    half = 12.706204736 * np.std([1.0, 3.0], ddof=1) / np.sqrt(2)  # t(0.975, 1 dof)
    assert low[0] == pytest.approx(2.0 - half) and high[0] == pytest.approx(2.0 + half)
    assert np.isnan(low[1]) and np.isnan(high[1])  # one seed: no band
