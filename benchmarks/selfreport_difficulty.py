"""Does a stated confidence tell right answers from wrong ones, or easy questions from hard ones?

    python benchmarks/selfreport_difficulty.py --out runs/cmp_llm/arith13 --task arith --baseline grpo \
        --methods grpo rlcr-rank rlcr-rankbal --json-out benchmarks/results/selfreport_difficulty_arith.json

From each finished run's held-out evaluation (``eval.json``: every problem's correctness and stated confidence, in
the same problem order for every run of a task), per method and seed:

- **own AUROC**: the stated confidence against the run's own correctness (what the evaluation reports);
- **ease**: each problem's share of right answers over the baseline's seeds (the run's own seed left out when the
  method is the baseline), a measure of how hard the question is that no stated report enters;
- **confidence -> easy**: the stated confidence's AUROC for telling the problems of above-median ease from the rest;
- **ease -> own**: the ease's AUROC for the run's own correctness: how much of "right or wrong" the question's
  difficulty alone predicts.

A confidence whose "confidence -> easy" is about its own AUROC ranks questions by how hard they are; one that also
tells a model's right answers from its wrong ones to the same question would need the within-group comparison a
GRPO group makes. Descriptive: means and ranges over seeds, no verdict.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import resultio

from reflectrl.eval.calibration import auroc


def reports(out: Path, task: str, method: str) -> dict[str, dict[str, list]]:
    """Seed -> the held-out reports of each finished run of ``method``."""
    found = {}
    for d in sorted((out / "runs" / task / method).glob("seed_*"), key=lambda p: int(p.name.split("_")[1])):
        if (d / "eval.json").is_file():
            found[d.name.split("_")[1]] = json.loads((d / "eval.json").read_text())["reports"]
    return found


def measure(a: argparse.Namespace) -> dict[str, Any]:
    base = reports(a.out, a.task, a.baseline)
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for m in a.methods:
        rows[m] = {}
        for seed, r in reports(a.out, a.task, m).items():
            others = [b["correct"] for s, b in base.items() if not (m == a.baseline and s == seed)]
            ease = [sum(col) / len(col) for col in zip(*others)]
            keep = [i for i, c in enumerate(r["confidence"]) if c is not None and c == c]
            conf = [r["confidence"][i] for i in keep]
            mid = statistics.median(ease[i] for i in keep)
            rows[m][seed] = {"own_auroc": auroc(conf, [r["correct"][i] for i in keep]),
                             "confidence_to_easy": auroc(conf, [int(ease[i] > mid) for i in keep]),
                             "ease_to_own": auroc([ease[i] for i in keep], [r["correct"][i] for i in keep])}
            print(m, seed, {k: round(v, 3) for k, v in rows[m][seed].items()}, flush=True)
    return {"benchmark": "selfreport_difficulty", "task": a.task, "out": str(a.out), "baseline": a.baseline,
            "runs": rows}


def render(names: list[str]) -> str:
    cols = (("own_auroc", "stated AUROC (own correctness)"), ("confidence_to_easy", "stated confidence -> easy question"),
            ("ease_to_own", "question's ease -> own correctness"))
    lines = ["| method | seeds | " + " | ".join(f"{t}, mean [min, max]" for _, t in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for n in names:
        d = json.loads(resultio.results_file(n).read_text())
        for m, seeds in d["runs"].items():
            cells = []
            for key, _ in cols:
                v = [s[key] for s in seeds.values()]
                cells.append(f"{statistics.mean(v):.3f} [{min(v):.3f}, {max(v):.3f}]")
            lines.append(f"| {m} | {len(seeds)} | " + " | ".join(cells) + " |")
        lines.append(f"\nEase: each held-out problem's share of right answers over {d['baseline']}'s seeds (a run of "
                     f"{d['baseline']} leaves its own seed out); easy: above the median ease.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="a `reflectrl llm compare` folder")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--methods", nargs="+", default=[])
    resultio.main(ap, measure, render, needs="out")


if __name__ == "__main__":
    main()
