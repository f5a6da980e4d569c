"""How the GRPO phase of ``benchmarks/llm_learn.py`` runs went: where a seed learned and where it did not.

    python benchmarks/llm_learn_dynamics.py runs/bench/llm_learn/rag_s1 runs/bench/llm_learn/rag_s2 \
        runs/bench/llm_learn/rag_s3 --json-out benchmarks/results/llm_learn_dynamics_rag.json
    python benchmarks/llm_learn_dynamics.py --render llm_learn_dynamics_rag.json    # markdown (BENCHMARKS.md)

For each output folder, the GRPO run's ``metrics.jsonl`` is cut into five equal spans of updates; per span the
table gives the mean training accuracy of the rollouts, the share of groups whose completions all scored alike
(``groups/zero_std_frac``: their group advantage is 0, so they carry no gradient), the policy's mean token
entropy and the searches (or queries) per episode. A run that learns little while most of its groups carry no
signal is starved of gradient, not misled by it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from reflectrl.runlog import read_metrics

RES = Path(__file__).resolve().parent / "results"
SPANS = 5
KEYS = {"accuracy": "training accuracy", "groups/zero_std_frac": "groups with one outcome",
        "losses/entropy": "token entropy", "rollout/tool_calls": "searches per episode"}


def measure(dirs: list[Path]) -> dict:
    runs = []
    for d in dirs:
        recs = [r for r in read_metrics(d / "grpo" / "metrics.jsonl") if "accuracy" in r]
        if len(recs) < SPANS:
            raise SystemExit(f"{d}: fewer than {SPANS} updates in grpo/metrics.jsonl")
        result = json.loads((d / "result.json").read_text()) if (d / "result.json").is_file() else {}
        spans = np.array_split(np.arange(len(recs)), SPANS)
        row = {"dir": str(d), "seed": result.get("seed"), "task": result.get("task"), "updates": len(recs),
               "gain_points": result.get("gain_points")}
        for key in KEYS:
            vals = np.array([float(r.get(key, float("nan"))) for r in recs])
            row[key] = [float(np.nanmean(vals[s])) if np.isfinite(vals[s]).any() else None for s in spans]
        runs.append(row)
    return {"benchmark": "llm_learn_dynamics", "spans": SPANS, "runs": runs}


def render(data: dict) -> str:
    cells = lambda v: " -> ".join("n/a" if x is None or not math.isfinite(x) else f"{x:.2f}" for x in v)
    lines = ["| task | seed | held-out gain, points | updates | " + " | ".join(
        f"{name}, by fifth of the updates" for name in KEYS.values()) + " |", "|---|---|---|---|" + "---|" * len(KEYS)]
    for r in data["runs"]:
        gain = "n/a" if r["gain_points"] is None else f"{r['gain_points']:+.1f}"
        lines.append(f"| {r['task']} | {r['seed']} | {gain} | {r['updates']} | "
                     + " | ".join(cells(r[k]) for k in KEYS) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="benchmarks/llm_learn.py --out folders")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--render", default=None, metavar="NAME", help="print the table of benchmarks/results/NAME")
    a = ap.parse_args()
    if a.render:
        p = RES / a.render
        print(render(json.loads(p.read_text())) if p.is_file() else f"(not produced yet: benchmarks/results/{a.render})")
        return
    data = measure(a.dirs)
    print(render(data))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
