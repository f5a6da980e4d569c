"""A real-model update at the defaults before and after a chat model took the fast paths, alternating in one process.

    python benchmarks/real_defaults.py [--rounds 3] [--json-out F]
    python benchmarks/real_defaults.py --render F

Two GRPO trainers of ``llm train --recipe real-arith`` (SmolLM2-135M-Instruct, LoRA 16, 8 prompts x 8 samples of
two-digit sums, 4 micro-batches, one thread), the same seed: **before** with ``--attention padded --old-logp
recompute`` (the defaults before), **now** at the defaults (a chat model's ``auto``: the shared-prompt layout; the
recipe's own ``--attention shared-prompt`` is left out so that the defaults decide). Each round times one update of
each on the process CPU clock (``time.process_time``), the order alternating between rounds; both trainers start from
the base model and draw the same problems, and the result says whether each round's two updates sampled the same
tokens (float rounding may part them after the first). It reports each arm's median CPU seconds per update and the
median of the per-round ratios before / now. The machine may be shared and loaded: CPU time, not wall time, and the
ratio of updates timed side by side, are what stand up to that.
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
from resultio import main as run  # noqa: E402
from resultio import results_file  # noqa: E402

ARMS = {"before": ["--attention", "padded", "--old-logp", "recompute"], "now": []}


def trainer(arm: str, a: argparse.Namespace, tmp: str) -> Any:
    from reflectrl.algos import config_for_algo
    from reflectrl.cli.util import config_from_flags
    from reflectrl.experiments.recipes import train_recipe
    from reflectrl.llm.grpo import GRPO

    r = train_recipe("real-arith")
    flags = list(r.flags)
    if "--attention" in flags:  # the defaults decide
        i = flags.index("--attention")
        del flags[i:i + 2]
    flags += [*ARMS[arm], "--updates", str(a.rounds + 1), "--run-dir", f"{tmp}/{arm}", "--no-progress",
              "--no-tensorboard", "--no-export-model", "--sample-interval", "0", "--cpu-time-limit-s", "1e9",
              "--seed", str(a.seed)]
    default = config_for_algo(r.algo, model=r.model, lora_r=16, task=r.task, task_options=r.task_options)
    return GRPO(config_from_flags(default, flags, "real_defaults", "llm", False))


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    tmp = tempfile.mkdtemp(prefix="real-defaults-")
    ts = {arm: trainer(arm, a, tmp) for arm in ARMS}
    cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    same, ratios = [], []
    for r in range(a.rounds):
        order = list(ARMS) if r % 2 == 0 else list(ARMS)[::-1]
        for arm in order:
            t0 = time.process_time()
            ts[arm].iteration()
            cpu[arm].append(time.process_time() - t0)
        b, n = ts["before"].last_batch, ts["now"].last_batch
        same.append(b.response_ids.shape == n.response_ids.shape and bool(torch.equal(b.response_ids, n.response_ids)))
        ratios.append(cpu["before"][-1] / cpu["now"][-1])
        print(f"round {r + 1}: before {cpu['before'][-1]:.1f} CPU s, now {cpu['now'][-1]:.1f} CPU s, same tokens "
              f"{same[-1]}", file=sys.stderr, flush=True)
    settings = {arm: {"attention": t.cfg.attention, "old_logp": t.cfg.old_logp} for arm, t in ts.items()}
    for t in ts.values():
        t.close()
    return {"model": "smollm2-135m-instruct", "recipe": "real-arith", "rounds": a.rounds, "settings": settings,
            "cpu_s_per_update": {arm: statistics.median(v) for arm, v in cpu.items()}, "cpu_s": cpu,
            "ratio_before_over_now": statistics.median(ratios), "ratios": ratios, "same_tokens": same,
            "torch": torch.__version__}


def render(names: list[str]) -> str:
    lines = ["| arm | --attention | --old-logp | CPU s per update (median) |", "|---|---|---|---|"]
    r = json.loads(results_file(names[0]).read_text())
    for arm in ARMS:
        s = r["settings"][arm]
        lines.append(f"| {arm} | {s['attention']} | {s['old_logp']} | {r['cpu_s_per_update'][arm]:.1f} |")
    same = sum(r["same_tokens"])
    lines += ["", f"Median of the per-round ratios, before / now: **{r['ratio_before_over_now']:.2f}x** "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in r['ratios'])}); the two arms sampled the same tokens in "
                  f"{same} of {r['rounds']} rounds (torch {r['torch']})."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    run(ap, measure, render)


if __name__ == "__main__":
    main()
