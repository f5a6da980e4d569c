"""Intervals over problems of one model's calibration: DeLong's AUROC variance on hand-worked cases, against a
pairwise brute force and against the bootstrap (clustered too); the ECE bootstrap over problems against a
row-by-row recomputation; the minimum counts below which no interval is given."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reflectrl.eval.calibration import auroc, ece
from reflectrl.eval.uncertainty import (
    MIN_AUROC_CLASS_ROWS,
    MIN_INTERVAL_ROWS,
    _ece_resamples,
    auroc_delong,
    auroc_interval,
    confidence_intervals,
    ece_interval,
    interval_refusal,
)

Z95 = 1.959963984540054


def brute_delong(q, y, groups=None):
    """DeLong's variance from its definitions, pair by pair; Obuchowski's clustered form with ``groups``."""
    q, y = np.asarray(q, float), np.asarray(y, int)
    pos, neg = [i for i in range(len(q)) if y[i] == 1], [i for i in range(len(q)) if y[i] == 0]
    psi = lambda a, b: 1.0 if q[a] > q[b] else 0.5 if q[a] == q[b] else 0.0  # noqa: E731
    v10 = {i: sum(psi(i, j) for j in neg) / len(neg) for i in pos}
    v01 = {j: sum(psi(i, j) for i in pos) / len(pos) for j in neg}
    theta = sum(v10.values()) / len(pos)
    m, n = len(pos), len(neg)
    if groups is None:
        s10 = sum((v - theta) ** 2 for v in v10.values()) / (m - 1)
        s01 = sum((v - theta) ** 2 for v in v01.values()) / (n - 1)
        return theta, s10 / m + s01 / n
    labels = sorted(set(groups))
    size, with_pos, with_neg = len(labels), len({groups[i] for i in pos}), len({groups[j] for j in neg})
    x = {g: sum(v10[i] - theta for i in pos if groups[i] == g) for g in labels}
    w = {g: sum(v01[j] - theta for j in neg if groups[j] == g) for g in labels}
    s10 = with_pos / ((with_pos - 1) * m) * sum(x[g] ** 2 for g in labels)
    s01 = with_neg / ((with_neg - 1) * n) * sum(w[g] ** 2 for g in labels)
    s11 = size / (size - 1) * sum(x[g] * w[g] for g in labels)
    return theta, s10 / m + s01 / n + 2 * s11 / (m * n)


def test_delong_hand_worked_with_ties():
    # right 0.9, 0.6, 0.6; wrong 0.6, 0.3. V10 (share of wrong rows each right row outranks, ties 1/2): 1, 3/4, 3/4;
    # V01 (share of right rows outranking each wrong row): 0.6 -> (1 + 1/2 + 1/2)/3 = 2/3, 0.3 -> 1. AUROC 5/6.
    # S10 = ((1/6)^2 + 2 (1/12)^2) / 2 = 1/48; S01 = ((1/6)^2 + (1/6)^2) / 1 = 1/18
    # variance = S10/3 + S01/2 = 1/144 + 4/144 = 5/144
    theta, var = auroc_delong([0.9, 0.6, 0.6, 0.6, 0.3], [1, 1, 1, 0, 0])
    assert theta == pytest.approx(5 / 6) and var == pytest.approx(5 / 144)


def test_delong_interval_hand_worked():
    # right 0.9 0.8 0.7 0.6 0.2, wrong 0.5 0.4 0.3 0.1 0.65 (ten rows, five of each class: an interval is given)
    # V10: 1, 1, 1, 0.8 (0.6 loses to 0.65), 0.2 (0.2 beats only 0.1): AUROC 4/5
    # V01: 0.8, 0.8, 0.8, 1 (0.1 is below all five), 0.6 (0.65 is below 0.9, 0.8, 0.7)
    # S10 = (3 * 0.2^2 + 0 + 0.6^2) / 4 = 0.12; S01 = (0 + 0 + 0 + 0.2^2 + 0.2^2) / 4 = 0.02; variance 0.14/5 = 0.028
    q = [0.9, 0.8, 0.7, 0.6, 0.2, 0.5, 0.4, 0.3, 0.1, 0.65]
    y = [1] * 5 + [0] * 5
    assert auroc_delong(q, y) == pytest.approx((0.8, 0.028))
    iv = auroc_interval(q, y)
    half = Z95 * math.sqrt(0.028)  # 0.328: the upper end is clipped to 1
    assert iv.value == pytest.approx(0.8) and iv.no_ci is None
    assert iv.ci == pytest.approx((0.8 - half, 1.0))
    lo90 = auroc_interval(q, y, level=0.90).ci[0]
    assert lo90 == pytest.approx(0.8 - 1.6448536269514722 * math.sqrt(0.028))


@pytest.mark.parametrize("seed", range(6))
def test_delong_equals_the_pairwise_brute_force(seed):
    """Ties on purpose (confidences rounded to tenths), unequal classes, clustered and not."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 40))
    q = np.round(rng.uniform(size=n), 1)
    y = (rng.uniform(size=n) < q).astype(int)
    y[:2], y[2:4] = 1, 0  # both classes, at least two rows each
    theta, var = auroc_delong(q, y)
    assert theta == pytest.approx(auroc(q, y))
    assert (theta, var) == pytest.approx(brute_delong(q, y))
    groups = [f"p{i // 3}" for i in range(n)]  # problems of three rows, labels of any kind
    assert auroc_delong(q, y, groups) == pytest.approx(brute_delong(q, y, groups))


def test_delong_is_the_bootstrap_variance():
    """400 independent rows: DeLong's variance is the bootstrap's (resampling rows), within 15%."""
    rng = np.random.default_rng(0)
    q = rng.uniform(size=400)
    y = (rng.uniform(size=400) < q).astype(int)
    _, var = auroc_delong(q, y)
    draws = rng.integers(0, 400, (2000, 400))
    boot = np.var([auroc(q[d], y[d]) for d in draws])
    assert 0.85 < var / boot < 1.15


def test_clustered_variance_is_the_cluster_bootstrap_variance():
    """150 problems of four samples each that share the problem's confidence (give or take 0.05) and mostly its
    outcome (one sample in ten flipped): Obuchowski's clustered variance matches a bootstrap that resamples problems;
    DeLong's over rows, as if the samples were independent, is about half of it."""
    rng = np.random.default_rng(1)
    problems, per = 150, 4
    ease = rng.uniform(size=problems)
    q = np.clip(np.repeat(ease, per) + rng.normal(0, 0.05, problems * per), 0, 1)
    y = np.repeat(rng.uniform(size=problems) < np.clip(1.6 * ease - 0.3, 0.03, 0.97), per).astype(int)
    y = np.where(rng.uniform(size=problems * per) < 0.1, 1 - y, y)
    groups = np.repeat(np.arange(problems), per)
    _, clustered = auroc_delong(q, y, groups)
    _, rows = auroc_delong(q, y)
    members = np.arange(problems * per).reshape(problems, per)  # each problem's rows
    boot = np.var([auroc(q[members[d].ravel()], y[members[d].ravel()])
                   for d in rng.integers(0, problems, (1500, problems))])
    assert 0.8 < clustered / boot < 1.25
    assert rows < 0.65 * boot


def test_a_duplicated_row_adds_no_information_when_grouped():
    """Every row twice, each pair one group: the clustered variance is exactly that of the rows once, one group each,
    which is DeLong's; DeLong's over the doubled rows, which takes them for independent, is about half of it."""
    rng = np.random.default_rng(2)
    q = np.round(rng.uniform(size=60), 2)
    y = (rng.uniform(size=60) < q).astype(int)
    once = auroc_delong(q, y, np.arange(60))
    twice = auroc_delong(np.repeat(q, 2), np.repeat(y, 2), np.repeat(np.arange(60), 2))
    assert twice == pytest.approx(once)
    assert once == pytest.approx(auroc_delong(q, y))  # one row per group: Obuchowski's form is DeLong's
    assert auroc_delong(np.repeat(q, 2), np.repeat(y, 2))[1] == pytest.approx(once[1] / 2, rel=0.05)


def test_delong_edge_cases():
    assert all(math.isnan(v) for v in auroc_delong([0.2, 0.9], [1, 1]))  # one class: nothing to rank
    theta, var = auroc_delong([0.9, 0.8, 0.2], [1, 0, 0])
    assert theta == 1.0 and math.isnan(var)  # one right row: no variance estimate
    # a perfect ranking: every V10 and V01 is 1, the variance 0, the interval the point
    q, y = [0.9, 0.8, 0.75, 0.7, 0.65, 0.4, 0.3, 0.2, 0.15, 0.1], [1] * 5 + [0] * 5
    assert auroc_delong(q, y) == (1.0, 0.0) and auroc_interval(q, y).ci == (1.0, 1.0)
    assert auroc_delong([0.6] * 10, y) == (0.5, 0.0)  # a constant ranks nothing: every placement is one half
    with pytest.raises(ValueError, match="one label per row"):
        auroc_delong([0.1, 0.9], [0, 1], groups=[0])


def test_missing_confidences_are_left_out_with_their_groups():
    q = [0.9, 0.8, 0.7, 0.6, 0.2, 0.5, 0.4, 0.3, 0.1, 0.65]
    y = [1] * 5 + [0] * 5
    groups = list(range(10))
    more_q, more_y, more_g = q + [None, math.nan], y + [1, 0], groups + [10, 3]
    assert auroc_delong(more_q, more_y, more_g) == pytest.approx(auroc_delong(q, y, groups))
    assert auroc_interval(more_q, more_y).ci == pytest.approx(auroc_interval(q, y).ci)
    assert ece_interval(more_q, more_y, more_g, reps=200) == ece_interval(q, y, groups, reps=200)


def test_refusals_below_the_minimum_counts():
    assert interval_refusal(MIN_INTERVAL_ROWS - 1) == f"interval needs >= {MIN_INTERVAL_ROWS} rows"
    assert interval_refusal(MIN_INTERVAL_ROWS) is None
    assert interval_refusal(40, groups=MIN_INTERVAL_ROWS - 1) == f"interval needs >= {MIN_INTERVAL_ROWS} groups (problems)"
    few = (MIN_AUROC_CLASS_ROWS - 1, 30)
    assert interval_refusal(34, classes=few) == (f"interval needs >= {MIN_AUROC_CLASS_ROWS} right and >= "
                                                 f"{MIN_AUROC_CLASS_ROWS} wrong rows")
    assert interval_refusal(35, classes=(MIN_AUROC_CLASS_ROWS, 30)) is None
    # the rule as the interval functions apply it: four wrong rows among twenty, then five
    q = [0.5 + 0.02 * i for i in range(16)] + [0.3] * 4
    y = [1] * 16 + [0] * 4
    iv = auroc_interval(q, y)
    assert iv.ci is None and iv.value == 1.0 and "wrong rows" in iv.no_ci
    assert ece_interval(q, y, reps=100).ci is not None  # ECE needs rows, not classes
    assert auroc_interval(q + [0.6], y + [0]).ci is not None
    grouped = ece_interval(q, y, groups=[i // 4 for i in range(20)], reps=100)  # five problems of four rows
    assert grouped.ci is None and grouped.no_ci == f"interval needs >= {MIN_INTERVAL_ROWS} groups (problems)"
    lumped = auroc_interval(q + [0.9] * 10, y + [0] * 10, groups=[0] * 16 + list(range(1, 15)))  # right: one problem
    assert lumped.ci is None and lumped.no_ci == "interval needs right and wrong rows in >= 2 groups each"
    one_class = auroc_interval([0.1 * i for i in range(10)], [1] * 10)
    assert math.isnan(one_class.value) and one_class.ci is None and "wrong rows" in one_class.no_ci


def test_ece_resamples_match_a_row_by_row_recomputation():
    """Each resample's ECE from the groups' bin sums equals ece() of the rows the drawn groups hold."""
    rng = np.random.default_rng(3)
    q = np.round(rng.uniform(size=45), 2)
    y = (rng.uniform(size=45) < q).astype(float)
    codes = np.sort(rng.integers(0, 12, 45))
    codes = np.unique(codes, return_inverse=True)[1]
    size = int(codes.max()) + 1
    draws = rng.integers(0, size, (30, size))
    got = _ece_resamples(q, y, codes, draws, bins=10)
    for row, value in zip(draws, got):
        rows = np.concatenate([np.flatnonzero(codes == g) for g in row])
        assert value == pytest.approx(ece(q[rows], y[rows]))


def test_ece_interval_is_seeded_and_resamples_problems():
    rng = np.random.default_rng(4)
    q = np.round(rng.uniform(size=80), 2)
    y = (rng.uniform(size=80) < q ** 2).astype(int)
    a, b = ece_interval(q, y, reps=500, seed=7), ece_interval(q, y, reps=500, seed=7)
    assert a == b and a.value == pytest.approx(ece(q, y)) and a.ci[0] < a.value < a.ci[1]
    assert ece_interval(q, y, reps=500, seed=8).ci != a.ci
    # every row twice, each pair a problem: the same draws pick the same rows (twice over), so the same interval;
    # resampling the doubled rows one by one, as if independent, gives a narrower one
    doubled = ece_interval(np.repeat(q, 2), np.repeat(y, 2), np.repeat(np.arange(80), 2), reps=500, seed=7)
    assert doubled.value == pytest.approx(a.value) and doubled.ci == pytest.approx(a.ci)
    naive = ece_interval(np.repeat(q, 2), np.repeat(y, 2), reps=500, seed=7)
    assert naive.ci[1] - naive.ci[0] < 0.85 * (a.ci[1] - a.ci[0])


def test_ece_interval_agrees_with_scipy_bootstrap():
    from scipy import stats

    rng = np.random.default_rng(5)
    q = rng.uniform(size=300)
    y = (rng.uniform(size=300) < q ** 1.5).astype(int)
    ours = ece_interval(q, y, reps=4000, seed=0).ci
    idx = np.arange(300)
    ref = stats.bootstrap((idx,), lambda i, axis=-1: np.apply_along_axis(lambda j: ece(q[j], y[j]), axis, i),
                          n_resamples=4000, method="percentile", random_state=np.random.default_rng(1))
    assert ours == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), abs=0.01)


def test_ece_interval_degenerate_and_bad_settings():
    assert ece_interval([1.0] * 12, [1] * 12, reps=50).ci == (0.0, 0.0)  # every resample is perfectly calibrated
    with pytest.raises(ValueError, match="reps"):
        ece_interval([0.5] * 12, [1] * 12, reps=0)
    with pytest.raises(ValueError, match="level"):
        auroc_interval([0.5] * 12, [1] * 12, level=95)


def test_confidence_intervals_fields():
    q = [0.9, 0.8, 0.7, 0.6, 0.2, 0.5, 0.4, 0.3, 0.1, 0.65]
    y = [1] * 5 + [0] * 5
    out = confidence_intervals(q, y, reps=200)
    assert out["auroc_ci"] == pytest.approx(list(auroc_interval(q, y).ci))
    assert out["ece_ci"] == pytest.approx(list(ece_interval(q, y, reps=200).ci))
    assert "auroc_no_ci" not in out and "ece_no_ci" not in out
    few = confidence_intervals(q[:4], y[:4])
    assert few == {"auroc_ci": None, "auroc_no_ci": f"interval needs >= {MIN_INTERVAL_ROWS} rows", "ece_ci": None,
                   "ece_no_ci": f"interval needs >= {MIN_INTERVAL_ROWS} rows"}
