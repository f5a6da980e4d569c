"""Intervals over problems for one evaluated model's calibration: the AUROC of its stated confidences with
DeLong's variance, and their ECE with a percentile bootstrap over problems.

Inputs are as in :mod:`reflectrl.eval.calibration`: per-row confidences q in [0, 1] (None or NaN where not stated:
those rows are left out, as every confidence metric leaves them out) and binary outcomes. ``groups`` (optional, one
label per row) names the problem each row belongs to, where a problem has several rows (several samples, or a
problem asked twice): rows of one problem are not independent, so the AUROC variance sums each problem's
contributions (Obuchowski's clustered form of DeLong's) and the bootstrap resamples problems, each with all its
rows. Without ``groups`` every row is its own problem.

An interval is refused (``ci`` None, ``no_ci`` saying why) from too few rows: :data:`MIN_INTERVAL_ROWS` stated
confidences (and as many groups), and for AUROC :data:`MIN_AUROC_CLASS_ROWS` right and as many wrong rows.

References: DeLong, DeLong and Clarke-Pearson 1988, "Comparing the areas under two or more correlated receiver
operating characteristic curves: a nonparametric approach" (Biometrics 44); Obuchowski 1997, "Nonparametric analysis
of clustered ROC curve data" (Biometrics 53).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .calibration import _array, _bin_index, _pairs, auroc, ece

__all__ = ["MIN_AUROC_CLASS_ROWS", "MIN_INTERVAL_ROWS", "Interval", "auroc_delong", "auroc_interval",
           "confidence_intervals", "ece_interval", "interval_refusal"]

MIN_INTERVAL_ROWS = 10
"""Fewest rows an interval is given from. Below it most bootstrap resamples repeat the same few rows, and the
percentile interval says little or nothing (three agreeing rows give ``[1.000, 1.000]``); a normal interval from a
variance estimated on so few rows is no better. The value is printed alone, with ``interval needs >= 10 rows``. With
``groups``, as many groups are needed too."""

MIN_AUROC_CLASS_ROWS = 5
"""Fewest right and fewest wrong rows (among those that stated a confidence) an AUROC interval is given from. DeLong's
variance is a sum of one variance per class, each estimated from that class's rows; and a bootstrap needs both
classes in a resample: with c rows of a class among n, about e^-c of the resamples lack it (5% at c = 3, under 1% at
c = 5) and are dropped, which biases the interval."""


class Interval(NamedTuple):
    """A point estimate with its two-sided interval: ``ci`` is None when none is given, and ``no_ci`` then says why
    (None when the interval is given)."""

    value: float
    ci: tuple[float, float] | None
    no_ci: str | None


def _codes(groups: Any, size: int) -> np.ndarray:
    """``groups`` (labels of any kind numpy can sort, one per row) as integer codes 0..G-1."""
    g = np.asarray(groups.detach().cpu().numpy() if hasattr(groups, "detach") else groups).ravel()
    if g.size != size:
        raise ValueError(f"groups must have one label per row, got {g.size} for {size} rows")
    return np.unique(g, return_inverse=True)[1].ravel()


def _stated(confidence: Any, correct: Any, groups: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(q, y, group codes) of the rows that stated a confidence (codes None without ``groups``)."""
    q_all = _array(confidence, "confidence")
    codes = None if groups is None else _codes(groups, q_all.size)
    q, y = _pairs(q_all, correct, binary=True)  # checks lengths, ranges and binary outcomes
    if codes is not None:
        codes = np.unique(codes[~np.isnan(q_all)], return_inverse=True)[1].ravel()
    return q, y, codes


def _z(level: float) -> float:
    """The standard normal quantile of a two-sided ``level`` (1.96 at 0.95)."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def _placements(q: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's structural components: per right row, the share of wrong rows it outranks (ties one half); per wrong
    row, the share of right rows that outrank it. Both from midranks, in O(n log n)."""
    from scipy.stats import rankdata

    pos, neg = q[y == 1], q[y == 0]
    whole = rankdata(q)  # midranks among all rows
    v10 = (whole[y == 1] - rankdata(pos)) / neg.size  # wrong rows below (ties one half)
    v01 = 1.0 - (whole[y == 0] - rankdata(neg)) / pos.size  # right rows above (ties one half)
    return v10, v01


def auroc_delong(confidence: Any, correct: Any, groups: Any = None) -> tuple[float, float]:
    """``(auroc, variance)``: the AUROC of the stated confidences and DeLong's estimate of its variance.

    With V10_i the share of wrong rows right row i outranks (ties one half; m right rows) and V01_j the share of
    right rows that outrank wrong row j (n wrong rows), AUROC = mean V10 = mean V01 and the variance is
    S10 / m + S01 / n, S10 = sum (V10_i - AUROC)^2 / (m - 1) and S01 likewise over the wrong rows. With ``groups``
    (I groups, I10 of them with a right row and I01 with a wrong one; group k holds m_k right rows with V10 sum X_k
    and n_k wrong rows with V01 sum Y_k) it is Obuchowski's clustered form: S10 = I10 / ((I10 - 1) m) sum_k
    (X_k - m_k AUROC)^2, S01 = I01 / ((I01 - 1) n) sum_k (Y_k - n_k AUROC)^2, S11 = I / (I - 1) sum_k
    (X_k - m_k AUROC)(Y_k - n_k AUROC), variance S10 / m + S01 / n + 2 S11 / (m n); with one row per group it is
    DeLong's. A perfect (or perfectly reversed) ranking has variance 0, and so has a constant confidence (AUROC 0.5:
    it ranks nothing). NaN for both with a class missing; NaN variance with fewer than two rows (or groups) holding
    a class."""
    q, y, codes = _stated(confidence, correct, groups)
    m, n = int(y.sum()), int(y.size - y.sum())
    if m == 0 or n == 0:
        return math.nan, math.nan
    v10, v01 = _placements(q, y)
    theta = float(v10.mean())
    if codes is None:
        if m < 2 or n < 2:
            return theta, math.nan
        return theta, float(v10.var(ddof=1) / m + v01.var(ddof=1) / n)
    size = int(codes.max()) + 1
    with_right, with_wrong = np.unique(codes[y == 1]).size, np.unique(codes[y == 0]).size
    if min(size, with_right, with_wrong) < 2:
        return theta, math.nan
    x = np.bincount(codes[y == 1], weights=v10 - theta, minlength=size)  # X_k - m_k AUROC
    w = np.bincount(codes[y == 0], weights=v01 - theta, minlength=size)  # Y_k - n_k AUROC
    s10 = with_right / ((with_right - 1) * m) * np.sum(x * x)
    s01 = with_wrong / ((with_wrong - 1) * n) * np.sum(w * w)
    s11 = size / (size - 1) * np.sum(x * w)
    return theta, float(s10 / m + s01 / n + 2 * s11 / (m * n))


def interval_refusal(rows: int, groups: int | None = None, classes: tuple[int, int] | None = None) -> str | None:
    """Why no interval is given from ``rows`` rows (those that stated a confidence) in ``groups`` groups (where rows
    are grouped), with ``classes`` = (right rows, wrong rows) for an AUROC, or None: fewer than
    :data:`MIN_INTERVAL_ROWS` rows (or groups), or fewer than :data:`MIN_AUROC_CLASS_ROWS` rows of a class."""
    if rows < MIN_INTERVAL_ROWS:
        return f"interval needs >= {MIN_INTERVAL_ROWS} rows"
    if groups is not None and groups < MIN_INTERVAL_ROWS:
        return f"interval needs >= {MIN_INTERVAL_ROWS} groups (problems)"
    if classes is not None and min(classes) < MIN_AUROC_CLASS_ROWS:
        return f"interval needs >= {MIN_AUROC_CLASS_ROWS} right and >= {MIN_AUROC_CLASS_ROWS} wrong rows"
    return None


def _groups_of(codes: np.ndarray | None) -> int | None:
    return None if codes is None else (int(codes.max()) + 1 if codes.size else 0)


def auroc_interval(confidence: Any, correct: Any, groups: Any = None, level: float = 0.95) -> Interval:
    """The AUROC of the stated confidences with its DeLong interval: AUROC +- z * sqrt(variance)
    (:func:`auroc_delong`; z the normal quantile of ``level``), clipped to [0, 1]. Refused below the minimum
    counts (:func:`interval_refusal`); the value is NaN with a class missing."""
    z = _z(level)
    q, y, codes = _stated(confidence, correct, groups)
    value = auroc(q, y)
    right = int(y.sum())
    refused = interval_refusal(y.size, _groups_of(codes), (right, y.size - right))
    if refused or not math.isfinite(value):
        return Interval(value, None, refused)
    _, var = auroc_delong(q, y, codes)
    if not math.isfinite(var):
        return Interval(value, None, "interval needs right and wrong rows in >= 2 groups each")
    half = z * math.sqrt(max(var, 0.0))
    return Interval(value, (max(0.0, value - half), min(1.0, value + half)), None)


def _ece_resamples(q: np.ndarray, y: np.ndarray, codes: np.ndarray, draws: np.ndarray, bins: int) -> np.ndarray:
    """The ECE of each resample: row r of ``draws`` lists the groups (codes) drawn, each with all its rows.

    ECE = sum over bins of |sum of q - sum of y| / rows, so a resample's bin sums are its groups' bin sums weighted
    by how often each was drawn."""
    size = int(codes.max()) + 1
    cell = codes * bins + _bin_index(q, bins)
    gap = np.bincount(cell, weights=q - y, minlength=size * bins).reshape(size, bins)
    rows = np.bincount(codes, minlength=size).astype(np.float64)
    reps = draws.shape[0]
    weight = np.bincount((draws + size * np.arange(reps)[:, None]).ravel(),
                         minlength=reps * size).reshape(reps, size).astype(np.float64)
    return np.abs(weight @ gap).sum(1) / (weight @ rows)


def ece_interval(confidence: Any, correct: Any, groups: Any = None, bins: int = 10, level: float = 0.95,
                 reps: int = 2000, seed: int = 0) -> Interval:
    """The ECE of the stated confidences (``bins`` equal-width bins, as :func:`~reflectrl.eval.calibration.ece`) with
    a percentile bootstrap interval: ``reps`` resamples of the groups (with ``groups``; else of the rows), drawn with
    replacement from ``numpy.random.default_rng(seed)`` (the same inputs give the same interval), each group with all
    its rows; the interval is the (1 - level) / 2 and (1 + level) / 2 percentiles of the resamples' ECEs. Refused
    below the minimum counts (:func:`interval_refusal`); the value is NaN with no stated confidence."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    q, y, codes = _stated(confidence, correct, groups)
    value = ece(q, y, bins)
    refused = interval_refusal(y.size, _groups_of(codes))
    if refused:
        return Interval(value, None, refused)
    codes = np.arange(q.size) if codes is None else codes
    size = int(codes.max()) + 1
    rng = np.random.default_rng(seed)
    chunk = max(1, 2_000_000 // size)  # bounds the [resamples, groups] weight matrix
    samples = np.concatenate([_ece_resamples(q, y, codes, rng.integers(0, size, (min(chunk, reps - s), size)), bins)
                              for s in range(0, reps, chunk)])
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return Interval(value, (float(lo), float(hi)), None)


def confidence_intervals(confidence: Any, correct: Any, groups: Any = None, level: float = 0.95, reps: int = 2000,
                         seed: int = 0) -> dict[str, Any]:
    """``auroc_ci`` (DeLong, :func:`auroc_interval`) and ``ece_ci`` (bootstrap over problems, :func:`ece_interval`),
    each ``[low, high]`` or None; a refused one adds ``auroc_no_ci`` / ``ece_no_ci`` saying why."""
    out: dict[str, Any] = {}
    for name, iv in (("auroc", auroc_interval(confidence, correct, groups, level)),
                     ("ece", ece_interval(confidence, correct, groups, level=level, reps=reps, seed=seed))):
        out[f"{name}_ci"] = None if iv.ci is None else [iv.ci[0], iv.ci[1]]
        if iv.no_ci:
            out[f"{name}_no_ci"] = iv.no_ci
    return out
