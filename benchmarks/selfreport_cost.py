"""What the self-report terms cost per token: each new term against the same method without it.

    python benchmarks/selfreport_cost.py --model runs/cmp_llm/arith13/models/arith/seed_1/warmup --updates 30 \
        --rounds 3 --json-out benchmarks/results/selfreport_cost_arith.json
    python benchmarks/selfreport_cost.py --render selfreport_cost_arith.json

Each pair trains the same warmed-up model on arith with the recipe's train flags for ``--updates`` updates, once
with the plain term and once with the new one (split credit on both sides, so the term is the only difference), in
fresh processes at one thread, alternating which goes first, ``--rounds`` times. Per run: process CPU seconds of the
training (``cpu_s`` of its summary, set-up excluded) per completion token it generated, and the share of each
update's wall time spent in the method (its ``time/method/NAME`` over ``time/iteration``, measured inside the run,
so other load on the machine does not enter it). The ratio is the median over rounds of new / plain CPU per token;
the bar is 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import resultio

from reflectrl.experiments.recipes import RECIPES
from reflectrl.runlog import read_metrics

PAIRS = {  # name: (plain flags, new flags)
    "refgrpo balanced": (["--algo", "refgrpo", "--refgrpo-credit", "split"],
                         ["--algo", "refgrpo", "--refgrpo-credit", "split", "--refgrpo-reward", "balanced"]),
    "refgrpo rank": (["--algo", "refgrpo", "--refgrpo-credit", "split"],
                     ["--algo", "refgrpo", "--refgrpo-credit", "split", "--refgrpo-reward", "rank"]),
    "rlcr rank": (["--algo", "rlcr", "--rlcr-credit", "split"],
                  ["--algo", "rlcr", "--rlcr-credit", "split", "--rlcr-calibration", "rank"]),
    "refgrpo rank-balanced": (["--algo", "refgrpo", "--refgrpo-credit", "split"],
                              ["--algo", "refgrpo", "--refgrpo-credit", "split", "--refgrpo-reward", "rank-balanced"]),
    "rlcr rank-balanced": (["--algo", "rlcr", "--rlcr-credit", "split"],
                           ["--algo", "rlcr", "--rlcr-credit", "split", "--rlcr-calibration", "rank-balanced"]),
    "rlcr batch-rank": (["--algo", "rlcr", "--rlcr-credit", "split"],
                        ["--algo", "rlcr", "--rlcr-credit", "split", "--rlcr-calibration", "batch-rank"]),
}


def train(model: str, flags: list[str], updates: int, seed: int, run_dir: Path) -> dict[str, float]:
    """One training process; its CPU seconds per completion token and the method's share of the wall time."""
    cmd = [sys.executable, "-m", "reflectrl.cli", "llm", "train", *flags, "--task", "arith", "--model", model,
           *RECIPES["arith"].train, "--updates", str(updates), "--seed", str(seed), "--run-dir", str(run_dir),
           "--threads", "1", "--no-progress", "--no-tensorboard", "--no-export-model", "--sample-interval", "0",
           "--eval-interval", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    recs = read_metrics(run_dir / "metrics.jsonl")
    samples = summary["global_step"] / summary["updates"]
    tokens = sum(r["completion/mean_length"] * samples for r in recs)
    method = sum(v for r in recs for k, v in r.items() if k.startswith("time/method/"))
    return {"cpu_per_token_us": 1e6 * summary["cpu_s"] / tokens, "method_share": method / sum(r["time/iteration"]
                                                                                            for r in recs)}


def measure(a: argparse.Namespace) -> dict[str, Any]:
    chosen = {n: PAIRS[n] for n in (a.pairs or PAIRS)}
    pairs: dict[str, dict[str, list[dict[str, float]]]] = {n: {"plain": [], "new": []} for n in chosen}
    loads: list[list[float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            loads.append(resultio.load_average())
            for name, (plain, new) in chosen.items():
                order = [("plain", plain), ("new", new)] if r % 2 == 0 else [("new", new), ("plain", plain)]
                for side, flags in order:
                    run = Path(tmp) / f"{name.replace(' ', '_')}_{side}_{r}"
                    pairs[name][side].append(res := train(a.model, flags, a.updates, a.seed, run))
                    print(name, side, r, res, file=sys.stderr, flush=True)
    out = {}
    for name, sides in pairs.items():
        ratios = [n["cpu_per_token_us"] / p["cpu_per_token_us"] for n, p in zip(sides["new"], sides["plain"])]
        out[name] = {"ratio": statistics.median(ratios), "ratios": ratios, "ratio_range": [min(ratios), max(ratios)],
                     "method_share_plain": statistics.median(x["method_share"] for x in sides["plain"]),
                     "method_share_new": statistics.median(x["method_share"] for x in sides["new"]), **sides}
    return {"benchmark": "selfreport_cost", "model": a.model, "updates": a.updates, "rounds": a.rounds,
            "seed": a.seed, "pairs": out, "load_before": loads}


def render(names: list[str]) -> str:
    lines = ["| term (split credit) | CPU per token, new / plain (median over rounds) | rounds | method's share of an "
             "update's wall time, plain -> new |", "|---|---|---|---|"]
    for n in names:
        d = json.loads(resultio.results_file(n).read_text())
        for name, p in d["pairs"].items():
            lines.append(f"| {name} | {p['ratio']:.3f}x | {len(p['ratios'])} | "
                         f"{100 * p['method_share_plain']:.2f}% -> {100 * p['method_share_new']:.2f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a warmed-up arith model")
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pairs", nargs="*", choices=sorted(PAIRS), default=None, help="the terms measured (default: all)")
    resultio.main(ap, measure, render, needs="model")


if __name__ == "__main__":
    main()
