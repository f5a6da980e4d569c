"""Calibration of self-reports: stated confidences (Brier score, ECE, AUROC, risk-coverage, selective accuracy and
an abstention threshold) and binary reflections (reflection accuracy, under- and overconfidence, selective
prediction). Their intervals over problems are in :mod:`reflectrl.eval.uncertainty`.

Every function takes lists, numpy arrays or torch tensors (bool, int or float; any shape, flattened) and
returns plain Python floats (or numpy arrays for curves). A rate without a denominator is NaN.

- A confidence is a number q in [0, 1]: the stated probability that the rollout is correct. A missing one
  (None or NaN) drops that rollout from the confidence metrics, except that selective accuracy and the abstention
  threshold count it as an abstention; a value outside [0, 1] is an error.
- ``correct`` is the outcome: 0 / 1 (or False / True). ``brier`` and ``ece`` also accept fractional
  outcomes in [0, 1]; ``auroc``, ``risk_coverage`` and ``reflection_metrics`` need binary ones.
- A reflection is a binary self-report ŝ: 1 ("solved") or 0 ("unsolved"); a missing one (None or NaN) is
  left out of every rate and counted in ``missing_rate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SELECTIVE_COVERAGES", "apply_threshold", "auroc", "brier", "ece", "pick_threshold", "reflection_metrics",
           "reliability_bins", "reliability_diagram", "risk_coverage", "risk_coverage_curve", "selective_accuracies",
           "selective_accuracy", "self_report_metrics", "transfer_threshold"]

NAN = float("nan")


def _array(x: Any, name: str) -> np.ndarray:
    """``x`` (list, numpy array, torch tensor, scalar) as a flat float64 array; None becomes NaN."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    if isinstance(x, (list, tuple)):
        x = [NAN if v is None else v for v in x]
    try:
        out = np.asarray(x, dtype=np.float64).ravel()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numbers (a list, numpy array or torch tensor): {exc}") from None
    return out


def _pairs(confidence: Any, correct: Any, binary: bool) -> tuple[np.ndarray, np.ndarray]:
    """(q, y) with the rollouts that have no confidence removed; checks ranges and lengths."""
    q, y = _array(confidence, "confidence"), _array(correct, "correct")
    if q.shape != y.shape:
        raise ValueError(f"confidence and correct must have the same length, got {q.size} and {y.size}")
    if np.isnan(y).any():
        raise ValueError("correct has missing values (None or NaN); outcomes are never missing")
    keep = ~np.isnan(q)
    q, y = q[keep], y[keep]
    if ((q < 0) | (q > 1)).any():
        raise ValueError(f"confidences must lie in [0, 1], got values from {q.min():g} to {q.max():g}")
    if binary and not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("correct must be binary (0/1 or False/True) here")
    if not binary and ((y < 0) | (y > 1)).any():
        raise ValueError("correct must lie in [0, 1]")
    return q, y


def brier(confidence: Any, correct: Any) -> float:
    """Brier score: mean over rollouts of (q - correct)^2 (0 is perfect, 0.25 is a constant 0.5); NaN if empty."""
    q, y = _pairs(confidence, correct, binary=False)
    return float(np.mean((q - y) ** 2)) if q.size else NAN


def _bin_index(q: np.ndarray, bins: int) -> np.ndarray:
    """Bin i = min(floor(q * bins), bins - 1) of equal-width bins on [0, 1]: a confidence of 1 is in the last."""
    if not (isinstance(bins, (int, np.integer)) and bins >= 1):
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    return np.minimum(np.floor(q * bins).astype(np.int64), bins - 1)


def reliability_bins(confidence: Any, correct: Any, bins: int = 10) -> dict[str, np.ndarray]:
    """Per equal-width bin on [0, 1]: ``count``, ``confidence`` (mean q) and ``accuracy`` (mean outcome);
    NaN means for empty bins; ``edges`` has ``bins + 1`` entries."""
    q, y = _pairs(confidence, correct, binary=False)
    idx = _bin_index(q, bins)
    count = np.bincount(idx, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.bincount(idx, weights=q, minlength=bins) / count
        acc = np.bincount(idx, weights=y, minlength=bins) / count
    return {"edges": np.linspace(0.0, 1.0, bins + 1), "count": count, "confidence": conf, "accuracy": acc}


def ece(confidence: Any, correct: Any, bins: int = 10) -> float:
    """Expected calibration error: sum over equal-width bins of (bin's share of rollouts) * |mean q - accuracy|.

    Bin i holds min(floor(q * bins), bins - 1), so bins are [i/B, (i+1)/B) and the last one also holds
    q = 1. NaN if empty."""
    b = reliability_bins(confidence, correct, bins)
    n = b["count"].sum()
    if n == 0:
        return NAN
    used = b["count"] > 0
    return float(np.sum(b["count"][used] / n * np.abs(b["confidence"][used] - b["accuracy"][used])))


def auroc(confidence: Any, correct: Any) -> float:
    """Area under the ROC curve of the confidence as a score for correctness: the probability that a correct
    rollout has a higher confidence than a wrong one, ties counting one half (Mann-Whitney U / (n1 n0)).

    NaN when there is only one class (all correct or all wrong: the ROC curve is undefined) or no rollout."""
    from scipy import stats

    q, y = _pairs(confidence, correct, binary=True)
    pos, neg = q[y == 1], q[y == 0]
    if pos.size == 0 or neg.size == 0:
        return NAN
    u = stats.mannwhitneyu(pos, neg, alternative="two-sided").statistic  # U of the correct rollouts
    return float(u / (pos.size * neg.size))


def _rate(num: float, den: float) -> float:
    return float(num / den) if den else NAN


def reflection_metrics(reflection: Any, outcome: Any) -> dict[str, float]:
    """Agreement of binary self-reports ŝ (1 solved, 0 unsolved, None/NaN missing) with outcomes o (0/1).

    Rollouts without a reflection are left out of every rate below (so all rates describe the same
    rollouts) and counted in ``missing_rate`` (their share of all rollouts) and ``missing``; ``n`` is the
    number kept. Keys (plain floats; NaN where a rate has no denominator):

    - ``task_accuracy``: P(o = 1). ``reflection_accuracy``: P(ŝ = o).
    - ``underconfidence``: P(o = 1 | ŝ = 0), flagged unsolved but right.
      ``overconfidence``: P(o = 0 | ŝ = 1), flagged solved but wrong.
    - ``delta``: reflection_accuracy - task_accuracy. ``best_constant``: max(acc, 1 - acc), the reflection
      accuracy of the better constant reflection (always "solved" or always "unsolved"); a reflection beats
      guessing only when its accuracy exceeds it.
    - Selective prediction, reading ŝ = 1 as "commit to the answer" and ŝ = 0 as "abstain":
      ``coverage`` P(ŝ = 1); ``selective_accuracy`` P(o = 1 | ŝ = 1); ``selective_score`` the mean over
      rollouts of +1 for a committed correct answer, -1 for a committed wrong one and 0 for an abstention,
      i.e. P(ŝ = 1, o = 1) - P(ŝ = 1, o = 0), in [-1, 1]. Always committing scores 2·acc - 1, always
      abstaining 0, a perfect reflection acc.
    """
    s, o = _array(reflection, "reflection"), _array(outcome, "outcome")
    if s.shape != o.shape:
        raise ValueError(f"reflection and outcome must have the same length, got {s.size} and {o.size}")
    if not np.isin(o, (0.0, 1.0)).all():
        raise ValueError("outcome must be binary (0/1 or False/True) with no missing values")
    present = ~np.isnan(s)
    if not np.isin(s[present], (0.0, 1.0)).all():
        raise ValueError("reflection must be 1 (solved), 0 (unsolved) or None/NaN (missing)")
    total, s, o = s.size, s[present], o[present]
    n = s.size
    acc = _rate(o.sum(), n)
    flagged = s == 1
    hits, misses = float(np.sum(flagged & (o == 1))), float(np.sum(flagged & (o == 0)))
    refl_acc = _rate(np.sum(s == o), n)
    return {
        "n": float(n),
        "missing": float(total - n),
        "missing_rate": _rate(total - n, total),
        "task_accuracy": acc,
        "reflection_accuracy": refl_acc,
        "underconfidence": _rate(np.sum(~flagged & (o == 1)), np.sum(~flagged)),
        "overconfidence": _rate(misses, np.sum(flagged)),
        "delta": refl_acc - acc,
        "best_constant": max(acc, 1.0 - acc) if n else NAN,
        "coverage": _rate(np.sum(flagged), n),
        "selective_accuracy": _rate(hits, np.sum(flagged)),
        "selective_score": _rate(hits - misses, n),
    }


def risk_coverage(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    """Selective risk against coverage when answering only rollouts with q >= t, for every distinct
    confidence t from the highest down: ``coverage[i]`` is the share answered at the i-th threshold and
    ``risk[i]`` the error rate among them (rollouts with equal confidence are answered together).
    Empty arrays for no rollouts."""
    q, y = _pairs(confidence, correct, binary=True)
    if q.size == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(-q, kind="stable")
    q, y = q[order], y[order]
    last = np.r_[np.flatnonzero(q[1:] != q[:-1]), q.size - 1]  # last index of each run of equal confidence
    answered = last + 1.0
    errors = np.cumsum(1.0 - y)[last]
    return answered / q.size, errors / answered


# ---------------------------------------------------------------------------------------------- abstention
SELECTIVE_COVERAGES = (0.5, 0.8, 1.0)
"""The coverages ``reflectrl llm eval`` and ``reflectrl calibration`` report selective accuracy at."""


def _levels(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The distinct stated confidences from the highest down, the rows at or above each (cumulative count), the right
    ones among them (cumulative), and the number of all rows, those without a confidence included."""
    total = _array(confidence, "confidence").size
    q, y = _pairs(confidence, correct, binary=True)
    levels, inverse = np.unique(-q, return_inverse=True)  # ascending -q: the highest confidence first
    count = np.cumsum(np.bincount(inverse.ravel(), minlength=levels.size)).astype(np.float64)
    right = np.cumsum(np.bincount(inverse.ravel(), weights=y, minlength=levels.size))
    return -levels, count, right, total


def _share(name: str, value: Any) -> float:
    """``value`` as a float, ValueError unless it lies in (0, 1]."""
    if not (isinstance(value, (int, float, np.floating)) and 0 < value <= 1):
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return float(value)


def selective_accuracy(confidence: Any, correct: Any, coverage: float) -> float:
    """The accuracy of the answers kept when the model answers the ``coverage`` share of the rows it is most confident
    on and abstains on the rest.

    Of N rows, k = coverage * N are kept (k may be fractional), from the highest confidence down. Ties at the cut are
    averaged: when the cut falls inside a group of rows with equal confidence, each of them is kept in the same
    share, so the group adds its own accuracy times the rows it contributes; this is the expected accuracy when ties
    are broken at random, and the order of the rows never matters (a fractional k keeps that share of the next
    row the same way). A missing confidence (None or NaN) is an abstention: that row is never kept, and N counts
    it, so a coverage above the share of rows that stated a confidence is out of reach: NaN (as for no rows).
    Coverage 1 with every confidence stated is the plain accuracy."""
    coverage = _share("coverage", coverage)
    levels, count, right, total = _levels(confidence, correct)
    k = coverage * total
    if not levels.size or k > count[-1] * (1 + 1e-12):
        return NAN
    k = min(k, count[-1])
    j = int(np.searchsorted(count, k * (1 - 1e-12)))  # the first level whose rows reach k: the cut is in it
    above, above_right = (count[j - 1], right[j - 1]) if j else (0.0, 0.0)
    group_accuracy = (right[j] - above_right) / (count[j] - above)
    return float((above_right + (k - above) * group_accuracy) / k)


def selective_accuracies(confidence: Any, correct: Any, coverages: tuple[float, ...] = SELECTIVE_COVERAGES
                         ) -> dict[str, float]:
    """``{"selective_accuracy@C": ...}`` for each coverage C (``selective_accuracy@0.5``, ``@0.8``, ``@1.0``):
    :func:`selective_accuracy` at each, NaN where out of reach."""
    return {f"selective_accuracy@{float(c)}": selective_accuracy(confidence, correct, c) for c in coverages}


def pick_threshold(confidence: Any, correct: Any, coverage: float | None = None, accuracy: float | None = None
                   ) -> float:
    """The abstention threshold t picked on validation rows: the model answers a row when its stated confidence
    q >= t and abstains otherwise (and on a row without a confidence). Give one target:

    - ``coverage``: the highest t whose share of answered rows (of all rows, those without a confidence included)
      is at least ``coverage``: the fewest most-confident rows that reach it (rows of equal confidence are answered
      together, so the share reached can exceed the target);
    - ``accuracy``: the lowest t whose answered rows are at least ``accuracy`` right: the most rows answered at
      that accuracy.

    ValueError when the target cannot be reached on these rows (too few stated confidences for the coverage, no
    threshold as accurate), saying what can."""
    if (coverage is None) == (accuracy is None):
        raise ValueError("give one target: coverage or accuracy")
    levels, count, right, total = _levels(confidence, correct)
    if not levels.size:
        raise ValueError("no row states a confidence: no threshold can be picked")
    if coverage is not None:
        reach = count / total >= _share("coverage", coverage) - 1e-12
        if not reach.any():
            raise ValueError(f"coverage {coverage:g} is out of reach: {int(count[-1])} of {total} rows state a "
                             "confidence (a missing one abstains)")
        return float(levels[int(np.argmax(reach))])
    acc = right / count
    ok = acc >= _share("accuracy", accuracy) - 1e-12
    if not ok.any():
        best = int(np.argmax(acc))
        raise ValueError(f"no threshold reaches accuracy {accuracy:g}: the best is {acc[best]:.3f}, answering "
                         f"q >= {levels[best]:g} ({count[best] / total:.3f} of the rows)")
    return float(levels[int(np.flatnonzero(ok)[-1])])


def apply_threshold(threshold: float, confidence: Any, correct: Any) -> dict[str, float]:
    """What answering only the rows with stated confidence q >= ``threshold`` gives: ``coverage`` (answered rows over
    all rows, a missing confidence counting as an abstention), ``accuracy`` of the answered rows (NaN when none is),
    ``answered`` and ``rows``."""
    total = _array(confidence, "confidence").size
    q, y = _pairs(confidence, correct, binary=True)
    kept = q >= threshold
    return {"coverage": _rate(kept.sum(), total), "accuracy": _rate(y[kept].sum(), kept.sum()),
            "answered": int(kept.sum()), "rows": total}


def transfer_threshold(validation_confidence: Any, validation_correct: Any, confidence: Any, correct: Any,
                       coverage: float | None = None, accuracy: float | None = None) -> dict[str, Any]:
    """The abstention threshold picked on validation rows for a target ``coverage`` or ``accuracy``
    (:func:`pick_threshold`), applied to held-out rows (:func:`apply_threshold`): ``threshold``, the held-out
    ``coverage``, ``accuracy``, ``answered`` and ``rows``, and ``validation`` (the same four on the validation
    rows)."""
    t = pick_threshold(validation_confidence, validation_correct, coverage, accuracy)
    return {"threshold": t, **apply_threshold(t, confidence, correct),
            "validation": apply_threshold(t, validation_confidence, validation_correct)}


def _figure(width: float = 4.6, height: float = 4.2):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend (Agg when saving)

    return Figure(figsize=(width, height), layout="constrained")


def _unit_axes(ax: Any, xlabel: str, ylabel: str, title: str, top: float) -> None:
    """Both axes on [0, 1] (the y axis to ``top``, room for labels), with labels, a title and a light grid."""
    ax.set_xlim(0, 1)
    ax.set_ylim(0, top)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def _save(fig: Any, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, format="png")
    return out


def reliability_diagram(confidence: Any, correct: Any, path: str | Path, bins: int = 10,
                        title: str = "Reliability diagram") -> Path:
    """Write a PNG reliability diagram to ``path``: the accuracy of each confidence bin as a bar over the
    bin, the diagonal (perfect calibration), each bin's count above its bar, ECE and Brier in the legend."""
    b = reliability_bins(confidence, correct, bins)
    fig = _figure()
    ax = fig.subplots()
    width = 1.0 / bins
    used = b["count"] > 0
    left = b["edges"][:-1][used]
    ax.bar(left, b["accuracy"][used], width=width, align="edge", color="C0", alpha=0.75, edgecolor="k", lw=0.5,
           label=f"accuracy (ECE {ece(confidence, correct, bins):.3f}, Brier {brier(confidence, correct):.3f})")
    ax.plot(b["confidence"][used], b["accuracy"][used], "o", color="C3", ms=4, label="bin (mean confidence, accuracy)")
    ax.plot([0, 1], [0, 1], "--", color="gray", lw=1, label="perfect calibration")
    for x, acc, count in zip(left, b["accuracy"][used], b["count"][used]):
        ax.text(x + width / 2, min(acc, 0.93) + 0.02, f"{int(count)}", ha="center", va="bottom", fontsize=7)
    if not used.any():
        ax.text(0.5, 0.5, "no confidences", ha="center", va="center", transform=ax.transAxes)
    ax.legend(fontsize=7, loc="upper left")
    _unit_axes(ax, "stated confidence", "accuracy", f"{title} (n={int(b['count'].sum())})", top=1.05)
    return _save(fig, path)


def risk_coverage_curve(confidence: Any, correct: Any, path: str | Path,
                        title: str = "Risk-coverage") -> Path:
    """Write a PNG of selective risk against coverage (see :func:`risk_coverage`) to ``path``, with the
    risk of always answering as a reference line."""
    coverage, risk = risk_coverage(confidence, correct)
    n = _pairs(confidence, correct, binary=True)[0].size
    fig = _figure()
    ax = fig.subplots()
    if coverage.size:
        ax.step(np.r_[0.0, coverage], np.r_[risk[0], risk], where="pre", color="C0", lw=1.6,
                label=f"answer if q >= t (AUROC {auroc(confidence, correct):.3f})")
        ax.axhline(risk[-1], ls="--", color="gray", lw=1, label=f"always answer ({risk[-1]:.3f})")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no confidences", ha="center", va="center", transform=ax.transAxes)
    _unit_axes(ax, "coverage (share answered)", "selective risk (error rate of answered)", f"{title} (n={n})",
               top=1.02)
    return _save(fig, path)


def self_report_metrics(outcome: Any, reflection: Any = None, confidence: Any = None) -> dict[str, float]:
    """Every calibration metric of a set of rollouts at once: per-rollout ``outcome`` (0 / 1), ``reflection``
    (1 / 0, NaN missing) and ``confidence`` (q, NaN missing); either report may be None (not asked).
    Reflection metrics come from :func:`reflection_metrics`; confidence metrics are ``ece``, ``brier``,
    ``auroc`` and ``confidence_missing_rate``, plus ``reflection_missing_rate`` for reflections."""
    y = _array(outcome, "outcome")
    out: dict[str, float] = {"accuracy": float(y.mean()) if y.size else NAN}
    if reflection is not None:
        r = reflection_metrics(reflection, y)
        out.update({k: v for k, v in r.items() if k not in ("n", "missing", "missing_rate")})
        out["reflection_missing_rate"] = r["missing_rate"]
    if confidence is not None:
        q = _array(confidence, "confidence")
        ok = ~np.isnan(q)
        out["confidence_missing_rate"] = float(1.0 - ok.mean()) if q.size else NAN
        out.update({"ece": ece(q[ok], y[ok]), "brier": brier(q[ok], y[ok]), "auroc": auroc(q[ok], y[ok]),
                    "mean_confidence": float(q[ok].mean()) if ok.any() else NAN})
    return out
