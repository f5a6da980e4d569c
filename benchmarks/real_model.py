"""A real pretrained model through the LLM front end, on the CPU: SmolLM2-135M-Instruct (``smollm2-135m-instruct``).

    python benchmarks/real_model.py calibration --task arith [--limit 200]
    python benchmarks/real_model.py learn --algo grpo --seed 1 [--cpu-seconds 3600]
    python benchmarks/real_model.py choices
    python benchmarks/real_model.py --render

``calibration``: the model as it ships, asked each held-out problem of a task through its chat template, then
asked after its answer for a reflection (yes or no) and a confidence in [0, 1]: accuracy, the share of reports
that parse, and their calibration (``reflectrl llm eval MODEL --task T --split heldout --self-report both``).

``learn``: ``reflectrl llm train --algo ALGO --lora-r 16`` on two-digit addition (``arith`` with ``ops=+``) until
the trainer has used ``--cpu-seconds`` of CPU time at one thread, then held-out accuracy and self-report
calibration on all 500 held-out problems, before (the base model, evaluated once and kept) and after. The
learning rate (1e-4), group size and temperature are the defaults that follow the model with LoRA
(docs/llm.md, "Defaults that fit the model"). Each command is printed before it runs; results go to
``benchmarks/results/real_*.json`` and ``--render`` prints the tables of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from reflectrl.eval.stats import difference_of_proportions_ci

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
TASKS = ("arith", "codegen", "humaneval", "text2sql", "rag")
LEARN_TASK = ("arith", ("ops=+",))  # two-digit addition: why, in BENCHMARKS.md (`choices`)
LEARN_FLAGS = ("--lora-r", "16", "--prompts-per-update", "8", "--grad-accum", "4", "--threads", "1", "--updates", "100000",
               "--no-progress", "--eval-interval", "0", "--sample-interval", "25")


def reflectrl(args: list[str], log: Path) -> str:
    """Run ``reflectrl ARGS`` at one thread; echo the command, keep stderr in ``log``, return stdout."""
    print("$ reflectrl " + " ".join(args), flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as err:
        proc = subprocess.run([sys.executable, "-m", "reflectrl.cli", *args], stdout=subprocess.PIPE, stderr=err,
                              text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): reflectrl {' '.join(args)}; see {log}")
    return proc.stdout


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def evaluation(model: str, task: str, options: tuple[str, ...], log: Path, limit: int | None = None) -> dict:
    args = ["llm", "eval", model, "--task", task, "--split", "heldout", "--self-report", "both", "--json"]
    args += [x for o in options for x in ("--set", o)] + (["--limit", str(limit)] if limit else [])
    res = last_json(reflectrl(args, log))
    res.pop("reports", None)
    res["command"] = "reflectrl " + " ".join(args)
    return res


def calibration(a: argparse.Namespace) -> None:
    res = evaluation(MODEL, a.task, (), Path("runs/real/logs") / f"real_calibration_{a.task}.log", a.limit)
    out = RESULTS / f"real_calibration_{a.task}.json"
    out.write_text(json.dumps({"benchmark": "real_calibration", "model": MODEL, **res}, indent=2) + "\n")
    print(json.dumps(res))


def choices(a: argparse.Namespace) -> None:
    """The measurements two choices rest on, on train problems only (held-out problems give final numbers): the base
    model's greedy accuracy per kind of two-digit problem (why learn on sums), and per sampling temperature the share
    of groups of 8 samples whose rewards differ (the default temperature of a pretrained model)."""
    import numpy as np
    import torch

    from reflectrl.llm.evaluate import evaluate_policy
    from reflectrl.llm.policy import load_policy
    from reflectrl.tasks.base import get_task, parse_options

    torch.set_num_threads(1)
    policy, task = load_policy(MODEL), get_task("arith")
    problems = task.problems("train")[:a.limit]
    res = evaluate_policy(policy, task, "train", max_new_tokens=24, limit=a.limit, per_problem=True)
    kinds: dict[str, list[float]] = {}
    for p, ok in zip(problems, res["per_problem"]):
        kind = "sum" if p.meta["ops"] == ["+"] else ("difference below 0" if p.meta["value"] < 0 else "difference")
        kinds.setdefault(kind, []).append(ok)
    per_kind = {k: {"n": len(v), "accuracy": float(np.mean(v))} for k, v in kinds.items()}
    temps, sums = {}, get_task(LEARN_TASK[0], **parse_options(LEARN_TASK[1]))  # the task the learn runs train on
    for t in a.temperatures:
        r = evaluate_policy(policy, sums, "train", samples=8, temperature=t, max_new_tokens=24, limit=a.groups,
                            per_problem=True)
        share = np.array(r["per_problem"])
        temps[str(t)] = {"pass@1": r["accuracy"], "groups_with_spread": float(np.mean((share > 0) & (share < 1)))}
        print(f"temperature {t}: {temps[str(t)]}", flush=True)
    out = {"benchmark": "real_choices", "model": MODEL, "train_problems": a.limit, "per_kind": per_kind,
           "groups": a.groups, "temperatures": temps}
    (RESULTS / "real_choices.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


def dynamics(metrics: Path) -> dict:
    """Updates, time shares and the learning signal over the run, from its metrics.jsonl."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    total = sum(r.get("time/iteration", 0.0) for r in recs) or 1.0
    mean = lambda key, rows: sum(r.get(key, 0.0) for r in rows) / max(1, len(rows))
    return {"updates": len(recs), "generate_share": sum(r.get("time/generate", 0.0) for r in recs) / total,
            "update_share": sum(r.get("time/update", 0.0) for r in recs) / total,
            "seconds_per_update": total / max(1, len(recs)),
            "zero_std_frac": mean("groups/zero_std_frac", recs),
            "train_accuracy_first10": mean("accuracy", recs[:10]), "train_accuracy_last10": mean("accuracy", recs[-10:]),
            "completion_tokens": sum(r.get("rollout/generated_tokens", 0) for r in recs)}


def learn(a: argparse.Namespace) -> None:
    task, options = LEARN_TASK
    label = a.label or a.algo
    out = Path(a.out or f"runs/real/{label}_s{a.seed}")
    base_file = RESULTS / f"real_base_{task}.json"
    if not base_file.is_file():  # the base model, greedy: the same for every seed and algo
        base = evaluation(MODEL, task, options, out.parent / "base.log")
        base_file.write_text(json.dumps({"benchmark": "real_base", "model": MODEL, **base}, indent=2) + "\n")
    before = json.loads(base_file.read_text())
    run, done = out / "run", out / "train.done"
    if not done.is_file():  # a finished training is kept (the evaluation may be run again)
        if run.exists():
            sys.exit(f"{run} holds an unfinished run: a budget in CPU seconds cannot be resumed to the same total; "
                     f"remove {out} and start again")
        args = ["llm", "train", "--algo", a.algo, "--task", task, "--model", MODEL, "--run-dir", str(run),
                "--seed", str(a.seed), "--cpu-time-limit-s", str(a.cpu_seconds), *LEARN_FLAGS, *shlex.split(a.flags),
                *[x for o in options for x in ("--set", o)]]
        reflectrl(args, out / "train.log")
        done.write_text("finished\n")
    config = json.loads((run / "config.json").read_text())
    after = evaluation(str(run), task, options, out / "eval.log")
    keys = ("accuracy", "ci", "reflection_accuracy", "reflection_missing_rate", "confidence_missing_rate", "ece",
            "brier", "auroc", "mean_confidence", "underconfidence", "overconfidence")
    result = {"benchmark": "real_learn", "model": MODEL, "algo": label, "train_algo": a.algo, "flags": a.flags,
              "seed": a.seed, "task": task,
              "task_options": list(options), "cpu_seconds_budget": a.cpu_seconds,
              "before": {k: before.get(k) for k in keys}, "after": {k: after.get(k) for k in keys},
              "n": after["n"], "eval_command": after["command"],
              "settings": {k: config[k] for k in ("learning_rate", "group_size", "prompts_per_update", "temperature",
                                                   "lora_r", "max_new_tokens", "self_report", "threads")},
              **dynamics(run / "metrics.jsonl")}
    (RESULTS / f"real_learn_{label}_s{a.seed}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


# ------------------------------------------------------------------------------------------------ rendering
def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def gain_interval(before: dict, after: dict) -> tuple[float, float]:
    """Newcombe's interval of the accuracy after - before, in points."""
    lo, hi = difference_of_proportions_ci(before["accuracy"], before["ci"], after["accuracy"], after["ci"])
    return 100 * lo, 100 * hi


def render_choices() -> None:
    path = RESULTS / "real_choices.json"
    if not path.is_file():
        print("(no real_choices result yet)")
        return
    r = json.loads(path.read_text())
    print(f"| first {r['train_problems']} train problems of arith (greedy) | problems | accuracy |\n|---|---|---|")
    for kind, v in r["per_kind"].items():
        print(f"| {kind} | {v['n']} | {100 * v['accuracy']:.1f}% |")
    print(f"\n| temperature | pass@1 (8 samples of {r['groups']} train sums) | groups whose rewards differ |\n"
          "|---|---|---|")
    for t, v in r["temperatures"].items():
        print(f"| {t} | {100 * v['pass@1']:.1f}% | {100 * v['groups_with_spread']:.1f}% |")
    print("\nCommand: `python benchmarks/real_model.py choices`")


def table(head: list[str], rows: list[str], commands: list[str], missing: str) -> None:
    """A markdown table with its commands below, or a line saying the result is not there yet."""
    if not rows:
        print(f"(no {missing} result yet)")
        return
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    print("\n".join(rows))
    print("\nCommands: " + "; ".join(f"`{c}`" for c in commands))


def calibration_row(r: dict) -> str:
    lo, hi = r["ci"]
    return (f"| {r['task']} | {r['n']} | {_pct(r['accuracy'])} [{_pct(lo)}, {_pct(hi)}] | "
            f"{_pct(1 - r['reflection_missing_rate'])}% | {_pct(1 - r['confidence_missing_rate'])}% | "
            f"{_num(r.get('reflection_accuracy'))} | {_num(r.get('ece'))} | {_num(r.get('brier'))} | "
            f"{_num(r.get('auroc'))} | {_num(r.get('mean_confidence'))} |")


def learn_row(r: dict) -> str:
    b, f = r["before"], r["after"]
    lo, hi = gain_interval(b, f)
    return (f"| {r['algo']} | {r['seed']} | {r['n']} | {_pct(b['accuracy'])} [{_pct(b['ci'][0])}, {_pct(b['ci'][1])}] | "
            f"{_pct(f['accuracy'])} [{_pct(f['ci'][0])}, {_pct(f['ci'][1])}] | "
            f"{100 * (f['accuracy'] - b['accuracy']):+.1f} [{lo:+.1f}, {hi:+.1f}] | {r['updates']} | "
            f"{r['cpu_seconds_budget']} | {100 * r['generate_share']:.0f}% | {_num(b['ece'])} → {_num(f['ece'])} | "
            f"{_num(b['auroc'])} → {_num(f['auroc'])} | {_num(b['reflection_accuracy'])} → "
            f"{_num(f['reflection_accuracy'])} |")


def render(part: str = "all") -> None:
    if part == "choices":
        render_choices()
        return
    if part in ("all", "calibration"):
        rows = [json.loads((RESULTS / f"real_calibration_{t}.json").read_text()) for t in TASKS
                if (RESULTS / f"real_calibration_{t}.json").is_file()]
        table(["task", "held-out problems", "accuracy, % [95% CI]", "reflections parsed", "confidences parsed",
               "reflection accuracy", "ECE", "Brier", "AUROC", "mean confidence"],
              [calibration_row(r) for r in rows], [r["command"] for r in rows], "real_calibration")
    if part in ("all", "learn"):
        runs = sorted((json.loads(p.read_text()) for p in RESULTS.glob("real_learn_*_s*.json")),
                      key=lambda r: (r["algo"], r["seed"]))
        if runs:
            print()
        table(["algo", "seed", "held-out", "before, % [95% CI]", "after, % [95% CI]", "gain, points [95% CI]", "updates",
               "CPU s", "generating", "ECE before → after", "AUROC before → after", "reflection acc. before → after"],
              [learn_row(r) for r in runs],
              [learn_command(r) for r in runs], "real_learn")


def learn_command(r: dict) -> str:
    """The command that made a learn result (a variant's: its algo, label and flags)."""
    if not r.get("flags"):
        return f"python benchmarks/real_model.py learn --algo {r['algo']} --seed {r['seed']}"
    return (f"python benchmarks/real_model.py learn --algo {r['train_algo']} --label {r['algo']} --flags '{r['flags']}' "
            f"--seed {r['seed']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--render", nargs="?", const="all", choices=("all", "calibration", "learn", "choices"), default=None,
                    help="print the tables of BENCHMARKS.md from the results (one part, or all)")
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("calibration", help="the base model's accuracy and self-report calibration on one task")
    c.add_argument("--task", choices=TASKS, required=True)
    c.add_argument("--limit", type=int, default=None, help="first N held-out problems (default all)")
    ch = sub.add_parser("choices", help="on train problems: accuracy per kind of problem, signal per temperature")
    ch.add_argument("--limit", type=int, default=200, help="train problems for the accuracy per kind")
    ch.add_argument("--groups", type=int, default=64, help="train problems sampled 8 times per temperature")
    ch.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.6, 0.8, 1.0])
    learn_p = sub.add_parser("learn", help="RL with LoRA on two-digit addition for a CPU budget, before and after")
    learn_p.add_argument("--algo", default="grpo")
    learn_p.add_argument("--seed", type=int, default=1)
    learn_p.add_argument("--cpu-seconds", type=int, default=3600)
    learn_p.add_argument("--out", default=None, help="run folder (default runs/real/LABEL_sSEED)")
    learn_p.add_argument("--label", default=None, help="the result's name for a variant (default: the algo)")
    learn_p.add_argument("--flags", default="", help="train flags of a variant, quoted: '--rlcr-calibration rank "
                                                   "--rlcr-credit split'")
    a = ap.parse_args()
    if a.render:
        render(a.render)
    elif a.cmd == "calibration":
        calibration(a)
    elif a.cmd == "learn":
        learn(a)
    elif a.cmd == "choices":
        choices(a)
    else:
        ap.error("give a command (calibration, learn) or --render")


if __name__ == "__main__":
    main()
