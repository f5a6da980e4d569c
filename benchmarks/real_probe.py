"""Does the real model's hidden state know whether its answer is right, where its stated confidence does not say so?

    python benchmarks/real_probe.py --runs 'runs/real_equal/late_u12_r3/*_s*' \\
        --json-out benchmarks/results/real_probe.json
    python benchmarks/real_probe.py --render real_probe.json

For each trained run of ``benchmarks/real_equal.py`` (SmolLM2-135M-Instruct, LoRA, two-digit sums):

* **the probe**: greedy answers (no report asked) to the first ``--train-problems`` train problems and to the first
  ``--limit`` validation problems; the last hidden state at each answer's last token is the feature, and a logistic
  regression fit on the train answers' correctness (``selfreport_probe.probe_auroc``) is scored on the validation
  answers. Its AUROC says whether the information is in the model at all.
* **the stated confidence** on the same validation problems, completed inline after each answer, and its AUROC
  within kinds of problem: with and without a carry from the units, and sums below 100 or not.

Validation problems only. Across runs of an arm, the probe's and the stated AUROC against 0.5 and the probe
against the stated, paired by run, by the one rule (``reflectrl.eval.stats``, Holm over the table).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import resultio
import torch
from selfreport_probe import features, probe_auroc

from reflectrl.eval.calibration import auroc
from reflectrl.eval.stats import compare_samples, decide

KINDS = {"carry": lambda a, b: (a % 10 + b % 10) >= 10, "no carry": lambda a, b: (a % 10 + b % 10) < 10,
         "sum >= 100": lambda a, b: a + b >= 100, "sum < 100": lambda a, b: a + b < 100}


def _auroc(conf: list[float], ok: list[float]) -> float:
    return float(auroc(np.array(conf), np.array(ok))) if len(set(ok)) == 2 else math.nan


def stated(policy: Any, task: Any, limit: int, new_tokens: int) -> dict[str, Any]:
    """The inline confidence's AUROC on the validation problems, overall and within each kind of problem."""
    from reflectrl.llm.evaluate import evaluate_policy

    e = evaluate_policy(policy, task, "validation", limit=limit, self_report="inline", max_new_tokens=new_tokens)
    problems = list(task.problems("validation"))[:limit]  # greedy: one report per problem, in the split's order
    reports = e["reports"]
    rows = [(float(q), float(ok), *p.meta["operands"])
            for q, ok, p in zip(reports["confidence"], reports["correct"], problems) if q is not None]
    out: dict[str, Any] = {"stated_auroc": _auroc([r[0] for r in rows], [r[1] for r in rows]),
                           "validation_accuracy": float(e["accuracy"]), "kinds": {}}
    for kind, test in KINDS.items():
        mine = [r for r in rows if test(r[2], r[3])]
        out["kinds"][kind] = {"n": len(mine), "accuracy": float(np.mean([r[1] for r in mine])) if mine else math.nan,
                              "stated_auroc": _auroc([r[0] for r in mine], [r[1] for r in mine])}
    return out


def measure_run(run: Path, train_problems: int, limit: int, l2: float) -> dict[str, Any]:
    from reflectrl.llm.evaluate import load_for_eval
    from reflectrl.tasks.base import get_task, parse_options

    policy, cfg = load_for_eval(run)
    policy.eval()
    task = get_task(cfg["task"], **parse_options(cfg.get("task_options") or []))
    torch.manual_seed(0)
    n = int(cfg["max_new_tokens"])
    xt, yt = features(policy, task, "train", train_problems, 0, n)
    xv, yv = features(policy, task, "validation", limit, 0, n)
    return {"probe_auroc": probe_auroc(xt, yt, xv, yv, l2), "probe_train_accuracy": float(yt.mean()),
            "arm": cfg["algo"] if cfg["algo"] == "grpo" else run.name.rsplit("_s", 1)[0],
            "seed": int(cfg["seed"]), **stated(policy, task, limit, n)}


def claims(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict]]:
    """Per arm: the probe's and the stated AUROC against 0.5, the probe against the stated (paired by run)."""
    cells = []
    for arm in sorted({r["arm"] for r in runs.values()}):
        mine = [r for r in runs.values() if r["arm"] == arm]
        for key in ("probe_auroc", "stated_auroc"):
            vals = np.array([r[key] for r in mine if math.isfinite(r[key])])
            if len(vals):
                cells.append((arm, key, compare_samples(vals, np.full_like(vals, 0.5), paired=True)))
        pairs = np.array([(r["probe_auroc"], r["stated_auroc"]) for r in mine
                          if math.isfinite(r["probe_auroc"]) and math.isfinite(r["stated_auroc"])])
        if len(pairs):
            cells.append((arm, "probe_minus_stated", compare_samples(pairs[:, 0], pairs[:, 1], paired=True)))
    out: dict[str, dict[str, dict]] = {}
    for (arm, key, _), c in zip(cells, decide([c for *_, c in cells])):
        out.setdefault(arm, {})[key] = c
    return out


def measure(a: argparse.Namespace) -> dict[str, Any]:
    """Probe every run the patterns match; runs already in ``--json-out`` (from an earlier call with the same
    settings) are kept, not probed again, and the claims are decided over all of them."""
    old = Path(a.json_out) if a.json_out else None
    runs = json.loads(old.read_text())["runs"] if old is not None and old.is_file() else {}
    for path in sorted(p for pattern in a.runs for p in glob.glob(pattern)):
        if path in runs:
            continue
        print(f"probing {path}", flush=True)
        runs[path] = measure_run(Path(path), a.train_problems, a.limit, a.l2)
    return {"benchmark": "real_probe", "runs": runs, "claims": claims(runs), "train_problems": a.train_problems,
            "limit": a.limit, "l2": a.l2,
            "command": f"python benchmarks/real_probe.py --runs {' '.join(repr(r) for r in a.runs)} "
                       f"--train-problems {a.train_problems} --limit {a.limit}"}


def _c(claim: dict | None) -> str:
    if claim is None:
        return "n/a"
    lo, hi = claim["ci"]
    return f"{claim['effect']:+.3f} [{lo:+.3f}, {hi:+.3f}]: {claim['verdict']}"


def render(files: list[str]) -> str:
    out = []
    for f in files:
        d = json.loads(resultio.results_file(f).read_text())
        out += [f"`{d['command']}`", "",
                "| run | validation accuracy | probe AUROC | stated AUROC | " +
                " | ".join(f"stated AUROC, {k} (n)" for k in KINDS) + " |", "|---|---|---|---|" + "---|" * len(KINDS)]
        for r in d["runs"].values():
            kinds = " | ".join(f"{r['kinds'][k]['stated_auroc']:.2f} ({r['kinds'][k]['n']})" for k in KINDS)
            out.append(f"| {r['arm']} s{r['seed']} | {r['validation_accuracy']:.3f} | {r['probe_auroc']:.3f} | "
                       f"{r['stated_auroc']:.3f} | {kinds} |")
        out += ["", "Across runs, by the one rule (mean minus 0.5, or probe minus stated, [95% t interval]: verdict):", ""]
        for arm, c in d["claims"].items():
            out.append(f"- {arm}: probe - 0.5 {_c(c.get('probe_auroc'))}; stated - 0.5 {_c(c.get('stated_auroc'))}; "
                       f"probe - stated {_c(c.get('probe_minus_stated'))}")
        out.append("")
    return "\n".join(out).rstrip()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", help="run folders (glob patterns) of benchmarks/real_equal.py")
    ap.add_argument("--train-problems", type=int, default=400)
    ap.add_argument("--limit", type=int, default=200, help="validation problems")
    ap.add_argument("--l2", type=float, default=1e-2)
    resultio.main(ap, measure, render, needs="runs")
