"""``report.md`` of ``reflectrl llm compare``: per task, one row per method with the IQM of final held-out
accuracy, the probability of improvement over the first method and the early-learning AUC of training
accuracy (each with a 95% bootstrap CI over seeds), then the calibration of the self-reports asked at
evaluation (ECE, Brier, AUROC, reflection accuracy against the best constant reflection, under- and
overconfidence), each a mean over seeds with its bootstrap CI; ``curves.png`` (training accuracy) and one
reliability diagram per task (confidences pooled over seeds, one panel per method); and, where the runs trained
self-reports, which of them raised the collapse alarm (:mod:`reflectrl.llm.collapse`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..eval.stats import (
    MIN_SEEDS,
    bootstrap_ci,
    claim_text,
    compare_samples,
    decide,
    early_auc,
    iqm_ci,
    probability_of_improvement_ci,
)
from .report import _est, _num, _ordered, seed_key
from .rundata import RunData, load_run

ACCURACY_MARGIN = 0.02
"""Non-inferiority margin of held-out accuracy: 2 accuracy points."""

HIGHER = ("accuracy", "reflection_accuracy", "auroc", "selective_score")
"""Held-out metrics where higher is better."""
LOWER = ("ece", "brier", "underconfidence", "overconfidence")
"""Held-out metrics where lower is better."""
TASK_HIGHER = ("step_auroc",)
"""Higher-is-better metrics that only some tasks' evaluations give (rag: the AUROC of the confidences stated along an
episode)."""
TASK_LOWER = ("step_ece", "premature_rate")
"""Lower-is-better metrics of the same kind (rag: the ECE of confidences stated along an episode, the share answered
wrong after fewer searches than the question needs)."""
DIRECTED = HIGHER + LOWER + TASK_HIGHER + TASK_LOWER
"""The held-out metrics with a better direction: the family of a task's comparison holds each of them for every
method against the baseline."""


def heldout_family(pairs: dict[str, dict[str, tuple]], min_n: int = MIN_SEEDS) -> dict[str, dict[str, dict]]:
    """The family of one set of runs (one task of one ``reflectrl llm compare`` folder), decided by the one rule:
    ``pairs`` maps method -> metric -> (method's values, baseline's values), paired by seed (the same warmed-up model
    per seed); every directed metric (:data:`DIRECTED`) of every method is one claim, accuracy with the
    non-inferiority margin :data:`ACCURACY_MARGIN`, and Holm runs over all of them together
    (:func:`reflectrl.eval.stats.decide`). ``report.md`` shows the accuracy column of this family and
    ``benchmarks/llm_claims.py`` all of it, so a claim reads the same in both. Returns method -> metric -> claim."""
    cells = [(m, k, compare_samples(x, y, paired=True, higher_is_better=k not in LOWER + TASK_LOWER,
                                    margin=ACCURACY_MARGIN if k == "accuracy" else None))
             for m, by_metric in pairs.items() for k, (x, y) in by_metric.items() if k in DIRECTED and len(x)]
    out: dict[str, dict[str, dict]] = {m: {} for m in pairs}
    for (m, k, _), c in zip(cells, decide([c for *_, c in cells], min_n=min_n)):
        out[m][k] = c
    return out


def family_size(decided: dict[str, dict[str, dict]]) -> int:
    """How many hypotheses the Holm step of a decided family adjusted over: each claim's difference, and its
    non-inferiority where a margin was stated (claims below the seed minimum stay out)."""
    return sum(1 + ("p_ni_holm" in c) for by in decided.values() for c in by.values() if "p_holm" in c)


def paired_values(mine: dict, base: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    """The seeds both sides ran with a finite ``key`` in both eval dicts, as (method's, baseline's) values."""
    seeds = sorted(set(mine) & set(base), key=str)
    x = np.array([_eval_value(mine[s], key) for s in seeds])
    y = np.array([_eval_value(base[s], key) for s in seeds])
    ok = np.isfinite(x) & np.isfinite(y)
    return x[ok], y[ok]


def _eval_value(ev: dict, key: str) -> float:
    v = ev.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


CALIBRATION = (("ece", "ECE"), ("brier", "Brier"), ("auroc", "AUROC"), ("reflection_accuracy", "reflection acc."),
               ("best_constant", "best constant"), ("underconfidence", "underconf."), ("overconfidence", "overconf."),
               ("selective_score", "selective score"))
TRAIN_ACCURACY = "accuracy"
COLLAPSE = "selfreport/collapse"


def _value(run: RunData, key: str) -> float:
    v = (run.eval or {}).get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def _finite(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(list(x), float)
    return a[np.isfinite(a)]


def _mean_ci(x: np.ndarray, reps: int) -> str:
    if len(x) == 0:
        return "n/a"
    if len(x) == 1:
        return f"{_num(float(x[0]), 3)} [n/a]"
    lo, hi = bootstrap_ci(x, np.mean, 0.95, reps)
    return f"{float(np.mean(x)):.3f} [{lo:.3f}, {hi:.3f}]"


def family_line(hypotheses: int, baseline: str) -> str:
    """The sentence under a task's accuracy table naming the family its verdicts were adjusted in."""
    return (f"Verdicts: Holm over the {hypotheses} hypotheses of this task's family (every method against {baseline} "
            "on every held-out metric with a better direction, accuracy's non-inferiority included: the family "
            "benchmarks/llm_claims.py decides too, widened there to every variant tried on the same held-out problems "
            "where its variants.json records several); this table shows its accuracy claims.")


VERDICT_DEFINITION = (
    "- Verdict (accuracy - baseline): the one rule of `reflectrl.eval.stats` (docs/compare.md, \"How verdicts are "
    "decided\"): paired by seed over the seeds both methods ran (exact sign-flip test), Student's t interval; one "
    "family per task: Holm over every method's claim on every held-out metric with a better direction, and over "
    "accuracy's one-sided non-inferiority test (margin 2 accuracy points; NI p); \"better\"/\"worse\" when the "
    "difference's adjusted p is below 0.05, else \"not lower\" when the adjusted NI p is; otherwise \"inconclusive "
    f"(n seeds)\"; fewer than {MIN_SEEDS} pairs: \"too few seeds (n)\".")
"""The report's definition of its verdict column."""


def task_family(by_method: dict[str, list[RunData]], baseline: str) -> dict[str, dict[str, dict]]:
    """The decided family of one task's runs (:func:`heldout_family`) from their eval.json files."""
    evals = {m: {seed_key(r): r.eval or {} for r in rs} for m, rs in by_method.items()}
    base = evals.get(baseline)
    if not base:
        return {}
    return heldout_family({m: {k: paired_values(ev, base, k) for k in DIRECTED}
                           for m, ev in evals.items() if m != baseline})


def task_tables(task: str, by_method: dict[str, list[RunData]], methods: Sequence[str], early_fraction: float,
                reps: int) -> list[str]:
    """The two tables of one task: accuracy and calibration."""
    baseline = methods[0]
    kw = dict(n_resamples=reps)
    updates = max((r.total_timesteps or 0 for rs in by_method.values() for r in rs), default=0)
    total = max((r.last_step for rs in by_method.values() for r in rs), default=0)
    base = _finite(_value(r, "accuracy") for r in by_method.get(baseline, []))
    lines = [f"## {task}", "", f"{updates} updates per run; held-out accuracy greedy; training accuracy over the "
             f"first {early_fraction:.0%} of sampled completions for the early AUC.", "",
             f"| method | runs | held-out accuracy, IQM [95% CI] | P(method > {baseline}) [95% CI] | "
             f"accuracy - {baseline}: mean [95% t CI], Holm p: verdict | "
             "early AUC of training accuracy, IQM [95% CI] |", "|---|---|---|---|---|---|"]
    family = task_family(by_method, baseline)
    verdicts = {m: by["accuracy"] for m, by in family.items() if "accuracy" in by}
    for method in _ordered(by_method, methods):
        rs = by_method[method]
        acc = _finite(_value(r, "accuracy") for r in rs)
        aucs = _finite(early_auc(*r.series(TRAIN_ACCURACY), total, early_fraction) for r in rs)
        poi = "(baseline)" if method == baseline else (
            _est(*probability_of_improvement_ci(acc, base, **kw)) if len(acc) and len(base) else "n/a")
        c = verdicts.get(method)
        claim = ("(baseline)" if method == baseline else "n/a" if c is None else
                 claim_text(c) if "p_holm" in c else c["verdict"])
        lines.append(f"| {method} | {len(acc)} | {_est(*iqm_ci(acc, **kw))} | {poi} | {claim} | "
                     f"{_est(*iqm_ci(aucs, **kw))} |")
    if family_size(family):
        lines += ["", family_line(family_size(family), baseline)]
    lines += ["", "Calibration of the self-reports asked after each held-out answer (mean over seeds [95% bootstrap "
              "CI]); ECE and Brier: lower is better; AUROC > 0.5: the confidences rank right answers above wrong "
              "ones; reflection accuracy beats guessing only above the best constant.", "",
              "| method | " + " | ".join(name for _, name in CALIBRATION) + " | missing reports |",
              "|---|" + "---|" * (len(CALIBRATION) + 1)]
    for method in _ordered(by_method, methods):
        rs = by_method[method]
        cells = [_mean_ci(_finite(_value(r, k) for r in rs), reps) for k, _ in CALIBRATION]
        missing = _finite([max(_value(r, "reflection_missing_rate"), _value(r, "confidence_missing_rate"))
                           for r in rs])
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {_num(float(np.mean(missing)), 3) if len(missing) else 'n/a'} |")
    return lines + [""] + collapse_line(by_method, methods)


def collapse_line(by_method: dict[str, list[RunData]], methods: Sequence[str]) -> list[str]:
    """One line naming the runs whose training raised the collapse alarm (``selfreport/collapse``), each with the
    first update it rang at; nothing when no run logged the alarm (no self-reports trained)."""
    seen, rang = False, []
    for method in _ordered(by_method, methods):
        for r in sorted(by_method[method], key=lambda r: (r.seed is None, r.seed or 0, str(r.run_dir))):
            first = next((rec.get("update") for rec in r.records if rec.get(COLLAPSE, 0) >= 1), None)
            seen = seen or any(COLLAPSE in rec for rec in r.records)
            if first is not None:
                name = f"seed {r.seed}" if r.seed is not None else Path(r.run_dir).name
                rang.append(f"{method} {name} (update {first})")
    if not seen:
        return []
    return [f"Collapse alarm (self-reports constant for K updates in training): "
            f"{', '.join(rang) if rang else 'no run'}.", ""]


def pooled_reports(runs: Sequence[RunData]) -> tuple[np.ndarray, np.ndarray]:
    """Confidences and correctness of every held-out rollout of ``runs`` that stated a confidence."""
    q, y = [], []
    for r in runs:
        rep = (r.eval or {}).get("reports") or {}
        for c, ok in zip(rep.get("confidence") or [], rep.get("correct") or []):
            if c is not None and math.isfinite(c):
                q.append(float(c))
                y.append(float(ok))
    return np.asarray(q), np.asarray(y)


def reliability_figure(task: str, by_method: dict[str, list[RunData]], methods: Sequence[str], path: Path) -> Path | None:
    """One reliability panel per method (confidences pooled over seeds); None without confidences."""
    from matplotlib.figure import Figure

    from ..eval.calibration import reliability_bins

    names = [m for m in _ordered(by_method, methods) if len(pooled_reports(by_method[m])[0])]
    if not names:
        return None
    fig = Figure(figsize=(3.2 * len(names), 3.4), layout="constrained")
    for i, m in enumerate(names):
        ax = fig.add_subplot(1, len(names), i + 1)
        q, y = pooled_reports(by_method[m])
        b = reliability_bins(q, y, 10)
        centers = (b["edges"][:-1] + b["edges"][1:]) / 2
        used = b["count"] > 0
        ax.bar(centers[used], b["accuracy"][used], width=0.09, alpha=0.7, label="accuracy")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set(title=f"{m} (n={len(q)})", xlabel="stated confidence", xlim=(0, 1), ylim=(0, 1))
        if i == 0:
            ax.set_ylabel("held-out accuracy")
    fig.suptitle(f"{task}: reliability of stated confidence")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def write_llm_outputs(out: Path, specs: Sequence[Any], results: Sequence[dict], command: str, methods: Sequence[str],
                      tasks: Sequence[str], early_fraction: float, reps: int, notes: Sequence[str] = ()) -> dict[str, Path]:
    """report.md, curves.png and ``reliability_{task}.png`` from the finished runs of ``specs``."""
    from .plots import plot_runs

    runs: dict[str, dict[str, list[RunData]]] = {}
    for s in specs:
        d = Path(s.run_dir)
        if (d / "eval.json").is_file() and (d / "config.json").is_file():
            r = load_run(d)
            r.method, r.env_id, r.total_timesteps = s.method, s.env_id, s.budget
            runs.setdefault(s.env_id, {}).setdefault(s.method, []).append(r)
    lines = ["# LLM comparison", "", f"Command: `{command}`", ""]
    paths: dict[str, Path] = {}
    all_runs = [r for by in runs.values() for rs in by.values() for r in rs]
    if all_runs:
        try:
            paths["curves"] = plot_runs(all_runs, TRAIN_ACCURACY, out / "curves.png")
            lines += ["Training accuracy over sampled completions: [curves.png](curves.png).", ""]
        except Exception as exc:  # noqa: BLE001 - a plot is a convenience; the report stands without it
            lines += [f"No curves: {exc}", ""]
    for task in tasks:
        if task not in runs:
            lines += [f"## {task}", "", "No finished runs.", ""]
            continue
        lines += task_tables(task, runs[task], methods, early_fraction, reps)
        fig = reliability_figure(task, runs[task], methods, out / f"reliability_{task}.png")
        if fig is not None:
            paths[f"reliability ({task})"] = fig
            lines += [f"Reliability diagram: [{fig.name}]({fig.name}).", ""]
    failed = [r for r in results if r.get("status") != "ok"]
    if failed or notes:
        lines += ["## Failures and notes", ""] + [f"- {r['name']}: {r['error']}" for r in failed] + [
            f"- {n}" for n in notes] + [""]
    lines += ["## Definitions", "",
              "- IQM: the mean of the middle half of the seeds' values; CIs: 95% percentile bootstrap over seeds.",
              "- P(method > baseline): the probability that a random seed of the method beats a random seed of the "
              "baseline (ties count one half), with a bootstrap CI.",
              VERDICT_DEFINITION,
              "- ECE: 10 equal-width confidence bins, |accuracy - mean confidence| weighted by the bins' shares; "
              "Brier: mean (q - correct)^2; AUROC: of the stated confidence as a score for correctness.",
              "- Reflection accuracy P(reflection = outcome); best constant: max(accuracy, 1 - accuracy); "
              "underconfidence P(right | flagged unsolved); overconfidence P(wrong | flagged solved); selective "
              "score: +1 per committed right answer, -1 per committed wrong one, 0 per abstention, averaged.", ""]
    report = out / "report.md"
    tmp = report.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(report)
    paths["report"] = report
    return paths
