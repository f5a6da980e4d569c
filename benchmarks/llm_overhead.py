"""CPU cost of each LLM method per token against its baseline, same model and settings, alternating in one run.

    python benchmarks/llm_overhead.py --model runs/cmp_llm/arith13/models/arith/seed_1/warmup --updates 20 \
        --rounds 5 --json-out benchmarks/results/llm_overhead.json

Each round trains every method and its baseline (grpo; drgrpo for exgrpo) for ``--updates`` updates on the
task with the recipe's settings, in this process, in a rotating order; the report is the median over rounds
of each method's ratio to its baseline of the same round of **process CPU seconds per token** (this machine
may be shared: CPU time, not wall time, and ratios within a round). Tokens are the completion tokens of the
trained batches (``rollout/generated_tokens``, plus the stored rows exgrpo replays, which are trained but not
generated), so a reflection turn's tokens count as tokens, as the bars ask. exgrpo runs with
``--exgrpo-start-rate 0`` so that its replay is on for the whole measurement. ``rlcr`` asks for its confidence in a
turn of its own; ``rlcr-inline`` is rlcr ``--self-report inline`` (the confidence at the end of the answer: measure it
on a model warmed up with ``--self-report inline``, whose answers carry the tag).

Four rows without a bar split the asked self-report's cost in two: ``grpo-reflect`` / ``grpo-confidence`` is GRPO
asking the same question after each episode (the turn trained, no bonus) against plain GRPO, the turn's own cost;
``refgrpo@asked`` / ``rlcr@asked`` is the method against that GRPO, what the method adds beyond its turn.
``refgrpo-kept`` and ``rlcr-kept`` are the methods with ``--engine-options reuse_cache=true``: the report turn
continues each row's KV cache instead of prefilling the transcript again (bar 1.10 against GRPO).
``refgrpo-fast`` and ``rlcr-fast`` are the methods against ``grpo-fast``, all three with the speed work's opt-in
flags: ``--old-logp engine`` (no no-grad pass, which runs over the asked turn's question too),
``--engine-options reuse_cache=true`` and ``--attention causal`` (bar 1.10).
``exgrpo-seed-terminal`` is exgrpo-seed with ``--refl-credit terminal`` (its LLM default before this version);
``exgrpo-seed-lm`` is exgrpo-seed with the language-model reflector (``--refl-reflector lm``: the policy grades every
episode), against GRPO and (``@network``) against exgrpo-seed's network reflector. A subset of rows
(``--methods``) is best written to a results file of its own, since the file holds the rows of one run.
``--prompts-per-update`` and ``--group-size`` replace the recipe's batch (the methods' fixed cost per update weighs
more on a small batch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from reflectrl.algos import get_algo
from reflectrl.cli.util import config_from_flags
from reflectrl.experiments.recipes import recipe
from reflectrl.runlog import read_metrics
from reflectrl.tasks.base import parse_options

RUNS = {  # label: (algo, extra options) of one training run per round
    "grpo": ("grpo", {}),
    "drgrpo": ("drgrpo", {}),
    "grpo-reflect": ("grpo", {"self_report": "reflect"}),
    "grpo-confidence": ("grpo", {"self_report": "confidence"}),
    "refgrpo": ("refgrpo", {}),
    "rlcr": ("rlcr", {}),
    "rlcr-inline": ("rlcr", {"self_report": "inline"}),
    "refgrpo-seed": ("refgrpo-seed", {}),
    "gear-seed": ("gear-seed", {}),
    "gear": ("gear", {}),
    "exgrpo": ("exgrpo", {"exgrpo_start_rate": 0.0}),
    "exgrpo-seed": ("exgrpo-seed", {}),
    "exgrpo-seed-terminal": ("exgrpo-seed", {"refl_credit": "terminal"}),
    "exgrpo-seed-lm": ("exgrpo-seed", {"refl_reflector": "lm"}),
    # the asked self-report turn with each row's KV cache kept from the answer (no second prefill)
    "refgrpo-kept": ("refgrpo", {"engine_options": ("reuse_cache=true",)}),
    "rlcr-kept": ("rlcr", {"engine_options": ("reuse_cache=true",)}),
    # the speed work's opt-in flags on both sides: the sampler's log-probs as the old ones (no no-grad pass over the
    # asked turn's question), the report turn continuing the answer's KV cache, the causal layout
    **{f"{k}-fast": (k, {"old_logp": "engine", "engine_options": ("reuse_cache=true",), "attention": "causal"})
       for k in ("grpo", "refgrpo", "rlcr")},
}
METHODS = {  # row label: (run, baseline run, bar; None: a decomposition row without a bar)
    "refgrpo": ("refgrpo", "grpo", 1.05),
    "rlcr": ("rlcr", "grpo", 1.05),
    "rlcr-inline": ("rlcr-inline", "grpo", 1.05),
    "refgrpo-seed": ("refgrpo-seed", "grpo", 1.10),
    "gear-seed": ("gear-seed", "grpo", 1.10),
    "gear": ("gear", "grpo", 1.35),
    "exgrpo": ("exgrpo", "drgrpo", 1.10),
    "exgrpo-seed": ("exgrpo-seed", "grpo", 1.10),
    "exgrpo-seed-terminal": ("exgrpo-seed-terminal", "grpo", None),
    # the language-model reflector (the policy grading each episode), reported apart: against GRPO, and against
    # the network reflector (what the grader adds)
    "exgrpo-seed-lm": ("exgrpo-seed-lm", "grpo", None),
    "exgrpo-seed-lm@network": ("exgrpo-seed-lm", "exgrpo-seed", None),
    # the asked turn's own cost against the method's: GRPO asking the same question, without a bonus
    "grpo-reflect": ("grpo-reflect", "grpo", None),
    "refgrpo@asked": ("refgrpo", "grpo-reflect", None),
    "grpo-confidence": ("grpo-confidence", "grpo", None),
    "rlcr@asked": ("rlcr", "grpo-confidence", None),
    # the asked turn without its second prefill (--engine-options reuse_cache=true), against plain GRPO
    "refgrpo-kept": ("refgrpo-kept", "grpo", 1.10),
    "rlcr-kept": ("rlcr-kept", "grpo", 1.10),
    # both with the speed work's opt-in flags (``-fast``: --old-logp engine, reuse_cache=true, --attention causal)
    "refgrpo-fast": ("refgrpo-fast", "grpo-fast", 1.10),
    "rlcr-fast": ("rlcr-fast", "grpo-fast", 1.10),
}


def train_flags(task: str, prompts: int | None, group: int | None) -> tuple[str, ...]:
    """The recipe's train flags of ``task``, with ``--prompts-per-update`` and ``--group-size`` replaced where given."""
    flags = list(recipe(task).train)
    for name, value in (("--prompts-per-update", prompts), ("--group-size", group)):
        if value is not None:
            i = flags.index(name)
            flags[i + 1] = str(value)
    return tuple(flags)


def run(algo: str, model: str, task: str, updates: int, seed: int, extra: dict, flags: tuple[str, ...]) -> dict:
    a = get_algo("llm", algo)
    with tempfile.TemporaryDirectory() as d:
        cfg = config_from_flags(a.config(task=task, model=model, run_dir=d, updates=updates, seed=seed, progress=False,
                                         tensorboard=False, save_interval=0, sample_interval=0, export_model=False,
                                         **extra), list(flags), "llm_overhead", "llm", False)
        trainer = a.make(cfg)
        c0 = time.process_time()
        trainer.learn()
        cpu = time.process_time() - c0
        recs = read_metrics(Path(d) / "metrics.jsonl")
    generated = sum(r.get("rollout/generated_tokens", 0) for r in recs)
    share = statistics.median(r.get("losses/stored_share", 0.0) for r in recs)
    tokens = generated / max(1e-9, 1.0 - share)  # exgrpo's stored rows are trained tokens too
    return {"cpu_s": cpu, "tokens": tokens, "generated_tokens": generated, "cpu_per_token": cpu / max(tokens, 1.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a warmed-up model directory (one of llm compare's models)")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", nargs="*", default=list(METHODS))
    ap.add_argument("--prompts-per-update", type=int, default=None, help="in place of the recipe's")
    ap.add_argument("--group-size", type=int, default=None, help="in place of the recipe's")
    ap.add_argument("--no-recipe", action="store_true",
                    help="the trainer's defaults (with --config) in place of the task's recipe train flags")
    ap.add_argument("--config", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="config fields for every run (VALUE read as JSON when it parses, else text), e.g. lora_r=16 "
                         "'task_options=[\"ops=+\"]'")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    flags = () if a.no_recipe else train_flags(a.task, a.prompts_per_update, a.group_size)
    common = {k: tuple(v) if isinstance(v, list) else v for k, v in parse_options(a.config).items()}  # task_options
    if a.no_recipe:
        common.update({k: v for k, v in (("prompts_per_update", a.prompts_per_update), ("group_size", a.group_size))
                       if v is not None})
    unknown = [m for m in a.methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    algos = sorted({METHODS[m][0] for m in a.methods} | {METHODS[m][1] for m in a.methods})
    rows, loads = [], []
    for r in range(a.rounds):
        order = algos[r % len(algos):] + algos[:r % len(algos)]
        loads.append([round(x, 2) for x in os.getloadavg()])
        res = {}
        for algo in order:
            name, extra = RUNS[algo]
            res[algo] = run(name, a.model, a.task, a.updates, r + 1, {**common, **extra}, flags)
            print(f"round {r + 1} {algo}: {res[algo]['cpu_s']:.1f} CPU-s, {res[algo]['tokens']:.0f} tokens",
                  file=sys.stderr, flush=True)
        rows.append(res)
    out: dict = {"benchmark": "llm_overhead", "task": a.task, "model": a.model, "updates": a.updates, "rounds": a.rounds,
                 "settings": " ".join([*flags, *(f"{k}={v}" for k, v in common.items())]),
                 "clock": "process CPU seconds per token", "load_before": loads}
    for m in a.methods:
        label, base, bar = METHODS[m]
        ratios = [row[label]["cpu_per_token"] / row[base]["cpu_per_token"] for row in rows]
        update_ratios = [row[label]["cpu_s"] / row[base]["cpu_s"] for row in rows]
        out[m] = {"baseline": base, "ratio_per_token": round(statistics.median(ratios), 3),
                  "ratios_per_token": [round(x, 3) for x in ratios],
                  "ratio_per_update": round(statistics.median(update_ratios), 3),
                  "tokens_per_update_ratio": round(statistics.median(row[label]["tokens"] / row[base]["tokens"]
                                                                     for row in rows), 3),
                  "bar": bar, "within_bar": None if bar is None else statistics.median(ratios) <= bar,
                  "algo": RUNS[label][0], "options": RUNS[label][1], "baseline_options": RUNS[base][1]}
    print(json.dumps(out))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
