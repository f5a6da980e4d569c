"""The update's memory estimate (``reflectrl.llm.memory``) against the measured peak of real updates.

Each setting trains one update of the real model (SmolLM2-135M-Instruct, LoRA 16, arith) in its own process, at the
settings the trainer chooses or is given, and records the estimated peak (the plan the trainer checked) beside the
process's measured peak resident memory; the estimate should be above the measurement, by a margin that is not
wasteful.

    python benchmarks/memory_estimate.py --json-out benchmarks/results/memory_estimate.json   # ~12 CPU-minutes
    python benchmarks/memory_estimate.py --render memory_estimate.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from resultio import main, results_file

GIB = 1 << 30
SETTINGS: dict[str, list[str]] = {
    # the README's rlcr command at its defaults (16 prompts x 8, the asked confidence turn): micro-batches chosen
    "rlcr, defaults": ["--algo", "rlcr"],
    "grpo, defaults": ["--algo", "grpo"],
    # the one-CPU-hour settings of the real-model benchmarks: a given split
    "grpo, 8 x 8, --grad-accum 4": ["--algo", "grpo", "--prompts-per-update", "8", "--grad-accum", "4"],
}


def child(flags: list[str], run_dir: str) -> dict[str, Any]:
    """One update in this process: the plan the trainer checked, and the peak resident memory of the process."""
    import resource

    from reflectrl.algos import get_algo
    from reflectrl.cli.util import config_from_flags
    from reflectrl.llm.memory import estimate_update

    algo = get_algo("llm", flags[flags.index("--algo") + 1])
    rest = [f for i, f in enumerate(flags) if f != "--algo" and (i == 0 or flags[i - 1] != "--algo")]
    base = ["--task", "arith", "--model", "smollm2-135m-instruct", "--lora-r", "16", "--updates", "1", "--threads",
            "1", "--run-dir", run_dir, "--no-progress", "--no-tensorboard", "--no-export-model"]
    default = algo.config(model="smollm2-135m-instruct", lora_r=16)
    cfg = config_from_flags(default, base + rest, "memory_estimate", "llm", True)
    trainer = algo.make(cfg)
    found = estimate_update(trainer.cfg, trainer.policy, trainer.prompt_lengths)
    assert found is not None
    plan = found[0]
    trainer.learn()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    batch = trainer.last_batch
    return {"estimate_gib": plan.peak / GIB, "held_gib": plan.held / GIB,
            "phases_gib": {k: v / GIB for k, v in plan.phases.items()}, "measured_gib": peak / GIB,
            "micro_batch_tokens": trainer.cfg.micro_batch_tokens, "grad_accum": trainer.cfg.grad_accum,
            "rows": batch.rows if batch is not None else None,
            "width": (batch.prompt_ids.shape[1] + batch.response_ids.shape[1]) if batch is not None else None}


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    rows = []
    for name, flags in SETTINGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
            out = subprocess.run([sys.executable, __file__, "--child", json.dumps(flags), str(Path(tmp) / "run")],
                                 env=env, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
        row["setting"] = name
        row["ratio"] = row["estimate_gib"] / row["measured_gib"]
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return {"model": "smollm2-135m-instruct", "task": "arith", "lora_r": 16, "threads": 1, "rows": rows}


def render(files: list[str]) -> str:
    lines = []
    for f in files:
        res = json.loads(results_file(f).read_text())
        lines += [f"One update of {res['model']} (LoRA {res['lora_r']}, {res['task']}), one thread: the trainer's "
                  "estimate of its peak memory against the process's measured peak resident memory.", "",
                  "| setting | micro-batches | rows x width | estimated peak (GiB) | measured peak (GiB) | "
                  "estimate / measured |", "|---|---|---|---|---|---|"]
        for r in res["rows"]:
            split = (f"at most {r['micro_batch_tokens']} tokens" if r["micro_batch_tokens"]
                     else f"{r['grad_accum']} equal splits")
            lines.append(f"| {r['setting']} | {split} | {r['rows']} x {r['width']} | {r['estimate_gib']:.1f} | "
                         f"{r['measured_gib']:.1f} | {r['ratio']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]), sys.argv[3])))
    else:
        main(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]), measure, render)
