"""Final deterministic return of PPO with a preset, over seeds: IQM with a 95% bootstrap CI.

Each seed is `reflectrl train --preset ENV --seed S` into OUT/ENV/seed_S, then
`reflectrl eval OUT/ENV/seed_S --episodes 20 --json`; finished runs are skipped on rerun.

    python benchmarks/ppo_learn.py --env-id LunarLander-v3 --seeds 5 --workers 2 --out runs/bench/ppo_learn
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reflectrl.eval.stats import bootstrap_ci, iqm
from reflectrl.runlog import read_metrics


def train_and_eval(env_id: str, seed: int, total: int | None, out: Path, episodes: int) -> dict:
    """One seed, via the CLI; returns its evaluation and wall time."""
    run = out / env_id / f"seed_{seed}"
    result = run / "eval.json"
    if result.exists():
        return json.loads(result.read_text())
    t0 = time.time()
    if (run / "checkpoint.safetensors").exists():
        cmd = ["reflectrl", "train", "--resume", str(run), "--no-progress"]
    else:
        cmd = ["reflectrl", "train", "--preset", env_id, "--seed", str(seed), "--run-dir", str(run), "--no-progress"]
        if total:
            cmd += ["--total-timesteps", str(total)]
    subprocess.run([sys.executable, "-m", "reflectrl.cli", *cmd[1:]], check=True, stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    ev = subprocess.run([sys.executable, "-m", "reflectrl.cli", "eval", str(run), "--episodes", str(episodes), "--json"],
                        check=True, capture_output=True, text=True)
    rec = {"seed": seed, **json.loads(ev.stdout.strip().splitlines()[-1]), "train_wall_s": wall}
    result.write_text(json.dumps(rec))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env-id", required=True)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--total-timesteps", type=int, default=None, help="default: the preset's")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/ppo_learn"))
    ap.add_argument("--json-out", type=Path, default=None, help="also write the result JSON here")
    args = ap.parse_args()
    with ThreadPoolExecutor(args.workers) as pool:
        recs = list(pool.map(lambda s: train_and_eval(args.env_id, s, args.total_timesteps, args.out, args.episodes),
                             range(1, args.seeds + 1)))
    finals = [r["mean"] for r in recs]
    loop_s = [sum(m.get("time/iteration", 0.0)
                  for m in read_metrics(args.out / args.env_id / f"seed_{r['seed']}" / "metrics.jsonl"))
              for r in recs]
    lo, hi = bootstrap_ci(finals)
    summary = {"env_id": args.env_id, "seeds": args.seeds, "total_timesteps": args.total_timesteps or "preset",
               "iqm": iqm(finals), "ci95": [lo, hi], "per_seed": finals,
               "train_loop_s_mean": sum(loop_s) / len(loop_s), "train_loop_s": loop_s}
    print(json.dumps(summary))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
