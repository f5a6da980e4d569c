"""Wall-time overhead of each seed method over plain PPO at the same steps and settings, in one run.

PPO and each PPO-based method (refgrpo-seed, gear-seed, exgrpo-seed, at their defaults) train on
LunarLander-v3 with CleanRL's ppo.py settings (8 envs x 128 steps, 4 epochs, 4 minibatches,
64x64 tanh, one torch thread), alternately, ``--rounds`` times; the order rotates every round.
The machine may be shared and noisy, so the report is the median over rounds of each method's
ratio to the PPO run of the same round, for wall time (the bar: <= 1.05 refgrpo-seed, <= 1.10
gear-seed and exgrpo-seed) and for process CPU time, plus the share of each update spent inside
the method (``time/method`` / ``time/iteration``), which machine load affects least.
A method that changes the policy also changes the episodes (their lengths, the resets, Box2D's
contacts), and so the env's share of the time; ``refgrpo-seed@alpha0`` (refgrpo-seed with a zero
bonus: all of its work, PPO's exact trajectory) separates the method's own compute from that;
``exgrpo-seed@background`` is exgrpo-seed with ``--refl-background``.

    python benchmarks/overhead.py --total-timesteps 40960 --rounds 5 --json-out benchmarks/results/overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from reflectrl.algos import get_algo
from reflectrl.runlog import read_metrics

METHODS = ("refgrpo-seed", "gear-seed", "exgrpo-seed")
BARS = {"refgrpo-seed": 1.05, "gear-seed": 1.10, "exgrpo-seed": 1.10}


# refgrpo-seed with alpha = 0 does all of its work (fit, bonus, GAE shift) but adds a zero bonus, so its
# run follows PPO's trajectory exactly (the method draws from its own generator): its ratio to PPO is the
# method's compute alone, without the change of episodes that a different policy brings
# exgrpo-seed@background trains its reflector on a background thread (--refl-background)
VARIANTS = {"refgrpo-seed@alpha0": ("refgrpo-seed", {"cal_alpha": 0.0}),
            "exgrpo-seed@background": ("exgrpo-seed", {"refl_background": True})}


def run(algo: str, total: int, seed: int, env_id: str) -> dict:
    """Train one run; return its wall and CPU seconds and the time spent in the method."""
    algo, extra = VARIANTS.get(algo, (algo, {}))
    a = get_algo("control", algo)
    with tempfile.TemporaryDirectory() as d:
        cfg = a.config_cls(env_id=env_id, seed=seed, total_timesteps=total, num_envs=8, num_steps=128,
                           update_epochs=4, num_minibatches=4, run_dir=d, progress=False, tensorboard=False,
                           save_interval=0, **extra)
        trainer = a.make(cfg)
        c0 = time.process_time()
        summary = trainer.learn()
        cpu = time.process_time() - c0
        recs = read_metrics(Path(d) / "metrics.jsonl")
    method_s = sum(v for r in recs for k, v in r.items() if k.startswith("time/method"))
    iter_s = sum(r["time/iteration"] for r in recs)
    return {"wall_s": summary["wall_s"], "cpu_s": cpu, "method_share": method_s / iter_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-timesteps", type=int, default=40_960)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--env-id", default="LunarLander-v3")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the result JSON here")
    args = ap.parse_args()
    algos = ("ppo", *METHODS, *VARIANTS)
    rows, loads = [], []
    for r in range(args.rounds):
        order = algos[r % len(algos):] + algos[:r % len(algos)]
        loads.append([round(x, 2) for x in os.getloadavg()])
        res = {a: run(a, args.total_timesteps, r + 1, args.env_id) for a in order}
        rows.append(res)
        print(f"round {r + 1}: " + ", ".join(f"{a} {res[a]['wall_s']:.1f}s" for a in algos), file=sys.stderr)
    out: dict = {"env_id": args.env_id, "total_timesteps": args.total_timesteps, "rounds": args.rounds,
                 "settings": "8 envs x 128 steps, 4 epochs, 4 minibatches, 64x64 tanh, 1 torch thread, method defaults",
                 "ppo_wall_s_median": statistics.median(row["ppo"]["wall_s"] for row in rows), "load_before": loads}
    for m in (*METHODS, *VARIANTS):
        wall = [row[m]["wall_s"] / row["ppo"]["wall_s"] for row in rows]
        cpu = [row[m]["cpu_s"] / row["ppo"]["cpu_s"] for row in rows]
        out[m] = {"wall_ratio": round(statistics.median(wall), 3), "wall_ratios": [round(x, 3) for x in wall],
                  "cpu_ratio": round(statistics.median(cpu), 3),
                  "method_share_of_update": round(statistics.median(row[m]["method_share"] for row in rows), 4),
                  "bar": BARS[VARIANTS.get(m, (m,))[0]],
                  "within_bar": statistics.median(wall) <= BARS[VARIANTS.get(m, (m,))[0]]}
    print(json.dumps(out))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
