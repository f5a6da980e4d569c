"""Speed of reflectrl's PPO against a re-implementation of CleanRL's ppo.py loop, in one run.

Both run CleanRL's ppo.py settings on LunarLander-v3 (8 envs x 128 steps, 4 epochs, 4 minibatches,
64x64 tanh, one torch thread), alternately, ``--rounds`` times each; the machine is shared and noisy,
so the report is the median of the per-round ratios, with where the time goes.

    python benchmarks/ppo_speed.py --total-timesteps 100000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cleanrl_ppo  # noqa: E402

from reflectrl.control import PPO, PPOConfig  # noqa: E402
from reflectrl.runlog import read_metrics  # noqa: E402


def run_reflectrl(total_timesteps: int, seed: int, env_id: str) -> dict:
    """reflectrl PPO with CleanRL's ppo.py settings; returns SPS and the time breakdown."""
    with tempfile.TemporaryDirectory() as d:
        cfg = PPOConfig(env_id=env_id, seed=seed, total_timesteps=total_timesteps, num_envs=8, num_steps=128,
                        update_epochs=4, num_minibatches=4, run_dir=d, progress=False, tensorboard=False,
                        save_interval=0, bootstrap_truncation=True)
        summary = PPO(cfg).learn()
        recs = read_metrics(Path(d) / "metrics.jsonl")
    out = {"sps": summary["sps"], "time/total": summary["wall_s"]}
    for k in ("time/env", "time/inference", "time/update"):
        out[k] = sum(r[k] for r in recs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-timesteps", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--env-id", default="LunarLander-v3")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the result JSON here")
    args = ap.parse_args()
    rows = []
    for r in range(args.rounds):
        load = [round(x, 2) for x in os.getloadavg()]
        order = ("cleanrl", "reflectrl") if r % 2 == 0 else ("reflectrl", "cleanrl")  # alternate between rounds
        res = {}
        for who in order:
            res[who] = (cleanrl_ppo.run(total_timesteps=args.total_timesteps, seed=r + 1, env_id=args.env_id)
                        if who == "cleanrl" else run_reflectrl(args.total_timesteps, r + 1, args.env_id))
        c, m = res["cleanrl"], res["reflectrl"]
        c.pop("episodic_returns", None)
        rows.append({"round": r + 1, "order": list(order), "load_before": load, "cleanrl": c, "reflectrl": m,
                     "ratio": m["sps"] / c["sps"]})
        print(f"round {r + 1}: cleanrl {c['sps']:.0f} steps/s, reflectrl {m['sps']:.0f} steps/s, "
              f"ratio {rows[-1]['ratio']:.2f}", file=sys.stderr)
    def med(who: str, key: str) -> float:
        return statistics.median(row[who][key] for row in rows)
    result = {"env_id": args.env_id, "total_timesteps": args.total_timesteps, "rounds": args.rounds,
              "settings": "8 envs x 128 steps, 4 epochs, 4 minibatches, 64x64 tanh, 1 torch thread",
              "ratio_median": statistics.median(r["ratio"] for r in rows),
              "ratios": [round(r["ratio"], 3) for r in rows], "ratio_range": [min(r["ratio"] for r in rows),
                                                                            max(r["ratio"] for r in rows)],
              "per_round": [{k: row[k] for k in ("round", "order", "load_before")} for row in rows]}
    for who in ("cleanrl", "reflectrl"):
        result[f"{who}_sps_median"] = med(who, "sps")
        for k in ("time/env", "time/inference", "time/update", "time/total"):
            result[f"{who}_{k}_median_s"] = med(who, k)
    print(json.dumps(result))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
