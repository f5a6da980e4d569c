"""Aggregate statistics over seeds: IQM and bootstrap confidence intervals (scipy), as rliable recommends.

Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice" (NeurIPS):
report the interquartile mean with stratified bootstrap confidence intervals instead of a mean of few seeds.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from scipy import stats


def iqm(x) -> float:
    """Interquartile mean: the mean of the middle 50% (scipy's 25%-trimmed mean)."""
    return float(stats.trim_mean(np.asarray(x, float), 0.25))


def bootstrap_ci(x, statistic=iqm, confidence: float = 0.95, n_resamples: int = 5000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``statistic`` over the samples ``x`` (runs of one task)."""
    x = np.asarray(x, float)
    if len(x) < 2:
        return float("nan"), float("nan")
    res = stats.bootstrap((x,), lambda s, axis=-1: np.apply_along_axis(statistic, axis, s), confidence_level=confidence,
                          n_resamples=n_resamples, method="percentile", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


# --------------------------------------------------------------------------------------------------
# Interval estimates for comparisons (``reflectrl compare``). Two engines compute the same quantities:
# scipy's ``stats.bootstrap`` (default: vectorized, fast) and rliable, the reference implementation of
# Agarwal et al. (optional: ``pip install rliable``). Point estimates agree exactly; intervals agree up to
# bootstrap noise (tests/eval/test_stats.py checks both).

ENGINES = ("scipy", "rliable")


def rliable_available() -> bool:
    """Whether ``rliable.library`` imports. rliable 1.2 pins ``arch<8``, and arch 7.x fails at import time
    under pandas 3, so any exception counts as unavailable (install ``pandas<3`` beside it)."""
    try:
        import rliable.library  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def _engine(engine: str | None) -> str:
    engine = engine or "scipy"
    if engine not in ENGINES:
        raise ValueError(f"unknown statistics engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "rliable" and not rliable_available():
        raise ImportError("the rliable engine needs rliable: pip install rliable 'pandas<3'")
    return engine


def probability_of_improvement(x, y) -> float:
    """P(X > Y) + P(X = Y)/2 for one draw of each sample: the Mann-Whitney U of ``x`` over ``y`` / (m n).

    Samples that do not overlap give 1 (or 0); identical samples give 0.5.
    """
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    return float(stats.mannwhitneyu(x, y, alternative="two-sided").statistic / (len(x) * len(y)))


def mean_probability_of_improvement(xs, ys) -> float:
    """The probability of improvement averaged over tasks: ``xs[k]`` and ``ys[k]`` are the runs of task k."""
    return float(np.mean([probability_of_improvement(x, y) for x, y in zip(xs, ys)]))


def _pairwise_poi(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The same U/(m n) by counting pairs along the last axis (leading axes batch bootstrap resamples)."""
    d = x[..., :, None] - y[..., None, :]
    return np.mean((d > 0) + 0.5 * (d == 0), axis=(-2, -1))


def _rliable_ci(arrays: list, func, confidence: float, n_resamples: int, seed: int) -> tuple[float, float]:
    """rliable's stratified (independent) bootstrap, percentile interval of ``func(*arrays)``; arrays are
    [runs, tasks] and runs are resampled within each task."""
    import warnings

    from rliable import library

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # arch: "random_state is deprecated"
        _, ci = library.get_interval_estimates({"x": list(arrays)}, func, reps=n_resamples,
                                               confidence_interval_size=confidence,
                                               random_state=np.random.RandomState(seed))
    low, high = np.asarray(ci["x"], float).reshape(2, -1)[:, 0]
    return float(low), float(high)


def _scipy_ci(samples: tuple, statistic, confidence: float, n_resamples: int, seed: int) -> tuple[float, float]:
    """scipy's percentile bootstrap of the vectorized ``statistic(*samples, axis=-1)``, every sample resampled
    independently (each sample is one stratum)."""
    import warnings

    if all(np.ptp(s) == 0 for s in samples):  # constant data: every resample gives the point estimate
        v = float(statistic(*samples, axis=-1))
        return v, v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.bootstrap(samples, statistic, vectorized=True, paired=False, confidence_level=confidence,
                              n_resamples=n_resamples, batch=1000, method="percentile",
                              rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def iqm_ci(x, confidence: float = 0.95, n_resamples: int = 5000, seed: int = 0,
           engine: str | None = None) -> tuple[float, float, float]:
    """``(IQM, low, high)`` of the runs ``x`` of one task, with a percentile bootstrap CI over runs."""
    x = np.asarray(x, float).ravel()
    if len(x) < 2:
        return (iqm(x) if len(x) else float("nan")), float("nan"), float("nan")
    if _engine(engine) == "rliable":
        from rliable import metrics

        ci = _rliable_ci([x[:, None]], lambda a: np.array([metrics.aggregate_iqm(a)]), confidence, n_resamples, seed)
    else:
        ci = _scipy_ci((x,), lambda a, axis: stats.trim_mean(a, 0.25, axis=axis), confidence, n_resamples, seed)
    return (iqm(x), *ci)


def probability_of_improvement_ci(x, y, confidence: float = 0.95, n_resamples: int = 5000, seed: int = 0,
                                  engine: str | None = None) -> tuple[float, float, float]:
    """``(P(X > Y), low, high)``; the bootstrap resamples the runs of X and of Y independently."""
    return mean_probability_of_improvement_ci([x], [y], confidence, n_resamples, seed, engine)


def mean_probability_of_improvement_ci(xs, ys, confidence: float = 0.95, n_resamples: int = 5000, seed: int = 0,
                                       engine: str | None = None) -> tuple[float, float, float]:
    """``(mean over tasks of P(X_k > Y_k), low, high)`` with a stratified bootstrap: runs are resampled
    within each task, independently for X and for Y (tasks are the strata; the set of tasks is fixed).
    The rliable engine needs the same number of runs in every task; otherwise scipy's bootstrap is used."""
    xs = [np.asarray(x, float).ravel() for x in xs]
    ys = [np.asarray(y, float).ravel() for y in ys]
    if not xs or min(len(v) for v in xs + ys) == 0:
        return float("nan"), float("nan"), float("nan")
    point = mean_probability_of_improvement(xs, ys)
    if min(len(v) for v in xs + ys) < 2:
        return point, float("nan"), float("nan")
    k = len(xs)
    same_shape = len({len(x) for x in xs}) == 1 and len({len(y) for y in ys}) == 1
    if _engine(engine) == "rliable" and same_shape:
        # rliable's StratifiedIndependentBootstrap; the statistic is rliable's metrics.probability_of_improvement
        # computed by counting pairs (identical values, without a Mann-Whitney call per resample).
        poi = lambda X, Y: np.mean(_pairwise_poi(X.T, Y.T))  # noqa: E731  [runs, tasks] -> per task
        return (point, *_rliable_ci([np.stack(xs, 1), np.stack(ys, 1)], poi, confidence, n_resamples, seed))
    stat = lambda *s, axis=-1: np.mean([_pairwise_poi(s[i], s[k + i]) for i in range(k)], axis=0)  # noqa: E731
    return (point, *_scipy_ci((*xs, *ys), stat, confidence, n_resamples, seed))


def interpolate_curve(steps, values, grid, extrapolate: bool = False) -> np.ndarray:
    """A logged curve (``values`` at increasing ``steps``) linearly interpolated on ``grid``.

    Outside the logged range the value is NaN, or with ``extrapolate`` the first (last) logged value."""
    steps, values, grid = (np.asarray(a, float) for a in (steps, values, grid))
    if len(steps) == 0:
        return np.full(grid.shape, np.nan)
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    out = np.interp(grid, steps, values)
    if not extrapolate:
        out[(grid < steps[0]) | (grid > steps[-1])] = np.nan
    return out


def early_auc(steps, values, total_steps: float, fraction: float = 0.2, num_points: int = 101) -> float:
    """Early-learning area under the curve: the mean of the curve over steps [0, fraction * total_steps].

    The curve is interpolated linearly on ``num_points`` evenly spaced steps of that window (holding the first
    logged value before the first logged step), integrated by the trapezoid rule and divided by the window's
    length. NaN when nothing was logged."""
    if len(np.asarray(steps)) == 0:
        return float("nan")
    end = fraction * float(total_steps)
    grid = np.linspace(0.0, end, num_points)
    y = interpolate_curve(steps, values, grid, extrapolate=True)
    return float(np.trapezoid(y, grid) / end)


def mean_t_band(y, confidence: float = 0.95, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, low, high)`` of ``y`` along ``axis`` ignoring NaNs; the band is Student's t interval of the mean
    (NaN where fewer than two values)."""
    y = np.asarray(y, float)
    n = np.sum(~np.isnan(y), axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(y, axis=axis)
            sem = np.nanstd(y, axis=axis, ddof=1) / np.sqrt(n)
        half = stats.t.ppf(0.5 + confidence / 2, np.maximum(n - 1, 1)) * sem
    half = np.where(n >= 2, half, np.nan)
    return mean, mean - half, mean + half


def difference_of_proportions_ci(before: float, before_ci: tuple[float, float], after: float,
                                 after_ci: tuple[float, float]) -> tuple[float, float]:
    """95% interval of ``after - before`` from the two proportions' Wilson intervals: Newcombe's hybrid score
    interval (Newcombe 1998, "Interval estimation for the difference between independent proportions", method 10).
    Where both were measured on the same problems it is conservative: a paired interval would be narrower when
    they are correlated."""
    (b_lo, b_hi), (a_lo, a_hi) = before_ci, after_ci
    d = after - before
    return (d - ((after - a_lo) ** 2 + (b_hi - before) ** 2) ** 0.5,
            d + ((a_hi - after) ** 2 + (before - b_lo) ** 2) ** 0.5)


# --------------------------------------------------------------------------------------------------
# Verdicts at few seeds: exact tests, Holm over a table, non-inferiority with a stated margin (docs/compare.md,
# "How verdicts are decided"). Intervals and IQMs above describe; these decide.
ALPHA = 0.05
MIN_SEEDS = 3
"""Fewest runs (pairs) a claim needs for a verdict; with fewer it reads "too few seeds (n)" and stays out of its
family. Every report and claims script uses it, so a family is the same set of claims wherever it is decided."""
EXACT_LIMIT = 100_000  # unpaired splits enumerated exactly up to this many; random draws beyond


def sign_flip_p(d) -> float:
    """Two-sided p-value of the exact sign-flip permutation test of paired differences ``d`` (H0: symmetric about
    0): the share of all 2^n sign patterns whose |mean| is at least the observed one. n = 0 gives 1."""
    d = np.asarray(d, float).ravel()
    n = d.size
    if n == 0:
        return 1.0
    if n > 20:
        raise ValueError(f"sign_flip_p enumerates 2^n patterns; {n} differences are too many")
    signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
    means = np.abs(signs @ d) / n
    return float(np.mean(means >= abs(d.mean()) - 1e-12 * max(1.0, abs(d.mean()))))


def permutation_p(x, y, draws: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of the permutation test of a difference in means between independent samples: exact
    (every split of the pooled values) when there are at most :data:`EXACT_LIMIT` splits, else ``draws`` random
    splits (the observed one counted, so p >= 1/(draws + 1))."""
    from itertools import combinations
    from math import comb

    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    m, n = x.size, y.size
    if m == 0 or n == 0:
        return 1.0
    pooled = np.concatenate([x, y])
    obs = abs(x.mean() - y.mean())
    tol = 1e-12 * max(1.0, obs)
    total = pooled.sum()
    if comb(m + n, m) <= EXACT_LIMIT:
        idx = np.array(list(combinations(range(m + n), m)))
        sx = pooled[idx].sum(1)
        diffs = np.abs(sx / m - (total - sx) / n)
        return float(np.mean(diffs >= obs - tol))
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((draws, m + n)), axis=1)[:, :m]
    sx = pooled[perms].sum(1)
    hits = np.sum(np.abs(sx / m - (total - sx) / n) >= obs - tol)
    return float((hits + 1) / (draws + 1))


def t_interval(x, y=None, paired: bool = False, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean difference, low, high)``: Student's t interval of the mean of ``x - y`` (paired, or ``y`` None) or
    Welch's interval of ``mean(x) - mean(y)`` (independent). Not degenerate at small n: at n = 3 it is wide, never
    [min, max]. NaN bounds below two values (or zero spread)."""
    x = np.asarray(x, float).ravel()
    if y is None or paired:
        d = x if y is None else x - np.asarray(y, float).ravel()
        n, mean = d.size, float(d.mean()) if d.size else float("nan")
        if n < 2:
            return mean, float("nan"), float("nan")
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
        return mean, mean - half, mean + half
    y = np.asarray(y, float).ravel()
    mean = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return mean, float("nan"), float("nan")
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = np.sqrt(vx + vy)
    if se == 0:
        return mean, mean, mean
    dof = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, dof) * se)
    return mean, mean - half, mean + half


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error over one table's claims)."""
    p = np.asarray(pvalues, float).ravel()
    order = np.argsort(p, kind="stable")
    adj = np.empty_like(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (p.size - rank) * p[i]))
        adj[i] = running
    return adj


def non_inferiority_p(x, y=None, margin: float = 0.0, paired: bool = False) -> float:
    """One-sided p-value of the non-inferiority test H0: mean(x - y) <= -margin against mean(x - y) > -margin:
    Student's t test of the paired (or ``y`` None) differences shifted by ``margin``, or Welch's test when unpaired.
    It is below 0.05 exactly where the one-sided 95% lower bound (the lower end of the 90% :func:`t_interval`) lies
    above -margin. With no spread: 0 when the difference lies above -margin, else 1; 1 below two values."""
    x = np.asarray(x, float).ravel()
    if y is None or paired:
        d = x if y is None else x - np.asarray(y, float).ravel()
        if d.size < 2:
            return 1.0
        shift, se, dof = float(d.mean()) + margin, float(d.std(ddof=1) / np.sqrt(d.size)), float(d.size - 1)
    else:
        y = np.asarray(y, float).ravel()
        if x.size < 2 or y.size < 2:
            return 1.0
        vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
        shift, se = float(x.mean() - y.mean()) + margin, float(np.sqrt(vx + vy))
        dof = float((vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1))) if se > 0 else 1.0
    if se == 0:
        return 0.0 if shift > 0 else 1.0
    return float(stats.t.sf(shift / se, dof))


def compare_samples(x, y, paired: bool, higher_is_better: bool = True, margin: float | None = None) -> dict:
    """One claim, "x against its baseline y": the mean difference (oriented so that positive is better), its 95%
    t interval, the exact p-value (sign flips when paired, a permutation test when not), and with ``margin`` the
    one-sided 95% lower bound of the oriented difference and the one-sided p-value of non-inferiority
    (:func:`non_inferiority_p`: "not worse than the baseline by more than ``margin``", i.e. not lower by more
    than it for a higher-is-better metric, not higher for a lower-is-better one). :func:`decide` turns a family
    of these into verdicts."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    if paired and x.size != y.size:
        raise ValueError(f"a paired comparison needs as many runs on each side, got {x.size} and {y.size}")
    sign = 1.0 if higher_is_better else -1.0
    effect, lo, hi = t_interval(sign * x, sign * y, paired=paired)
    p = sign_flip_p(sign * (x - y)) if paired else permutation_p(x, y)
    out = {"effect": effect, "ci": (lo, hi), "p": p, "n": int(min(x.size, y.size)), "paired": paired,
           "higher_is_better": bool(higher_is_better)}
    if margin is not None:
        out["margin"] = float(margin)
        out["lower_95"] = t_interval(sign * x, sign * y, paired=paired, confidence=0.90)[1]  # one-sided 95%
        out["p_ni"] = non_inferiority_p(sign * x, sign * y, float(margin), paired=paired)
    return out


def non_inferior_word(claim: dict) -> str:
    """The verdict word of a non-inferiority claim that holds: "not lower" for a higher-is-better metric, "not
    higher" for a lower-is-better one (ECE, Brier): the direction the margin guards."""
    return "not lower" if claim.get("higher_is_better", True) else "not higher"


DECISIVE = ("better", "worse", "not lower", "not higher")
"""The verdict words that decide something (the rest read "inconclusive (n seeds)" or "too few seeds (n)")."""


def decide(claims: list[dict], alpha: float = ALPHA, min_n: int = MIN_SEEDS) -> list[dict]:
    """The verdict of each claim of one family (each from :func:`compare_samples`), Holm over every hypothesis the
    family tests: the two-sided difference of each claim and, for each claim with a margin, its one-sided
    non-inferiority. "better" or "worse" when the difference's Holm-adjusted p-value is below ``alpha`` (the sign of
    the effect says which); otherwise "not lower" ("not higher" for a lower-is-better metric) where a margin was
    stated and the non-inferiority p-value, adjusted in the same Holm step, is below ``alpha``; otherwise
    "inconclusive (n seeds)". A claim backed by fewer than ``min_n`` runs reads "too few seeds (n)" and stays out of
    the family. Returns the claims with ``verdict`` (and, for those decided, ``p_holm``, and ``p_ni_holm`` where a
    margin was stated) added."""
    family = [c for c in claims if c["n"] >= min_n]
    pvals = [c["p"] for c in family] + [c["p_ni"] for c in family if "margin" in c]
    adjusted = holm(pvals) if pvals else np.zeros(0)
    diff_adj, ni_adj = iter(adjusted[:len(family)]), iter(adjusted[len(family):])
    out = []
    for c in claims:
        if c["n"] < min_n:
            out.append(dict(c, verdict=f"too few seeds ({c['n']})"))
            continue
        c = dict(c, p_holm=float(next(diff_adj)))
        if "margin" in c:
            c["p_ni_holm"] = float(next(ni_adj))
        if c["p_holm"] < alpha and c["effect"] != 0:
            c["verdict"] = "better" if c["effect"] > 0 else "worse"
        elif "margin" in c and c["p_ni_holm"] < alpha:
            c["verdict"] = non_inferior_word(c)
        else:
            c["verdict"] = f"inconclusive ({c['n']} seeds)"
        out.append(c)
    return out


def by_seed(x: dict, y: dict) -> tuple[np.ndarray, np.ndarray, bool]:
    """Two sides of a claim as ``{seed: value}``: paired by seed (the same env seed or the same warmed-up model per
    pair) when both ran exactly the same seeds, else two independent samples. NaNs are left out (with their pair)."""
    if set(x) == set(y) and x:
        keys = sorted(x, key=str)
        a, b = np.array([x[k] for k in keys], float), np.array([y[k] for k in keys], float)
        ok = np.isfinite(a) & np.isfinite(b)
        return a[ok], b[ok], True
    a, b = np.array(list(x.values()), float), np.array(list(y.values()), float)
    return a[np.isfinite(a)], b[np.isfinite(b)], False


def difference(c: dict, lower_is_better: bool = False) -> tuple[float, float, float]:
    """A claim's effect and 95% interval as the plain difference x - y (undoing the orientation of
    :func:`compare_samples`, which makes positive mean better)."""
    sign = -1.0 if lower_is_better else 1.0
    lo, hi = sorted(sign * float(v) for v in c["ci"])
    return sign * float(c["effect"]), lo, hi


def claim_text(c: dict, digits: int = 3, lower_is_better: bool = False) -> str:
    """One decided claim in a table cell: ``x - y [95% CI], p = (Holm): verdict``, and where a non-inferiority
    margin was stated, its Holm-adjusted one-sided p-value too (``NI p``)."""
    eff, lo, hi = difference(c, lower_is_better)
    ci = f" [{lo:+.{digits}f}, {hi:+.{digits}f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
    ni = f", NI p = {c['p_ni_holm']:.3g}" if "p_ni_holm" in c else ""
    return f"{eff:+.{digits}f}{ci}, p = {c['p_holm']:.3g}{ni}: {c['verdict']}"


def family_against_baseline(values: dict[str, dict[str, dict]], baseline: str,
                            margins: dict[str, float | None] | None = None, lower_is_better: Collection[str] = (),
                            min_n: int = MIN_SEEDS) -> dict[str, dict[str, dict]]:
    """Every method against ``baseline`` on every metric of one set of runs, decided as one family (Holm over all
    of them, non-inferiority included): ``values`` maps metric -> method -> ``{seed: value}``; ``margins`` gives
    a metric its non-inferiority margin, ``lower_is_better`` names the metrics where lower is better. A pair of
    methods that ran the same seeds is compared paired by seed (:func:`by_seed`). Returns metric -> method ->
    decided claim; methods with no values, and the baseline itself, get no entry."""
    margins = margins or {}
    cells = []
    for metric, by_method in values.items():
        base = by_method.get(baseline) or {}
        for m, v in by_method.items():
            if m != baseline and v and base:
                cells.append((metric, m, compare_samples(*by_seed(v, base), higher_is_better=metric not in lower_is_better,
                                                         margin=margins.get(metric))))
    out: dict[str, dict[str, dict]] = {metric: {} for metric in values}
    for (metric, m, _), c in zip(cells, decide([c for *_, c in cells], min_n=min_n)):
        out[metric][m] = c
    return out


def against_baseline(values: dict[str, dict], baseline: str, margin: float | None = None,
                     higher_is_better: bool = True) -> dict[str, dict]:
    """Every method of one table against ``baseline`` on one metric, decided together as one family
    (:func:`family_against_baseline` with that metric alone)."""
    return family_against_baseline({"_": values}, baseline, {"_": margin}, () if higher_is_better else ("_",))["_"]
