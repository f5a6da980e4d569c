"""A reasoning-gym generator trains the real model: GRPO with LoRA for one CPU-hour, held-out accuracy before and after.

    python benchmarks/rgym_learn.py run [--cpu-seconds 3600] [--seed 1]
    python benchmarks/rgym_learn.py progress        # a training under way, as far as it got
    python benchmarks/rgym_learn.py --render rgym_learn.json

``run``: 1. the base SmolLM2-135M-Instruct, greedy, on the first 60 *validation* problems of each candidate
generator (``reflectrl llm eval smollm2-135m-instruct --task reasoning-gym --set dataset=NAME --split validation
--limit 60``), every candidate recorded; 2. the choice, made on those numbers only: the candidates whose accuracy is
between 10% and 60%, and among them the one nearest 35% (the middle of the band; the first listed on a tie); 3. the
base model on all 200 held-out problems of the chosen generator; 4. ``reflectrl llm train --algo grpo --lora-r 16``
on its train problems until the trainer has used ``--cpu-seconds`` of CPU time at one thread (the settings of
benchmarks/real_model.py's ``learn``, with ``--attention shared-prompt``); 5. the trained model on the same 200
held-out problems. The gain's interval is Newcombe's (from the two Wilson intervals, conservative on the same
problems), with the paired t interval over the 200 problems beside it.

Every stage is kept under ``runs/rgym/`` and the results file is written after each, so an interrupted run goes on
where it stopped: a training cut short resumes (``llm train --resume``) with the budget less the CPU its finished
updates recorded. Each command is printed before it runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from real_model import dynamics, last_json, reflectrl
from resultio import results_file

from reflectrl.eval.stats import difference_of_proportions_ci, t_interval

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
# (generator, task options, prompts): in the order they were tried. Through the chat template the model answers in
# a sentence ("The answer is 1.") that a generator's scorer reads as wrong, whatever the number: every chat candidate
# scored 0, so the same generators were tried on raw prompts ("QUESTION\nanswer: "), which it completes with the
# answer alone.
CANDIDATES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("chain_sum", (), "auto"), ("basic_arithmetic", (), "auto"), ("letter_counting", (), "auto"),
    ("leg_counting", (), "auto"), ("syllogism", (), "auto"), ("spell_backward", (), "auto"), ("aiw", (), "auto"),
    ("chain_sum", (), "off"), ("basic_arithmetic", (), "off"), ("letter_counting", (), "off"),
    ("leg_counting", (), "off"), ("chain_sum", ('config={"max_terms": 2, "max_digits": 2}',), "off"),
)
BAND, MIDDLE, CANDIDATE_LIMIT = (0.10, 0.60), 0.35, 60
TRAIN_FLAGS = ("--lora-r", "16", "--prompts-per-update", "8", "--grad-accum", "4", "--threads", "1", "--attention",
               "shared-prompt", "--updates", "100000", "--no-progress", "--eval-interval", "0", "--sample-interval",
               "25")


def sets(dataset: str, options: tuple[str, ...]) -> list[str]:
    return [x for o in (f"dataset={dataset}", *options) for x in ("--set", o)]


def key_of(dataset: str, options: tuple[str, ...], chat: str) -> str:
    return "_".join([dataset, *(o.split("=")[0] for o in options), *(["raw"] if chat == "off" else [])])


def evaluate(model: str, dataset: str, options: tuple[str, ...], chat: str, split: str, out: Path,
             limit: int | None = None, transcripts: Path | None = None) -> dict:
    """``llm eval`` (greedy), its stdout kept in ``out``: a stage done before is read back, not run again."""
    args = ["llm", "eval", model, "--task", "reasoning-gym", *sets(dataset, options), "--split", split, "--json",
            "--no-progress", "--chat", chat, *(["--limit", str(limit)] if limit else []),
            *(["--transcripts", str(transcripts)] if transcripts else [])]
    if not out.is_file() or not out.read_text().strip():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(reflectrl(args, out.with_suffix(".log")))
    res = last_json(out.read_text())
    keep = ("n", "accuracy", "ci", "mean_score")
    return {**{k: res[k] for k in keep}, "command": "reflectrl " + " ".join(args)}


def choose(candidates: dict[str, dict]) -> str | None:
    """The candidate in the band nearest its middle (the first listed on a tie), or None."""
    inside = [k for k, c in candidates.items() if BAND[0] <= c["accuracy"] <= BAND[1]]
    return min(inside, key=lambda k: abs(candidates[k]["accuracy"] - MIDDLE)) if inside else None


def outcomes(path: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["problem"]: float(bool(r["correct"])) for r in rows}


def gain(before: dict, after: dict, paired: tuple[list[float], list[float]] | None) -> dict:
    lo, hi = difference_of_proportions_ci(before["accuracy"], before["ci"], after["accuracy"], after["ci"])
    out = {"gain": after["accuracy"] - before["accuracy"], "newcombe_ci": [lo, hi], "bar_met": lo > 0}
    if paired:
        mean, plo, phi = t_interval(paired[1], paired[0], paired=True)
        out["paired_t_ci"] = [plo, phi]
        out["changed"] = {"wrong_to_right": sum(a > b for b, a in zip(*paired)),
                          "right_to_wrong": sum(a < b for b, a in zip(*paired))}
    return out


def train(dataset: str, options: tuple[str, ...], chat: str, root: Path, seed: int, budget: float) -> dict:
    run, done = root / "run", root / "train.done"
    resumed = []
    if not done.is_file():
        metrics = run / "metrics.jsonl"
        if metrics.is_file():  # cut short: the rest of the budget
            used = sum(json.loads(x).get("time/cpu_iteration", 0.0) for x in metrics.read_text().splitlines() if x)
            resumed.append(used)
            args = ["llm", "train", "--resume", str(run), "--cpu-time-limit-s", f"{max(1.0, budget - used):.0f}",
                    "--no-progress"]
        else:
            args = ["llm", "train", "--algo", "grpo", "--task", "reasoning-gym", *sets(dataset, options), "--model",
                    MODEL, "--chat", chat, "--run-dir", str(run), "--seed", str(seed), "--cpu-time-limit-s", f"{budget:g}",
                    *TRAIN_FLAGS]
        reflectrl(args, root / "train.log")
        done.write_text("finished\n")
    config = json.loads((run / "config.json").read_text())
    settings = {k: config.get(k) for k in ("learning_rate", "group_size", "prompts_per_update", "temperature", "lora_r",
                                           "max_new_tokens", "attention", "threads")}
    return {"settings": settings, "resumed_after_cpu_s": resumed, **cpu_and_dynamics(run / "metrics.jsonl")}


def cpu_and_dynamics(metrics: Path) -> dict:
    """real_model's dynamics (its seconds_per_update is wall time, which a busy machine stretches) and the CPU
    seconds the updates recorded (``time/cpu_iteration``), which it does not."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    cpu = sum(r.get("time/cpu_iteration", 0.0) for r in rows)
    return {**dynamics(metrics), "cpu_seconds": cpu, "cpu_seconds_per_update": cpu / max(1, len(rows))}


def run(a: argparse.Namespace) -> dict:
    root = Path(a.runs)
    out = results_file(a.out)
    result: dict = {"benchmark": "rgym_learn", "model": MODEL, "seed": a.seed, "cpu_seconds_budget": a.cpu_seconds,
                    "band": list(BAND), "candidate_limit": CANDIDATE_LIMIT, "status": "candidates"}

    def save(status: str) -> None:
        result["status"] = status
        out.write_text(json.dumps(result, indent=1) + "\n")

    cands = {}
    for dataset, options, chat in CANDIDATES:
        key = key_of(dataset, options, chat)
        cands[key] = {"dataset": dataset, "options": list(options), "chat": chat,
                      **evaluate(MODEL, dataset, options, chat, "validation", root / "candidates" / f"{key}.out",
                                 CANDIDATE_LIMIT)}
        print(f"{key}: validation accuracy {cands[key]['accuracy']:.3f}", flush=True)
    result["candidates"] = cands
    chosen = choose(cands)
    result["chosen"] = chosen
    if chosen is None:
        save("no candidate in the band")
        return result
    dataset, options, chat = cands[chosen]["dataset"], tuple(cands[chosen]["options"]), cands[chosen]["chat"]
    base = root / chosen
    result["before"] = evaluate(MODEL, dataset, options, chat, "heldout", base / "before.out",
                                transcripts=base / "before.jsonl")
    save("before")
    result["training"] = train(dataset, options, chat, base, a.seed, a.cpu_seconds)
    save("trained")
    result["after"] = evaluate(str(base / "run"), dataset, options, chat, "heldout", base / "after.out",
                               transcripts=base / "after.jsonl")
    b, c = outcomes(base / "before.jsonl"), outcomes(base / "after.jsonl")
    ids = sorted(set(b) & set(c))
    result.update(gain(result["before"], result["after"], ([b[i] for i in ids], [c[i] for i in ids])))
    save("done")
    return result


def progress(a: argparse.Namespace) -> dict:
    """A training still under way, as far as it got (its metrics.jsonl), written into the results file beside the
    stages already done: for a partial result, not a final one."""
    out = results_file(a.out)
    result = json.loads(out.read_text())
    metrics = Path(a.runs) / result["chosen"] / "run" / "metrics.jsonl"
    result["progress"] = cpu_and_dynamics(metrics)
    if a.eval:  # the latest checkpoint, copied (the training goes on writing its own), on the held-out problems
        import shutil

        run = metrics.parent
        copy = run.parent / f"interim_u{result['progress']['updates']}"
        if not copy.exists():
            shutil.copytree(run, copy, ignore=shutil.ignore_patterns("tb", ".*"))
        from safetensors import safe_open

        with safe_open(str(copy / "checkpoint.safetensors"), "pt") as f:  # the update it holds (saved every 10)
            update = int(json.loads(next(iter(f.metadata().values())))["update"])
        rows = [json.loads(x) for x in (copy / "metrics.jsonl").read_text().splitlines() if x.strip()][:update]
        c = result["candidates"][result["chosen"]]
        after = evaluate(str(copy), c["dataset"], tuple(c["options"]), c["chat"], "heldout", copy / "after.out",
                         transcripts=copy / "after.jsonl")
        result["interim"] = {"updates": update, "cpu_seconds": sum(r.get("time/cpu_iteration", 0.0) for r in rows),
                             "after": after, **gain(result["before"], after, None)}
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result["progress"]


# ------------------------------------------------------------------------------------------------ rendering
STATUS = {"before": "the training is under way", "trained": "trained, not yet evaluated", "done": "done"}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def render(paths: list[str]) -> str:
    lines = []
    for path in paths:
        r = json.loads(results_file(path).read_text())
        lines += ["Candidates, the base model on the first validation problems (greedy; chosen: between "
                  f"{_pct(r['band'][0])}% and {_pct(r['band'][1])}%, nearest {_pct(MIDDLE)}%):", "",
                  "| generator | options | prompts | n | accuracy % [95% CI] | mean score |", "|---|---|---|---|---|---|"]
        for key, c in r.get("candidates", {}).items():
            name = f"**{c['dataset']}**" if key == r.get("chosen") else c["dataset"]
            prompts = "raw" if c["chat"] == "off" else "chat"
            lines.append(f"| {name} | {' '.join(c['options']) or '–'} | {prompts} | {c['n']} | {_pct(c['accuracy'])} "
                         f"[{_pct(c['ci'][0])}, {_pct(c['ci'][1])}] | {c['mean_score']:.3f} |")
        lines.append("")
        if r.get("chosen") is None:
            lines.append("No candidate is in the band: nothing was trained.")
            continue
        before, after, t = r.get("before"), r.get("after"), r.get("training")
        lines += [f"Held-out ({r['chosen']}), greedy, before and after {r['cpu_seconds_budget']:g} CPU-s of GRPO "
                  f"with LoRA (seed {r['seed']}; {STATUS.get(r['status'], r['status'])}):", "",
                  "| model | n | accuracy % [95% CI] | gain, points [Newcombe 95%] | paired t 95% | updates | "
                  "CPU-s/update | train acc. first 10 → last 10 |", "|---|---|---|---|---|---|---|---|"]
        if before:
            lines.append(f"| base | {before['n']} | {_pct(before['accuracy'])} [{_pct(before['ci'][0])}, "
                         f"{_pct(before['ci'][1])}] | | | | | |")
        if after and t:
            lo, hi = r["newcombe_ci"]
            plo, phi = r["paired_t_ci"]
            lines.append(f"| trained | {after['n']} | {_pct(after['accuracy'])} [{_pct(after['ci'][0])}, "
                         f"{_pct(after['ci'][1])}] | {100 * r['gain']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] | "
                         f"[{100 * plo:+.1f}, {100 * phi:+.1f}] | {t['updates']} | {t['cpu_seconds_per_update']:.1f} | "
                         f"{_pct(t['train_accuracy_first10'])} → {_pct(t['train_accuracy_last10'])} |")
        if t is None and "interim" in r:
            i, ia = r["interim"], r["interim"]["after"]
            lo, hi = i["newcombe_ci"]
            lines.append(f"| interim: the checkpoint of update {i['updates']} ({i['cpu_seconds']:.0f} CPU-s) | "
                         f"{ia['n']} | {_pct(ia['accuracy'])} [{_pct(ia['ci'][0])}, {_pct(ia['ci'][1])}] | "
                         f"{100 * i['gain']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] | | {i['updates']} | | |")
        if t is None and "progress" in r:
            p = r["progress"]
            lines.append(f"| (training, not finished: {p['cpu_seconds']:.0f} of {r['cpu_seconds_budget']:g} CPU-s) | "
                         f"| | | | {p['updates']} | {p['cpu_seconds_per_update']:.1f} | "
                         f"{_pct(p['train_accuracy_first10'])} → {_pct(p['train_accuracy_last10'])} |")
        elif t is None:
            lines.append("| trained | – | (the training has not finished) | | | | | |")
        verdict = ("not yet measured: the training has not finished" if "bar_met" not in r else
                   "met" if r["bar_met"] else "not met")
        lines += ["", f"The bar (the gain's Newcombe interval above 0 after the whole budget): {verdict}."]
        lines += ["", "Commands: `python benchmarks/rgym_learn.py run` "
                  f"(`--cpu-seconds {r['cpu_seconds_budget']:g} --seed {r['seed']}`); the held-out evaluation: `"
                  + (before["command"] if before else "") + "`"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--render", nargs="+", metavar="JSON", help="print the tables of these results files")
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("run", help="candidates on validation, the choice, before, train, after")
    r.add_argument("--cpu-seconds", type=float, default=3600)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--runs", default="runs/rgym", help="where the stages are kept")
    r.add_argument("--out", default="rgym_learn.json", help="results file (a name in benchmarks/results/)")
    pr = sub.add_parser("progress", help="a training under way, as far as it got, into the results file")
    pr.add_argument("--runs", default="runs/rgym")
    pr.add_argument("--out", default="rgym_learn.json")
    pr.add_argument("--eval", action="store_true", help="and the latest checkpoint on the held-out problems (interim)")
    a = ap.parse_args()
    if a.render:
        print(render(a.render))
    elif a.cmd == "run":
        print(json.dumps(run(a)))
    elif a.cmd == "progress":
        print(json.dumps(progress(a)))
    else:
        ap.error("give run or --render")


if __name__ == "__main__":
    main()
