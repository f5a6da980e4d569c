"""How much of a GRPO step waits for codegen rewards: one sandbox per completion vs batched sandboxes.

    python benchmarks/reward_overlap.py [--model DIR] [--rounds 2] [--updates 15] [--sandbox-batch 16]

Runs, alternately (``--rounds`` times each, so drift of a shared machine's load hits both modes alike),
a short GRPO run on ``codegen`` from a warm-up checkpoint with

* ``per_job``: ``--sandbox-batch 1`` (one sandbox launch per completion, one env step per reward thread), and
* ``batch``:   ``--sandbox-batch N`` (the rollout scores each generated chunk with one call; the task runs
  the chunk's tests N jobs per sandbox launch, each job in its own forked process; the task's sandbox
  pool keeps its batch runners between calls),

and prints one JSON line: per mode the reward-wait fraction (sum of ``time/reward_wait`` over sum of
``time/iteration``), seconds per step, seconds of reward calls per step (``time/reward``, summed over the
reward threads, wall time; key ``reward_cpu_s_per_step``),
the per-round values, and the batch/per-job ratios. The default model is the codegen warm-up checkpoint
of ``benchmarks/llm_learn.py`` (runs/bench/llm_learn/codegen_s1/warmup); if it is missing, it is made
with that benchmark's first two steps (init-tiny, warm-up) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "runs/bench/llm_learn/codegen_s1/warmup"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_learn import PRESETS  # noqa: E402  (the codegen recipe's settings)


def reflectrl(args: list[str], log: Path) -> str:
    """Run ``reflectrl ARGS`` (stderr appended to ``log``) and return its stdout."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    print("$ reflectrl " + " ".join(args), file=sys.stderr, flush=True)
    with open(log, "a") as err:
        proc = subprocess.run([sys.executable, "-m", "reflectrl.cli", *args], stdout=subprocess.PIPE, stderr=err,
                              text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): reflectrl {' '.join(args)}; see {log}")
    return proc.stdout


def ensure_model(model: Path, out: Path, log: Path, threads: int) -> Path:
    """The warm-up checkpoint, made with llm_learn's init-tiny + warm-up steps if it does not exist."""
    if (model / "config.json").exists():
        return model
    p = PRESETS["codegen"]
    made = out / "warmup"
    if not (made / "config.json").exists():
        reflectrl(["llm", "init-tiny", str(out / "tiny"), *p["tiny"], "--seed", "1"], log)
        reflectrl(["llm", "warmup", "--model", str(out / "tiny"), "--task", "codegen", "--out", str(made),
                   *p["warmup"], "--stop-at-accuracy", str(p["warmup_target"]), "--max-new-tokens",
                   str(p["max_new_tokens"]), "--seed", "1", "--threads", str(threads), "--no-progress"], log)
    return made


def sums(metrics: Path) -> dict[str, float]:
    """Sums of the step timings over a run's updates."""
    tot = {"steps": 0, "wait": 0.0, "iteration": 0.0, "reward": 0.0, "generate": 0.0}
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        if "time/iteration" not in rec:
            continue
        tot["steps"] += 1
        tot["wait"] += rec.get("time/reward_wait", 0.0)
        tot["iteration"] += rec["time/iteration"]
        tot["reward"] += rec.get("time/reward", 0.0)
        tot["generate"] += rec.get("time/generate", 0.0)
    return tot


def summary(runs: list[dict[str, float]]) -> dict:
    total = {k: sum(r[k] for r in runs) for k in runs[0]}
    steps = max(total["steps"], 1)
    return {
        "reward_wait_fraction": round(total["wait"] / max(total["iteration"], 1e-9), 4),
        "step_s": round(total["iteration"] / steps, 3),
        "reward_wait_s_per_step": round(total["wait"] / steps, 3),
        "reward_cpu_s_per_step": round(total["reward"] / steps, 3),
        "generate_s_per_step": round(total["generate"] / steps, 3),
        "steps": int(total["steps"]),
        "rounds_wait_fraction": [round(r["wait"] / max(r["iteration"], 1e-9), 4) for r in runs],
        "rounds_step_s": [round(r["iteration"] / max(r["steps"], 1), 3) for r in runs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="warm-up checkpoint (HF model directory)")
    ap.add_argument("--out", type=Path, default=None, help="where runs go (default: a temporary directory)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating (default 2)")
    ap.add_argument("--updates", type=int, default=15)
    ap.add_argument("--sandbox-batch", type=int, default=16, help="jobs per sandbox launch in batch mode")
    ap.add_argument("--prompts-per-update", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="reward_overlap-"))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "stderr.log"
    model = ensure_model(a.model, out, log, a.threads)
    modes = {"per_job": 1, "batch": a.sandbox_batch}
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for rnd in range(a.rounds):
        for mode, size in (modes.items() if rnd % 2 == 0 else reversed(modes.items())):
            run_dir = out / f"{mode}_{rnd}"
            shutil.rmtree(run_dir, ignore_errors=True)
            reflectrl(["llm", "train", "--algo", "grpo", "--task", "codegen", "--model", str(model),
                       "--run-dir", str(run_dir), "--updates", str(a.updates),
                       "--prompts-per-update", str(a.prompts_per_update), "--group-size", str(a.group_size),
                       "--max-new-tokens", str(a.max_new_tokens), "--gen-batch", str(a.gen_batch),
                       "--threads", str(a.threads), "--seed", str(a.seed), "--sandbox-batch", str(size),
                       "--save-interval", "0", "--sample-interval", "0", "--no-tensorboard", "--no-export-model",
                       "--no-progress"], log)
            runs[mode].append(sums(run_dir / "metrics.jsonl"))
            print(f"{mode} round {rnd}: {json.dumps(runs[mode][-1])}", file=sys.stderr, flush=True)
    res = {m: summary(r) for m, r in runs.items()}
    result = {
        "benchmark": "reward_overlap", "task": "codegen", "model": str(model), "rounds": a.rounds,
        "updates": a.updates, "rows_per_update": a.prompts_per_update * a.group_size, "gen_batch": a.gen_batch,
        "sandbox_batch": a.sandbox_batch, "cpus": os.cpu_count(),
        **res,
        "ratio_step_s": round(res["batch"]["step_s"] / max(res["per_job"]["step_s"], 1e-9), 3),
        "ratio_reward_wait_fraction": round(res["batch"]["reward_wait_fraction"]
                                            / max(res["per_job"]["reward_wait_fraction"], 1e-9), 3),
        "ratio_reward_cpu_s": round(res["batch"]["reward_cpu_s_per_step"]
                                    / max(res["per_job"]["reward_cpu_s_per_step"], 1e-9), 3),
    }
    if a.out is None:
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
