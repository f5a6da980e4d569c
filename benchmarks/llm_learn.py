"""Does GRPO learn at CPU scale? init-tiny -> warm-up -> GRPO, held-out accuracy before and after.

    python benchmarks/llm_learn.py --task arith --out runs/bench/llm_learn/arith [--seed 1]

The whole recipe, as the four CLI commands it runs (each printed before it runs):

1. ``reflectrl llm init-tiny OUT/tiny``                 a random-init tiny Llama + character tokenizer
2. ``reflectrl llm warmup ... --out OUT/warmup``         supervised on demonstrations until a weak-but-nonzero
                                                        accuracy (``--warmup-target``) on train problems
3. ``reflectrl llm train --algo grpo ... --run-dir OUT/grpo --cpu-time-limit-s RL_SECONDS`` (or
   ``--time-limit-s`` with ``--clock wall``)
4. ``reflectrl llm eval`` of OUT/warmup (before) and OUT/grpo (after) on the held-out split (greedy)

The last line of output is one JSON object: before, after, gain_points, train_seconds (wall time of
the RL phase) and train_cpu_seconds (its CPU time), warmup_seconds, intervals, the settings, and
reward_wait_fraction (share of the GRPO steps' time spent waiting for rewards that generation did
not hide).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# per task: the tiny model, warm-up and GRPO settings of the CPU recipe (reflectrl.experiments.recipes); the completion
# budget of arith and codegen as the recorded runs used it (the task's own default elsewhere)
MAX_NEW_TOKENS = {"arith": 6, "codegen": 40}


EPISODE_KEYS = ("tool_calls", "premature_rate", "step_reports", "step_ece", "step_auroc")


def preset(task: str, task_options: tuple[str, ...] = ()) -> dict:
    """The recipe's flags of each phase; ``task_options`` (KEY=VALUE) are added to the recipe's own (a later one wins)."""
    from reflectrl.experiments.recipes import recipe
    from reflectrl.tasks.base import get_task

    r = recipe(task).with_options(task_options)
    return {"tiny": list(r.tiny), "warmup": [*r.warmup, *r.task_flags()], "warmup_target": r.warmup_target,
            "train": [*r.train, *r.task_flags(train=True)], "eval": list(r.task_flags("--set")),
            "max_new_tokens": MAX_NEW_TOKENS.get(task, int(getattr(get_task(task), "max_new_tokens", 32)))}


def run(args: list[str], log: Path) -> str:
    """Run ``reflectrl ARGS``; echo the command, keep stderr in ``log``, return stdout."""
    cmd = [sys.executable, "-m", "reflectrl.cli", *args]
    print("$ reflectrl " + " ".join(args), flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log, "a") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): reflectrl {' '.join(args)}; see {log}")
    return proc.stdout


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def reward_wait(metrics: Path) -> tuple[float, float]:
    """Seconds the GRPO steps waited for rewards beyond the generation they overlap, and the steps'
    total seconds (sums of ``time/reward_wait`` and ``time/iteration`` over the run's updates)."""
    wait = total = 0.0
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        wait += rec.get("time/reward_wait", 0.0)
        total += rec.get("time/iteration", 0.0)
    return wait, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="arith", choices=("arith", "codegen", "text2sql", "rag"))
    ap.add_argument("--out", required=True, help="output directory (tiny/, warmup/, grpo/ are written here)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rl-seconds", type=float, default=600.0, help="time budget of the GRPO phase")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="budget in CPU seconds of the training process and the processes it runs (sandboxed "
                         "tests) (default; much less dependent on other load on a shared machine) or wall seconds")
    ap.add_argument("--warmup-target", type=float, default=None, help="stop warm-up at this train accuracy")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out problems to evaluate (default all)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each phase")
    ap.add_argument("--keep", action="store_true", help="reuse OUT/tiny and OUT/warmup if present")
    ap.add_argument("--train-extra", default="",
                    help="flags appended to the recipe's training flags (a later flag wins), written with '=': "
                         "--train-extra='--group-size 16'")
    ap.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a task option added to the recipe's, in every phase (repeatable): --task-option report=steps")
    ap.add_argument("--tiny-extra", default="",
                    help="flags appended to the recipe's tiny-model flags, written with '=': --tiny-extra='--width 128'")
    ap.add_argument("--warmup-extra", default="",
                    help="flags appended to the recipe's warm-up flags, written with '=': --warmup-extra='--step-confidence'")
    a = ap.parse_args()
    p = preset(a.task, tuple(a.task_option))
    out = Path(a.out)
    if out.exists() and not a.keep:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "stderr.log"
    n_tok = str(p["max_new_tokens"])
    train_args = [*p["train"], *a.train_extra.split()]
    limit = ["--limit", str(a.eval_limit)] if a.eval_limit else []
    target = a.warmup_target if a.warmup_target is not None else p["warmup_target"]
    if not (out / "warmup" / "config.json").exists():
        run(["llm", "init-tiny", str(out / "tiny"), *p["tiny"], *a.tiny_extra.split(), "--seed", str(a.seed)], log)
        t0 = time.perf_counter()
        warm = last_json(run(["llm", "warmup", "--model", str(out / "tiny"), "--task", a.task, "--out",
                              str(out / "warmup"), *p["warmup"], *a.warmup_extra.split(),
                              "--stop-at-accuracy", str(target), "--max-new-tokens",
                              n_tok, "--seed", str(a.seed), "--threads", str(a.threads), "--no-progress"], log))
        warm["wall_s"] = time.perf_counter() - t0
        (out / "warmup_summary.json").write_text(json.dumps(warm))
    warm = json.loads((out / "warmup_summary.json").read_text())
    before = last_json(run(["llm", "eval", str(out / "warmup"), "--task", a.task, "--json", "--max-new-tokens", n_tok,
                            *limit, *p["eval"]], log))
    budget_flag = "--cpu-time-limit-s" if a.clock == "cpu" else "--time-limit-s"
    if (out / "grpo").exists():
        shutil.rmtree(out / "grpo")
    train = last_json(run(["llm", "train", "--algo", "grpo", "--task", a.task, "--model", str(out / "warmup"),
                           "--run-dir", str(out / "grpo"), *train_args, "--max-new-tokens", n_tok,
                           "--updates", "100000", budget_flag, str(a.rl_seconds), "--save-interval", "0",
                           "--seed", str(a.seed), "--threads", str(a.threads), "--no-progress"], log))
    after = last_json(run(["llm", "eval", str(out / "grpo"), "--task", a.task, "--json", *limit], log))
    wait, iters = reward_wait(out / "grpo" / "metrics.jsonl")
    result = {
        "benchmark": "llm_learn", "task": a.task, "seed": a.seed,
        "before": round(before["accuracy"], 4), "after": round(after["accuracy"], 4),
        "gain_points": round(100 * (after["accuracy"] - before["accuracy"]), 2),
        "train_seconds": round(train["wall_s"], 1), "train_cpu_seconds": round(train["cpu_s"], 1), "clock": a.clock,
        "budget_seconds": a.rl_seconds, "warmup_seconds": round(warm["wall_s"], 1),
        "warmup_steps": warm["steps"], "updates": train["updates"], "n_heldout": after["n"],
        "before_ci": [round(x, 4) for x in before["ci"]], "after_ci": [round(x, 4) for x in after["ci"]],
        "tiny": " ".join([*p["tiny"], *a.tiny_extra.split()]), "train_args": " ".join(train_args),
        "max_new_tokens": p["max_new_tokens"],
        "warmup_target": target, "threads": a.threads, "warmup_extra": a.warmup_extra,
        "reward_wait_fraction": round(wait / iters, 4) if iters > 0 else None,
        # the task's episode metrics where its evaluation gives them (rag: searches, per-step confidences)
        **{f"{when}_{k}": ev[k] for when, ev in (("before", before), ("after", after)) for k in EPISODE_KEYS if k in ev},
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
