"""Does a trained model's hidden state know whether its answer is right, where its stated report does not say so?

    python benchmarks/selfreport_probe.py --out runs/cmp_llm/arith13 --task arith --methods grpo rlcr-rank \
        refgrpo-balanced --json-out benchmarks/results/selfreport_probe_arith17.json
    python benchmarks/selfreport_probe.py --render selfreport_probe_arith17.json

For every finished run of ``reflectrl llm compare`` (``OUT/runs/TASK/METHOD/seed_S/model``):

* **the probe**: greedy answers to the first ``--train-problems`` train problems and to every validation problem
  (no self-report question asked); the policy's last hidden state at each answer's last token is the feature. A
  logistic regression (standardized features, L2 ``--l2``, fit by L-BFGS) is fit on the train answers' correctness
  and scored on the validation answers: its AUROC says how well the model's own state separates its right answers
  from its wrong ones.
* **the stated reports** on the same validation problems, asked after each answer (``confidence`` and
  ``reflect``): the AUROC of the stated confidence, and reflection accuracy minus the best constant reflection.

Validation problems only: held-out problems give the comparison's final numbers (BENCHMARKS.md). Per method, each
check against its reference (AUROC 0.5, the best constant 0) by the one rule of ``reflectrl.eval.stats`` (exact
sign-flip test per seed, t interval, Holm over the table), and the probe against the stated confidence, paired
by seed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import resultio
import torch

from reflectrl.eval.calibration import auroc
from reflectrl.eval.stats import compare_samples, decide

CHECKS = {"probe_auroc": 0.5, "stated_auroc": 0.5, "reflection_minus_best_constant": 0.0}


def features(policy: Any, task: Any, split: str, limit: int | None, seed: int, new_tokens: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """Greedy answers to ``split``'s problems: each answer's last hidden state ``[N, H]`` and its correctness."""
    from reflectrl.llm.engines import make_engine
    from reflectrl.llm.rollout import Rollout

    problems = list(task.problems(split))[:limit]
    ro = Rollout(policy, make_engine("torch", policy, 1.0), task, new_tokens, 1, None, 128, reward_workers=0)
    gen = torch.Generator().manual_seed(seed)
    feats, ok = [], []
    for s in range(0, len(problems), 256):
        batch, _ = ro.run(problems[s:s + 256], 1, gen, greedy=True)
        with torch.no_grad():
            hidden = policy.forward_batch(batch, with_hidden=True).hidden
        last = batch.last_completion_index().clamp_min(0)
        feats.append(hidden[torch.arange(batch.rows), last].float().cpu().numpy())
        ok.append(batch.correct.numpy().astype(float))
    return np.concatenate(feats), np.concatenate(ok)


def probe_auroc(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, l2: float) -> float:
    """AUROC on the validation answers of a logistic regression fit on the train answers."""
    if len(set(y_train.tolist())) < 2 or len(set(y_val.tolist())) < 2:
        return math.nan
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-6
    xt, xv = torch.tensor((x_train - mu) / sd), torch.tensor((x_val - mu) / sd)
    yt = torch.tensor(y_train)
    w = torch.zeros(xt.shape[1], dtype=xt.dtype, requires_grad=True)
    b = torch.zeros((), dtype=xt.dtype, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(xt @ w + b, yt) + l2 * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(auroc((xv @ w + b).sigmoid().numpy(), y_val))


def stated(policy: Any, task: Any, limit: int | None, seed: int, new_tokens: int) -> dict[str, float]:
    """The stated reports' AUROC and reflection accuracy minus the best constant, on the validation problems."""
    from reflectrl.llm.evaluate import evaluate_policy

    e = evaluate_policy(policy, task, "validation", limit=limit, seed=seed, self_report="both",
                        max_new_tokens=new_tokens)
    au = e.get("auroc")
    refl, best = e.get("reflection_accuracy"), e.get("best_constant")
    return {"stated_auroc": math.nan if au is None else float(au),
            "reflection_minus_best_constant": math.nan if refl is None or best is None else float(refl) - float(best),
            "validation_accuracy": float(e["accuracy"])}


def measure_run(run: Path, train_problems: int, val_limit: int | None, l2: float) -> dict[str, float]:
    from reflectrl.llm.policy import load_policy
    from reflectrl.tasks.base import get_task, parse_options
    from reflectrl.trainer import read_config_json

    cfg = read_config_json(run)
    task = get_task(cfg["task"], **parse_options(cfg.get("task_options") or []))
    policy = load_policy(str(run / "model"))
    policy.eval()
    torch.manual_seed(0)
    n = int(cfg["max_new_tokens"])  # the run's answer budget
    xt, yt = features(policy, task, "train", train_problems, 0, n)
    xv, yv = features(policy, task, "validation", val_limit, 0, n)
    out = {"probe_auroc": probe_auroc(xt, yt, xv, yv, l2), "probe_train_accuracy": float(yt.mean())}
    return {**out, **stated(policy, task, val_limit, 0, n)}


def decide_all(per_method: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Per method: each check against its reference, and the probe against the stated confidence (paired by seed);
    Holm over all of them."""
    cells, out = [], {}
    for m, runs in per_method.items():
        out[m] = {}
        for k, ref in CHECKS.items():
            vals = np.array([r[k] for r in runs.values() if math.isfinite(r.get(k, math.nan))])
            if len(vals):
                cells.append((m, k, compare_samples(vals, np.full_like(vals, ref), paired=True)))
        pairs = np.array([(r["probe_auroc"], r["stated_auroc"]) for r in runs.values()
                          if math.isfinite(r["probe_auroc"]) and math.isfinite(r["stated_auroc"])])
        if len(pairs):
            cells.append((m, "probe_minus_stated", compare_samples(pairs[:, 0], pairs[:, 1], paired=True)))
    for (m, k, _), c in zip(cells, decide([c for *_, c in cells])):
        out[m][k] = c
    return out


def cell(claim: dict | None, ref: float) -> str:
    """A check's mean (its reference added back) with its t interval, Holm p and verdict."""
    if claim is None:
        return "n/a"
    lo, hi = claim["ci"]
    return f"{claim['effect'] + ref:.3f} [{lo + ref:.3f}, {hi + ref:.3f}], p = {claim['p_holm']:.3g}: {claim['verdict']}"


def render_one(data: dict) -> str:
    cols = {**CHECKS, "probe_minus_stated": 0.0}
    head = {"probe_auroc": "probe AUROC (> 0.5?)", "stated_auroc": "stated-confidence AUROC (> 0.5?)",
            "reflection_minus_best_constant": "reflection acc. - best constant (> 0?)",
            "probe_minus_stated": "probe - stated AUROC, paired (> 0?)"}
    lines = ["| method | seeds | validation accuracy | " + " | ".join(head[c] for c in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for m, runs in data["runs"].items():
        acc = np.mean([r["validation_accuracy"] for r in runs.values()])
        cells = [cell(data["claims"][m].get(c), ref) for c, ref in cols.items()]
        lines.append(f"| {m} | {len(runs)} | {acc:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + (f"\n\nMean over seeds [95% t CI], Holm p over the table (exact sign-flip tests per seed); "
                               f"probe fit on {data['train_problems']} train answers, L2 {data['l2']:g}.")


CHOICE_KEYS = ("validation_accuracy", "stated_auroc", "reflection_minus_best_constant")


def decide_choices(runs: dict[str, dict[str, dict[str, float]]], pairs: list[str]) -> dict[str, dict[str, dict]]:
    """Per ``PLAIN:NEW`` pair of methods, the paired difference NEW - PLAIN on the validation problems of each
    :data:`CHOICE_KEYS` (higher is better), by the one rule, Holm over the pairs' claims."""
    cells = []
    for pair in pairs:
        plain, new = pair.split(":")
        for k in CHOICE_KEYS:
            both = [(runs[new][s][k], runs[plain][s][k]) for s in runs[new] if s in runs[plain]
                    and math.isfinite(runs[new][s].get(k, math.nan)) and math.isfinite(runs[plain][s].get(k, math.nan))]
            if both:
                x = np.array(both)
                cells.append((pair, k, compare_samples(x[:, 0], x[:, 1], paired=True,
                                                       margin=0.02 if k == "validation_accuracy" else None)))
    out: dict[str, dict[str, dict]] = {}
    for (pair, k, _), c in zip(cells, decide([c for *_, c in cells])):
        out.setdefault(pair, {})[k] = c
    return out


PICK_SLACK = 0.01
"""--pick's accuracy slack: half the claims' 2-point non-inferiority margin."""


def pick(choices: dict[str, dict[str, dict]]) -> dict[str, str]:
    """Per plain method of the ``PLAIN:NEW`` pairs, the NEW chosen by the rule stated before the runs: the highest
    mean stated AUROC among the candidates whose mean validation accuracy, paired with PLAIN's, is at most
    :data:`PICK_SLACK` lower; where none is, the highest mean paired validation accuracy."""
    by_plain: dict[str, list[tuple[str, dict[str, dict]]]] = {}
    for pair, claims in choices.items():
        plain, new = pair.split(":")
        by_plain.setdefault(plain, []).append((new, claims))
    out = {}
    for plain, cands in by_plain.items():
        ok = [(c["stated_auroc"]["effect"], new) for new, c in cands if c["validation_accuracy"]["effect"] >= -PICK_SLACK]
        out[plain] = max(ok)[1] if ok else max((c["validation_accuracy"]["effect"], new) for new, c in cands)[1]
    return out


def render_choices(data: dict) -> str:
    if not data.get("choices"):
        return ""
    lines = ["| new - plain, paired by seed, validation problems | " + " | ".join(CHOICE_KEYS) + " |",
             "|---|" + "---|" * len(CHOICE_KEYS)]
    for pair, claims in data["choices"].items():
        plain, new = pair.split(":")
        lines.append(f"| {new} - {plain} | " + " | ".join(
            "n/a" if claims.get(k) is None else cell(claims[k], 0.0).replace("better", "higher").replace(
                "worse", "lower") for k in CHOICE_KEYS) + " |")
    picked = "".join(f" Picked against {plain} (the highest mean stated AUROC among the candidates whose mean "
                     f"validation accuracy is at most {PICK_SLACK:g} below {plain}'s, paired): **{new}**."
                     for plain, new in data.get("picked", {}).items())
    return "\n\n" + "\n".join(lines) + ("\n\nValidation accuracy: 'not lower' with a 2-point margin, as for held-out "
                                         "accuracy; Holm over this table." + picked)


def render(names: list[str]) -> str:
    return "\n\n".join(render_one(d) + render_choices(d)
                       for d in (json.loads(resultio.results_file(n).read_text()) for n in names))


def measure(a: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    done = {}
    if a.reuse:
        old = json.loads(resultio.results_file(a.reuse).read_text())
        if (old["train_problems"], old["l2"], old["task"]) != (a.train_problems, a.l2, a.task):
            raise SystemExit(f"{a.reuse} was measured with other settings (train problems, l2, task)")
        done = old["runs"]
    runs: dict[str, dict[str, dict[str, float]]] = {}
    for m in a.methods:
        runs[m] = {}
        for d in sorted((a.out / "runs" / a.task / m).glob("seed_*"), key=lambda p: int(p.name.split("_")[1])):
            seed = d.name.split("_")[1]
            if a.seeds and int(seed) not in a.seeds:
                continue
            if seed in done.get(m, {}):
                runs[m][seed] = done[m][seed]
            elif (d / "model" / "config.json").is_file():
                runs[m][seed] = r = measure_run(d, a.train_problems, a.val_limit, a.l2)
                print(m, d.name, {k: round(v, 3) for k, v in r.items()}, flush=True)
    choices = decide_choices(runs, a.choices)
    return {"benchmark": "selfreport_probe", "task": a.task, "out": str(a.out), "train_problems": a.train_problems,
            "l2": a.l2, "runs": runs, "claims": decide_all(runs), "choices": choices,
            **({"picked": pick(choices)} if a.pick else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="a `reflectrl llm compare` folder")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--methods", nargs="+", default=[])
    ap.add_argument("--train-problems", type=int, default=2000, help="train answers the probe is fit on")
    ap.add_argument("--val-limit", type=int, default=None, help="validation problems (default: all)")
    ap.add_argument("--l2", type=float, default=1e-3, help="the probe's L2 penalty per weight")
    ap.add_argument("--choices", nargs="*", default=[], metavar="PLAIN:NEW",
                    help="pairs of methods compared on the validation problems (the choice of a default)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[], help="only these seeds (default: every finished run)")
    ap.add_argument("--pick", action="store_true",
                    help="pick one NEW per PLAIN of --choices by the rule of pick() (validation problems only)")
    ap.add_argument("--reuse", default=None, metavar="JSON",
                    help="a result of this script whose runs are taken as measured (same settings), not measured again")
    resultio.main(ap, measure, render, needs="out")


if __name__ == "__main__":
    main()
