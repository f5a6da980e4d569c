"""How the GRPO phase of ``benchmarks/llm_learn.py`` runs went: where a seed learned and where it did not.

    python benchmarks/llm_learn_dynamics.py runs/bench/llm_learn/rag_s1 runs/bench/llm_learn/rag_s2 \
        runs/bench/llm_learn/rag_s3 --json-out benchmarks/results/llm_learn_dynamics_rag.json
    python benchmarks/llm_learn_dynamics.py --render llm_learn_dynamics_rag.json    # markdown (BENCHMARKS.md)
    python benchmarks/llm_learn_dynamics.py runs/cmp_llm/arith13/runs/arith/exgrpo-seed/seed_1 ... \
        --keys accuracy groups/zero_std_frac completion/truncated_frac exgrpo-seed/coef --json-out ...

Folders may also be run directories (of ``reflectrl llm train`` or ``llm compare``, with their own ``metrics.jsonl``
and, from compare, ``eval.json``); ``--keys`` picks the metrics (default: the four below).

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

from reflectrl.methods.exgrpo import ExGRPO
from reflectrl.methods.exgrpo_seed import ExGRPOSeed
from reflectrl.runlog import RENAMED_METRICS, read_metrics

RES = Path(__file__).resolve().parent / "results"
SPANS = 5
KEYS = {"accuracy": "training accuracy", "groups/zero_std_frac": "groups with one outcome",
        "losses/entropy": "token entropy", "rollout/tool_calls": "searches per episode"}
LABELS = {**KEYS, "completion/truncated_frac": "completions cut at the token limit",
          "completion/mean_length": "completion length", **ExGRPO.metric_labels, **ExGRPOSeed.metric_labels,
          "calibration/mean_confidence": "mean stated confidence", "calibration/step_ece": "per-step ECE",
          "rlcr/unanswered_rate": "episodes without an answer", "rollout/premature_rate": "premature answers"}
FAMILIES = tuple(k for k in LABELS if k.endswith("_"))  # a numbered family of metrics: exgrpo/bucket_1, ...


def label(key: str) -> str:
    key = RENAMED_METRICS.get(key, key)  # a results file written before the seed methods had their own names
    family = next((f for f in FAMILIES if key.startswith(f)), None)
    if family is not None:
        return LABELS[family].format(key[len(family):])
    return LABELS.get(key, key)


def is_count(key: str) -> bool:
    return any(key == c or (c.endswith("_") and key.startswith(c)) for c in ExGRPO.count_metrics)


def _read_json(p: Path) -> dict:
    return json.loads(p.read_text()) if p.is_file() else {}


def measure(dirs: list[Path], keys: list[str] | None = None) -> dict:
    """Per folder, each metric's mean over five equal spans of updates; ``keys`` None: the llm_learn table."""
    runs = []
    for d in dirs:
        learn = (d / "grpo" / "metrics.jsonl").is_file()
        path = d / "grpo" / "metrics.jsonl" if learn else d / "metrics.jsonl"
        recs = [r for r in read_metrics(path) if "accuracy" in r]
        if len(recs) < SPANS:
            raise SystemExit(f"{d}: fewer than {SPANS} updates in {path.relative_to(d)}")
        spans = np.array_split(np.arange(len(recs)), SPANS)
        if learn:
            result = _read_json(d / "result.json")
            row = {"dir": str(d), "seed": result.get("seed"), "task": result.get("task"), "updates": len(recs),
                   "gain_points": result.get("gain_points")}
        else:
            cfg, ev = _read_json(d / "config.json"), _read_json(d / "eval.json")
            row = {"dir": str(d), "seed": cfg.get("seed"), "task": cfg.get("task"), "updates": len(recs),
                   "method": d.parent.name, "eval_accuracy": ev.get("accuracy")}
        for key in keys or KEYS:
            default = 0.0 if key.startswith(FAMILIES) else float("nan")  # an empty bucket is not logged
            vals = np.array([float(v) if isinstance(v := r.get(key, default), (int, float)) else float("nan")
                             for r in recs])  # null (nothing to measure that update): no value
            row[key] = [float(np.nanmean(vals[s])) if np.isfinite(vals[s]).any() else None for s in spans]
        runs.append(row)
    out = {"benchmark": "llm_learn_dynamics", "spans": SPANS, "runs": runs}
    if keys:
        out["keys"] = list(keys)
    return out


def render(data: dict) -> str:
    def cells(v: list, key: str = "") -> str:
        digits = 0 if is_count(key) else 2
        return " -> ".join("n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}" for x in v)

    if "keys" in data:  # run directories: method, seed, final held-out accuracy
        keys = data["keys"]
        lines = ["| task | method | seed | held-out accuracy | updates | " + " | ".join(
            f"{label(k)}, by fifth of the updates" for k in keys) + " |", "|---|---|---|---|---|" + "---|" * len(keys)]
        for r in data["runs"]:
            acc = "n/a" if r.get("eval_accuracy") is None else f"{r['eval_accuracy']:.3f}"
            lines.append(f"| {r['task']} | {r.get('method', '')} | {r['seed']} | {acc} | {r['updates']} | "
                         + " | ".join(cells(r[k], k) for k in keys) + " |")
        return "\n".join(lines)
    lines = ["| task | seed | held-out gain, points | updates | " + " | ".join(
        f"{name}, by fifth of the updates" for name in KEYS.values()) + " |", "|---|---|---|---|" + "---|" * len(KEYS)]
    for r in data["runs"]:
        gain = "n/a" if r["gain_points"] is None else f"{r['gain_points']:+.1f}"
        lines.append(f"| {r['task']} | {r['seed']} | {gain} | {r['updates']} | "
                     + " | ".join(cells(r[k]) for k in KEYS) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="benchmarks/llm_learn.py --out folders, or run directories")
    ap.add_argument("--keys", nargs="+", default=None, metavar="METRIC",
                    help="metrics.jsonl keys to follow (default: the llm_learn table's four)")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--render", default=None, metavar="NAME", help="print the table of benchmarks/results/NAME")
    a = ap.parse_args()
    if a.render:
        p = RES / a.render
        print(render(json.loads(p.read_text())) if p.is_file() else f"(not produced yet: benchmarks/results/{a.render})")
        return
    data = measure(a.dirs, a.keys)
    print(render(data))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
