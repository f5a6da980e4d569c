"""Speed of ``reflectrl train`` (PPO) against the CleanRL ``ppo.py`` re-implementation as whole processes.

Each side is one process timed from launch to exit (``time.perf_counter`` around ``subprocess.run``):
interpreter start-up, imports, argument parsing, env creation, training, logging and checkpoints
included. Both run CleanRL's ``ppo.py`` settings on LunarLander-v3 (8 envs x 128 steps, 4 epochs,
4 minibatches, 64x64 tanh actor and critic, one torch thread with ``OMP_NUM_THREADS=1``), alternately,
the order swapped every round; steps/s = the steps a process trained / its wall time, and the report
is the median of the per-round ratios (the machine is shared and noisy), with the load average
before and after each round.

Logging, kept comparable (``--tensorboard``, the default): both sides write TensorBoard events, as
CleanRL's ``ppo.py`` and ``reflectrl train`` do by default. The CleanRL side
(``cleanrl_ppo.py --tensorboard DIR``) writes what ``ppo.py`` writes (its hyperparameter table, the
return and length of every finished episode, nine scalars per iteration; not its per-episode
``print``); reflectrl writes its own logging in full: every update's record to ``metrics.jsonl`` and
TensorBoard, and a checkpoint every 10 updates and at the end (``--save-interval`` default, with
``config.json``). ``--no-tensorboard`` turns TensorBoard off on both sides.

    python benchmarks/ppo_process_speed.py --rounds 3 --json-out benchmarks/results/ppo_process_speed.json
    python benchmarks/ppo_process_speed.py --render    # markdown of the saved result (BENCHMARKS.md)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "ppo_process_speed.json"
SYNC = "reflectrl, envs in its process"  # the third side of a round with --with-sync
SETTINGS = ["--num-envs", "8", "--num-steps", "128", "--update-epochs", "4", "--num-minibatches", "4"]


def commands(total: int, seed: int, env_id: str, out: Path, tensorboard: bool, env_workers: int = 0,
             with_sync: bool = False) -> dict[str, list[str]]:
    """The command lines of one round (``out``: a fresh directory for every side's files): CleanRL's, reflectrl's
    (with ``env_workers``) and, ``with_sync``, reflectrl's with every env in its process as well."""
    def reflectrl(workers: int, name: str) -> list[str]:
        return [sys.executable, "-m", "reflectrl", "train", "--algo", "ppo", "--env-id", env_id,
                "--total-timesteps", str(total), *SETTINGS, "--seed", str(seed), "--run-dir", str(out / name),
                "--no-progress", *([] if tensorboard else ["--no-tensorboard"]),
                *(["--env-workers", str(workers)] if workers else [])]
    cleanrl = [sys.executable, str(HERE / "cleanrl_ppo.py"), "--total-timesteps", str(total), "--seed", str(seed),
               "--env-id", env_id, "--threads", "1", *(["--tensorboard", str(out / "cleanrl_tb")] if tensorboard else [])]
    cmds = {"cleanrl": cleanrl, "reflectrl": reflectrl(env_workers, "reflectrl")}
    if with_sync and env_workers:
        cmds[SYNC] = reflectrl(0, "reflectrl_sync")
    return cmds


def shown(arg: str) -> str:
    """A command-line word as the report shows it (``python``, paths relative to the repository)."""
    if arg == sys.executable:
        return "python"
    return arg[len(str(HERE.parent)) + 1:] if arg.startswith(str(HERE.parent) + "/") else arg


def timed(cmd: list[str]) -> dict:
    """Run one process to its exit; its wall time, steps, steps/s and the in-loop steps/s it reports."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = int(out["global_step"])
    return {"wall_s": wall, "steps": steps, "sps": steps / wall, "loop_sps": float(out["sps"]),
            "outside_loop_s": wall - steps / float(out["sps"])}


def measure(args: argparse.Namespace) -> dict:
    rows = []
    for r in range(args.rounds):
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory() as d:
            cmds = commands(args.total_timesteps, r + 1, args.env_id, Path(d), args.tensorboard, args.env_workers,
                            args.with_sync)
            order = list(cmds) if r % 2 == 0 else list(cmds)[::-1]
            row: dict = {"round": r + 1, "order": order, "load_before": [round(x, 2) for x in load_before]}
            for who in order:
                row[who] = timed(cmds[who])
        row["load_after"] = [round(x, 2) for x in os.getloadavg()]
        row["ratio"] = row["reflectrl"]["sps"] / row["cleanrl"]["sps"]
        row["loop_ratio"] = row["reflectrl"]["loop_sps"] / row["cleanrl"]["loop_sps"]
        if SYNC in row:
            row["sync_ratio"] = row[SYNC]["sps"] / row["cleanrl"]["sps"]
            row["workers_over_sync"] = row["reflectrl"]["sps"] / row[SYNC]["sps"]
        rows.append(row)
        print(f"round {r + 1} ({order[0]} first, load {load_before[0]:.1f} -> {row['load_after'][0]:.1f}): "
              + ", ".join(f"{who} {row[who]['sps']:.0f} steps/s ({row[who]['wall_s']:.1f} s)" for who in order)
              + f", ratio {row['ratio']:.3f} (in-loop {row['loop_ratio']:.3f})", file=sys.stderr, flush=True)
    med = lambda who, key: statistics.median(row[who][key] for row in rows)
    ratios = [row["ratio"] for row in rows]
    result = {
        "env_id": args.env_id, "total_timesteps": args.total_timesteps, "rounds": args.rounds,
        "settings": "8 envs x 128 steps, 4 epochs, 4 minibatches, 64x64 tanh, OMP_NUM_THREADS=1, one torch thread",
        "tensorboard": args.tensorboard, "cpus": os.cpu_count(), "env_workers": args.env_workers,
        **({"label": args.label} if args.label else {}),
        "commands": {k: " ".join(shown(c) for c in v)
                     for k, v in commands(args.total_timesteps, 1, args.env_id, Path("TMP"), args.tensorboard,
                                          args.env_workers, args.with_sync).items()},
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "ratios": [round(x, 3) for x in ratios],
        "loop_ratio_median": statistics.median(row["loop_ratio"] for row in rows),
        "loop_ratios": [round(row["loop_ratio"], 3) for row in rows],
    }
    for who in ("cleanrl", "reflectrl", *([SYNC] if SYNC in rows[0] else [])):
        for key in ("sps", "wall_s", "loop_sps", "outside_loop_s"):
            result[f"{who}_{key}_median"] = med(who, key)
        result[f"{who}_sps"] = [round(row[who]["sps"], 1) for row in rows]
    if SYNC in rows[0]:
        for key in ("sync_ratio", "workers_over_sync"):
            result[f"{key}_median"] = statistics.median(row[key] for row in rows)
            result[f"{key}s"] = [round(row[key], 3) for row in rows]
    result["per_round"] = rows
    return result


def render(path: Path = RESULT) -> str:
    """The markdown table of a saved result (BENCHMARKS.md embeds it)."""
    if not path.exists():
        return "(not run yet: `python benchmarks/ppo_process_speed.py --json-out benchmarks/results/ppo_process_speed.json`)"
    r = json.loads(path.read_text())
    rows = ["| | steps/s (whole process) | wall s | steps/s in its training loop | s outside the loop |",
            "|---|---|---|---|---|"]
    for who in ("cleanrl", "reflectrl", *([SYNC] if f"{SYNC}_sps_median" in r else [])):
        rows.append(f"| {who} | {r[f'{who}_sps_median']:.0f} | {r[f'{who}_wall_s_median']:.1f} | "
                    f"{r[f'{who}_loop_sps_median']:.0f} | {r[f'{who}_outside_loop_s_median']:.1f} |")
    ratios = ", ".join(f"{x:.2f}" for x in r["ratios"])
    loads = ", ".join(f"{row['load_before'][0]:.1f}-{row['load_after'][0]:.1f}" for row in r["per_round"])
    logging = "both sides with TensorBoard" if r["tensorboard"] else "TensorBoard off on both sides"
    if r.get("env_workers"):
        logging += f", reflectrl's envs in {r['env_workers']} worker processes (`--env-workers {r['env_workers']}`)"
    return ("\n".join(rows) + f"\n\nRatio reflectrl / CleanRL as whole processes (median of {r['rounds']} alternating "
            f"rounds of {r['total_timesteps']} steps, {logging}): **{r['ratio_median']:.2f}x** (rounds: {ratios}; "
            f"range {r['ratio_min']:.2f}-{r['ratio_max']:.2f}); the ratio of the same processes' training loops: "
            f"{r['loop_ratio_median']:.2f}x. Medians per column; 1-minute load average before-after each round: {loads}."
            + (f" In the same rounds, reflectrl with every env in its process: {r['sync_ratio_median']:.2f}x CleanRL "
               f"(rounds: {', '.join(f'{x:.2f}' for x in r['sync_ratios'])}); the workers' speed over it: "
               f"{r['workers_over_sync_median']:.2f}x (rounds: {', '.join(f'{x:.2f}' for x in r['workers_over_syncs'])})."
               if "sync_ratio_median" in r else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-timesteps", type=int, default=400_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--env-id", default="LunarLander-v3")
    ap.add_argument("--env-workers", type=int, default=0, help="reflectrl's --env-workers (0: the envs in its process)")
    ap.add_argument("--with-sync", action="store_true",
                    help="with --env-workers: also time reflectrl with every env in its process, in the same rounds")
    ap.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=True,
                    help="TensorBoard logging on both sides (default) or on neither")
    ap.add_argument("--json-out", type=Path, default=None, help="write the result JSON here")
    ap.add_argument("--label", default=None, help="a note kept in the result JSON (what was measured)")
    ap.add_argument("--render", nargs="?", const=str(RESULT), default=None, metavar="JSON",
                    help="print the markdown of a saved result (default benchmarks/results/ppo_process_speed.json)")
    args = ap.parse_args()
    if args.render is not None:
        path = Path(args.render)
        print(render(path if path.exists() else RESULT.parent / path.name))  # a name in benchmarks/results/
        return
    result = measure(args)
    print(json.dumps({k: v for k, v in result.items() if k != "per_round"}))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
