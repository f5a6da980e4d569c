"""Aggregate statistics over seeds: IQM and bootstrap confidence intervals (scipy), as rliable recommends.

Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice" (NeurIPS):
report the interquartile mean with stratified bootstrap confidence intervals instead of a mean of few seeds.
"""

from __future__ import annotations

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
