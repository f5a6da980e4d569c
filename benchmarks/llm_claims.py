"""The LLM self-assessment claims, tested on ``reflectrl llm compare`` output folders.

    python benchmarks/llm_claims.py --out runs/cmp_llm/arith13 --task arith --baseline grpo \
        --methods refgrpo rlcr refgrpo-seed --json-out benchmarks/results/llm_claims_arith.json

Per method the runs are paired with the baseline's by seed (the same warmed-up model per seed). For each
metric of the held-out evaluation (accuracy, and the calibration of the self-reports asked after each
answer) the script gives the mean over seeds of method and baseline, and P(method better than baseline)
with its 95% bootstrap CI over seeds (better: higher accuracy, reflection accuracy, AUROC, selective score;
lower ECE, Brier, underconfidence, overconfidence). Verdicts: **holds** when the CI lies above 0.5,
**does not hold** when it lies below, **level (within noise)** otherwise; for "accuracy not lower" the claim
holds unless the CI lies below 0.5. Two checks of self-knowledge per method, baselines included: AUROC above
0.5 beyond noise (bootstrap CI of the mean over seeds), and reflection accuracy above the best constant
reflection max(acc, 1 - acc) (CI of the mean per-seed difference above 0). A verdict needs ``--min-seeds``
pairs (default 3). A second reading uses the pairing: the mean over seeds of the per-seed difference (method minus
baseline, from the same warmed-up model) with its 95% bootstrap CI; "better" there means the CI excludes 0 on the
better side. The verdicts of the first table stay the claims' rule; the paired table says how far the pairing
narrows them. A last table follows each run's self-reports: the share of held-out answers it flagged solved and
its mean held-out confidence, and in its training rollouts the first update at which it flagged none solved
(a collapse to the constant answer "not solved") with the training accuracy at that update, and the mean
stated confidence at the first and the last update. Where the folder holds the comparison's own tiny models, a
first table gives each seed's warm-up: its steps and the train accuracy at which it stopped, against its target.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from reflectrl.eval.stats import bootstrap_ci, probability_of_improvement_ci

HIGHER = ("accuracy", "reflection_accuracy", "auroc", "selective_score")
LOWER = ("ece", "brier", "underconfidence", "overconfidence")
TASK_LOWER = ("step_ece", "premature_rate")
"""Lower-is-better metrics that only some tasks' evaluations give (rag: the ECE of confidences stated along an
episode, the share answered wrong after fewer searches than the question needs); a table row only where a run has one."""
TASK_HIGHER = ("step_auroc",)
"""Higher-is-better metrics of the same kind (rag: the AUROC of the confidences stated along an episode)."""
UP = HIGHER + TASK_HIGHER
NEUTRAL = ("tool_calls", "step_reports")
"""Behaviour with no better direction (searches or queries per episode, confidences stated per episode): means and
the paired difference only."""


def load(out: Path, task: str, method: str) -> dict[int, dict]:
    """Seed -> the run's eval.json (finished runs only)."""
    runs = {}
    for d in sorted((out / "runs" / task / method).glob("seed_*")):
        p = d / "eval.json"
        if p.is_file():
            runs[int(d.name.split("_")[1])] = json.loads(p.read_text())
    return runs


def value(ev: dict, key: str) -> float:
    v = ev.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def compare(m: dict[int, dict], b: dict[int, dict], key: str) -> dict:
    seeds = sorted(set(m) & set(b))
    x = np.array([value(m[s], key) for s in seeds])
    y = np.array([value(b[s], key) for s in seeds])
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) == 0:
        return {"n": 0}
    better = (x, y) if key in UP else (y, x)  # P(first > second) is P(method better); NEUTRAL keys: P unused
    p = probability_of_improvement_ci(*better) if len(x) >= 2 else (float("nan"),) * 3
    kept = [s for s, k in zip(seeds, ok) if k]
    d = x - y
    lo, hi = bootstrap_ci(d, np.mean) if len(d) >= 2 else (float("nan"), float("nan"))
    return {"n": int(len(x)), "method": float(x.mean()), "baseline": float(y.mean()), "p_better": [float(v) for v in p],
            "per_seed": {str(s): [float(a), float(b)] for s, a, b in zip(kept, x, y)},
            "paired_diff": [float(d.mean()), float(lo), float(hi)]}


PAIRED_KEYS = ("accuracy", "reflection_accuracy", "auroc", "ece", "brier", "underconfidence")


def paired_verdict(c: dict, key: str, min_seeds: int) -> str:
    if c.get("n", 0) < min_seeds:
        return f"too few seeds ({c.get('n', 0)})"
    _, lo, hi = c["paired_diff"]
    if not math.isfinite(lo):
        return "no CI"
    if key in NEUTRAL:
        return "higher" if lo > 0 else "lower" if hi < 0 else "level"
    up, down = (lo > 0, hi < 0) if key in UP else (hi < 0, lo > 0)
    return "better" if up else "worse" if down else "level"


def paired_rows(result: dict, methods: list[str], min_seeds: int, keys: tuple[str, ...] = PAIRED_KEYS) -> list[str]:
    """Per metric and method: mean paired difference (method - baseline) [95% bootstrap CI] and its reading."""
    rows = ["", "| paired by seed: method - baseline [95% CI] | " + " | ".join(methods) + " |",
            "|---|" + "---|" * len(methods)]
    for k in keys:
        cells = []
        for m in methods:
            c = result["methods"][m]["metrics"][k]
            if c.get("n", 0) == 0:
                cells.append("n/a")
                continue
            d, lo, hi = c["paired_diff"]
            ci = f" [{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) else ""
            cells.append(f"{d:+.3f}{ci}: {paired_verdict(c, k, min_seeds)}")
        reading = "no better direction" if k in NEUTRAL else f"{'higher' if k in UP else 'lower'} is better"
        rows.append(f"| {k} ({reading}) | " + " | ".join(cells) + " |")
    return rows


def verdict(c: dict, min_seeds: int, not_lower: bool = False) -> str:
    if c.get("n", 0) < min_seeds:
        return f"too few seeds ({c.get('n', 0)})"
    p, lo, hi = c["p_better"]
    if not math.isfinite(lo):
        return "no CI"
    if not_lower:
        return "does not hold" if hi < 0.5 else "holds"
    return "holds" if lo > 0.5 else "does not hold" if hi < 0.5 else "level (within noise)"


def self_knowledge(runs: dict[int, dict], min_seeds: int) -> dict:
    """AUROC above 0.5 and reflection accuracy above the best constant, each beyond noise over seeds."""
    au = np.array([value(e, "auroc") for e in runs.values()])
    au = au[np.isfinite(au)]
    diff = np.array([value(e, "reflection_accuracy") - value(e, "best_constant") for e in runs.values()])
    diff = diff[np.isfinite(diff)]
    step = np.array([value(e, "step_auroc") for e in runs.values()])
    step = step[np.isfinite(step)]
    out = {}
    checks = [("auroc", au, 0.5), ("reflection_minus_best_constant", diff, 0.0)]
    if len(step):  # a task whose episodes state confidences along the way (rag report=steps)
        checks.append(("step_auroc", step, 0.5))
    for name, arr, ref in checks:
        if len(arr) < min_seeds:
            out[name] = {"n": int(len(arr)), "verdict": f"too few seeds ({len(arr)})"}
            continue
        lo, hi = bootstrap_ci(arr, np.mean)
        out[name] = {"n": int(len(arr)), "mean": float(arr.mean()), "ci": [float(lo), float(hi)],
                     "verdict": "holds" if lo > ref else "does not hold" if hi < ref else "level (within noise)"}
    return out


def fmt(c: dict) -> str:
    if c.get("n", 0) == 0:
        return "n/a"
    p, lo, hi = c["p_better"]
    if not math.isfinite(p):
        return f"{c['method']:.3f} / {c['baseline']:.3f}"
    return f"{c['method']:.3f} / {c['baseline']:.3f}, P = {p:.2f} [{lo:.2f}, {hi:.2f}]"


def reflection_dynamics(out: Path, task: str, method: str) -> dict[int, dict]:
    """Seed -> how the reflections of the run's training rollouts evolved: the first update at which none was
    'solved' (``calibration/coverage`` 0: a collapse to the constant 'not solved'), the training accuracy
    then, and the coverage of the last update (runs whose rollouts carry no reflection are left out)."""
    from reflectrl.runlog import read_metrics

    res = {}
    for d in sorted((out / "runs" / task / method).glob("seed_*")):
        if not (d / "eval.json").is_file():
            continue
        all_recs = read_metrics(d / "metrics.jsonl")
        conf = [r["calibration/mean_confidence"] for r in all_recs
                if isinstance(r.get("calibration/mean_confidence"), (int, float))]
        recs = [r for r in all_recs if isinstance(r.get("calibration/coverage"), (int, float))]
        if not recs and not conf:
            continue
        row: dict = {"confidence_first_last": [float(conf[0]), float(conf[-1])] if conf else None}
        if recs:
            first = next((r for r in recs if r["calibration/coverage"] == 0), None)
            row.update({"first_update_all_not_solved": None if first is None else int(first["update"]),
                        "train_accuracy_then": None if first is None else
                        float(first.get("calibration/task_accuracy", float("nan"))),
                        "last_coverage": float(recs[-1]["calibration/coverage"]), "updates": int(recs[-1]["update"])})
        res[int(d.name.split("_")[1])] = row
    return res


def warmups(out: Path, task: str) -> dict[int, dict]:
    """Seed -> the warm-up summary of the comparison's tiny model (``OUT/models/TASK/seed_S/warmup/warmup.json``):
    steps, train accuracy at the stop, its target and the step limit (seeds whose model is not there are left out)."""
    res = {}
    for d in sorted((out / "models" / task).glob("seed_*")):
        try:
            w = json.loads((d / "warmup" / "warmup.json").read_text())
        except (OSError, ValueError):
            continue
        cfg = w.get("config", {})
        res[int(d.name.split("_")[1])] = {"steps": w.get("steps"), "train_accuracy": w.get("train_accuracy"),
                                          "target": cfg.get("stop_at_accuracy"), "max_steps": cfg.get("steps")}
    return res


def warmup_rows(ws: dict[int, dict]) -> list[str]:
    if not ws:
        return []
    rows = ["| seed | warm-up steps (limit) | train accuracy at the stop (target) |", "|---|---|---|"]
    for s, w in sorted(ws.items()):
        acc, target = w["train_accuracy"], w["target"]
        rows.append(f"| {s} | {w['steps']} ({w['max_steps']}) | "
                    f"{'n/a' if acc is None else f'{acc:.3f}'} ({'none' if target is None else target}) |")
    return [*rows, ""]


def dynamics_rows(all_runs: dict[str, dict[str, dict[int, dict]]], dyn: dict[str, dict[int, dict]]) -> list[str]:
    """Per method and seed: the share of held-out answers flagged solved, and the training reflections' course."""
    rows = ["", "| method | seed | held-out: share flagged solved | held-out: mean confidence | training: first update "
            "with none flagged solved (train accuracy then) | training: share flagged solved at the last update | "
            "training: mean confidence, first -> last update |", "|---|---|---|---|---|---|---|"]
    for m, runs in all_runs.items():
        for s in sorted(runs):
            t = dyn.get(m, {}).get(s) or {}
            if "updates" in t:
                first = ("never" if t["first_update_all_not_solved"] is None else
                         f"{t['first_update_all_not_solved']} ({t['train_accuracy_then']:.2f})")
                last = f"{t['last_coverage']:.3f} (update {t['updates']})"
            else:
                first, last = "no reflection in training", "-"
            c = t.get("confidence_first_last")
            conf = f"{c[0]:.3f} -> {c[1]:.3f}" if c else "no confidence in training"
            rows.append(f"| {m} | {s} | {value(runs[s], 'coverage'):.3f} | {value(runs[s], 'mean_confidence'):.3f} | "
                        f"{first} | {last} | {conf} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a `reflectrl llm compare --out` folder")
    ap.add_argument("--task", required=True)
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--methods", nargs="+", required=True)
    ap.add_argument("--min-seeds", type=int, default=3)
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--md-out", type=Path, default=None)
    a = ap.parse_args()
    base = load(a.out, a.task, a.baseline)
    runs_of = {m: load(a.out, a.task, m) for m in a.methods}
    present = lambda k: any(isinstance(e.get(k), (int, float)) for r in (base, *runs_of.values()) for e in r.values())
    task_keys = tuple(k for k in TASK_HIGHER + TASK_LOWER if present(k))
    keys = HIGHER + LOWER + task_keys
    neutral = tuple(k for k in NEUTRAL if present(k))
    result = {"task": a.task, "baseline": a.baseline, "out": str(a.out), "seeds_baseline": sorted(base),
              "self_knowledge": {a.baseline: self_knowledge(base, a.min_seeds)}, "methods": {}}
    rows = ["| metric (held-out) | better | " + " | ".join(f"{m} / {a.baseline}, P({m} better) [95% CI]" for m in a.methods)
            + " |", "|---|---|" + "---|" * len(a.methods)]
    cells: dict[str, list[str]] = {k: [] for k in keys}
    for m in a.methods:
        runs = runs_of[m]
        cmp = {k: compare(runs, base, k) for k in keys + neutral}
        verdicts = {k: verdict(cmp[k], a.min_seeds, not_lower=(k == "accuracy")) for k in keys}
        result["methods"][m] = {"seeds": sorted(set(runs) & set(base)), "metrics": cmp, "verdicts": verdicts}
        result["self_knowledge"][m] = self_knowledge(runs, a.min_seeds)
        for k in keys:
            cells[k].append(f"{fmt(cmp[k])}: {'not lower: ' if k == 'accuracy' else ''}{verdicts[k]}")
    for k in keys:
        rows.append(f"| {k} | {'higher' if k in UP else 'lower'} | " + " | ".join(cells[k]) + " |")
    result["warmups"] = warmups(a.out, a.task)
    rows[:0] = warmup_rows(result["warmups"])
    rows.insert(0, f"Seeds paired with {a.baseline}: " + ", ".join(
        f"{m} {len(result['methods'][m]['seeds'])}" for m in a.methods) + ".\n")
    names = ["auroc", "reflection_minus_best_constant"]
    head = "| method | mean AUROC [95% CI] (> 0.5?) | reflection acc. - best constant [95% CI] (> 0?) |"
    if any("step_auroc" in s for s in result["self_knowledge"].values()):
        names.append("step_auroc")
        head += " mean per-step AUROC [95% CI] (> 0.5?) |"
    sk = ["", head, "|---|" + "---|" * len(names)]
    for m, s in result["self_knowledge"].items():
        cells = []
        for name in names:
            e = s.get(name, {"verdict": "n/a"})
            cells.append(f"{e['mean']:.3f} [{e['ci'][0]:.3f}, {e['ci'][1]:.3f}] ({e['verdict']})" if "mean" in e
                         else e["verdict"])
        sk.append(f"| {m} | " + " | ".join(cells) + " |")
    all_runs = {a.baseline: base, **runs_of}
    dyn = {m: reflection_dynamics(a.out, a.task, m) for m in all_runs}
    result["reflection_dynamics"] = dyn
    paired = paired_rows(result, a.methods, a.min_seeds, PAIRED_KEYS + task_keys + neutral)
    text = "\n".join(rows + paired + sk + dynamics_rows(all_runs, dyn))
    print(text)
    if a.md_out:
        a.md_out.write_text(text + "\n")
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
