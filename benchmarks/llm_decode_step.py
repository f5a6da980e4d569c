"""The sampler's lean decoding step against the model's forward at every step: one rollout, both ways, alternating.

    python benchmarks/llm_decode_step.py --task rag [--model DIR] [--reps 4] [--json-out F]
    python benchmarks/llm_decode_step.py --render F [F ...]

The model is ``--model`` (a directory or a named model) or, where none is given, the task's recipe warm-up (made by
``llm_update_speed.py``'s commands under ``--out``, and kept). A GRPO trainer at the task's recipe settings (its
``--prompts-per-update`` and ``--group-size`` replaced where given; a named model runs with ``--lora-r``) draws one
update's problems; then the same rollout (the same problems and generator state, every turn, rewards included) runs
``--reps`` times each way, alternating which goes first, in one process: with the lean step (the default,
``reflectrl.llm.decode``) and with ``--engine-options lean_step=false`` (the model's forward at every step).
Each rollout is timed by the process's CPU clock (all threads, so that other load on a shared machine does not skew
the ratio), and its episodes are compared: the two ways must draw the same tokens. It reports the median CPU seconds
per rollout each way, the sampling loop's share of them (the generate time less the prefill), the speedup (the median
and range of the per-round paired ratios, forward over lean in the same round), the machine's load averages before
each round, and whether every rollout drew the same tokens. The last line of output is one JSON object.
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
    from llm_learn import preset
    from llm_update_speed import warmed_up

    from reflectrl.algos import config_for_algo
    from reflectrl.cli.util import config_from_flags
    from reflectrl.llm.grpo import GRPO

    torch.set_num_threads(1)
    p = preset(a.task)
    model = a.model or str(warmed_up(a.task, Path(a.out)))
    flags = [*p["train"], "--max-new-tokens", str(p["max_new_tokens"])] if not a.model else []
    for name, value in (("--prompts-per-update", a.prompts), ("--group-size", a.group)):
        if value is not None:
            flags += [name, str(value)]
    with tempfile.TemporaryDirectory() as tmp:
        base = config_for_algo("grpo", task=a.task, model=model, run_dir=str(Path(tmp) / "run"), updates=1, seed=1,
                               progress=False, tensorboard=False, save_interval=0, sample_interval=0,
                               export_model=False, threads=1, lora_r=a.lora_r if a.model else 0,
                               task_options=tuple(a.set), reward_cache=0)  # every rollout scores its own
        trainer = GRPO(config_from_flags(base, flags, "llm_decode_step", "llm", False))
        problems, group, offset, gen = trainer.draw_problems()
        state = gen.get_state()
        engine, policy = trainer.rollout.engine, trainer.policy
        cpu: dict[str, list[float]] = {"lean": [], "forward": []}
        loop: dict[str, list[float]] = {"lean": [], "forward": []}
        episodes: dict[str, Any] = {}
        same = True
        loads = []
        for rep in range(a.reps + 1):
            loads.append(load_average())
            for arm in (("lean", "forward") if rep % 2 else ("forward", "lean")):
                engine.lean_step = arm == "lean"
                engine.sync(policy)  # nothing kept from the other way's rollout
                gen.set_state(state)
                c0 = time.process_time()
                batch, stats = trainer.rollout.run(problems, group, gen, index_offset=offset)
                c = time.process_time() - c0
                if rep:  # the first rollout each way warms up
                    cpu[arm].append(c)
                    loop[arm].append(stats.generate_s - stats.prefill_s)
                ids = batch.response_ids.tolist()
                same = same and episodes.setdefault("ids", ids) == ids
        tokens = int(batch.completion_mask.sum())
        trainer.rollout.close()
    med = {k: statistics.median(v) for k, v in cpu.items()}
    return {"benchmark": "llm_decode_step", "task": a.task, "model": a.model or "the recipe's warm-up",
            "rows": batch.rows, "generated_tokens": tokens, "reps": a.reps, "clock": "process CPU time (threads=1)",
            "cpu_s_per_rollout": med, "rounds": cpu,
            "sampling_loop_s": {k: statistics.median(v) for k, v in loop.items()},
            **speedup(cpu), "load_before": loads, "same_tokens": same}


def speedup(cpu: dict[str, list[float]]) -> dict[str, Any]:
    """The lean step's speedup: the median (and range) of the per-round paired ratios, the forward's CPU seconds over
    the lean step's in the same round."""
    r = paired_ratios(cpu["forward"], cpu["lean"])
    return {"speedup": r["median"], "speedup_range": r["range"]}


def render(names: list[str]) -> str:
    lines = ["| task | model | rows | CPU s per rollout, forward | CPU s per rollout, lean step | speedup | sampling "
             "loop s, forward | sampling loop s, lean step | same tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        r = json.loads(results_file(n).read_text())
        c, s = r["cpu_s_per_rollout"], r["sampling_loop_s"]
        lines.append(f"| {r['task']} | {r['model']} | {r['rows']} | {c['forward']:.3f} | {c['lean']:.3f} | "
                     f"{r['speedup']:.2f}x | {s['forward']:.3f} | {s['lean']:.3f} | {'yes' if r['same_tokens'] else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="rag")
    ap.add_argument("--model", default=None, help="a model directory or named model (default: the recipe's warm-up)")
    ap.add_argument("--out", default="runs/bench/update_speed", help="where the recipe's warm-up is (made if missing)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per update (default: the recipe's)")
    ap.add_argument("--group", type=int, default=None, help="group size (default: the recipe's)")
    ap.add_argument("--lora-r", type=int, default=16, help="LoRA rank with --model")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a task option")
    ap.add_argument("--reps", type=int, default=4, help="timed rollouts each way")
    run(ap, measure, render)


if __name__ == "__main__":
    main()
