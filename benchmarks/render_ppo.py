"""Render the PPO sections of BENCHMARKS.md from the JSON files in benchmarks/results/.

    python benchmarks/render_ppo.py   # prints markdown; BENCHMARKS.md embeds its output
"""

import json
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"


def learn_row(env: str) -> str:
    path = RES / f"ppo_learn_{env}.json"
    if not path.exists():
        return f"| {env} | (not run) | | | |"
    r = json.loads(path.read_text())
    seeds = ", ".join(f"{x:.0f}" for x in r["per_seed"])
    return (f"| {env} | {r['seeds']} | **{r['iqm']:.1f}** [{r['ci95'][0]:.1f}, {r['ci95'][1]:.1f}] | {seeds} | "
            f"{r['train_loop_s_mean'] / 60:.1f} |")


def speed_table() -> str:
    r = json.loads((RES / "ppo_speed.json").read_text())
    rows = ["| | steps/s | env s | inference s | update s | total s |", "|---|---|---|---|---|---|"]
    for who in ("cleanrl", "reflectrl"):
        rows.append(f"| {who} | {r[f'{who}_sps_median']:.0f} | {r[f'{who}_time/env_median_s']:.1f} | "
                    f"{r[f'{who}_time/inference_median_s']:.1f} | {r[f'{who}_time/update_median_s']:.1f} | "
                    f"{r[f'{who}_time/total_median_s']:.1f} |")
    ratios = ", ".join(f"{x:.2f}" for x in r["ratios"])
    return ("\n".join(rows) + f"\n\nRatio reflectrl / CleanRL (median of {r['rounds']} alternating rounds of "
            f"{r['total_timesteps']} steps): **{r['ratio_median']:.2f}x** (rounds: {ratios}).")


if __name__ == "__main__":
    print("### Learning\n")
    print("| env | seeds | IQM of final return [95% CI] | per seed | training-loop time per seed, min |")
    print("|---|---|---|---|---|")
    for env in ("LunarLander-v3", "HalfCheetah-v5"):
        print(learn_row(env))
    print("\n### Speed\n")
    print(speed_table())
