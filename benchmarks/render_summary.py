"""The "In short" paragraph of README.md, every number read from benchmarks/results/ (render_all.py puts it
between the README's ``<!-- summary -->`` markers).

    python benchmarks/render_summary.py           # prints the claims table and the paragraph (README.md)
    python benchmarks/render_summary.py --table   # the claims table alone, linking inside BENCHMARKS.md

The table has one row per method and task or env: its effect against its baseline with Student's t 95%
interval and the verdict of the one rule (docs/compare.md, "How verdicts are decided"), read from the claims
results files, losses and wins alike.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from render_llm import gain_interval, variant_slug  # noqa: E402

from reflectrl.eval.stats import difference  # noqa: E402

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


SECTIONS = {"seed": "The seed's claims",
            "arith16": "Reflection and calibration on arith (refgrpo, rlcr, refgrpo-seed against GRPO)",
            "arith13": "Reflection and calibration on arith (refgrpo, rlcr, refgrpo-seed against GRPO)",
            "arith17": "Self-reports a constant cannot win, on arith (rlcr's rank reward, refgrpo's balanced agreement)",
            "arith18": "Confidences that keep their level, on arith (rlcr's class-balanced rank reward)",
            "text2sql13": "Reflection on text2sql (refgrpo against GRPO, multi-turn)",
            "gear": "Finer credit from self-distillation (gear-seed, gear against GRPO)",
            "exgrpo": "Learning from experience (exgrpo against Dr.GRPO, exgrpo-seed against GRPO)",
            "rag": "The search agent (rag: GRPO, refgrpo-seed per turn, refgrpo, rlcr)",
            "real": "Self-reports at equal work on the real model"}
TINY, REAL, CONTROL = "tiny char-level", "SmolLM2-135M-Instruct, LoRA 16", "MLP"
HEADLINE = (  # (results file, method, section): each method's comparison on each task at its current recipe
    ("llm_claims_arith16.json", "refgrpo", "arith16"), ("llm_claims_arith16.json", "rlcr", "arith16"),
    ("llm_claims_arith17.json", "rlcr-rank", "arith17"), ("llm_claims_arith17.json", "refgrpo-balanced", "arith17"),
    ("llm_claims_arith18.json", "rlcr-rankbal", "arith18"), ("llm_claims_arith19.json", "rlcr-batchrank", "arith18"),
    ("llm_claims_arith20.json", "rlcr-batchrank-w0.5", "arith18"),
    ("llm_claims_arith19late.json", "rlcr-batchrank-late", "arith18"),
    ("llm_claims_arith13.json", "refgrpo-seed", "arith13"), ("llm_claims_arith14.json", "gear-seed", "gear"),
    ("llm_claims_arith14gear.json", "gear", "gear"), ("llm_claims_arith15.json", "exgrpo", "exgrpo"),
    ("llm_claims_text2sql13.json", "refgrpo", "text2sql13"), ("llm_claims_codegen14.json", "gear-seed", "gear"),
    ("llm_claims_codegen14.json", "gear", "gear"), ("llm_claims_codegen15.json", "exgrpo", "exgrpo"),
    ("llm_claims_rag_steps_recipe.json", "refgrpo-seed", "rag"), ("llm_claims_rag.json", "rlcr", "rag"),
    ("llm_claims_rag_steps.json", "refgrpo", "rag"), ("llm_claims_rag_steps.json", "rlcr-steps", "rag"))


def anchor(title: str) -> str:
    """GitHub's anchor of a heading."""
    return "#" + re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def effect_cell(claim: dict | None, lower_is_better: bool = False, digits: int = 3) -> str:
    """The raw difference (method - baseline) with its t interval, then the verdict."""
    if not claim or "p_holm" not in claim:
        return "n/a | n/a"
    eff, lo, hi = difference(claim, lower_is_better)
    return f"{eff:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] | **{claim['verdict']}**"


ALPHA = 0.05
CONTROL_SEEDS = 10
"""Seeds the issue asks of a control comparison (its runs cost minutes each)."""
DECISIVE = ("better", "worse", "not lower", "not higher")


def seeds_to_decide(family: int, n: int) -> int:
    """The fewest paired seeds at which Holm's first step can bring the exact sign-flip test's smallest p, 2 / 2^n,
    below 0.05 in a family of ``family`` hypotheses (the family's size held)."""
    need = n
    while family * 2 / 2 ** need >= ALPHA:
        need += 1
    return need


def decidable(family: int, n: int) -> bool:
    """Whether a row's paired claims can read "better" or "worse" at all, whatever the data."""
    return family * 2 / 2 ** n < ALPHA


def claims_table(prefix: str) -> list[str]:
    """One row per method and task or env, each linking to its BENCHMARKS.md section (``prefix`` + anchor); a row
    that can decide nothing by construction (:func:`decidable`) and holds no decisive verdict goes under the table
    instead, as "not decidable at n seeds", with what deciding it would take."""
    rows = ["| method | task or env | model | against | seeds | accuracy or final return: method - baseline [95% CI] | "
            "verdict | ECE, AUROC (real model) or early AUC: method - baseline [95% CI] | verdict |",
            "|---|---|---|---|---|---|---|---|---|"]
    under: list[str] = []
    for row, n, family, verdicts, cost in all_rows(prefix):
        if decidable(family, n) or any(v in DECISIVE for v in verdicts):
            rows.append(row)
            continue
        c = [x.strip() for x in row.strip().strip("|").split("|")]
        under.append(f"- {c[0]}, {c[1]} ({c[2]}) against {c[3]}: {c[5]} and {c[7]}, not decidable at {n} seeds (the "
                     f"smallest exact p, 2/{2 ** n}, times the {family} hypotheses of its family is "
                     f"{family * 2 / 2 ** n:.2g}); {cost}.")
    if under:
        rows += ["", f"Not decidable at their seed counts, whatever the data ({len(under)} rows: Holm's first step on "
                 "the exact test's smallest p cannot fall below 0.05), each with what deciding it would take:", "",
                 *under]
    return rows


def _cost(need: int, n: int, per_run: dict[str, float] | None, kind: str = "wall") -> str:
    """What deciding a row would take: the seeds, the runs, and where the runs' times are recorded, the hours."""
    more = need - n
    runs = f"{more} more run{'s' if more != 1 else ''} of each side"
    if not per_run:
        return f"deciding needs {need} paired seeds, {runs} (the runs' times are not kept in its results file)"
    hours = more * sum(per_run.values()) / 3600
    each = ", ".join(f"{k} {v:.0f} s" for k, v in per_run.items())
    if kind == "wall":
        return (f"deciding needs {need} paired seeds: {runs}, about {hours:.1f} hours of one-core runs (the recorded "
                f"wall time per run: {each})")
    return (f"deciding needs {need} paired seeds: {runs}, about {hours:.1f} CPU-hours (the recorded CPU seconds per "
            f"update times the updates, median per run: {each})")


def all_rows(prefix: str) -> list[tuple[str, int, int, list[str], str]]:
    """Every row of the summary: its text, seeds, family size, verdicts and the cost of deciding it."""
    out = []
    for name, method, sec in HEADLINE:
        res = load(name)
        if not res or method not in res["methods"]:
            continue
        mets = res["methods"][method]["metrics"]
        link = f"[{method}]({prefix}{anchor(SECTIONS[sec])})"
        n = len(res["methods"][method]["seeds"])
        family = int(res.get("family_hypotheses", 1))
        claims = [mets["accuracy"].get("claim"), mets.get("ece", {}).get("claim")]
        out.append((f"| {link} | {res['task']} | {TINY} | {res['baseline']} | {n} | {effect_cell(claims[0])} | "
                    f"{effect_cell(claims[1], lower_is_better=True)} |", n, family,
                    [c["verdict"] for c in claims if c], _cost(seeds_to_decide(family, n), n, None)))
    out += real_rows(prefix)
    seed = load("seed_claims.json")
    for env, e in (seed or {}).get("envs", {}).items():
        family = sum(1 + ("p_ni_holm" in r[k]) for r in e["methods"].values() for k in ("final_claim", "early_claim")
                     if "p_holm" in r[k])
        walls = control_walls(env)
        for m, rec in e["methods"].items():
            link = f"[{m}]({prefix}{anchor(SECTIONS['seed'])})"
            n = rec["seeds"]
            need = max(CONTROL_SEEDS, seeds_to_decide(family, n))
            per_run = {k: walls[k] for k in (m, "ppo")} if {m, "ppo"} <= set(walls) else None
            out.append((f"| {link} | {env} | {CONTROL} | ppo | {n} | {effect_cell(rec['final_claim'], digits=1)} | "
                        f"{effect_cell(rec['early_claim'], digits=1)} |", n, family,
                        [rec["final_verdict"], rec["early_verdict"]], _cost(need, n, per_run)))
    return out


CONTROL_REPORTS = {"LunarLander-v3": "compare_lander_now.md", "HalfCheetah-v5": "compare_cheetah1m.md",
                   "MountainCar-v0": "compare_mountaincar1m.md"}
"""The compare report of each env's runs in seed_claims.json (the folders its command read)."""


def control_walls(env: str) -> dict[str, float]:
    """Each method's mean wall seconds per run (its processes) in the env's compare report."""
    out = {}
    for m in ("ppo", "refgrpo-seed", "gear-seed", "exgrpo-seed"):
        cells = report_row(CONTROL_REPORTS[env], m) if env in CONTROL_REPORTS else None
        if cells:
            out[m] = float(cells[-1].split()[0].rstrip("+"))
    return out


def real_rows(prefix: str) -> list[tuple[str, int, int, list[str], str]]:
    """The real model's rows: each self-report arm against GRPO at equal updates on held-out problems
    (``real_equal.json``), accuracy and the stated confidence's AUROC."""
    from real_equal import setting_claims, setting_rows, settings_of

    res = load("real_equal.json")
    runs = list((res or {}).get("runs", {}).values())
    out = []
    for setting in settings_of(runs):
        form, start, updates, split = setting
        if split != "heldout":
            continue
        rows, _ = setting_rows(runs, setting)
        claims = setting_claims(rows)
        family = sum(1 + ("p_ni_holm" in c) for by in claims.values() for c in by.values() if "p_holm" in c)
        where = f"sums, {'base' if start == 'base' else 'late'} start, {updates} updates"
        for arm, acc in claims["accuracy"].items():
            seeds = len({r["seed"] for r in rows if r["arm"] == arm})
            link = f"[{arm}]({prefix}{anchor(SECTIONS['real'])})"
            per_run = {a: statistics.median(r["cpu_s_per_update"] * updates for r in rows
                                            if r["arm"] == a and r.get("cpu_s_per_update"))
                       for a in (arm, "grpo") if any(r["arm"] == a and r.get("cpu_s_per_update") for r in rows)}
            out.append((f"| {link} | {where} | {REAL} | grpo | {seeds} | {effect_cell(acc)} | "
                        f"{effect_cell(claims['auroc'].get(arm))} |", seeds, family,
                        [c["verdict"] for c in (acc, claims["auroc"].get(arm)) if c],
                        _cost(seeds_to_decide(family, seeds), seeds, per_run if len(per_run) == 2 else None, "cpu")))
    return out


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
        s = (f"PPO reaches an IQM of {ppo['iqm']:.0f} on LunarLander-v3 at 1M steps ({ppo['seeds']} seeds) and runs "
             f"{speed['ratio_median']:.1f}x faster than CleanRL's loop")
        whole, wk = load("ppo_process_speed.json"), load("ppo_process_speed_workers.json")
        if whole:
            s += f" ({whole['ratio_median']:.1f}x as whole processes, start-up and logging included"
            if wk and "sync_ratio_median" in wk:  # measured with the in-process run in the same rounds
                s += (f"; {wk['ratio_median']:.2f}x with its envs stepped beside it by one worker process, "
                      f"`--env-workers 1`, rounds {min(wk['ratios']):.2f}-{max(wk['ratios']):.2f}")
            s += ")"
        out.append(s)
    arith, codegen = llm_gains("arith"), llm_gains("codegen")
    thr = load("llm_throughput.json")
    if arith and codegen:
        s = (f"GRPO on a tiny model raises held-out accuracy by {arith[0]:.0f}-{arith[1]:.0f} points on arith and "
             f"{codegen[0]:.0f}-{codegen[1]:.0f} on codegen ({arith[2]} seeds) in 10 CPU-minutes")
        if thr:
            s += f", at {thr['ratio']:.1f}x TRL's throughput" + (
                f" ({thr['ratio_engine_logp']:.1f}x with the sampler's log-probs as the old ones, `--old-logp engine`)"
                if "ratio_engine_logp" in thr else "")
        out.append(s)
    rag = llm_gains("rag")
    if rag:
        gains = llm_gain_list("rag")
        met = sum(g >= 15 for g in gains)
        beyond = sum(gain_interval(r)[0] >= 15 for r in llm_learn_results("rag"))
        out.append(f"on the rag search task it raises held-out accuracy by {rag[0]:+.0f} to {rag[1]:+.0f} points "
                   f"({rag[2]} seeds, the same budget; the 15-point bar is met in {met} of {len(gains)}, in {beyond} "
                   "with the lower end of its 95% interval above it"
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
            if "ratio_shared_prompt" in thr_real:
                s += (f" ({thr_real['ratio_shared_prompt']:.1f}x with `--old-logp engine --attention shared-prompt`, "
                      "each group's prompt run once in the update)")
        out.append(s)
    first = load("readme_llm.json")
    if first and "gain_ci" in first:  # the real model's example (readme_llm_tiny.json: the tiny model's, before it)
        lo, hi = first["gain_ci"]
        out.append(f"the README's first LLM example, run as written (one seed), takes SmolLM2-135M-Instruct from "
                   f"{100 * first['before']['accuracy']:.1f}% to {100 * first['after']['accuracy']:.1f}% on "
                   f"{first['after']['n']} held-out sums, {100 * first['gain']:+.1f} points [{100 * lo:+.1f}, "
                   f"{100 * hi:+.1f}], in {first['train_cpu_s_process'] / 60:.1f} CPU-minutes of training")
    waits = [json.loads(p.read_text()).get("reward_wait_fraction") for p in sorted(RES.glob("llm_learn_codegen_s*.json"))]
    waits = [w for w in waits if w is not None]
    if waits:
        out.append(f"a codegen step waits for its sandboxed rewards {100 * statistics.median(waits):.1f}% of its time "
                   "(median over seeds, with the backend the run had)")
    demo = load("demo_time.json")
    if demo and "llm" in demo:  # the demo whose LLM half is the real model (demo_time_earlier.json: the tiny one's)
        llm = demo["llm"]
        loads = demo["load_average_1min"]  # at its start and at its end
        busy = (f" shared with other work (load average {loads[0]:.1f} at its start, {loads[-1]:.1f} at its end)"
                if max(loads) > 0.5 * demo["cpus"] else "")
        cpu = f", {demo['cpu_s'] / 60:.1f} CPU-minutes" if "cpu_s" in demo else ""
        out.append(f"`make demo` took {demo['wall_s']:.0f} s on {demo['cpus']} cores{busy}{cpu}, after set-up, its real model "
                   f"going from {100 * llm['before']['accuracy']:.0f}% to {100 * llm['after']['accuracy']:.0f}% on "
                   f"{llm['problems']} held-out sums in {llm['updates']} updates")
    text = "; ".join(out) + "."
    if "--table" in sys.argv[1:]:
        print("\n".join(claims_table("")))
        return
    print("\n".join(claims_table("BENCHMARKS.md")))
    print()
    print("Also: " + text)


if __name__ == "__main__":
    main()
