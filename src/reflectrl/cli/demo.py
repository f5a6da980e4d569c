"""``reflectrl demo`` (``make demo``): a first look at both front ends in minutes on a laptop CPU.

The control half: ppo, refgrpo-seed and gear-seed on LunarLander-v3 (its tuned preset), a ``reflectrl compare`` folder
with report.md and curves.png. The LLM half: the real model (the ``real-arith`` recipe's, SmolLM2-135M-Instruct) on
held-out two-digit sums before and after a few GRPO updates with LoRA, each evaluation with the confidence the model
states inline after its answer, then the two side by side: the accuracy's gain with its interval, and the
confidence's calibration before and after. ``OUT/llm/summary.json`` holds both evaluations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REAL_RECIPE = "real-arith"


def main(argv: list[str]) -> int:
    """``reflectrl demo``."""
    ap = argparse.ArgumentParser(
        prog="reflectrl demo",
        description="ppo, refgrpo-seed and gear-seed on LunarLander-v3 (its tuned preset), then the real model "
                    f"(the {REAL_RECIPE} recipe's) on held-out sums before and after a few GRPO updates with LoRA, "
                    "with the confidence it states after each answer")
    ap.add_argument("--total-timesteps", type=int, default=300_000, help="steps per control run (default 300000)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per control method (default 3)")
    ap.add_argument("--workers", type=int, default=2, help="control runs at a time (default 2)")
    ap.add_argument("--llm-updates", type=int, default=12,
                    help="GRPO updates of the real model, 8 prompts x 8 samples each (default 12; 0 skips the LLM "
                         "half)")
    ap.add_argument("--llm-problems", type=int, default=100,
                    help="held-out problems of each evaluation, before and after (default 100)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads of the LLM half (default: the CPU count, at most 4)")
    ap.add_argument("--skip-control", action="store_true", help="the LLM half alone")
    ap.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    args = ap.parse_args(argv)
    from ..errors import ConfigError

    if args.llm_updates < 0 or args.llm_problems < 1 or (args.threads is not None and args.threads < 1):
        raise ConfigError("--llm-updates must be >= 0, --llm-problems >= 1 and --threads >= 1")
    if not args.skip_control:
        from ..experiments.compare import main as compare_main

        rc = compare_main([
            "--methods", "ppo", "refgrpo-seed", "gear-seed", "--env-ids", "LunarLander-v3",
            "--seeds", str(args.seeds), "--total-timesteps", str(args.total_timesteps), "--out", args.out,
            "--workers", str(args.workers), "--extra", "--preset", "LunarLander-v3",
        ])
        if rc != 0:
            return rc
    if args.llm_updates == 0:
        return 0
    threads = args.threads or max(1, min(4, os.cpu_count() or 1))
    return demo_llm(Path(args.out) / "llm", args.llm_updates, args.llm_problems, threads)


def _evaluate(model: str, task: str | None, options: tuple[str, ...] | None, problems: int) -> dict[str, Any]:
    from ..llm.evaluate import evaluate

    res = evaluate(model, task, "heldout", 0, task_options=options, limit=problems, self_report="inline",
                   progress=True)
    res.pop("episodes", None)
    return res


def demo_llm(out: Path, updates: int, problems: int, threads: int) -> int:
    """The real model before and after ``updates`` GRPO updates (the recipe's settings, ``threads`` torch threads);
    a run already in ``out/grpo`` continues to ``updates`` (or is reused as it is)."""
    import torch

    from ..eval.stats import difference_of_proportions_ci
    from ..experiments.recipes import train_recipe
    from ..runlog import strict
    from .eval_report import summary_lines
    from .llm import main as llm_main

    torch.set_num_threads(threads)
    r = train_recipe(REAL_RECIPE)
    run_dir = out / "grpo"
    print(f"\nthe real model, {r.model}: {problems} held-out problems of {r.task} ({', '.join(r.task_options)}) before "
          f"and after {updates} GRPO updates with LoRA (`reflectrl llm train --recipe {r.name} --updates {updates}`)",
          flush=True)
    before = _evaluate(r.model, r.task, r.task_options, problems)
    print("\n".join(["before:", *summary_lines(before, r.model)]), flush=True)
    if (run_dir / "config.json").is_file():
        train = ["train", "--resume", str(run_dir), "--updates", str(updates)]
    else:
        train = ["train", "--recipe", r.name, "--updates", str(updates), "--threads", str(threads),
                 "--run-dir", str(run_dir), "--no-tensorboard"]
    rc = llm_main(train)
    if rc != 0:
        return rc
    after = _evaluate(str(run_dir), None, None, problems)
    print("\n".join(["after:", *summary_lines(after, str(run_dir))]), flush=True)
    lo, hi = difference_of_proportions_ci(before["accuracy"], before["ci"], after["accuracy"], after["ci"])
    gain = after["accuracy"] - before["accuracy"]
    lines = [f"\nthe real model, {problems} held-out problems, before -> after {updates} GRPO updates:",
             f"  accuracy    {100 * before['accuracy']:.0f}% -> {100 * after['accuracy']:.0f}%: {100 * gain:+.0f} "
             f"points [95% interval {100 * lo:+.0f}, {100 * hi:+.0f}]"
             + (" (the interval is above 0: it learned)" if lo > 0 else " (the interval holds 0: not shown to learn)")]
    for key, what in (("ece", "ECE (0: calibrated)"), ("auroc", "AUROC (0.5: the confidence does not rank)"),
                      ("mean_confidence", "mean stated confidence")):
        b, a = before.get(key), after.get(key)
        show = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"  {what:<44} {show(b)} -> {show(a)}")
    lines.append(f"the trained run: {run_dir} (`reflectrl llm eval {run_dir} --self-report inline` evaluates it)")
    print("\n".join(lines), flush=True)
    keep = ("n", "accuracy", "ci", "ece", "auroc", "brier", "mean_confidence", "confidence_missing_rate")
    summary = {"model": r.model, "recipe": r.name, "updates": updates, "problems": problems,
               "before": {k: before.get(k) for k in keep}, "after": {k: after.get(k) for k in keep},
               "gain": gain, "gain_ci": [lo, hi]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(strict(summary), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
