"""The "In short" paragraph of README.md, every number read from benchmarks/results/ (render_all.py puts it
between the README's ``<!-- summary -->`` markers).

    python benchmarks/render_summary.py        # prints the paragraph
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from render_llm import gain_interval, variant_slug  # noqa: E402

RES = Path(__file__).resolve().parent / "results"


def load(name: str) -> dict | None:
    p = RES / name
    return json.loads(p.read_text()) if p.is_file() else None


def report_row(name: str, method: str) -> list[str] | None:
    """The cells of ``method``'s row in a compare report kept in results/."""
    p = RES / name
    if not p.is_file():
        return None
    for line in p.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == method:
            return cells
    return None


def seed_verdicts(claims: dict) -> str:
    """Per method: the envs where its final return ends level with, above or below PPO."""
    parts = []
    by_method: dict[str, dict[str, list[str]]] = {}
    for env, e in claims["envs"].items():
        for m, rec in e["methods"].items():
            p, lo, hi = rec["p_final"]
            side = "above" if lo > 0.5 else "below" if hi < 0.5 else "level with"
            by_method.setdefault(m, {}).setdefault(side, []).append(f"{env} (P = {p:.2f} [{lo:.2f}, {hi:.2f}])"
                                                                   if side != "level with" else env)
    for m, sides in by_method.items():
        parts.append(f"{m} ends " + "; ".join(f"{side} PPO on {', '.join(envs)}" for side, envs in sides.items()))
    return "; ".join(parts)


def early_none(claims: dict) -> bool:
    return all(rec["early_verdict"] != "holds" for e in claims["envs"].values() for rec in e["methods"].values())


def llm_learn_results(task: str, variant: str | None = None) -> list[dict]:
    """The task's llm_learn results, one per seed: the current recipe's, or those collected with the label
    ``variant`` (``render_llm.py --collect --variant``)."""
    name = f"llm_learn_{task}{variant_slug(variant)}_s*.json"
    return [json.loads(p.read_text()) for p in sorted(RES.glob(name))]


def llm_gain_list(task: str, variant: str | None = None) -> list[float]:
    """The held-out gains of :func:`llm_learn_results`."""
    return [r["gain_points"] for r in llm_learn_results(task, variant)]


def llm_gains(task: str) -> tuple[float, float, int] | None:
    gains = llm_gain_list(task)
    return (min(gains), max(gains), len(gains)) if gains else None


def main() -> None:
    out = []
    ppo = load("ppo_learn_LunarLander-v3.json")
    speed = load("ppo_speed.json")
    if ppo and speed:
        out.append(f"PPO reaches an IQM of {ppo['iqm']:.0f} on LunarLander-v3 at 1M steps ({ppo['seeds']} seeds) and runs "
                   f"{speed['ratio_median']:.1f}x faster than CleanRL's loop"
                   + (f" ({whole['ratio_median']:.1f}x as whole processes, start-up and logging included)"
                      if (whole := load("ppo_process_speed.json")) else ""))
    claims = load("seed_claims.json")
    if claims:
        out.append("of the seed methods (1M steps, 5 seeds each), " + seed_verdicts(claims))
        if early_none(claims):
            out.append("none learns faster early beyond noise")
    rank = report_row("compare_lander_rank.md", "gear-rank")
    if rank:
        m = re.match(r"([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", rank[3])
        if m:
            p, lo, hi = (float(x) for x in m.groups())
            side = "above" if lo > 0.5 else "below" if hi < 0.5 else "level with"
            out.append(f"gear-seed with its optional ranking loss ends {side} PPO on LunarLander-v3 "
                       f"(P = {p:.2f} [{lo:.2f}, {hi:.2f}])")
    arith, codegen = llm_gains("arith"), llm_gains("codegen")
    thr = load("llm_throughput.json")
    if arith and codegen:
        s = (f"GRPO on a tiny model raises held-out accuracy by {arith[0]:.0f}-{arith[1]:.0f} points on arith and "
             f"{codegen[0]:.0f}-{codegen[1]:.0f} on codegen ({arith[2]} seeds) in 10 CPU-minutes")
        if thr:
            s += f", at {thr['ratio']:.1f}x TRL's throughput"
        out.append(s)
    rag = llm_gains("rag")
    if rag:
        gains = llm_gain_list("rag")
        met = sum(g >= 15 for g in gains)
        beyond = sum(gain_interval(r)[0] >= 15 for r in llm_learn_results("rag"))
        out.append(f"on the rag search task it raises held-out accuracy by {rag[0]:+.0f} to {rag[1]:+.0f} points "
                   f"({rag[2]} seeds, the same budget; the 15-point bar is met in {met} of {len(gains)}, {beyond} beyond noise"
                   + ("; BENCHMARKS.md shows where the seeds below it fail)" if met < len(gains) else ")"))
        again = llm_gain_list("rag", "recipe again, every held-out problem")
        if again:
            out.append(f"the recipe before its search credit and dynamic sampling cleared the bar in "
                       f"{sum(g >= 15 for g in again)} of {len(again)} seeds")
    real = sorted((json.loads(p.read_text()) for p in RES.glob("real_learn_grpo_s*.json")), key=lambda r: r["seed"])
    if real:
        gains = [100 * (r["after"]["accuracy"] - r["before"]["accuracy"]) for r in real]
        s = (f"on a real pretrained model, SmolLM2-135M-Instruct through its chat template, GRPO with LoRA raises held-out "
             f"accuracy on two-digit addition from {100 * real[0]['before']['accuracy']:.0f}% by "
             f"{' and '.join(f'{g:+.0f}' for g in gains)} points in one CPU-hour ({len(real)} seeds)")
        thr_real = load("llm_throughput_real.json")
        if thr_real:
            s += f", at {thr_real['ratio']:.1f}x TRL's tokens per second"
        out.append(s)
    waits = [json.loads(p.read_text()).get("reward_wait_fraction") for p in sorted(RES.glob("llm_learn_codegen_s*.json"))]
    waits = [w for w in waits if w is not None]
    if waits:
        out.append(f"a codegen step waits for its sandboxed rewards {100 * statistics.median(waits):.1f}% of its time "
                   "(median over seeds, with the backend the run had)")
    demo = load("demo_time.json")
    if demo:
        out.append(f"`make demo` took {demo['wall_s']:.0f} s on {demo['cpus']} cores, after set-up")
    text = "; ".join(out) + "."
    print("In short: " + text[0].lower() + text[1:] if text[:3] != "PPO" else "In short: " + text)


if __name__ == "__main__":
    main()
