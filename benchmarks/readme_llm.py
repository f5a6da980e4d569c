"""Does the README's first LLM example learn? Its commands as written, in a fresh folder: the real model's held-out
accuracy before GRPO (the first ``llm eval``) beside the trained run's (the last), and the training's CPU time.

    python benchmarks/readme_llm.py [--out runs/bench/readme_llm]

The commands are read from README.md (the first ``bash`` block under "## LLM agents") and run unchanged, each
printed before it runs, with one addition: ``--json`` on each ``llm eval`` (its numbers as one JSON line; the
evaluation itself is the same). The CPU time of each command is its process's (user + system, from the operating
system), model loading included. Writes ``benchmarks/results/readme_llm.json``; ``--render`` prints its table for
BENCHMARKS.md, then the earlier first examples' (the tiny model: ``readme_llm_tiny.json`` and the files before it).

The bar (issue 55): at least +20 held-out points, the 95% interval of the gain above 0, in at most 15 CPU-minutes of
training, one seed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from reflectrl.eval.stats import difference_of_proportions_ci

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "readme_llm.json"
BAR_POINTS, BAR_CPU_MINUTES = 20.0, 15.0
TINY = (("tiny model, 600 updates", "readme_llm_tiny.json"), ("tiny model, 200 updates", "readme_llm_earlier.json"),
        ("tiny model, the defaults alone", "readme_llm_defaults.json"))


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## LLM agents"):]
    found = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert found, "no bash block under ## LLM agents"
    joined = re.sub(r"\\\n\s*", " ", found.group(1))
    return [line.split("#", 1)[0].strip() for line in joined.splitlines() if line.split("#", 1)[0].strip()]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd: str, cwd: Path) -> tuple[str, float]:
    """Run one README command (``--json`` added to ``llm eval``); its stdout and its process's CPU seconds."""
    print(f"$ {cmd}", flush=True)
    args = shlex.split(cmd)
    assert args[0] == "reflectrl", cmd
    if args[1:3] == ["llm", "eval"] and "--json" not in args:
        args.append("--json")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cpu0 = children_cpu()
    proc = subprocess.run([sys.executable, "-m", "reflectrl.cli", *args[1:]], cwd=cwd, env=env, text=True,
                          capture_output=True)
    cpu = children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {cmd}\n{proc.stderr[-2000:]}")
    print(f"  {cpu:.0f} CPU-s", flush=True)
    return proc.stdout, cpu


def last_json(stdout: str) -> dict[str, Any]:
    return json.loads(stdout.strip().splitlines()[-1])


def measure(cwd: Path) -> dict[str, Any]:
    commands = readme_commands()
    evals = [i for i, c in enumerate(commands) if c.split()[1:3] == ["llm", "eval"]]
    trains = [i for i, c in enumerate(commands) if c.split()[1:3] == ["llm", "train"]]
    assert len(evals) == 2 and len(trains) == 1 and evals[0] < trains[0] < evals[1], (
        "the block should evaluate, train, then evaluate again", commands)
    load_before = os.getloadavg()[0]
    outputs = [run(c, cwd) for c in commands]
    keep = ("n", "accuracy", "ci", "ece", "auroc", "mean_confidence", "brier")
    before, after = (last_json(outputs[i][0]) for i in evals)
    train = last_json(outputs[trains[0]][0])
    b, a = before["accuracy"], after["accuracy"]
    lo, hi = difference_of_proportions_ci(b, before["ci"], a, after["ci"])
    minutes = outputs[trains[0]][1] / 60
    return {"benchmark": "readme_llm", "commands": commands, "json_added_to": [commands[i] for i in evals],
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"),
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "before": {k: before.get(k) for k in keep}, "after": {k: after.get(k) for k in keep},
            "gain": a - b, "gain_ci": [lo, hi], "updates": train["updates"],
            "train_cpu_s_process": outputs[trains[0]][1], "train_cpu_s_trainer": train["cpu_s"],
            "train_wall_s": train["wall_s"], "eval_cpu_s": [outputs[i][1] for i in evals],
            "bar": {"points": BAR_POINTS, "cpu_minutes": BAR_CPU_MINUTES,
                    "met": bool(100 * (a - b) >= BAR_POINTS and lo > 0 and minutes <= BAR_CPU_MINUTES)}}


def pct(x: float, ci: list[float]) -> str:
    return f"{100 * x:.1f} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def render() -> None:
    """The current example's table, then the earlier (tiny-model) first examples' where their files are kept."""
    if RESULT.is_file():
        r = json.loads(RESULT.read_text())
        b, f = r["before"], r["after"]
        lo, hi = r["gain_ci"]
        conf = lambda e: "n/a" if e.get("ece") is None else f"{e['ece']:.2f}"  # noqa: E731
        auroc = lambda e: "n/a" if e.get("auroc") is None else f"{e['auroc']:.2f}"  # noqa: E731
        print("| held-out problems | before, % [95% CI] | after, % [95% CI] | gain, points [95% CI] | GRPO updates | "
              "training, CPU-minutes | ECE before / after | AUROC before / after | bar |")
        print("|---|---|---|---|---|---|---|---|---|")
        bar = r["bar"]
        verdict = (f"met (+{bar['points']:g} points, interval above 0, at most {bar['cpu_minutes']:g} CPU-minutes)"
                   if bar["met"] else f"not met (+{bar['points']:g} points, interval above 0, at most "
                   f"{bar['cpu_minutes']:g} CPU-minutes)")
        print(f"| {f['n']} | {pct(b['accuracy'], b['ci'])} | {pct(f['accuracy'], f['ci'])} | {100 * r['gain']:+.1f} "
              f"[{100 * lo:+.1f}, {100 * hi:+.1f}] | {r['updates']} | {r['train_cpu_s_process'] / 60:.1f} (the "
              f"trainer's budget counted {r['train_cpu_s_trainer'] / 60:.1f}) | {conf(b)} / {conf(f)} | "
              f"{auroc(b)} / {auroc(f)} | {verdict} |")
        print(f"\nCommands (README.md now, `--json` added to each `llm eval`, OMP_NUM_THREADS={r['omp_num_threads']}): "
              + "; ".join(f"`{c}`" for c in r["commands"]))
        load = r.get("load_average_1min")
        print(f"\nThe training's wall time was {r['train_wall_s'] / 60:.1f} minutes"
              + (f" (the machine's load average {load[0]:.1f} at the start, {load[1]:.1f} at the end)" if load else "")
              + "; wall time depends on what else the machine runs, CPU time hardly; the two evaluations took "
              + " and ".join(f"{s / 60:.1f}" for s in r["eval_cpu_s"]) + " CPU-minutes.")
    rows = [(label, RESULT.with_name(name)) for label, name in TINY if RESULT.with_name(name).is_file()]
    if not rows:
        return
    print("\nThe earlier first examples, a tiny model warmed up on demonstrations (all 500 held-out problems):\n")
    print("| example | held-out problems | warmed-up model, % [95% CI] | after `llm train`, % [95% CI] | "
          "gain, points [95% CI] | GRPO updates |")
    print("|---|---|---|---|---|---|")
    for label, path in rows:
        r = json.loads(path.read_text())
        b, f = r["before"], r["after"]
        d = f["accuracy"] - b["accuracy"]
        lo, hi = difference_of_proportions_ci(b["accuracy"], b["ci"], f["accuracy"], f["ci"])
        print(f"| {label} | {f['n']} | {pct(b['accuracy'], b['ci'])} | {pct(f['accuracy'], f['ci'])} | "
              f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] | {r['updates']} |")
    for label, path in rows:
        print(f"\nCommands ({label}): " + "; ".join(f"`{c}`" for c in json.loads(path.read_text())["commands"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default="runs/bench/readme_llm", help="the folder the commands run in (made fresh)")
    ap.add_argument("--json-out", type=Path, default=RESULT, help=f"where to write the result (default {RESULT})")
    ap.add_argument("--render", action="store_true", help="print the tables of BENCHMARKS.md")
    a = ap.parse_args()
    if a.render:
        render()
        return
    cwd = Path(a.out).resolve()
    if cwd.exists() and any(cwd.iterdir()):
        sys.exit(f"{cwd} is not empty: give a new --out")
    cwd.mkdir(parents=True, exist_ok=True)
    result = measure(cwd)
    a.json_out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
