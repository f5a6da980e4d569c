"""The seed documents' claims, tested on `reflectrl compare` output folders.

    python benchmarks/seed_claims.py --dense runs/cmp/lander --sparse runs/cmp/mountaincar \
        --json-out benchmarks/results/seed_claims.json --md-out benchmarks/results/seed_claims.md

Each folder is a ``reflectrl compare --out`` folder (or any folder of run directories with
``eval.json``); ``--dense`` folders hold dense-reward envs, ``--sparse`` sparse-reward ones. Per env
and method the script compares against ``ppo`` (same env, same seeds) and prints markdown tables. Every
verdict comes from the one rule of ``reflectrl.eval.stats`` (docs/compare.md, "How verdicts are decided"),
one family per env (the env's set of runs, as its compare report decides them:
``reflectrl.experiments.report.control_family``), Holm over every hypothesis of the family:

- **final >= PPO**: the final (evaluation) return, paired by env seed (exact sign-flip test, Student's t 95%
  interval): "better"/"worse" at Holm p < 0.05, else "not lower" when the one-sided t test of non-inferiority
  within 5% of PPO's mean return, adjusted in the same Holm step, is below 0.05, otherwise "inconclusive (n seeds)".
- **faster early learning**: the early-learning AUC (episodic return averaged over the first
  ``--early-fraction`` of steps, as in report.md), paired the same way, in the same family; "better" means faster.
- **L_cal falls** (refgrpo-seed): per seed, mean held-out L_cal over the last 20% of updates divided by its
  mean over the first 20%, against 1 ("better": it falls); the relative std over the last 20% says whether it
  settles.
- **larger gains on sparse rewards**: each seed's gain over PPO's mean, relative to |PPO's mean|, on the
  sparse envs against the dense envs (independent samples: exact permutation test).

P(method > ppo) [95% bootstrap CI] and IQMs stay as descriptions. A verdict needs at least ``--min-seeds``
runs (default 3) of the method and of ppo; with fewer the claim reads "too few seeds (n)".
``--rerender FILE.json`` decides and renders a results file again from its per-seed values.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from reflectrl.eval.stats import (
    by_seed,
    claim_text,
    compare_samples,
    decide,
    iqm,
    probability_of_improvement_ci,
)
from reflectrl.experiments.report import control_family, run_auc
from reflectrl.experiments.rundata import discover_runs, group_runs, load_run

BASE = "ppo"


def finals(runs) -> np.ndarray:
    return np.array([r.final_return for r in runs if r.final_return is not None], float)


def aucs(runs, fraction: float) -> np.ndarray:
    total = float(max(r.total_timesteps or r.last_step for r in runs))
    a = np.array([run_auc(r, total, fraction) for r in runs], float)
    return a[np.isfinite(a)]


MARGIN_SHARE = 0.05
"""Non-inferiority margin of "final >= PPO": 5% of the magnitude of PPO's mean final return in the env."""


def lcal_trend(runs, metric: str = "refgrpo-seed/L_cal_heldout", min_seeds: int = 1) -> dict | None:
    ratios, settle = [], []
    for r in runs:
        _, v = r.series(metric)
        if len(v) < 5:
            continue
        k = max(1, len(v) // 5)
        first, last = float(np.mean(v[:k])), v[-k:]
        ratios.append(float(np.mean(last)) / first if first > 0 else float("nan"))
        settle.append(float(np.std(last) / np.mean(last)) if np.mean(last) > 0 else float("nan"))
    if not ratios:
        return None
    return {"ratios": ratios, "relative_std_last": settle}


def per_seed(runs, values) -> dict[str, float]:
    return {str(r.seed): float(v) for r, v in zip(runs, values) if np.isfinite(v)}


def gather(a: argparse.Namespace) -> dict:
    """Per env and method, each seed's final return and early AUC beside PPO's (and refgrpo-seed's L_cal course)."""
    out: dict = {"envs": {}}
    for kind, folders in (("dense", a.dense), ("sparse", a.sparse)):
        for folder in folders:
            g = group_runs(load_run(d) for d in discover_runs([folder]))
            for env, by_method in g.items():
                by_method = {m: [r for r in rs if r.final_return is not None] for m, rs in by_method.items()}
                by_method = {m: rs for m, rs in by_method.items() if rs}
                if BASE not in by_method:
                    continue
                total = float(max(r.total_timesteps or r.last_step for rs in by_method.values() for r in rs))
                data = {m: (per_seed(rs, [r.final_return for r in rs]),
                            per_seed(rs, [run_auc(r, total, a.early_fraction) for r in rs])) for m, rs in by_method.items()}
                out["envs"][env] = {"reward": kind, "methods": {}}
                for m, rs in by_method.items():
                    if m == BASE:
                        continue
                    rec = {"finals": data[m][0], "ppo_finals": data[BASE][0], "aucs": data[m][1],
                           "ppo_aucs": data[BASE][1]}
                    if rs[0].algo == "refgrpo-seed":
                        rec["l_cal"] = lcal_trend(rs)
                    out["envs"][env]["methods"][m] = rec
    return out


def relative_gains(rec: dict) -> list[float]:
    """Each seed's final return minus PPO's mean, over |PPO's mean|: gains comparable across envs."""
    base = float(np.mean(list(rec["ppo_finals"].values())))
    return [(v - base) / abs(base) for v in rec["finals"].values()]


def decide_claims(out: dict, min_seeds: int) -> dict:
    """Every verdict from the per-seed values, by the one rule of ``reflectrl.eval.stats``: per env one family
    (:func:`reflectrl.experiments.report.control_family`, as the env's compare report) of "final >= PPO" (paired by
    env seed, "not lower" within 5% of PPO's return) and "faster early learning" (the early AUC, paired); then
    "L_cal falls" (each seed's last/first ratio against 1) and "larger gains on sparse rewards" (relative gains over
    PPO on the sparse envs' seeds against the dense envs', unpaired), a family each."""
    lcal: list = []  # the L_cal table's claims, each against 1
    for e in out["envs"].values():
        finals, aucs = {BASE: {}}, {BASE: {}}
        for m, rec in e["methods"].items():
            f, bf, paired = by_seed(rec["finals"], rec["ppo_finals"])
            au, ba, paired_auc = by_seed(rec["aucs"], rec["ppo_aucs"])
            rec.update(seeds=len(rec["finals"]), final_iqm=iqm(f), ppo_final_iqm=iqm(bf),
                       p_final=list(probability_of_improvement_ci(f, bf)),
                       early_auc_iqm=iqm(au) if len(au) else float("nan"), ppo_early_auc_iqm=iqm(ba) if len(ba) else
                       float("nan"), p_early=list(probability_of_improvement_ci(au, ba)) if len(au) and len(ba)
                       else [float("nan")] * 3)
            finals[m], aucs[m] = rec["finals"], rec["aucs"]
            finals[BASE].update(rec["ppo_finals"])
            aucs[BASE].update(rec["ppo_aucs"])
            if rec.get("l_cal"):
                r = np.array(rec["l_cal"]["ratios"], float)
                rec["l_cal"]["claim"] = compare_samples(r, np.ones_like(r), paired=True, higher_is_better=False)
                lcal.append(rec["l_cal"])
        family = control_family(finals, aucs, BASE, min_n=min_seeds)  # one family per env: the env's set of runs
        for m, rec in e["methods"].items():
            for key in ("final", "early"):
                c = family[key].get(m) or {"n": 0, "verdict": "too few seeds (0)"}
                rec[f"{key}_claim"], rec[f"{key}_verdict"] = c, c["verdict"]
    for holder, c in zip(lcal, decide([h["claim"] for h in lcal], min_n=min_seeds)):
        holder["claim"], holder["verdict"] = c, c["verdict"]
    methods = sorted({m for e in out["envs"].values() for m in e["methods"]})
    sparse, svd = [], {}
    for m in methods:
        gains = {kind: [g for e in out["envs"].values() if e["reward"] == kind and m in e["methods"]
                        for g in relative_gains(e["methods"][m])] for kind in ("dense", "sparse")}
        if gains["dense"] and gains["sparse"]:
            svd[m] = {"dense_gains": gains["dense"], "sparse_gains": gains["sparse"],
                      "claim": compare_samples(gains["sparse"], gains["dense"], paired=False)}
            sparse.append(m)
    for m, c in zip(sparse, decide([svd[m]["claim"] for m in sparse], min_n=min_seeds)):
        svd[m]["claim"], svd[m]["verdict"] = c, c["verdict"]
    out["sparse_vs_dense"] = svd
    out["rule"] = ("one family per env (its set of runs), Holm at 0.05 over every method's final return and early AUC "
                   "against PPO, paired by env seed (exact sign-flip test), and final return's one-sided t test of "
                   "non-inferiority within 5% of PPO's mean return ('not lower'); L_cal: last/first ratio per seed "
                   "against 1, one family; sparse vs dense: relative gains, exact permutation test, one family")
    return out


def fmt(p) -> str:
    return "n/a" if not np.isfinite(p[0]) else f"{p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}]"


def render(out: dict) -> list[str]:
    """The tables of a decided results file (nothing read but the file)."""
    rows = ["| env (reward) | method | seeds | final IQM: method / ppo | P(final > ppo) [95% CI] | final - ppo: mean "
            "[95% t CI], Holm p: final >= PPO? | early AUC IQM: method / ppo | P(early AUC > ppo) [95% CI] | early AUC "
            "- ppo [95% t CI], Holm p: faster early learning? |", "|---|---|---|---|---|---|---|---|---|"]
    lrows = ["", "| env | method | held-out L_cal, last 20% / first 20% of updates, per seed | relative std over "
             "the last 20% | ratio - 1 [95% t CI], Holm p: L_cal falls? |", "|---|---|---|---|---|"]
    for env, e in out["envs"].items():
        for m, rec in e["methods"].items():
            rows.append(f"| {env} ({e['reward']}) | {m} | {rec['seeds']} | {rec['final_iqm']:.1f} / "
                        f"{rec['ppo_final_iqm']:.1f} | {fmt(rec['p_final'])} | {cell(rec, 'final', 1)} | "
                        f"{rec['early_auc_iqm']:.1f} / {rec['ppo_early_auc_iqm']:.1f} | {fmt(rec['p_early'])} | "
                        f"{cell(rec, 'early', 1)} |")
            t = rec.get("l_cal")
            if t:
                c = t["claim"]
                lrows.append(f"| {env} | {m} | {', '.join(f'{x:.2f}' for x in t['ratios'])} | "
                             f"{', '.join(f'{x:.2f}' for x in t['relative_std_last'])} | "
                             f"{claim_text(c, 2, lower_is_better=True) if 'p_holm' in c else t['verdict']} |")
    printed = ["\n".join(rows)] + (["\n".join(lrows)] if len(lrows) > 3 else [])
    srows = ["", "| method | relative gain over ppo per seed, dense envs: mean | sparse envs: mean | sparse - dense "
             "[95% t CI], Holm p: larger gains on sparse? |", "|---|---|---|---|"]
    for m, v in out.get("sparse_vs_dense", {}).items():
        srows.append(f"| {m} | {np.mean(v['dense_gains']):+.3f} | {np.mean(v['sparse_gains']):+.3f} | "
                     f"{claim_text(v['claim']) if 'p_holm' in v['claim'] else v['verdict']} |")
    return printed + (["\n".join(srows)] if len(srows) > 3 else [])


def cell(rec: dict, key: str, digits: int) -> str:
    c = rec[f"{key}_claim"]
    if "p_holm" not in c:
        return rec[f"{key}_verdict"]
    return claim_text(c, digits)


def migrate(old: dict, reports: list[Path]) -> dict:
    """A results file from before the one verdict rule, in today's layout: per-seed finals keyed by seed (its lists
    were in seed order; the compare reports' Runs tables confirm each to the printed digit) and each run's early
    AUC from those Runs tables (printed to 2 decimals)."""
    runs: dict[tuple[str, str, str], tuple[float, float]] = {}
    for rp in reports:
        for line in rp.read_text().splitlines():
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(c) == 8 and c[2].isdigit() and c[1] and not c[0].startswith("-"):
                try:
                    runs[(c[0], c[1], c[2])] = (float(c[3]), float(c[4]))
                except ValueError:
                    continue
    new = {"envs": {}, "migrated": "early AUCs per seed from the compare reports' Runs tables (2 decimals)"}
    for env, e in old["envs"].items():
        new["envs"][env] = {"reward": e["reward"], "methods": {}}
        for m, rec in e["methods"].items():
            if isinstance(rec["finals"], dict):
                new["envs"][env]["methods"][m] = rec
                continue
            r = {}
            for key, label, auc_key in (("finals", m, "aucs"), ("ppo_finals", BASE, "ppo_aucs")):
                seeds = sorted((s for (ev, mm, s) in runs if ev == env and mm == label), key=int)
                if len(seeds) != len(rec[key]):
                    raise SystemExit(f"{env} {label}: {len(seeds)} runs in the reports, {len(rec[key])} finals")
                for s, v in zip(seeds, rec[key]):
                    printed = runs[(env, label, s)][0]  # the report prints 0, 1 or 2 decimals by magnitude
                    if abs(v - printed) > (0.51 if abs(v) >= 1000 else 0.051 if abs(v) >= 100 else 0.0051):
                        raise SystemExit(f"{env} {label} seed {s}: final {v} is not the report's {runs[(env, label, s)][0]}")
                r[key] = {s: float(v) for s, v in zip(seeds, rec[key])}
                r[auc_key] = {s: runs[(env, label, s)][1] for s in seeds}
            if rec.get("l_cal"):
                r["l_cal"] = {"ratios": rec["l_cal"]["ratios"], "relative_std_last": rec["l_cal"]["relative_std_last"]}
            new["envs"][env]["methods"][m] = r
    return new


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dense", nargs="*", default=[], help="compare folders of dense-reward envs")
    ap.add_argument("--sparse", nargs="*", default=[], help="compare folders of sparse-reward envs")
    ap.add_argument("--early-fraction", type=float, default=0.2)
    ap.add_argument("--min-seeds", type=int, default=3, help="fewest runs per method and env for a verdict")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--md-out", type=Path, default=None, help="also write the printed tables here")
    ap.add_argument("--rerender", type=Path, default=None, metavar="JSON",
                    help="instead of reading runs: decide and render a --json-out file written before, from its "
                         "per-seed values")
    ap.add_argument("--reports", type=Path, nargs="*", default=[],
                    help="with --rerender of a file from before the one verdict rule: the compare report.md files "
                         "whose Runs tables give each run's seed and early AUC")
    a = ap.parse_args()
    out = migrate(json.loads(a.rerender.read_text()), a.reports) if a.rerender is not None else gather(a)
    write(decide_claims(out, a.min_seeds), a)


def write(out: dict, a: argparse.Namespace) -> None:
    printed = render(out)
    print("\n".join(printed))
    if a.md_out:
        a.md_out.write_text("\n".join(printed) + "\n")
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
