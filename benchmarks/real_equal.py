"""Self-report methods against GRPO on the real model at equal work: the same updates, the same prompts per update,
the same starting model, CPU time reported beside the result, never the budget that decides it.

    python benchmarks/real_equal.py run --arms grpo rlcr-inline rlcr-inline-batch-rank --seeds 1 2 3 --updates 30 \\
        --split validation --jobs 2                      # train every arm and seed (resumes), evaluate on validation
    python benchmarks/real_equal.py run --arms grpo rlcr-inline --seeds 1 2 3 --updates 30 --split heldout
    python benchmarks/real_equal.py --render real_equal.json

Every arm trains SmolLM2-135M-Instruct with LoRA 16 on two-digit addition (arith, ``ops=+``), 8 prompts x 8 per
update, at one thread (the CPU-hour settings of ``benchmarks/real_model.py learn``), from the base model (``--start
base``) or from a given model folder (``--start PATH``, the late start). Each trained model, and the start, is then
evaluated greedily on the split's first ``--limit`` problems with the inline report (the confidence completed in
the answer's own message, ``--self-report inline``): accuracy, the confidence's AUROC (DeLong interval over
problems) and ECE (bootstrap interval over problems), and selective accuracy. A variant is chosen on validation
problems; held-out problems are evaluated once, for the chosen variant and GRPO. Across seeds each arm is compared
with GRPO by the one rule (``reflectrl.eval.stats``: paired by seed, Holm over the setting's one family: every arm's
accuracy, AUROC and ECE, and accuracy's non-inferiority). Results accumulate in
``benchmarks/results/real_equal.json``, keyed by start, updates, arm, seed and split.
"""

from __future__ import annotations

import argparse
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from real_model import last_json
from real_model import reflectrl as run_cli
from resultio import results_file

from reflectrl.tasks.selfreport import INLINE_REPORT_TOKENS

MODEL = "smollm2-135m-instruct"
TASK = ("--task", "arith", "--set", "ops=+")
TRAIN = ("--lora-r", "16", "--prompts-per-update", "8", "--grad-accum", "4", "--threads", "1", "--no-progress",
         "--eval-interval", "0", "--sample-interval", "10", "--no-tensorboard", "--attention", "shared-prompt")
ARMS: dict[str, tuple[str, ...]] = {
    "grpo": ("--algo", "grpo"),
    # the paper's form and reward: the confidence in the answer's own message, R = acc - (q - acc)^2
    "rlcr-inline": ("--algo", "rlcr", "--self-report", "inline"),
    # reflectrl's batch rank reward on the report's own tokens (split credit), in the same form
    "rlcr-inline-batch-rank": ("--algo", "rlcr", "--self-report", "inline", "--rlcr-credit", "split",
                               "--rlcr-calibration", "batch-rank"),
    # the class-balanced rank reward, and the batch rank reward at half the report's weight
    "rlcr-inline-rank-balanced": ("--algo", "rlcr", "--self-report", "inline", "--rlcr-credit", "split",
                                  "--rlcr-calibration", "rank-balanced"),
    "rlcr-inline-batch-rank-w0.5": ("--algo", "rlcr", "--self-report", "inline", "--rlcr-credit", "split",
                                    "--rlcr-calibration", "batch-rank", "--rlcr-report-weight", "0.5"),
    # refgrpo's reflection in the answer's own message
    "refgrpo-inline": ("--algo", "refgrpo", "--self-report", "inline-reflect"),
}
RESULTS = "real_equal.json"
FORM = INLINE_REPORT_TOKENS
"""The inline report's token budget the results were taken with (recorded as ``report_tokens``; results without
it were taken while a report ran on to its closing tag, within the answer's 24-token budget)."""
METRICS = ("accuracy", "auroc", "ece", "brier", "mean_confidence", "confidence_missing_rate")
_lock = threading.Lock()


def reflectrl(args: list[str], log: Path) -> dict[str, Any]:
    """``reflectrl ARGS`` at one thread (``real_model.reflectrl``: echoed, stderr kept in ``log``); its last stdout
    line as JSON."""
    return last_json(run_cli(args, log))


def load() -> dict[str, Any]:
    path = results_file(RESULTS)
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}}


def save(key: str, value: dict[str, Any]) -> None:
    """Add one result, under a lock that other processes of this script respect too (runs of several starts may
    go on at once), written whole to a temporary file and renamed."""
    import fcntl
    import os

    path = results_file(RESULTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock, open(path.with_suffix(".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        data = load()
        data["runs"][key] = value
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)


def evaluation(model: str, split: str, limit: int, log: Path) -> dict[str, Any]:
    args = ["llm", "eval", model, *TASK, "--split", split, "--limit", str(limit), "--self-report", "inline", "--json",
            "--no-progress"]
    res = reflectrl(args, log)
    keep = {k: v for k, v in res.items() if k in METRICS or k.endswith("_ci") or k.startswith("selective_accuracy")}
    return {**keep, "n": res.get("n"), "reports": res.get("reports"), "command": "reflectrl " + " ".join(args)}


def start_of(a: argparse.Namespace, seed: int) -> str:
    """The model a seed's arms start from: ``base``, or ``--start`` with ``{seed}`` filled in (each seed's own), as
    given (a path relative to where the script runs stays relative in the recorded commands)."""
    return "base" if a.start == "base" else a.start.format(seed=seed)


def one(a: argparse.Namespace, arm: str, seed: int) -> None:
    start = start_of(a, seed)
    key = f"r{FORM}|{a.start}|{a.updates}|{arm}|{seed}|{a.split}"
    if key in load()["runs"]:
        return
    name = "base" if a.start == "base" else ("late" if "{seed}" in a.start else Path(a.start).name)
    run = Path(a.out) / f"{name}_u{a.updates}_r{FORM}" / f"{arm}_s{seed}"
    log = Path(a.out) / "logs" / f"{run.parent.name}_{arm}_s{seed}.log"
    train_file = run / "train_summary.json"
    if train_file.is_file():
        summary = json.loads(train_file.read_text())
    else:
        if (run / "checkpoint.safetensors").is_file():
            summary = reflectrl(["llm", "train", "--resume", str(run), "--updates", str(a.updates), "--no-progress"], log)
        else:
            summary = reflectrl(["llm", "train", *ARMS[arm], *TASK, "--model", MODEL if start == "base" else start,
                                 *TRAIN, "--updates", str(a.updates), "--seed", str(seed), "--run-dir", str(run)], log)
        train_file.write_text(json.dumps(summary) + "\n")
    res = evaluation(str(run), a.split, a.limit, log)
    save(key, {"start": a.start, "updates": a.updates, "arm": arm, "seed": seed, "split": a.split,
               "report_tokens": FORM, "cpu_s": summary.get("cpu_s"),
               "cpu_s_per_update": cpu_per_update(run, summary),
               "train_command": "reflectrl llm train " + " ".join([*ARMS[arm], *TASK, *TRAIN]), **res})


def cpu_per_update(run: Path, summary: dict[str, Any]) -> float:
    """The mean process CPU seconds of the run's updates (``time/cpu_iteration``; older runs: the summary's CPU
    seconds over its updates, set-up included)."""
    from reflectrl.runlog import read_metrics

    cpu = [float(r["time/cpu_iteration"]) for r in read_metrics(run / "metrics.jsonl") if "time/cpu_iteration" in r]
    return sum(cpu) / len(cpu) if cpu else summary["cpu_s"] / max(1, summary["updates"])


def base_eval(a: argparse.Namespace, seed: int = 0) -> None:
    """The start's own evaluation (each seed's where ``--start`` names each seed's model)."""
    key = f"r{FORM}|{a.start}|0|start|{seed}|{a.split}"
    if key not in load()["runs"]:
        model = MODEL if a.start == "base" else start_of(a, seed)
        save(key, {"start": a.start, "updates": 0, "arm": "start", "seed": seed, "split": a.split, "report_tokens": FORM,
                   **evaluation(model, a.split, a.limit, Path(a.out) / "logs" / f"start_s{seed}.log")})


def run(a: argparse.Namespace) -> None:
    jobs = [(arm, s) for s in a.seeds for arm in a.arms]
    with ThreadPoolExecutor(a.jobs) as pool:
        starts = [0] if "{seed}" not in a.start else a.seeds
        futures = [pool.submit(base_eval, a, s) for s in starts] + [pool.submit(one, a, arm, s) for arm, s in jobs]
        for f in futures:
            f.result()
    print(render([RESULTS]))


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over the rows that have it (None where none has)."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _f(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _per_seed(rows: list[dict[str, Any]], key: str) -> str:
    """Each seed's ``key`` with its interval over problems (``key_ci``) where it has one."""
    cells = []
    for r in sorted(rows, key=lambda r: r["seed"]):
        ci = r.get(f"{key}_ci")
        cells.append(f"s{r['seed']} {_f(r.get(key), 2)}" + (f" [{_f(ci[0], 2)}, {_f(ci[1], 2)}]" if ci else ""))
    return "; ".join(cells)


def settings_of(runs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The (report tokens, start, updates, split) settings of the trained arms' results."""
    return sorted({(r.get("report_tokens", 0), r["start"], r["updates"], r["split"]) for r in runs
                   if r["arm"] != "start"})


def setting_rows(runs: list[dict[str, Any]], setting: tuple[Any, ...]) -> tuple[list[dict], list[dict]]:
    """The trained arms' results of ``setting``, and its start's evaluations."""
    form, start, updates, split = setting
    rows = [r for r in runs if (r.get("report_tokens", 0), r["start"], r["updates"], r["split"]) == setting]
    base = [r for r in runs if r["arm"] == "start" and (r.get("report_tokens", 0), r["start"], r["split"]) ==
            (form, start, split)]
    return rows, base


def render(files: list[str]) -> str:
    from reflectrl.eval.stats import claim_text

    out: list[str] = []
    for f in files:
        runs = list(json.loads(results_file(f).read_text())["runs"].values())
        for setting in settings_of(runs):
            form, start, updates, split = setting
            rows, base = setting_rows(runs, setting)
            arms = sorted({r["arm"] for r in rows}, key=lambda x: (x != "grpo", x))
            n = max(r.get("n") or 0 for r in rows)
            where = "the base model" if start == "base" else f"each seed's model `{start}`"
            report = (f"the report cut after {form} tokens" if form else
                      "the report run on to its closing tag (before the report's own budget)")
            out += [f"Start: {where}; {updates} updates of 8 prompts x 8 per arm; {split} problems (the first {n}), "
                    f"greedy, the confidence completed inline, {report}.", "",
                    "| arm | seeds | accuracy | AUROC, per seed [95% interval over problems] | ECE, per seed | "
                    "mean confidence | reports parsed | selective accuracy at 50% / 80% coverage | CPU s per update |",
                    "|---|---|---|---|---|---|---|---|---|"]
            for arm, mine in [("start (no training)", base)] + [(x, [r for r in rows if r["arm"] == x]) for x in arms]:
                if not mine:
                    continue
                mean = lambda k, mine=mine: _mean(mine, k)  # noqa: E731
                cpu = _f(mean("cpu_s_per_update"), 1) if arm in arms else "-"
                out.append(f"| {arm} | {len(mine)} | {_f(mean('accuracy'))} | {_f(mean('auroc'))} "
                           f"({_per_seed(mine, 'auroc')}) | {_f(mean('ece'))} ({_per_seed(mine, 'ece')}) | "
                           f"{_f(mean('mean_confidence'))} | {_f(1 - (mean('confidence_missing_rate') or 0), 2)} | "
                           f"{_f(mean('selective_accuracy@0.5'))} / {_f(mean('selective_accuracy@0.8'))} | {cpu} |")
            if split == "heldout":
                out += ["", reliability(rows, arms), "", "Held-out problems, evaluated once, for the variant chosen on "
                        "validation problems and GRPO (every variant tried and its split: benchmarks/results/variants.json"
                        "); the verdicts below are this setting's family alone."]
            elif len({r["seed"] for r in rows}) < 3:
                out += ["", "One or two seeds: a diagnostic; no variant is chosen from this table."]
            elif len(arms) > 1:
                pick = chosen(rows)
                out += ["", f"Chosen by the rule stated before the held-out run (the highest mean AUROC among the "
                            f"variants whose mean accuracy is within {ACCURACY_MARGIN[start_kind(rows)] * 100:.0f} "
                            f"points of GRPO's): {pick or 'none'}."]
            out.append("")
            for metric, claims in setting_claims(rows).items():
                for arm, c in claims.items():
                    margin = f" (margin {c['margin']:g})" if c.get("margin") else ""
                    out.append(f"- {arm} against grpo, {metric}{margin}: "
                               f"{claim_text(c, lower_is_better=metric == 'ece') if 'p_holm' in c else c['verdict']}")
            out.append("")
    return "\n".join(out).rstrip()


def reliability(rows: list[dict[str, Any]], arms: list[str], bins: int = 5) -> str:
    """Each arm's reliability diagram as a table, seeds pooled: per confidence bin, the answers in it and their
    accuracy (a calibrated arm's accuracy is near the bin's confidence)."""
    import numpy as np

    from reflectrl.eval.calibration import reliability_bins

    edges = [f"{i / bins:.1f}-{(i + 1) / bins:.1f}" for i in range(bins)]
    out = ["Reliability, seeds pooled (per confidence bin: accuracy of its answers, and how many):", "",
           "| arm | " + " | ".join(edges) + " |", "|---|" + "---|" * bins]
    for arm in arms:
        q, y = [], []
        for r in rows:
            rep = r.get("reports") or {}
            if r["arm"] == arm and "confidence" in rep:
                pairs = [(c, ok) for c, ok in zip(rep["confidence"], rep["correct"]) if c is not None]
                q += [c for c, _ in pairs]
                y += [float(ok) for _, ok in pairs]
        if not q:
            continue
        b = reliability_bins(np.array(q), np.array(y), bins)
        cells = [f"{a:.2f} ({int(n)})" if n else "- (0)" for a, n in zip(b["accuracy"], b["count"])]
        out.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(out)


ACCURACY_MARGIN = {"base": 0.03, "late": 0.02}
"""How far below GRPO's accuracy a method may be and still read "not lower" (the issue's bars: 3 points from the
base model, 2 from the late start)."""


def start_kind(rows: list[dict[str, Any]]) -> str:
    """``base`` or ``late``: where a setting's arms started."""
    return "base" if all(r["start"] == "base" for r in rows) else "late"


def chosen(rows: list[dict[str, Any]]) -> str | None:
    """The variant a validation setting chooses: the highest mean AUROC among the arms (GRPO aside) whose mean
    accuracy is at most the start's margin below GRPO's; None when none is."""
    grpo = _mean([r for r in rows if r["arm"] == "grpo"], "accuracy")
    if grpo is None:
        return None
    margin = ACCURACY_MARGIN[start_kind(rows)]
    ok = []
    for arm in sorted({r["arm"] for r in rows} - {"grpo", "start"}):
        mine = [r for r in rows if r["arm"] == arm]
        acc, auroc = _mean(mine, "accuracy"), _mean(mine, "auroc")
        if acc is not None and auroc is not None and acc >= grpo - margin:
            ok.append((auroc, arm))
    return max(ok)[1] if ok else None


def setting_claims(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict]]:
    """Every arm of one setting (start, updates, split) against GRPO by the one rule, paired by seed, as one family
    (the setting's set of runs): accuracy (with the start's non-inferiority margin), AUROC and ECE, Holm over all."""
    from reflectrl.eval.stats import family_against_baseline

    rows = [r for r in rows if r["arm"] != "start"]
    arms = sorted({r["arm"] for r in rows}, key=lambda x: (x != "grpo", x))
    margin = ACCURACY_MARGIN[start_kind(rows)]
    values = {metric: {arm: {r["seed"]: (r.get(metric) if r.get(metric) is not None else float("nan"))
                             for r in rows if r["arm"] == arm} for arm in arms} for metric in ("accuracy", "auroc", "ece")}
    decided = family_against_baseline(values, "grpo", {"accuracy": margin}, lower_is_better=("ece",))
    return {metric: {arm: {**c, "margin": margin if metric == "accuracy" else None} for arm, c in by.items()}
            for metric, by in decided.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs="?", choices=("run",))
    ap.add_argument("--arms", nargs="+", default=["grpo", "rlcr-inline"], choices=sorted(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--updates", type=int, default=30, help="updates of every arm (equal work)")
    ap.add_argument("--start", default="base",
                    help="base, or a model folder every arm starts from (late start; {seed} in it: each seed's own)")
    ap.add_argument("--split", default="validation", choices=("validation", "heldout"))
    ap.add_argument("--limit", type=int, default=200, help="problems evaluated")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each at one thread)")
    ap.add_argument("--out", default="runs/real_equal", help="run folders and logs")
    ap.add_argument("--render", nargs="+", metavar="JSON", help="print the tables of these results files")
    a = ap.parse_args()
    if a.render:
        print(render(a.render))
    elif a.command == "run":
        run(a)
    else:
        ap.error("give run, or --render")


if __name__ == "__main__":
    main()
