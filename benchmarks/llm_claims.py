"""The LLM self-assessment claims, tested on ``reflectrl llm compare`` output folders.

    python benchmarks/llm_claims.py --out runs/cmp_llm/arith13 --task arith --baseline grpo \
        --methods refgrpo rlcr refgrpo-seed --json-out benchmarks/results/llm_claims_arith.json

Per method the runs are paired with the baseline's by seed (the same warmed-up model per seed). Every verdict
comes from the one rule of ``reflectrl.eval.stats`` (docs/compare.md, "How verdicts are decided"): per metric of
the held-out evaluation (accuracy, and the calibration of the self-reports asked after each answer; better:
higher accuracy, reflection accuracy, AUROC, selective score; lower ECE, Brier, underconfidence,
overconfidence), the exact sign-flip test of the per-seed differences, Student's t 95% interval of the mean
difference, and Holm over the directed claims of the table: "better" or "worse" only when the adjusted p-value
is below 0.05; accuracy "not lower" when the one-sided 95% lower bound of the difference lies above -0.02 (two
accuracy points); otherwise "inconclusive (n seeds)". Five pairs never decide (the smallest exact p is 2/32).
The unpaired P(method better) [95% bootstrap CI] stays in the first table as a description. Self-knowledge per
method, baselines included, in a second family: AUROC above 0.5, and reflection accuracy above the best constant
reflection max(acc, 1 - acc), each by the same test on the per-seed values. A verdict needs ``--min-seeds`` pairs
(default 3). A last table follows each run's self-reports: the share of held-out answers it flagged solved and
its mean held-out confidence, and in its training rollouts the first update at which it flagged none solved
(a collapse to the constant answer "not solved") with the training accuracy at that update, and the mean
stated confidence at the first and the last update. Where the folder holds the comparison's own tiny models, a
first table gives each seed's warm-up: its steps and the train accuracy at which it stopped, against its target.

``--rerender FILE.json`` decides and renders a result file again from its per-seed values alone (no run
folders needed); ``tests/eval/test_rendered_claims.py`` checks that every committed table equals that render.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from reflectrl.eval.stats import claim_text, compare_samples, decide, probability_of_improvement_ci
from reflectrl.experiments.llm_report import (  # the family of a task's runs, as `reflectrl llm compare` decides it
    HIGHER,
    LOWER,
    TASK_HIGHER,
    TASK_LOWER,
    family_size,
    heldout_family,
)

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
    """The seeds both ran, each with (method, baseline) values, plus the unpaired P(method better) [95% CI] as a
    description; the claim itself is decided by :func:`decide_result`."""
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
    return {"n": int(len(x)), "method": float(x.mean()), "baseline": float(y.mean()), "p_better": [float(v) for v in p],
            "per_seed": {str(s): [float(a), float(b)] for s, a, b in zip(kept, x, y)}}


PAIRED_KEYS = ("accuracy", "reflection_accuracy", "auroc", "ece", "brier", "underconfidence")


def self_knowledge_values(runs: dict[int, dict]) -> dict[str, dict[str, float]]:
    """Per check, seed -> the run's value: AUROC, reflection accuracy minus the best constant (max(acc, 1 - acc) over
    the answers that got a reflection), and
    (where a task gives it) the per-step AUROC."""
    out: dict[str, dict[str, float]] = {"auroc": {}, "reflection_minus_best_constant": {}}
    for s, e in sorted(runs.items()):
        out["auroc"][str(s)] = value(e, "auroc")
        out["reflection_minus_best_constant"][str(s)] = value(e, "reflection_accuracy") - value(e, "best_constant")
        if math.isfinite(value(e, "step_auroc")):
            out.setdefault("step_auroc", {})[str(s)] = value(e, "step_auroc")
    return {k: {s: v for s, v in d.items() if math.isfinite(v)} for k, d in out.items()}


RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = RESULTS / "variants.json"
"""Every variant tried per question, and the split it was chosen on (see its "about")."""


def question_of(name: str | None) -> tuple[str | None, list[str], bool]:
    """The question a claims file answers (``variants.json``), the other held-out tables of that question, and
    whether the file's variants were chosen on validation problems (then its family is its own runs')."""
    if not name or not VARIANTS.is_file():
        return None, [], False
    for q, rec in json.loads(VARIANTS.read_text())["questions"].items():
        mine = [v for v in rec["variants"] if v.get("claims") == name]
        if mine:
            if all(v["chosen_on"] == "validation" for v in mine):
                return q, [], True
            return q, sorted({v["claims"] for v in rec["variants"] if v.get("claims") not in (None, name)
                              and v["claims"].startswith("llm_claims_")}), False
    return None, [], False


def _pairs_of(metrics: dict) -> dict[str, tuple]:
    out = {}
    for k, c in metrics.items():
        if k not in NEUTRAL and c.get("n", 0) and "per_seed" in c:
            d = np.array(list(c["per_seed"].values()), float)
            out[k] = (d[:, 0], d[:, 1])
    return out


def sibling_pairs(result: dict, others: list[str]) -> dict[str, dict[str, tuple]]:
    """The per-seed pairs of every other variant tried on the same held-out problems, from its own claims file
    (``FILE: method``); a method of this result's own is the same runs, so it is not counted twice."""
    out = {}
    for other in others:
        for m, rec in json.loads((RESULTS / other).read_text())["methods"].items():
            if m not in result["methods"]:
                out[f"{other}: {m}"] = _pairs_of(rec["metrics"])
    return out


SELF_REFERENCE = {"auroc": 0.5, "reflection_minus_best_constant": 0.0, "step_auroc": 0.5}


def decide_result(result: dict, min_seeds: int) -> dict:
    """Every verdict of ``result`` from its per-seed values alone, by the one rule of ``reflectrl.eval.stats``: per
    method and metric, the paired comparison with the baseline (the same warmed-up model per seed: exact sign-flip
    test, Student's t interval), one family for the task's runs
    (:func:`reflectrl.experiments.llm_report.heldout_family`, the family ``reflectrl llm compare``'s report decides):
    Holm over every directed claim of the method table and accuracy's non-inferiority (2-point margin, "not lower").
    Self-knowledge: each run's value against its reference (0.5, or 0), a family of its own (claims about each
    method alone, not against the baseline). Fewer than ``min_seeds`` pairs: "too few seeds (n)"."""
    pairs: dict[str, dict[str, tuple]] = {}  # method -> directed metric -> (method's, baseline's) per-seed values
    for m, rec in result["methods"].items():
        rec["verdicts"] = {}
        pairs[m] = {}
        for k, c in rec["metrics"].items():
            for stale in ("paired_diff", "claim"):
                c.pop(stale, None)
            has = bool(c.get("n", 0)) and "per_seed" in c
            if k in NEUTRAL:  # no better direction: the difference only
                if has:
                    d = np.array(list(c["per_seed"].values()), float)
                    c["claim"] = compare_samples(d[:, 0], d[:, 1], paired=True)
                continue
            if has:
                d = np.array(list(c["per_seed"].values()), float)
                pairs[m][k] = (d[:, 0], d[:, 1])
                rec["verdicts"][k] = ""  # decided below, with the rest of the family (keeps the metrics' order)
            elif c.get("n", 0) == 0:
                rec["verdicts"][k] = "too few seeds (0)"
            else:  # a table from before per-seed values were kept: nothing to decide on
                rec["verdicts"][k] = f"inconclusive ({c['n']} seeds; per-seed values not kept)"
    question, others, chosen_on_validation = question_of(result.get("claims_file"))
    # one family: every method's directed metrics, as report.md, with every variant tried on the same held-out problems
    family = heldout_family({**pairs, **sibling_pairs(result, others)}, min_n=min_seeds)
    result.update(question=question, family_with=others, chosen_on_validation=chosen_on_validation)
    for m, by_metric in ((m, family[m]) for m in pairs):
        for k, decided in by_metric.items():
            result["methods"][m]["metrics"][k]["claim"] = decided
            result["methods"][m]["verdicts"][k] = decided["verdict"]
    result["family_hypotheses"] = family_size(family)
    checks = []  # the self-knowledge table: each run's value against its reference
    for per_method in result["self_knowledge"].values():
        for name, e in per_method.items():
            e.pop("p_holm", None)
            if "per_seed" not in e:
                e["verdict"] = f"inconclusive ({e.get('n', 0)} seeds; per-seed values not kept)"
                continue
            arr = np.array(list(e["per_seed"].values()), float)
            ref = SELF_REFERENCE[name]
            e.update(compare_samples(arr, np.full(arr.size, ref), paired=True), mean=float(arr.mean()) if arr.size
                     else float("nan"))
            e["ci"] = [float(ref + v) for v in e["ci"]]
            checks.append(e)
    for e, decided in zip(checks, decide([dict(e) for e in checks], min_n=min_seeds)):
        e.update({k: decided[k] for k in ("p_holm", "verdict") if k in decided})
    result["rule"] = RULE
    return result


def fmt(c: dict) -> str:
    """Method / baseline means, the unpaired P(method better) [95% CI] (a description), and the decided claim."""
    if c.get("n", 0) == 0:
        return "n/a"
    p, lo, hi = c["p_better"]
    poi = f", P = {p:.2f} [{lo:.2f}, {hi:.2f}]" if math.isfinite(p) else ""
    return f"{c['method']:.3f} / {c['baseline']:.3f}{poi}"


def paired_rows(result: dict, methods: list[str], keys: tuple[str, ...]) -> list[str]:
    """Per metric and method: mean paired difference (method - baseline) [95% t CI], the Holm p-value and the verdict."""
    rows = ["", "| paired by seed: method - baseline [95% t CI], Holm p: verdict | " + " | ".join(methods) + " |",
            "|---|" + "---|" * len(methods)]
    for k in keys:
        cells = []
        for m in methods:
            c = result["methods"][m]["metrics"].get(k, {"n": 0})
            if c.get("n", 0) == 0:
                cells.append("n/a")
            elif "claim" not in c:
                cells.append(result["methods"][m]["verdicts"].get(k, "n/a"))
            elif k in NEUTRAL:
                eff, (lo, hi) = c["claim"]["effect"], c["claim"]["ci"]
                cells.append(f"{eff:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) else ""))
            elif "p_holm" in c["claim"]:
                cells.append(claim_text(c["claim"], lower_is_better=k in LOWER + TASK_LOWER))
            else:
                cells.append(result["methods"][m]["verdicts"][k])
        reading = "no better direction" if k in NEUTRAL else f"{'higher' if k in UP else 'lower'} is better"
        rows.append(f"| {k} ({reading}) | " + " | ".join(cells) + " |")
    return rows


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


def dynamics_rows(result: dict) -> list[str]:
    """Per method and seed: the share of held-out answers flagged solved, and the training reflections' course."""
    rows = ["", "| method | seed | held-out: share flagged solved | held-out: mean confidence | training: first update "
            "with none flagged solved (train accuracy then) | training: share flagged solved at the last update | "
            "training: mean confidence, first -> last update |", "|---|---|---|---|---|---|---|"]
    dyn = result["reflection_dynamics"]
    for m, seeds in result["heldout_reports"].items():
        for s, (coverage, confidence) in sorted(seeds.items(), key=lambda kv: int(kv[0])):
            t = dyn.get(m, {}).get(s) or {}
            if "updates" in t:
                first = ("never" if t["first_update_all_not_solved"] is None else
                         f"{t['first_update_all_not_solved']} ({t['train_accuracy_then']:.2f})")
                last = f"{t['last_coverage']:.3f} (update {t['updates']})"
            else:
                first, last = "no reflection in training", "-"
            c = t.get("confidence_first_last")
            conf = f"{c[0]:.3f} -> {c[1]:.3f}" if c else "no confidence in training"
            rows.append(f"| {m} | {s} | {_num(coverage)} | {_num(confidence)} | {first} | {last} | {conf} |")
    return rows


def _num(v: float | None) -> str:
    return "nan" if v is None or not math.isfinite(v) else f"{v:.3f}"


def gather(out: Path, task: str, baseline: str, methods: list[str]) -> dict:
    """Everything the tables need from a ``reflectrl llm compare`` folder, per seed; verdicts come after."""
    base = load(out, task, baseline)
    runs_of = {m: load(out, task, m) for m in methods}
    present = lambda k: any(isinstance(e.get(k), (int, float)) for r in (base, *runs_of.values()) for e in r.values())
    task_keys = tuple(k for k in TASK_HIGHER + TASK_LOWER if present(k))
    neutral = tuple(k for k in NEUTRAL if present(k))
    all_runs = {baseline: base, **runs_of}
    return {"task": task, "baseline": baseline, "out": str(out), "seeds_baseline": sorted(base),
            "keys": list(HIGHER + LOWER + task_keys), "neutral": list(neutral),
            "self_knowledge": {m: {name: {"per_seed": v} for name, v in self_knowledge_values(r).items()}
                               for m, r in all_runs.items()},
            "methods": {m: {"seeds": sorted(set(r) & set(base)),
                            "metrics": {k: compare(r, base, k) for k in HIGHER + LOWER + task_keys + neutral}}
                        for m, r in runs_of.items()},
            "warmups": warmups(out, task),
            "reflection_dynamics": {m: {str(s): v for s, v in reflection_dynamics(out, task, m).items()}
                                    for m in all_runs},
            "heldout_reports": {m: {str(s): [value(e, "coverage"), value(e, "mean_confidence")] for s, e in r.items()}
                                for m, r in all_runs.items()}}


def family_note(result: dict) -> str:
    """Which variants of the same question share the family (variants.json), or that the variant was chosen on
    validation problems."""
    if result.get("chosen_on_validation"):
        return (f", this table's runs alone: its variant was chosen on validation problems (question "
                f"{result['question']} of variants.json)")
    if result.get("family_with"):
        return (", with every variant tried on the same held-out problems (question "
                f"{result['question']} of variants.json: {', '.join(result['family_with'])})")
    return ""


def render(result: dict) -> str:
    """The markdown tables of a decided ``result`` (nothing read but the result)."""
    methods, baseline = list(result["methods"]), result["baseline"]
    keys, neutral = tuple(result["keys"]), tuple(result["neutral"])
    rows = ["| metric (held-out) | better | " + " | ".join(
        f"{m} / {baseline}, P({m} better) [95% CI]; verdict" for m in methods) + " |",
        "|---|---|" + "---|" * len(methods)]
    for k in keys:
        cells = []
        for m in methods:
            c, v = result["methods"][m]["metrics"][k], result["methods"][m]["verdicts"].get(k, "n/a")
            cells.append(f"{fmt(c)}: {'not lower (2 points)? ' if k == 'accuracy' else ''}{v}")
        rows.append(f"| {k} | {'higher' if k in UP else 'lower'} | " + " | ".join(cells) + " |")
    rows[:0] = warmup_rows({int(s): w for s, w in result["warmups"].items()})
    rows.insert(0, f"Seeds paired with {baseline}: " + ", ".join(
        f"{m} {len(result['methods'][m]['seeds'])}" for m in methods) + ". Verdicts of the two method tables: Holm "
        f"over the {result['family_hypotheses']} hypotheses of this task's family (every method's directed metrics "
        "against the baseline and accuracy's non-inferiority, as `reflectrl llm compare` decides them; NI p: the "
        "adjusted p of non-inferiority)" + family_note(result) + "; the self-knowledge table: Holm over its own checks.\n")
    names = ["auroc", "reflection_minus_best_constant"]
    head = ("| method | mean AUROC [95% t CI], Holm p (> 0.5?) | reflection acc. - best constant [95% t CI], Holm p "
            "(> 0?) |")
    if any("step_auroc" in s for s in result["self_knowledge"].values()):
        names.append("step_auroc")
        head += " mean per-step AUROC [95% t CI], Holm p (> 0.5?) |"
    sk = ["", head, "|---|" + "---|" * len(names)]
    for m, checks in result["self_knowledge"].items():
        cells = []
        for name in names:
            e = checks.get(name, {"verdict": "n/a"})
            if "p_holm" in e:
                ci = f" [{e['ci'][0]:.3f}, {e['ci'][1]:.3f}]" if math.isfinite(e["ci"][0]) else ""
                cells.append(f"{e['mean']:.3f}{ci}, p = {e['p_holm']:.3g}: {e['verdict']}")
            else:
                cells.append(e.get("verdict", "n/a"))
        sk.append(f"| {m} | " + " | ".join(cells) + " |")
    paired = paired_rows(result, methods, PAIRED_KEYS + tuple(k for k in keys if k in TASK_HIGHER + TASK_LOWER) + neutral)
    return "\n".join(rows + paired + sk + dynamics_rows(result))


RULE = ("paired by seed: exact sign-flip test, Student's t 95% interval; one family per task's runs: Holm at 0.05 over "
        "every method's directed metrics and accuracy's one-sided t test of non-inferiority (2-point margin, 'not "
        "lower'); otherwise 'inconclusive (n seeds)'; self-knowledge: a family of its own")


def migrate(old: dict, md: Path | None) -> dict:
    """A result file written before the one verdict rule, in today's layout: the per-seed self-knowledge values
    from its metrics' per-seed pairs (reflection minus best constant = reflection accuracy - max(acc, 1 - acc), with
    the accuracy of all answers: it differs from the run's own best constant, over the answers that got a
    reflection, where some reflections were missing; ``migrated`` says so in the result),
    and the held-out flagged-solved shares and confidences from the dynamics table of its markdown ``md``."""
    res = dict(old)
    methods = old["methods"]
    if "keys" not in res:
        first = next(iter(methods.values()))["metrics"]
        res["keys"] = [k for k in first if k not in NEUTRAL]
        res["neutral"] = [k for k in first if k in NEUTRAL]
    kept = all("per_seed" in c for r in methods.values() for c in r["metrics"].values() if c.get("n", 0))
    if not kept:
        res["self_knowledge"] = {m: {name: {"n": e.get("n", 0)} for name, e in checks.items()}
                                 for m, checks in old["self_knowledge"].items()}
        res["migrated"] = "per-seed values not kept by the script that wrote this file: no verdict can be decided"
    elif not all("per_seed" in e for s in old["self_knowledge"].values() for e in s.values()):
        def side(m: str, i: int, key: str) -> dict[str, float]:
            mets = [methods[m]["metrics"]] if i == 0 else [r["metrics"] for r in methods.values()]
            return {s: v[i] for ms in mets for s, v in ms.get(key, {}).get("per_seed", {}).items()}
        sk = {}
        for m in old["self_knowledge"]:
            i, src = (1, next(iter(methods))) if m == old["baseline"] else (0, m)
            acc, refl, au = side(src, i, "accuracy"), side(src, i, "reflection_accuracy"), side(src, i, "auroc")
            checks = {"auroc": {"per_seed": au},
                      "reflection_minus_best_constant": {"per_seed": {s: refl[s] - max(acc[s], 1 - acc[s])
                                                                      for s in refl if s in acc}}}
            if "step_auroc" in old["self_knowledge"][m]:
                checks["step_auroc"] = {"per_seed": side(src, i, "step_auroc")}
            sk[m] = checks
        res["self_knowledge"] = sk
        res["migrated"] = ("self-knowledge per seed rebuilt from the metrics' per-seed values (best constant from "
                           "the accuracy of all answers, not only those with a reflection)")
    if "heldout_reports" not in res:
        reports: dict[str, dict[str, list]] = {}
        lines = md.read_text().splitlines() if md is not None and md.exists() else []
        for line in lines:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 7 and cells[1].isdigit() and (cells[0] == old["baseline"] or cells[0] in methods):
                reports.setdefault(cells[0], {})[cells[1]] = [float(cells[2]), float(cells[3])]
        res["heldout_reports"] = reports
    res["reflection_dynamics"] = {m: {str(s): v for s, v in d.items()} for m, d in old["reflection_dynamics"].items()}
    res["warmups"] = {str(s): w for s, w in old.get("warmups", {}).items()}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="a `reflectrl llm compare --out` folder")
    ap.add_argument("--task")
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--methods", nargs="+")
    ap.add_argument("--min-seeds", type=int, default=3)
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--md-out", type=Path, default=None)
    ap.add_argument("--rerender", type=Path, default=None, metavar="JSON",
                    help="instead of reading runs: decide and render a --json-out file written before, from its "
                         "per-seed values (a file from before the one verdict rule is first brought to today's "
                         "layout, reading its held-out report shares from --md-out)")
    a = ap.parse_args()
    if a.rerender is not None:
        result = migrate(json.loads(a.rerender.read_text()), a.md_out)
        result["claims_file"] = a.rerender.name
    else:
        if a.out is None or a.task is None or not a.methods:
            ap.error("--out, --task and --methods are needed (or --rerender)")
        result = gather(a.out, a.task, a.baseline, a.methods)
        result["claims_file"] = a.json_out.name if a.json_out else None
    text = render(decide_result(result, a.min_seeds))
    print(text)
    if a.md_out:
        a.md_out.write_text(text + "\n")
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
