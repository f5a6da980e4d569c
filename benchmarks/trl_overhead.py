"""What reflectrl's TRL reward and calibration callback add to a TRL GRPO step, on a tiny model on the CPU.

    python benchmarks/trl_overhead.py [--rounds 5] [--steps 8] [--json-out benchmarks/results/trl_overhead.json]

Each round runs TRL's ``GRPOTrainer`` twice, in fresh processes and alternating order: with a plain reward function
that returns zeros (what any TRL step costs), and with ``reflectrl.integrations.trl.rlcr_reward`` (arith's verifier and
the confidence parser) recording into a ``RewardLog`` that a ``CalibrationCallback`` reads at every step. The same
tiny model (a fresh init-tiny, 2 layers, width 64), prompts, seeds and shapes on both sides; the first ``--warmup``
steps are not timed. The result is the median over rounds of the time per step, wall and process CPU, their ratio
as the median (and range) of the per-round paired ratios, the machine's load averages before each round, and,
measured inside the same run, the share of a step's wall time spent in reflectrl's reward and callback
(the A/B ratio of whole steps is at the mercy of other load on a shared machine; the share is not). The bar is 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(a: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reflectrl.integrations.trl import CalibrationCallback, RewardLog, rlcr_reward, task_dataset

    torch.set_num_threads(1)
    times: list[tuple[float, float]] = []

    marks: list[tuple[float, float]] = []

    class Timer(TrainerCallback):  # a step runs from one step's start to the next: its logging (the callback) in
        def on_step_begin(self, args, state, control, **kw):
            marks.append((time.perf_counter(), time.process_time()))

        def on_train_end(self, args, state, control, **kw):
            marks.append((time.perf_counter(), time.process_time()))
            times.extend((b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:]))

    log = RewardLog()
    inside = [0.0]  # wall seconds spent in reflectrl's reward and callback, measured around their calls

    def timed(fn):
        def run(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                inside[0] += time.perf_counter() - t0
        return run

    if a.kind == "reflectrl":
        reward, callback = rlcr_reward("arith", log=log), CalibrationCallback(log)
        reward_call, callback.on_log = reward.__call__, timed(callback.on_log)

        def reflectrl_rlcr(*args, **kw):
            return timed(reward_call)(*args, **kw)

        rewards, callbacks = [reflectrl_rlcr], [Timer(), callback]
    else:
        def zeros(completions, **kw):
            return [0.0] * len(completions)

        rewards, callbacks = [zeros], [Timer()]
    args = GRPOConfig(output_dir=str(Path(a.tmp) / a.kind), per_device_train_batch_size=16, num_generations=8,
                      max_completion_length=16, max_steps=a.warmup + a.steps, learning_rate=1e-4, logging_steps=1,
                      beta=0.0, use_cpu=True, bf16=False, report_to="none", save_strategy="no", seed=0,
                      dataloader_num_workers=0, disable_tqdm=True)
    tok = AutoTokenizer.from_pretrained(a.model)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(a.model), processing_class=tok,
                          reward_funcs=rewards, args=args, callbacks=callbacks,
                          train_dataset=task_dataset("arith", self_report="confidence", chat=False))
    trainer.train()
    kept = times[a.warmup:]
    total = sum(t for t, _ in times)
    return {"wall_per_step": sum(t for t, _ in kept) / len(kept), "cpu_per_step": sum(c for _, c in kept) / len(kept),
            "inside_share": inside[0] / total if total else 0.0}


def ratios(runs: dict[str, list[dict]]) -> dict:
    """reflectrl's time per step over the plain reward's, wall and CPU: the median (and range) of the per-round paired
    ratios (both arms of a round ran under its load)."""
    out: dict = {}
    for clock, key in (("wall", "wall_per_step"), ("cpu", "cpu_per_step")):
        per = [x[key] / y[key] for x, y in zip(runs["reflectrl"], runs["plain"])]
        out.update({f"ratio_{clock}": statistics.median(per), f"ratio_{clock}_range": [min(per), max(per)]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=["plain", "reflectrl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--kind", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--render", default=None, metavar="JSON", help="print the table of a result file")
    a = ap.parse_args()
    if a.render:
        path = Path(a.render)
        r = json.loads((path if path.exists() else Path(__file__).resolve().parent / "results" / path).read_text())
        print("| | TRL step, s (wall) | TRL step, CPU s |\n|---|---|---|")
        for k in ("plain", "reflectrl"):
            print(f"| {'a reward returning zeros' if k == 'plain' else 'reflectrl rlcr_reward + CalibrationCallback'} | "
                  f"{r[k]['wall_per_step']:.3f} | {r[k]['cpu_per_step']:.3f} |")
        print(f"\nTime inside reflectrl's reward and callback, measured around their calls: **{100 * r['inside_share']:.2f}%** "
              f"of a step's wall time. Whole steps, with against without: {r['ratio_wall']:.3f}x wall, "
              f"{r['ratio_cpu']:.3f}x CPU (medians of the per-round paired ratios, rounds {r['ratio_wall_range'][0]:.3f}-"
              f"{r['ratio_wall_range'][1]:.3f} and {r['ratio_cpu_range'][0]:.3f}-{r['ratio_cpu_range'][1]:.3f}; "
              f"{r['rounds']} rounds of {r['steps']} timed steps, {r['rows']} "
              f"completions a step, on a machine shared with other runs; TRL {r['trl_version']}).")
        return
    if a.worker:
        a.kind = a.worker
        print(json.dumps(worker(a)))
        return
    from reflectrl.llm.tiny import init_tiny

    results: dict[str, list[dict]] = {"plain": [], "reflectrl": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(init_tiny(Path(tmp) / "tiny", layers=2, width=64, heads=4, max_positions=256, seed=0))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        loads = []
        for r in range(a.rounds):
            loads.append([round(x, 2) for x in os.getloadavg()])
            for kind in (("plain", "reflectrl") if r % 2 == 0 else ("reflectrl", "plain")):
                proc = subprocess.run([sys.executable, __file__, "--worker", kind, "--tmp", tmp, "--model", model,
                                       "--steps", str(a.steps), "--warmup", str(a.warmup)], capture_output=True,
                                      text=True, env=env)
                if proc.returncode != 0:
                    sys.exit(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                results[kind].append(res)
                print(f"round {r + 1} {kind}: {res['wall_per_step']:.3f} s/step, {res['cpu_per_step']:.3f} CPU s/step",
                      flush=True)
    import trl

    med = {k: {m: statistics.median(x[m] for x in v) for m in ("wall_per_step", "cpu_per_step")}
           for k, v in results.items()}
    share = statistics.median(x["inside_share"] for x in results["reflectrl"])
    out = {"benchmark": "trl_overhead", **med, "inside_share": share, **ratios(results), "rounds": a.rounds,
           "steps": a.steps, "rows": 16, "trl_version": trl.__version__, "runs": results, "load_before": loads}
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
