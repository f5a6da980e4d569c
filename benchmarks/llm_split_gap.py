"""Train split against held-out split: does a recipe's model learn the task or its training problems?

    python benchmarks/llm_split_gap.py runs/bench/llm_learn/rag_s1 runs/bench/llm_learn/rag_s2 --task rag \
        --limit 200 --json-out benchmarks/results/llm_split_gap_rag.json
    python benchmarks/llm_split_gap.py --render llm_split_gap_rag.json    # markdown (BENCHMARKS.md)

For each ``benchmarks/llm_learn.py`` output folder, the warmed-up model (``DIR/warmup``) and the model after
GRPO (``DIR/grpo``) are evaluated greedily (``reflectrl llm eval --json``) on the first ``--limit`` problems
of the ``train`` split and of the ``heldout`` split. A large train-minus-held-out gap says the model learned
its training problems (on a task whose held-out problems are about other entities, their facts) rather than
the skill the task asks for.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"
SPLITS = ("train", "heldout")
MODELS = ("warmup", "grpo")


def evaluate(model: Path, task: str, split: str, limit: int) -> dict:
    cmd = [sys.executable, "-m", "reflectrl.cli", "llm", "eval", str(model), "--task", task, "--split", split,
           "--limit", str(limit), "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"accuracy": float(r["accuracy"]), "n": int(r["n"]), "ci": [float(x) for x in r["ci"]]}


def measure(dirs: list[Path], task: str, limit: int) -> dict:
    rows = []
    for d in dirs:
        res = json.loads((d / "result.json").read_text()) if (d / "result.json").is_file() else {}
        row = {"dir": d.name, "seed": res.get("seed"), "updates": res.get("updates")}
        for m in MODELS:
            if not (d / m / "config.json").is_file():
                raise SystemExit(f"{d / m}: no model there (run benchmarks/llm_learn.py --out {d} first)")
            for split in SPLITS:
                row[f"{m}_{split}"] = evaluate(d / m, task, split, limit)
                print(f"{d.name} {m} {split}: {row[f'{m}_{split}']['accuracy']:.3f}", file=sys.stderr, flush=True)
        rows.append(row)
    return {"benchmark": "llm_split_gap", "task": task, "limit": limit, "runs": rows}


def render(path: Path) -> str:
    if not path.exists():
        return f"(not run yet: `python benchmarks/llm_split_gap.py ... --json-out {path}`)"
    r = json.loads(path.read_text())
    pct = lambda e: f"{100 * e['accuracy']:.1f} [{100 * e['ci'][0]:.1f}, {100 * e['ci'][1]:.1f}]"
    lines = [f"| {r['task']} seed | GRPO updates | warm-up: train, % | warm-up: held-out, % | after GRPO: train, % | "
             "after GRPO: held-out, % |", "|---|---|---|---|---|---|"]
    for row in r["runs"]:
        lines.append(f"| {row['seed']} | {row['updates']} | {pct(row['warmup_train'])} | {pct(row['warmup_heldout'])} | "
                     f"{pct(row['grpo_train'])} | {pct(row['grpo_heldout'])} |")
    n = r["runs"][0]["warmup_train"]["n"] if r["runs"] else 0
    return "\n".join(lines) + (f"\n\nGreedy, the first {n} problems of each split (`--limit {r['limit']}`), "
                               "95% Wilson intervals.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="benchmarks/llm_learn.py output folders")
    ap.add_argument("--task", default="rag")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--render", type=Path, default=None, metavar="JSON", help="print the markdown of a saved result")
    a = ap.parse_args()
    if a.render is not None:  # a path, or a file name in benchmarks/results/
        print(render(a.render if a.render.is_file() else RES / a.render.name))
        return
    if not a.dirs:
        ap.error("give at least one llm_learn output folder")
    result = measure(a.dirs, a.task, a.limit)
    print(json.dumps(result))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
