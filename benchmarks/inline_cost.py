"""What the inline self-report costs per update on the real model, against GRPO at the same settings.

    python benchmarks/inline_cost.py --arms rlcr-inline-batch-rank refgrpo-inline --rounds 3 --updates 4 \\
        --json-out benchmarks/results/inline_cost.json
    python benchmarks/inline_cost.py --task text2sql --arms rlcr-inline-batch-rank --rounds 3 --updates 4 \\
        --json-out benchmarks/results/inline_cost_text2sql.json
    python benchmarks/inline_cost.py --render inline_cost.json

Each round trains SmolLM2-135M-Instruct from the base model with GRPO and with each self-report arm, at the
settings of ``benchmarks/real_equal.py`` (LoRA 16, 8 prompts x 8, one thread, shared-prompt layout), in fresh
processes one at a time, the arms' order reversed every other round. Per run: the median over updates 2..N of the
process CPU seconds of an update (``time/cpu_iteration``: the first update warms the allocator up), split into
generating and training by the run's own timers, and the mean response tokens per row (answer plus report). The
ratio is the median over rounds of arm / GRPO within the round; the bar is 1.15x. The load average is recorded
before each round. ``--task text2sql`` measures the same on a task with longer answers (the report's tokens are a
smaller share of each row).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import resultio
from real_equal import ARMS, MODEL, TASK, TRAIN
from real_model import reflectrl as run_cli

from reflectrl.runlog import read_metrics

BAR = 1.15


TASKS = {"arith": TASK, "text2sql": ("--task", "text2sql")}


def one_run(arm: str, updates: int, seed: int, root: Path, task: str = "arith") -> dict[str, float]:
    """Train ``arm`` for ``updates`` updates; its per-update medians (updates 2..N)."""
    run = root / f"{arm}_s{seed}"
    run_cli(["llm", "train", *ARMS[arm], *TASKS[task], "--model", MODEL, *TRAIN, "--updates", str(updates), "--seed",
             str(seed), "--run-dir", str(run), "--no-export-model"], root / "train.log")
    recs = read_metrics(run / "metrics.jsonl")[1:]

    def med(key: str) -> float:
        return float(statistics.median(float(r[key]) for r in recs))

    return {"cpu_s": med("time/cpu_iteration"), "generate_s": med("time/generate"), "update_s": med("time/update"),
            "response_tokens": med("completion/mean_length")}


def measure(a: argparse.Namespace) -> dict[str, Any]:
    arms = ["grpo", *[x for x in a.arms if x != "grpo"]]
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = arms if r % 2 == 0 else arms[::-1]
            load = resultio.load_average()
            runs = {arm: one_run(arm, a.updates, a.seed, Path(tmp) / f"round{r}", a.task) for arm in order}
            rounds.append({"order": order, "load_before": load, "runs": runs,
                           "ratio": {arm: runs[arm]["cpu_s"] / runs["grpo"]["cpu_s"] for arm in arms[1:]}})
    summary = {arm: {"ratio_median": statistics.median(x["ratio"][arm] for x in rounds),
                     "ratio_range": [min(x["ratio"][arm] for x in rounds), max(x["ratio"][arm] for x in rounds)],
                     "cpu_s": statistics.median(x["runs"][arm]["cpu_s"] for x in rounds),
                     "response_tokens": statistics.median(x["runs"][arm]["response_tokens"] for x in rounds)}
               for arm in arms[1:]}
    grpo = {k: statistics.median(x["runs"]["grpo"][k] for x in rounds) for k in ("cpu_s", "response_tokens")}
    from reflectrl.tasks.selfreport import INLINE_REPORT_TOKENS

    return {"benchmark": "inline_cost", "model": MODEL, "task": a.task, "updates": a.updates, "rounds": a.rounds, "seed": a.seed,
            "report_tokens": INLINE_REPORT_TOKENS,
            "bar": BAR, "grpo": grpo, "arms": summary, "per_round": rounds,
            "command": "python benchmarks/inline_cost.py" + (f" --task {a.task}" if a.task != "arith" else "")
                       + f" --arms {' '.join(a.arms)} --rounds {a.rounds} --updates {a.updates}",
            "train_flags": " ".join([*TASKS[a.task], *TRAIN])}


def render(files: list[str]) -> str:
    out = []
    for f in files:
        d = json.loads(resultio.results_file(f).read_text())
        out += [f"`{d['command']}` ({d['model']} on {d.get('task', 'arith')}, {d['rounds']} rounds, updates "
                f"2..{d['updates']} of each run; the report's budget {d.get('report_tokens', 'n/a')} tokens)", "",
                "| arm | CPU s / update | response tokens / row | ratio to GRPO (median of rounds) | range | bar |",
                "|---|---|---|---|---|---|",
                f"| grpo | {d['grpo']['cpu_s']:.1f} | {d['grpo']['response_tokens']:.1f} | 1 | | |"]
        for arm, s in d["arms"].items():
            met = "met" if s["ratio_median"] <= d["bar"] else "not met"
            out.append(f"| {arm} | {s['cpu_s']:.1f} | {s['response_tokens']:.1f} | {s['ratio_median']:.2f}x | "
                       f"{s['ratio_range'][0]:.2f}-{s['ratio_range'][1]:.2f} | {d['bar']}x: {met} |")
        out.append("")
    return "\n".join(out).rstrip()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", default=["rlcr-inline-batch-rank", "refgrpo-inline"], choices=sorted(ARMS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--task", default="arith", choices=sorted(TASKS), help="arith (sums, short answers) or text2sql")
    resultio.main(ap, measure, render)
