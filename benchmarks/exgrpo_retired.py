"""Where exgrpo's retired questions stand at the end of a run: greedy accuracy on the training problems it
retired (solved K of K once, then never sampled again) and on the rest, for the exgrpo run, its baseline run
of the same seed and the warmed-up model both started from.

    python benchmarks/exgrpo_retired.py --out runs/cmp_llm/arith13 --task arith --seeds 5 \
        --json-out benchmarks/results/exgrpo_retired_arith.json

The retired set is read from the exgrpo run's final checkpoint. A model that forgets what it no longer
practises scores lower on its retired problems than the baseline, which kept sampling them, does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def greedy_correct(model_or_run: str, task_name: str) -> list[bool]:
    """Greedy correctness of each training problem, in the split's order (the evaluator's token budgets)."""
    from reflectrl.llm.evaluate import evaluate

    return [c >= 1.0 for c in evaluate(model_or_run, task_name, "train", per_problem=True)["per_problem"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="a `reflectrl llm compare` folder")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--method", default="exgrpo")
    ap.add_argument("--baseline", default="drgrpo")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    import torch

    from reflectrl.checkpoint import load_checkpoint
    from reflectrl.tasks.base import get_task

    torch.set_num_threads(1)
    problems = list(get_task(a.task).problems("train"))
    rows = []
    for seed in range(1, a.seeds + 1):
        runs = a.out / "runs" / a.task
        run = runs / a.method / f"seed_{seed}"
        _, meta = load_checkpoint(run / "checkpoint.safetensors")
        retired = set(meta["hook/ExGRPO"]["retired"])
        mask = [p.id in retired for p in problems]
        row = {"seed": seed, "train_problems": len(problems), "retired": int(sum(mask))}
        models = {a.method: str(run), a.baseline: str(runs / a.baseline / f"seed_{seed}"),
                  "warmup": str(a.out / "models" / a.task / f"seed_{seed}" / "warmup")}
        for name, path in models.items():
            ok = greedy_correct(path, a.task)
            ret = [c for c, m in zip(ok, mask) if m]
            rest = [c for c, m in zip(ok, mask) if not m]
            row[name] = {"retired": sum(ret) / max(len(ret), 1), "rest": sum(rest) / max(len(rest), 1),
                         "all": sum(ok) / len(ok)}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    out = {"benchmark": "exgrpo_retired", "out": str(a.out), "task": a.task, "method": a.method,
           "baseline": a.baseline, "rows": rows}
    print(json.dumps(out))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(out, indent=2) + "\n")
    render(out)


def render(d: dict) -> None:
    """The markdown table of a result file."""
    m, b = d["method"], d["baseline"]
    print(f"| seed | retired of train | {m} on retired | {b} on retired | warm-up on retired | {m} on the rest | "
          f"{b} on the rest | warm-up on the rest |")
    print("|---|---|---|---|---|---|---|---|")
    for r in d["rows"]:
        print(f"| {r['seed']} | {r['retired']} of {r['train_problems']} | {r[m]['retired']:.3f} | {r[b]['retired']:.3f} "
              f"| {r['warmup']['retired']:.3f} | {r[m]['rest']:.3f} | {r[b]['rest']:.3f} | {r['warmup']['rest']:.3f} |")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        render(json.loads((Path(__file__).resolve().parent / "results" / sys.argv[2]).read_text()))
    else:
        main()
