"""Render the LLM sections of BENCHMARKS.md from the JSON results of llm_learn.py and llm_throughput.py.

    python benchmarks/render_llm.py --collect runs/bench/llm_learn/*_s*   # copy each DIR/result.json
    python benchmarks/render_llm.py                                        # print the markdown

``--collect DIR...`` copies each run's ``DIR/result.json`` (the last JSON line of
``benchmarks/llm_learn.py --out DIR``) to ``benchmarks/results/llm_learn_{task}_s{seed}.json``,
adding the reward-wait share from ``DIR/grpo/metrics.jsonl`` to results that predate it.
The tables: per seed, held-out accuracy before and after GRPO with 95% Wilson intervals (from
``reflectrl llm eval``); per task, the mean gain over seeds with a Student's t 95% interval
(scipy), the smallest gain, and how many seeds reach the +15-point bar.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_learn import reward_wait  # noqa: E402

from reflectrl.eval.stats import difference_of_proportions_ci  # noqa: E402

RES = Path(__file__).resolve().parent / "results"
BAR = 15.0


def variant_slug(variant: str | None) -> str:
    """The part of a results file's name that a variant label gives (``-`` and the label, non-alphanumerics as ``-``)."""
    return "-" + "".join(c if c.isalnum() else "-" for c in variant) if variant else ""


def collect(dirs: list[Path], variant: str | None = None) -> None:
    for d in dirs:
        src = d / "result.json"
        if not src.is_file():
            print(f"skip {d}: no result.json")
            continue
        r = json.loads(src.read_text())
        if variant:
            r["variant"] = variant
        dst = RES / f"llm_learn_{r['task']}{variant_slug(variant)}_s{r['seed']}.json"
        metrics = d / "grpo" / "metrics.jsonl"
        # results written before llm_learn.py reported it: take it from the GRPO run's metrics when
        # that run is the one the result describes (same number of updates)
        if r.get("reward_wait_fraction") is None and metrics.is_file() and \
                sum(1 for _ in metrics.open()) == r["updates"]:
                wait, total = reward_wait(metrics)
                r["reward_wait_fraction"] = round(wait / total, 4) if total > 0 else None
        dst.write_text(json.dumps(r, indent=2))
        print(f"{src} -> {dst}")


def name(r: dict) -> str:
    return r["task"] + (f" ({r['variant']})" if r.get("variant") else "")


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def gain_interval(r: dict) -> tuple[float, float]:
    """95% interval of ``after - before``, in points: Newcombe's hybrid score interval for a difference of two
    proportions, from the two Wilson intervals the result holds (Newcombe 1998, "Interval estimation for the
    difference between independent proportions", method 10). The evaluations share their questions, so the
    interval is conservative: a paired one would be narrower when before and after are correlated."""
    lo, hi = difference_of_proportions_ci(r["before"], r["before_ci"], r["after"], r["after_ci"])
    return 100 * lo, 100 * hi


def learn_tables() -> str:
    runs = sorted((json.loads(p.read_text()) for p in RES.glob("llm_learn_*_s*.json")),
                  key=lambda r: (r["task"], r.get("variant", ""), r["seed"]))
    if not runs:
        return "(no llm_learn results)"
    lines = ["| task | seed | held-out problems | before, % [95% CI] | after, % [95% CI] | gain, points [95% CI] | "
             "RL budget | updates | RL wall time, s | reward wait share of a step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        budget = f"{r['budget_seconds']:.0f} {'CPU-' if r['clock'] == 'cpu' else 'wall '}s"
        wait, (g_lo, g_hi) = r.get("reward_wait_fraction"), gain_interval(r)
        lines.append(f"| {name(r)} | {r['seed']} | {r['n_heldout']} | {pct(r['before'])} "
                     f"[{pct(r['before_ci'][0])}, {pct(r['before_ci'][1])}] | {pct(r['after'])} "
                     f"[{pct(r['after_ci'][0])}, {pct(r['after_ci'][1])}] | {r['gain_points']:+.1f} "
                     f"[{g_lo:+.1f}, {g_hi:+.1f}] | {budget} | "
                     f"{r['updates']} | {r['train_seconds']:.0f} | {'n/a' if wait is None else f'{100 * wait:.1f}%'} |")
    lines += ["", "| task | seeds | mean gain, points [95% t CI] | smallest gain | seeds >= +15 points | "
              "seeds whose gain interval is above +15 |", "|---|---|---|---|---|---|"]
    for task in sorted({name(r) for r in runs}):
        g = np.array([r["gain_points"] for r in runs if name(r) == task], float)
        above = sum(gain_interval(r)[0] >= BAR for r in runs if name(r) == task)
        if len(g) > 1:
            lo, hi = stats.t.interval(0.95, len(g) - 1, loc=g.mean(), scale=stats.sem(g))
            ci = f"[{lo:+.1f}, {hi:+.1f}]"
        else:
            ci = "(one seed)"
        lines.append(f"| {task} | {len(g)} | {g.mean():+.1f} {ci} | {g.min():+.1f} | {int((g >= BAR).sum())} of {len(g)} | "
                     f"{above} of {len(g)} |")
    return "\n".join(lines)


def episode_table() -> str:
    """The episode metrics of the llm_learn runs whose evaluations give them (rag: searches, stated confidences)."""
    runs = sorted((json.loads(p.read_text()) for p in RES.glob("llm_learn_*_s*.json")),
                  key=lambda r: (r["task"], r.get("variant", ""), r["seed"]))
    runs = [r for r in runs if "before_step_reports" in r]
    if not runs:
        return "(no llm_learn result with per-step confidences)"
    num = lambda r, k: "n/a" if r.get(k) is None else f"{r[k]:.2f}"  # noqa: E731
    lines = ["| task | seed | searches per episode, before -> after | confidences stated per episode | "
             "per-step ECE | per-step AUROC | premature answers |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        cell = lambda k, r=r: f"{num(r, 'before_' + k)} -> {num(r, 'after_' + k)}"  # noqa: E731
        lines.append(f"| {name(r)} | {r['seed']} | {cell('tool_calls')} | {cell('step_reports')} | {cell('step_ece')} | "
                     f"{cell('step_auroc')} | {cell('premature_rate')} |")
    return "\n".join(lines)


def throughput_table(name: str = "llm_throughput.json") -> str:
    path = RES / name
    if not path.exists():
        return f"(no {name} result yet)"
    r = json.loads(path.read_text())
    rounds = lambda k: ", ".join(f"{x:.0f}" for x in r["rounds"][k])  # noqa: E731
    gc = "gc_share" in r  # results before the collector was timed have no column for it
    share = lambda k: (" " + ", ".join(f"{x:.1%}" for x in r["gc_share"][k]) + " |") if gc else ""  # noqa: E731
    return "\n".join([
        "| | completion tokens/s (median) | rounds |" + (" garbage collector's share of the CPU, per round |" if gc else ""),
        "|---|---|---|" + ("---|" if gc else ""),
        f"| reflectrl | {r['reflectrl_tokens_per_s']:.0f} | {rounds('reflectrl')} |{share('reflectrl')}",
        *([f"| reflectrl, `--old-logp engine` | {r['reflectrl_engine_logp_tokens_per_s']:.0f} | "
           f"{rounds('reflectrl_engine_logp')} |{share('reflectrl_engine_logp')}"] if "ratio_engine_logp" in r else []),
        *([f"| reflectrl, `--old-logp engine --attention shared-prompt` | "
           f"{r['reflectrl_shared_prompt_tokens_per_s']:.0f} | {rounds('reflectrl_shared_prompt')} |"
           f"{share('reflectrl_shared_prompt')}"] if "ratio_shared_prompt" in r else []),
        f"| TRL {r['trl_version']} `GRPOTrainer` | {r['trl_tokens_per_s']:.0f} | {rounds('trl')} |{share('trl')}",
        "", ratio_line(r) + f" ({r['clock']}; {order_text(r)}). Setting: {r['model']}, "
            f"task {r['task']}, {r['rows_per_step']} rows per step (groups of {r['group_size']}), "
            f"{r['minibatches']} optimizer steps per rollout, at most {r['max_new_tokens']} new tokens, "
            f"{r['timed_steps']} timed steps per round, transformers {r['transformers_version']}"
            + (f", LoRA rank {r['lora_r']}" if r.get("lora_r") else "")
            + (f", temperature {r['temperature']}" if "temperature" in r else "")
            + (f", task options {' '.join(r['task_options'])}" if r.get("task_options") else "") + "."])


def ratio_line(r: dict) -> str:
    """Each arm's speed ratio over TRL: the median of the per-round paired ratios, with their range."""
    parts = []
    for key, label in (("ratio", "reflectrl"), ("ratio_engine_logp", "with `--old-logp engine`"),
                       ("ratio_shared_prompt", "with `--attention shared-prompt` too")):
        if key in r:
            rounds = r.get(f"{key}_rounds") or [r[key]]
            lo, hi = r.get(f"{key}_range") or (r[key], r[key])
            parts.append(f"{label} **{r[key]:.2f}x** (rounds {lo:.2f}-{hi:.2f})" if len(rounds) > 1 else
                         f"{label} **{r[key]:.2f}x** (one round)")
    n = len(r.get("ratio_rounds") or [1])
    return f"Ratio over TRL, the median of the {n} per-round paired ratios: " + "; ".join(parts)


def order_text(r: dict) -> str:
    """How the arms were ordered in the rounds, and the machine's load where it was recorded."""
    rounds = r.get("per_round")
    if not rounds:
        return r.get("order", "arm order not recorded")
    loads = [x["load_before"][0] for x in rounds]
    return (f"arm order alternating between rounds; 1-minute load average {min(loads):.1f}-{max(loads):.1f} "
            "before the rounds")


def throughput_ab_table(name: str = "llm_throughput_ab_heap.json") -> str:
    """One llm_throughput.py round per library version, alternating: tokens per CPU-second and the collector's share."""
    path = RES / name
    if not path.exists():
        return f"(no {name} result yet)"
    r = json.loads(path.read_text())
    arms = [("reflectrl", "reflectrl"), ("reflectrl_engine_logp", "reflectrl, `--old-logp engine`"),
            ("trl", f"TRL {r['trl_version']} `GRPOTrainer`")]
    rows = ["| round | library | " + " | ".join(f"{label}: tokens/s (collector's share)" for _, label in arms) + " |",
            "|---|---|" + "---|" * len(arms)]
    for run in r["runs"]:
        cells = [f"{run['tokens_per_s'][k]:.0f} ({run['gc_share'][k]:.1%})" for k, _ in arms]
        rows.append(f"| {run['round']} | {run['code']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _reward_rows(r: dict, before: dict | None = None) -> list[str]:
    """The table of one reward_overlap result: per backend and mode (and the earlier code's row, if given)."""
    per_backend = r.get("backends", {"bwrap": r})  # results before the per-backend runs measured bwrap only
    rows = ["| sandbox backend | sandbox use | reward-wait share of a step (per round) | s per step | "
            "reward threads' s per step |", "|---|---|---|---|---|"]
    runs = []
    for backend, res in per_backend.items():
        batch = (f"batches of {r['sandbox_batch']}, kept runners, old log-probs during the wait"
                 if backend != "none" else f"chunks of {r['gen_batch']} scored per call, one sandbox per job "
                 "(no batch mode without a PID namespace)")
        runs += [(backend, res, "per_job", "one sandbox per completion"), (backend, res, "batch", batch)]
    if before is not None:  # the same benchmark before kept runners and the early old-log-prob pass
        runs.append(("bwrap", before, "batch", "batches of 16, one launch per batch, old log-probs after the wait "
                     "(earlier code, another run)"))
    for backend, res, key, label in runs:
        if key not in res:
            continue
        x = res[key]
        rows.append(f"| {backend} | {label} | {100 * x['reward_wait_fraction']:.1f}% "
                    f"({', '.join(f'{100 * v:.1f}%' for v in x['rounds_wait_fraction'])}) | {x['step_s']:.2f} | "
                    f"{x['reward_cpu_s_per_step']:.2f} |")
    skipped = "".join(f" Not run ({name} unavailable): {why}." for name, why in r.get("unavailable", {}).items())
    low, high = r.get("load_average_1min", (None, None))
    load = "" if low is None else f", 1-minute load average {low:.1f}-{high:.1f} between runs"
    return rows + ["", f"{r['rounds']} rounds of {r['updates']} GRPO updates per row, in one loop whose order "
                   f"rotates every round, {r['rows_per_update']} completions per update in chunks of "
                   f"{r['gen_batch']}, from `{r['model']}`, {r['cpus']} CPUs{load}.{skipped}"]


def reward_table() -> str:
    """reward_overlap.json (with the earlier code's row), then each reward_overlap_run*.json: further runs
    of the same command on the same machine, at other times."""
    path = RES / "reward_overlap.json"
    if not path.exists():
        return "(no reward_overlap result)"
    before = RES / "reward_overlap_before.json"
    out = _reward_rows(json.loads(path.read_text()), json.loads(before.read_text()) if before.exists() else None)
    for extra in sorted(RES.glob("reward_overlap_run*.json")):
        out += ["", f"Another run of the same command ({extra.name}):", ""]
        out += _reward_rows(json.loads(extra.read_text()))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collect", nargs="*", type=Path, default=None, metavar="DIR")
    ap.add_argument("--variant", default=None, help="with --collect: a label for runs of an older recipe")
    ap.add_argument("--part", choices=["learn", "episodes", "throughput", "throughput_ab", "throughput_real", "reward"],
                    default=None, help="print one table")
    ap.add_argument("--file", default=None, help="with --part throughput: another result file of llm_throughput.py")
    a = ap.parse_args()
    if a.collect is not None:
        collect(a.collect, a.variant)
        return
    if a.part:
        print({"learn": learn_tables, "episodes": episode_table,
               "throughput": lambda: throughput_table(a.file or "llm_throughput.json"),
               "throughput_ab": lambda: throughput_ab_table(a.file or "llm_throughput_ab_heap.json"),
               "throughput_real": lambda: throughput_table("llm_throughput_real.json"),
               "reward": reward_table}[a.part]())
        return
    print("### Learning on CPU\n")
    print(learn_tables())
    print("\n### Throughput against TRL\n")
    print(throughput_table())
    print("\n### Reward computation (codegen)\n")
    print(reward_table())


if __name__ == "__main__":
    main()
