"""``report.md`` of a comparison: per env, one row per method with IQM, probability of improvement and
early-learning AUC (each with a 95% bootstrap CI), the runs behind them, and the definitions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..eval.stats import (
    MIN_SEEDS,
    claim_text,
    early_auc,
    family_against_baseline,
    iqm_ci,
    mean_probability_of_improvement_ci,
    probability_of_improvement_ci,
)
from .rundata import EPISODIC_RETURN, RunData, group_runs

MARGIN_SHARE = 0.05
"""Non-inferiority margin of a control comparison: 5% of the magnitude of the baseline's mean final return."""


@dataclass
class ReportOptions:
    """What the report needs beyond the runs themselves."""

    command: str
    methods: Sequence[str]
    env_ids: Sequence[str]
    baseline: str = "ppo"
    early_fraction: float = 0.2
    confidence: float = 0.95
    n_resamples: int = 5000
    engine: str = "scipy"
    curves: str | None = "curves.png"
    failures: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _digits(v: float) -> int:
    a = abs(v)
    return 0 if a >= 1000 else 1 if a >= 100 else 2


def _num(v: float | None, digits: int | None = None) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v:.{_digits(v) if digits is None else digits}f}"


def _est(point: float, low: float, high: float) -> str:
    """``point [low, high]`` with the point's number of decimals throughout."""
    if not math.isfinite(point):
        return "n/a"
    d = _digits(point)
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{_num(point, d)} [n/a]"
    return f"{_num(point, d)} [{_num(low, d)}, {_num(high, d)}]"


def _ordered(keys, preferred: Sequence[str]) -> list[str]:
    """``keys`` with those named in ``preferred`` first, in that order."""
    keys = list(keys)
    return [k for k in preferred if k in keys] + [k for k in keys if k not in preferred]


def run_auc(run: RunData, total_steps: float, fraction: float) -> float:
    """The early-learning AUC of one run (NaN when it logged no episodic return)."""
    return early_auc(*run.series(EPISODIC_RETURN), total_steps, fraction)


def _env_total(runs: Sequence[RunData]) -> float:
    totals = [r.total_timesteps or r.last_step for r in runs]
    return float(max(totals)) if totals else float("nan")


def _finals(runs: Sequence[RunData]) -> np.ndarray:
    return np.array([r.final_return for r in runs if r.final_return is not None], float)


def _mean_or_none(vals) -> float | None:
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def _wall(runs: Sequence[RunData]) -> str:
    """``process (loop)`` seconds, means over runs; ``+`` marks a lower bound (a killed attempt's time is missing)."""
    proc, loop = _mean_or_none(r.train_wall_s for r in runs), _mean_or_none(r.learn_s for r in runs)
    plus = "+" if any(r.killed_attempts for r in runs) else ""
    return f"{_num(proc, 1)}{plus}" + (f" ({_num(loop, 1)}{plus})" if loop is not None else "")


def control_family(finals: dict[str, dict], aucs: dict[str, dict], baseline: str,
                   min_n: int = MIN_SEEDS) -> dict[str, dict[str, dict]]:
    """The family of one set of runs (one env of one comparison), decided by the one verdict rule: every method's
    final return and early AUC against the baseline's (``{method: {seed: value}}`` each), paired by env seed when
    both ran the same seeds, final return with a non-inferiority margin of :data:`MARGIN_SHARE` of the baseline's
    mean return; Holm over all of them together (:func:`reflectrl.eval.stats.family_against_baseline`).
    ``report.md`` and ``benchmarks/seed_claims.py`` decide this same family. Returns {"final", "early"} -> method
    -> decided claim."""
    base = [v for v in finals.get(baseline, {}).values() if math.isfinite(v)]
    margin = MARGIN_SHARE * abs(float(np.mean(base))) if base else None
    return family_against_baseline({"final": finals, "early": aucs}, baseline, {"final": margin}, min_n=min_n)


def env_family(by_method: dict[str, list[RunData]], baseline: str, fraction: float) -> dict[str, dict[str, dict]]:
    """:func:`control_family` of one env's runs."""
    total = _env_total([r for rs in by_method.values() for r in rs])
    finals = {m: {seed_key(r): r.final_return for r in rs if r.final_return is not None} for m, rs in by_method.items()}
    aucs = {m: {seed_key(r): v for r in rs if r.final_return is not None and math.isfinite(v := run_auc(r, total, fraction))}
            for m, rs in by_method.items()}
    return control_family(finals, aucs, baseline)


def seed_key(run: RunData) -> int | str:
    """What pairs a run with another method's run: its seed (its folder where it has none)."""
    return run.seed if run.seed is not None else str(run.run_dir)


def env_table(env: str, by_method: dict[str, list[RunData]], opts: ReportOptions) -> list[str]:
    """The markdown table of one env."""
    kw = dict(confidence=opts.confidence, n_resamples=opts.n_resamples, engine=opts.engine)
    total = _env_total([r for rs in by_method.values() for r in rs])
    base = _finals(by_method.get(opts.baseline, []))
    pct = f"{opts.early_fraction:.0%}"
    head = (f"| method | runs | final return, IQM [95% CI] | P(method > {opts.baseline}) [95% CI] | "
            f"final return - {opts.baseline}: mean [95% t CI], Holm p: verdict | "
            f"early AUC (first {pct} of steps), IQM [95% CI] | early AUC - {opts.baseline}: mean [95% t CI], Holm "
            "p: verdict | wall time per run, s: process (training loop) |")
    lines = [f"## {env}", "", f"{int(total) if math.isfinite(total) else '?'} environment steps per run.", "",
             head, "|---|---|---|---|---|---|---|---|"]
    family = env_family(by_method, opts.baseline, opts.early_fraction)
    n_hyp = sum(1 + ("p_ni_holm" in c) for by in family.values() for c in by.values() if "p_holm" in c)
    window_points = []
    for method in _ordered(by_method, opts.methods):
        rs = by_method[method]
        finals = _finals(rs)
        aucs = np.array([run_auc(r, total, opts.early_fraction) for r in rs], float)
        aucs = aucs[np.isfinite(aucs)]
        window_points += [int(np.sum(r.series(EPISODIC_RETURN)[0] <= opts.early_fraction * total)) for r in rs]
        if method == opts.baseline:
            poi = "(baseline)"
        elif len(base) and len(finals):
            poi = _est(*probability_of_improvement_ci(finals, base, **kw))
        else:
            poi = "n/a"
        claims = [_claim_cell(family[k].get(method), method, opts.baseline, digits) for k, digits in
                  (("final", _digits(float(np.mean(base))) if len(base) else 2), ("early", 2))]
        lines.append(f"| {method} | {len(finals)} | {_est(*iqm_ci(finals, **kw))} | {poi} | {claims[0]} | "
                     f"{_est(*iqm_ci(aucs, **kw))} | {claims[1]} | {_wall(rs)} |")
    if n_hyp:
        lines += ["", f"Verdicts: Holm over the {n_hyp} hypotheses of this env's family (every method's final return "
                      f"and early AUC against {opts.baseline}, final return's non-inferiority included: the family "
                      "benchmarks/seed_claims.py decides too)."]
    if window_points and np.median(window_points) < 3:
        lines += ["", f"Note: the first {pct} of steps hold a median of {int(np.median(window_points))} logged "
                      "updates per run, so the early AUC there is mostly interpolation; use a longer budget."]
    if opts.baseline not in by_method:
        lines += ["", f"No {opts.baseline} runs in this env: no probability of improvement."]
    return lines + [""]


def _claim_cell(claim: dict | None, method: str, baseline: str, digits: int) -> str:
    if method == baseline:
        return "(baseline)"
    if claim is None:
        return "n/a"
    return claim_text(claim, digits) if "p_holm" in claim else claim["verdict"]


def across_envs_table(groups: dict[str, dict[str, list[RunData]]], opts: ReportOptions) -> list[str]:
    """Average probability of improvement over envs (the only scale-free aggregate of raw returns)."""
    envs = [e for e in _ordered(groups, opts.env_ids) if opts.baseline in groups[e]]
    if len(envs) < 2:
        return []
    kw = dict(confidence=opts.confidence, n_resamples=opts.n_resamples, engine=opts.engine)
    lines = ["## Across environments", "",
             f"Probability of improvement over {opts.baseline}, averaged over the {len(envs)} envs in which both "
             "ran (stratified bootstrap: seeds resampled within each env).", "",
             f"| method | envs | mean P(method > {opts.baseline}) [95% CI] |", "|---|---|---|"]
    methods = _ordered(dict.fromkeys(m for e in envs for m in groups[e]), opts.methods)
    for m in methods:
        if m == opts.baseline:
            continue
        pairs = [(_finals(groups[e][m]), _finals(groups[e][opts.baseline])) for e in envs if m in groups[e]]
        pairs = [(x, y) for x, y in pairs if len(x) and len(y)]
        if len(pairs) < 2:
            continue
        est = mean_probability_of_improvement_ci([p[0] for p in pairs], [p[1] for p in pairs], **kw)
        lines.append(f"| {m} | {len(pairs)} | {_est(*est)} |")
    return lines + [""]


def runs_table(groups: dict[str, dict[str, list[RunData]]], root: Path, opts: ReportOptions) -> list[str]:
    """One row per run: the numbers behind the tables."""
    lines = ["## Runs", "",
             "| env | method | seed | final return | early AUC | wall s: process (loop) | attempts | run directory |",
             "|---|---|---|---|---|---|---|---|"]
    for env in _ordered(groups, opts.env_ids):
        by_method = groups[env]
        total = _env_total([r for rs in by_method.values() for r in rs])
        for method in _ordered(by_method, opts.methods):
            for r in by_method[method]:
                kinds = [a["kind"] + (" (killed)" if a.get("status") is None else "") for a in r.train_attempts]
                try:
                    where = r.run_dir.relative_to(root)
                except ValueError:
                    where = r.run_dir
                lines.append(f"| {env} | {method} | {r.seed} | {_num(r.final_return)} | "
                             f"{_num(run_auc(r, total, opts.early_fraction))} | {_wall([r])} | "
                             f"{' + '.join(kinds) or '-'} | `{where}` |")
    return lines + [""]


DEFINITIONS = """## Definitions

- **Final return** of a run: the mean undiscounted return of `reflectrl eval RUN_DIR --episodes {episodes}`
  (deterministic policy, fixed evaluation reset seeds) on the run's last checkpoint.
- **IQM**: the interquartile mean over a method's seeds, the mean of the middle 50% of values (25% trimmed
  from each end; `scipy.stats.trim_mean(x, 0.25)`; with fewer than 4 seeds nothing is trimmed).
- **95% CI**: percentile bootstrap, {n_resamples} resamples, engine `{engine}`. Within one env the stratified
  bootstrap of Agarwal et al. (2021) reduces to resampling the seeds with replacement; across envs each env is
  one stratum. Fewer than 2 seeds give no interval (n/a).
- **P(X > Y)**, probability of improvement: the chance that a run of X beats a run of Y on final return,
  counting ties as one half: U / (m n) with U the Mann-Whitney statistic of X's m final returns over Y's n.
  0.5 means no difference; 1 means every run of X beat every run of Y. The CI resamples X's and Y's seeds
  independently.
- **Verdict** (final return - baseline): decided by the one rule of `reflectrl.eval.stats` (docs/compare.md,
  "How verdicts are decided"). Runs are paired by env seed when both methods ran the same seeds (the exact
  sign-flip test over all 2^n sign patterns), else compared unpaired (an exact permutation test of the
  difference in means); the interval is Student's t (Welch's when unpaired). One family per env: Holm over
  every method's final return and early AUC against the baseline, and over final return's one-sided
  non-inferiority test (Student's t, margin 5% of the baseline's mean return; NI p). "better" or "worse" only
  when the difference's adjusted p-value is below 0.05; else "not lower" when the adjusted NI p is; otherwise
  "inconclusive (n seeds)"; fewer than 3 runs a side: "too few seeds (n)". Five paired seeds can never reach
  p < 0.05 (the smallest exact p is 2/32).
- **Early AUC** of a run: the mean of its training curve over the first {pct} of the steps budget T, i.e.
  (1 / (f T)) ∫₀^(f T) R(t) dt with f = {fraction}. R(t) is `charts/episodic_return` from `metrics.jsonl` (the
  mean return of the training episodes that ended in the update logged at step t), linearly interpolated on
  101 evenly spaced steps of [0, f T], holding the first logged value before the first logged step;
  the integral is the trapezoid rule. A method's entry is the IQM of its runs' AUCs.
- **Wall time per run**: wall-clock seconds of the `reflectrl train` processes of a run (all attempts,
  including resumes after an interruption; evaluation excluded), mean over the method's runs; in parentheses
  the seconds inside the training loop alone (the trainer's own `wall_s`: no interpreter start-up, imports
  or env creation), the figure to compare the compute cost of methods by. A `+` marks a lower bound: an
  attempt of some run was killed before it could record its time (`(killed)` in the Runs table).
- **curves.png**: per env, the mean over seeds of each method's interpolated `charts/episodic_return` on a
  common step grid, with Student's t 95% band of that mean.
"""


def build_report(runs: Sequence[RunData], root: Path, opts: ReportOptions, eval_episodes: int = 20) -> str:
    """The text of ``report.md``."""
    groups = group_runs(runs)
    lines = ["# Comparison report", "", "Produced by:", "", "```", opts.command, "```", "",
             f"Methods: {', '.join(opts.methods)}. Envs: {', '.join(opts.env_ids)}. Baseline for the probability "
             f"of improvement: {opts.baseline}. Statistics: IQM and bootstrap CIs ({opts.engine})."]
    if opts.curves:
        lines += ["", f"Learning curves: [{opts.curves}]({opts.curves})."]
    lines += [""] + [f"Note: {n}" for n in opts.notes] + ([""] if opts.notes else [])
    if opts.failures:
        lines += [f"## Failed runs ({len(opts.failures)})", ""]
        lines += [f"- {f['name']}: {f['error']} (log: `{f['log']}`)" for f in opts.failures] + [""]
    for env in _ordered(groups, opts.env_ids):
        lines += env_table(env, groups[env], opts)
    missing = [e for e in opts.env_ids if e not in groups]
    if missing:
        lines += [f"No finished runs for {', '.join(missing)}.", ""]
    lines += across_envs_table(groups, opts)
    lines += runs_table(groups, root, opts)
    lines += [DEFINITIONS.format(episodes=eval_episodes, n_resamples=opts.n_resamples, engine=opts.engine,
                                 pct=f"{opts.early_fraction:.0%}", fraction=opts.early_fraction)]
    return "\n".join(lines)
