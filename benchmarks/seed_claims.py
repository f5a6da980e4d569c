"""The seed documents' claims, tested on `reflectrl compare` output folders.

    python benchmarks/seed_claims.py --dense runs/cmp/lander --sparse runs/cmp/mountaincar \
        --json-out benchmarks/results/seed_claims.json --md-out benchmarks/results/seed_claims.md

Each folder is a ``reflectrl compare --out`` folder (or any folder of run directories with
``eval.json``); ``--dense`` folders hold dense-reward envs, ``--sparse`` sparse-reward ones. Per env
and method the script compares against ``ppo`` (same env, same seeds 1..N) and prints a markdown table:

- **faster early learning**: P(method > ppo) of the early-learning AUC (episodic return averaged
  over the first ``--early-fraction`` of steps, as in report.md), with its 95% bootstrap CI.
  holds: CI low > 0.5; does not hold: CI high < 0.5 or point <= 0.5; otherwise not resolved.
- **final >= PPO**: P(method > ppo) of the final (evaluation) return. holds: CI low > 0.5 (better beyond
  noise); does not hold: CI high < 0.5 (worse beyond noise); otherwise "level (within noise)": the
  claim is neither shown nor refuted.
- **L_cal falls and settles** (refgrpo-seed): per seed, mean held-out L_cal over the last 20% of
  updates divided by its mean over the first 20% (updates that logged it); settles: the relative std
  over the last 20%. holds: the ratio is < 1 in every seed.
- **larger gains on sparse rewards**: P(final > ppo) on the sparse envs (mean over them) against the
  dense envs. holds: sparse point > 0.5, sparse CI low > 0.5 and sparse point > dense point; does not
  hold: sparse point <= dense point or <= 0.5; otherwise not resolved.

A verdict needs at least ``--min-seeds`` runs (default 3) of the method and of ppo in the env (every
env, for the sparse-vs-dense claim; every seed's ratio, for L_cal); with fewer the claim reads
"too few seeds (n)": one pair of runs says nothing about a distribution.

Statistics: reflectrl.eval.stats (scipy's percentile bootstrap, 5000 resamples, seed 0).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from reflectrl.eval.report import run_auc
from reflectrl.eval.rundata import discover_runs, group_runs, load_run
from reflectrl.eval.stats import iqm, mean_probability_of_improvement_ci, probability_of_improvement_ci

BASE = "ppo"


def finals(runs) -> np.ndarray:
    return np.array([r.final_return for r in runs if r.final_return is not None], float)


def aucs(runs, fraction: float) -> np.ndarray:
    total = float(max(r.total_timesteps or r.last_step for r in runs))
    a = np.array([run_auc(r, total, fraction) for r in runs], float)
    return a[np.isfinite(a)]


def verdict_early(p: tuple[float, float, float]) -> str:
    point, lo, hi = p
    if lo > 0.5:
        return "holds"
    if hi < 0.5 or point <= 0.5:
        return "does not hold"
    return "not resolved"


def verdict_final(p: tuple[float, float, float]) -> str:
    point, lo, hi = p
    if lo > 0.5:
        return "holds"
    if hi < 0.5:
        return "does not hold"
    return "level (within noise)"


def too_few(n: int, min_seeds: int) -> str | None:
    """The verdict that replaces any other when fewer than ``min_seeds`` runs back a claim."""
    return f"too few seeds ({n})" if n < min_seeds else None


def lcal_trend(runs, metric: str = "refgrpo/L_cal_heldout", min_seeds: int = 1) -> dict | None:
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
    verdict = too_few(len(ratios), min_seeds) or ("holds" if all(x < 1 for x in ratios) else "does not hold")
    return {"ratios": ratios, "relative_std_last": settle, "verdict": verdict}


def fmt(p: tuple[float, float, float]) -> str:
    return f"{p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dense", nargs="*", default=[], help="compare folders of dense-reward envs")
    ap.add_argument("--sparse", nargs="*", default=[], help="compare folders of sparse-reward envs")
    ap.add_argument("--early-fraction", type=float, default=0.2)
    ap.add_argument("--min-seeds", type=int, default=3, help="fewest runs per method and env for a verdict")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--md-out", type=Path, default=None, help="also write the printed tables here")
    ap.add_argument("--rerender", type=Path, default=None, metavar="JSON",
                    help="instead of reading runs: apply the current verdict rules to a --json-out file written "
                         "before (its P values and CIs), and write --json-out / --md-out again")
    a = ap.parse_args()
    if a.rerender is not None:
        out = json.loads(a.rerender.read_text())
        for e in out["envs"].values():
            for rec in e["methods"].values():
                if not str(rec["final_verdict"]).startswith("too few"):
                    rec["final_verdict"] = verdict_final(tuple(rec["p_final"]))
                if not str(rec["early_verdict"]).startswith("too few"):
                    rec["early_verdict"] = verdict_early(tuple(rec["p_early"]))
        write(out, rerender_rows(out), a)
        return
    kinds: dict[str, str] = {}
    groups: dict[str, dict[str, list]] = {}
    for kind, folders in (("dense", a.dense), ("sparse", a.sparse)):
        for folder in folders:
            g = group_runs(load_run(d) for d in discover_runs([folder]))
            for env, by_method in g.items():
                by_method = {m: [r for r in rs if r.final_return is not None] for m, rs in by_method.items()}
                groups[env] = {m: rs for m, rs in by_method.items() if rs}
                kinds[env] = kind
    out: dict = {"envs": {}, "sparse_vs_dense": {}}
    rows = ["| env (reward) | method | seeds | final IQM: method / ppo | P(final > ppo) [95% CI] | final >= PPO "
            "| early AUC IQM: method / ppo | P(early AUC > ppo) [95% CI] | faster early learning |",
            "|---|---|---|---|---|---|---|---|---|"]
    methods_seen: list[str] = []
    for env, by_method in groups.items():
        if BASE not in by_method:
            continue
        base_f, base_a = finals(by_method[BASE]), aucs(by_method[BASE], a.early_fraction)
        out["envs"][env] = {"reward": kinds[env], "methods": {}}
        for m, rs in by_method.items():
            if m == BASE:
                continue
            methods_seen += [m] if m not in methods_seen else []
            f, au = finals(rs), aucs(rs, a.early_fraction)
            pf, pa = probability_of_improvement_ci(f, base_f), probability_of_improvement_ci(au, base_a)
            few_f = too_few(min(len(f), len(base_f)), a.min_seeds)
            few_a = too_few(min(len(au), len(base_a)), a.min_seeds)
            rec = {"seeds": len(f), "final_iqm": iqm(f), "ppo_final_iqm": iqm(base_f), "p_final": pf,
                   "final_verdict": few_f or verdict_final(pf), "early_auc_iqm": iqm(au),
                   "ppo_early_auc_iqm": iqm(base_a), "p_early": pa, "early_verdict": few_a or verdict_early(pa),
                   "finals": f.tolist(), "ppo_finals": base_f.tolist()}
            if rs[0].algo == "refgrpo-seed":
                rec["l_cal"] = lcal_trend(rs, min_seeds=a.min_seeds)
            out["envs"][env]["methods"][m] = rec
            rows.append(f"| {env} ({kinds[env]}) | {m} | {len(f)} | {rec['final_iqm']:.1f} / {rec['ppo_final_iqm']:.1f} "
                        f"| {fmt(pf)} | {rec['final_verdict']} | {rec['early_auc_iqm']:.1f} / "
                        f"{rec['ppo_early_auc_iqm']:.1f} | {fmt(pa)} | {rec['early_verdict']} |")
    printed = ["\n".join(rows)]
    lrows = ["", "| env | method | held-out L_cal, last 20% / first 20% of updates, per seed | relative std over "
             "the last 20% | L_cal falls |", "|---|---|---|---|---|"]
    for env, e in out["envs"].items():
        for m, rec in e["methods"].items():
            t = rec.get("l_cal")
            if t:
                lrows.append(f"| {env} | {m} | {', '.join(f'{x:.2f}' for x in t['ratios'])} | "
                             f"{', '.join(f'{x:.2f}' for x in t['relative_std_last'])} | {t['verdict']} |")
    if len(lrows) > 3:
        printed.append("\n".join(lrows))
    srows = ["", "| method | mean P(final > ppo), dense envs [95% CI] | sparse envs [95% CI] | larger gains on sparse |",
             "|---|---|---|---|"]
    for m in methods_seen:
        per = {}
        for kind in ("dense", "sparse"):
            envs = [e for e, rec in out["envs"].items() if rec["reward"] == kind and m in rec["methods"]]
            if envs:
                xs = [out["envs"][e]["methods"][m]["finals"] for e in envs]
                ys = [out["envs"][e]["methods"][m]["ppo_finals"] for e in envs]
                per[kind] = mean_probability_of_improvement_ci(xs, ys)
        if "dense" in per and "sparse" in per:
            d, s = per["dense"], per["sparse"]
            n = min(min(len(rec["methods"][m]["finals"]), len(rec["methods"][m]["ppo_finals"]))
                    for rec in out["envs"].values() if m in rec["methods"])
            v = too_few(n, a.min_seeds) or (
                "holds" if s[0] > 0.5 and s[1] > 0.5 and s[0] > d[0] else
                "does not hold" if s[0] <= d[0] or s[0] <= 0.5 else "not resolved")
            out["sparse_vs_dense"][m] = {"dense": d, "sparse": s, "verdict": v}
            srows.append(f"| {m} | {fmt(d)} | {fmt(s)} | {v} |")
    if len(srows) > 3:
        printed.append("\n".join(srows))
    write(out, printed, a)


def write(out: dict, printed: list[str], a: argparse.Namespace) -> None:
    print("\n".join(printed))
    if a.md_out:
        a.md_out.write_text("\n".join(printed) + "\n")
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(out, indent=2))


def rerender_rows(out: dict) -> list[str]:
    """The tables of a results file (the same layout as a fresh run writes)."""
    rows = ["| env (reward) | method | seeds | final IQM: method / ppo | P(final > ppo) [95% CI] | final >= PPO "
            "| early AUC IQM: method / ppo | P(early AUC > ppo) [95% CI] | faster early learning |",
            "|---|---|---|---|---|---|---|---|---|"]
    lrows = ["", "| env | method | held-out L_cal, last 20% / first 20% of updates, per seed | relative std over "
             "the last 20% | L_cal falls |", "|---|---|---|---|---|"]
    for env, e in out["envs"].items():
        for m, rec in e["methods"].items():
            rows.append(f"| {env} ({e['reward']}) | {m} | {rec['seeds']} | {rec['final_iqm']:.1f} / "
                        f"{rec['ppo_final_iqm']:.1f} | {fmt(rec['p_final'])} | {rec['final_verdict']} | "
                        f"{rec['early_auc_iqm']:.1f} / {rec['ppo_early_auc_iqm']:.1f} | {fmt(rec['p_early'])} | "
                        f"{rec['early_verdict']} |")
            t = rec.get("l_cal")
            if t:
                lrows.append(f"| {env} | {m} | {', '.join(f'{x:.2f}' for x in t['ratios'])} | "
                             f"{', '.join(f'{x:.2f}' for x in t['relative_std_last'])} | {t['verdict']} |")
    printed = ["\n".join(rows)] + (["\n".join(lrows)] if len(lrows) > 3 else [])
    srows = ["", "| method | mean P(final > ppo), dense envs [95% CI] | sparse envs [95% CI] | larger gains on sparse |",
             "|---|---|---|---|"]
    for m, v in out.get("sparse_vs_dense", {}).items():
        srows.append(f"| {m} | {fmt(v['dense'])} | {fmt(v['sparse'])} | {v['verdict']} |")
    return printed + (["\n".join(srows)] if len(srows) > 3 else [])


if __name__ == "__main__":
    main()
