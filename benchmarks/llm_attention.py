"""The training forward in its three layouts: ``padded`` (left-padded prompts under an attention mask) against
``causal`` (rows right-padded under the plain causal kernel, ``reflectrl llm train --attention causal``) and
``shared-prompt`` (each distinct prompt run once, the responses on its keys and values, ``--attention shared-prompt``).

    python benchmarks/llm_attention.py --model DIR --task arith [--rows 64] [--reps 20] [--json-out F]
    python benchmarks/llm_attention.py --render F [F ...]

One GRPO update of ``--algo`` (default grpo) on ``--task`` gives a real batch (its rollout's prompts, turns and
padding); then a forward and backward of the policy's log-probs over that batch, as the update computes them,
runs ``--reps`` times in each layout, in a rotating order, in one process, timed by the process's CPU clock (all
threads) so that other load on a shared machine does not skew the ratio. It reports the CPU seconds per pass of each
layout, each one's speedup over padded (the median and range of the per-round paired ratios), the load averages
before each round, and the largest log-prob difference from padded. The batch is the whole
update's (a group's rows together), as one micro-batch. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resultio import load_average, paired_ratios, results_file  # noqa: E402
from resultio import main as run  # noqa: E402


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from reflectrl.algos import config_for_algo
    from reflectrl.llm.grpo import GRPO

    with tempfile.TemporaryDirectory() as tmp:
        cfg = config_for_algo(a.algo, task=a.task, model=a.model, run_dir=str(Path(tmp) / "run"), updates=1,
                              prompts_per_update=a.rows // a.group_size, group_size=a.group_size,
                              task_options=tuple(a.set), threads=a.threads, lora_r=a.lora_r, progress=False,
                              tensorboard=False, save_interval=0, sample_interval=0, export_model=False, seed=a.seed)
        trainer = GRPO(cfg)
        trainer.iteration()
        trainer.rollout.close()
    policy, batch = trainer.policy, trainer.last_batch.trimmed()
    layouts = ["padded", "causal", "shared-prompt"]
    cpu: dict[str, list[float]] = {k: [] for k in layouts}
    logp: dict[str, Any] = {}
    loads = []
    for rep in range(a.reps + 1):
        loads.append(load_average())
        for layout in layouts[rep % 3:] + layouts[:rep % 3]:
            policy.attention = layout
            policy.zero_grad(set_to_none=True)
            c0 = time.process_time()
            out = policy.forward_batch(batch, with_entropy=True, temperature=cfg.temperature)
            (out.logp.sum() + out.entropy.sum()).backward()
            if rep:  # the first pass of each warms up
                cpu[layout].append(time.process_time() - c0)
            logp[layout] = out.logp.detach()
    mask = batch.completion_mask
    med = {k: statistics.median(v) for k, v in cpu.items()}
    causal, shared = paired_ratios(cpu["padded"], cpu["causal"]), paired_ratios(cpu["padded"], cpu["shared-prompt"])
    return {"task": a.task, "model": a.model, "algo": a.algo, "rows": batch.rows,
            "prompt_width": int(batch.prompt_ids.shape[1]), "response_width": batch.steps,
            "pad_share": 1.0 - float(batch.attention_mask.float().mean()),
            "threads": torch.get_num_threads(), "reps": a.reps,
            "padded_cpu_s": med["padded"], "causal_cpu_s": med["causal"],
            "speedup": causal["median"], "speedup_range": causal["range"], "rounds_cpu_s": cpu, "load_before": loads,
            "max_logp_diff": float((logp["padded"] - logp["causal"])[mask].abs().max()),
            "distinct_prompts": len({tuple(q) for q in batch.prompt_tokens()}),
            "shared_prompt_cpu_s": med["shared-prompt"],
            "shared_prompt_speedup": shared["median"], "shared_prompt_speedup_range": shared["range"],
            "shared_prompt_max_logp_diff": float((logp["padded"] - logp["shared-prompt"])[mask].abs().max()),
            "command": " ".join(["python", "benchmarks/llm_attention.py", *sys.argv[1:]])}


def render(paths: list[str]) -> str:
    lines = ["| task | model | rows (distinct prompts) | prompt + response width | padding | padded CPU s | "
             "causal CPU s (speedup) | shared-prompt CPU s (speedup) | largest log-prob difference (causal, shared) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in paths:
        path = results_file(p)
        r = json.loads(path.read_text())
        model = "tiny (a warm-up)" if "/" in r["model"] else r["model"]
        shared = "shared_prompt_cpu_s" in r  # results before the third layout have two
        lines.append(f"| {r['task']} | {model} | {r['rows']}"
                     + (f" ({r['distinct_prompts']})" if shared else "")
                     + f" | {r['prompt_width']} + {r['response_width']} | {100 * r['pad_share']:.0f}% | "
                     f"{r['padded_cpu_s']:.3f} | {r['causal_cpu_s']:.3f} ({r['speedup']:.2f}x{star(r)}) | "
                     + (f"{r['shared_prompt_cpu_s']:.3f} ({r['shared_prompt_speedup']:.2f}x{star(r)})" if shared
                        else "not measured")
                     + f" | {r['max_logp_diff']:.1e}"
                     + (f", {r['shared_prompt_max_logp_diff']:.1e}" if shared else "") + " |")
    if any("x*)" in line for line in lines):
        lines += ["", "* a ratio of the medians: the file was written before the ratios were taken per round, and its "
                  "per-round times were not kept."]
    return "\n".join(lines)


def star(r: dict) -> str:
    """A mark on a speedup that is a ratio of medians (a file from before the per-round ratios)."""
    return "" if "speedup_range" in r else "*"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model directory (a warmed-up tiny model) or a known model name")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--algo", default="grpo")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a task option (repeatable)")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lora-r", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    run(ap, measure, render, needs="model")


if __name__ == "__main__":
    main()
