"""How many inline reports parse inside TRL, from the base real model: ``examples/trl_rlcr.py`` with the inline rollout.

    python benchmarks/trl_inline.py --tasks arith text2sql --steps 4 --json-out benchmarks/results/trl_inline.json
    python benchmarks/trl_inline.py --render trl_inline.json

Per task: TRL's ``GRPOTrainer`` trains SmolLM2-135M-Instruct with LoRA 16 for ``--steps`` steps (8 completions a
step: 2 train prompts x 4) with reflectrl's rlcr reward, the answer sampled at the model's own settings and the
confidence's tag opened after it (``reflectrl.integrations.trl_inline.inline_rollout``); the share of completions
whose report parses, and their accuracy, read from the completions the callback kept. The bar is 90%.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import tempfile
from pathlib import Path
from typing import Any

import resultio

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {"arith": ["ops=+"], "text2sql": []}
BAR = 0.9


def one(task: str, steps: int) -> dict[str, Any]:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    mod = runpy.run_path(str(ROOT / "examples" / "trl_rlcr.py"))
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--model", "smollm2-135m-instruct", "--lora-r", "16", "--steps", str(steps), "--out", tmp,
                "--task", task, "--form", "inline", *[x for o in OPTIONS.get(task, []) for x in ("--set", o)]]
        mod["main"](args)
        rows = [json.loads(line) for line in (Path(tmp) / "completions.jsonl").read_text().splitlines()]
    parsed = [r for r in rows if r["confidence"] is not None]
    return {"task": task, "options": OPTIONS.get(task, []), "completions": len(rows),
            "parsed": len(parsed) / max(1, len(rows)), "accuracy": sum(r["acc"] for r in rows) / max(1, len(rows)),
            "mean_confidence": sum(r["confidence"] for r in parsed) / len(parsed) if parsed else None,
            "command": "python examples/trl_rlcr.py " + " ".join(a for a in args if not a.startswith("/"))}


def measure(a: argparse.Namespace) -> dict[str, Any]:
    return {"benchmark": "trl_inline", "steps": a.steps, "bar": BAR, "tasks": [one(t, a.steps) for t in a.tasks],
            "command": f"python benchmarks/trl_inline.py --tasks {' '.join(a.tasks)} --steps {a.steps}"}


def render(files: list[str]) -> str:
    out = []
    for f in files:
        d = json.loads(resultio.results_file(f).read_text())
        out += [f"`{d['command']}`", "", "| task | completions | reports parsed | bar | accuracy | mean confidence |",
                "|---|---|---|---|---|---|"]
        for t in d["tasks"]:
            met = "met" if t["parsed"] >= d["bar"] else "not met"
            conf = "n/a" if t["mean_confidence"] is None else f"{t['mean_confidence']:.2f}"
            out.append(f"| {t['task']} {' '.join(t['options'])} | {t['completions']} | {t['parsed']:.0%} | "
                       f"{d['bar']:.0%}: {met} | {t['accuracy']:.2f} | {conf} |")
        out.append("")
    return "\n".join(out).rstrip()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["arith", "text2sql"])
    ap.add_argument("--steps", type=int, default=4)
    resultio.main(ap, measure, render)
