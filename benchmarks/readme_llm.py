"""Does the README's own LLM example learn? Its four commands as written, in a fresh folder, then the warmed-up
model's held-out accuracy (before) beside the trained run's (after).

    python benchmarks/readme_llm.py [--out runs/bench/readme_llm]

The commands are read from README.md (the first ``bash`` block under "## LLM agents") and run unchanged, each
printed before it runs; the only addition is ``reflectrl llm eval runs/tiny-warm ...`` for the accuracy before RL.
Writes ``benchmarks/results/readme_llm.json``; ``--render`` prints its table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from reflectrl.eval.stats import difference_of_proportions_ci

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "readme_llm.json"


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## LLM agents"):]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def run(cmd: str, cwd: Path) -> str:
    print(f"$ {cmd}", flush=True)
    args = shlex.split(cmd)
    assert args[0] == "reflectrl", cmd
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run([sys.executable, "-m", "reflectrl.cli", *args[1:]], cwd=cwd, env=env, text=True,
                          capture_output=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {cmd}\n{proc.stderr[-2000:]}")
    return proc.stdout


def render() -> None:
    """The current example's row, then the earlier example's (``readme_llm_earlier.json``) where kept."""
    print("| example | held-out problems | warmed-up model, % [95% CI] | after `llm train`, % [95% CI] | "
          "gain, points [95% CI] | GRPO updates |")
    print("|---|---|---|---|---|---|")
    rows = [(label, path) for label, path in (("README.md now", RESULT),
                                              ("earlier (200 updates)", RESULT.with_name("readme_llm_earlier.json")),
                                              ("the defaults alone", RESULT.with_name("readme_llm_defaults.json")))
            if path.is_file()]
    for label, path in rows:
        r = json.loads(path.read_text())
        b, f = r["before"], r["after"]
        (b_lo, b_hi), (a_lo, a_hi) = b["ci"], f["ci"]
        d = f["accuracy"] - b["accuracy"]
        lo, hi = difference_of_proportions_ci(b["accuracy"], b["ci"], f["accuracy"], f["ci"])
        print(f"| {label} | {f['n']} | {100 * b['accuracy']:.1f} [{100 * b_lo:.1f}, {100 * b_hi:.1f}] | "
              f"{100 * f['accuracy']:.1f} [{100 * a_lo:.1f}, {100 * a_hi:.1f}] | {100 * d:+.1f} [{100 * lo:+.1f}, "
              f"{100 * hi:+.1f}] | {r['updates']} |")
    for label, path in rows:
        print(f"\nCommands ({label}): " + "; ".join(f"`{c}`" for c in json.loads(path.read_text())["commands"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/bench/readme_llm", help="the folder the commands run in (made fresh)")
    ap.add_argument("--render", action="store_true", help="print the table of BENCHMARKS.md")
    a = ap.parse_args()
    if a.render:
        render()
        return
    cwd = Path(a.out).resolve()
    if cwd.exists() and any(cwd.iterdir()):
        sys.exit(f"{cwd} is not empty: give a new --out")
    cwd.mkdir(parents=True, exist_ok=True)
    commands = readme_commands()
    outputs = [run(c, cwd) for c in commands]
    before = json.loads(run("reflectrl llm eval runs/tiny-warm --task arith --split heldout --self-report both --json",
                            cwd).strip().splitlines()[-1])
    after = json.loads(outputs[-1].strip().splitlines()[-1])
    run_dir = next(c.split("--run-dir")[1].split()[0] for c in commands if "--run-dir" in c)
    config = json.loads((cwd / run_dir / "config.json").read_text())
    keep = ("n", "accuracy", "ci", "reflection_accuracy", "ece", "auroc")
    result = {"benchmark": "readme_llm", "commands": commands, "learning_rate": config["learning_rate"],
              "updates": config["updates"], "before": {k: before.get(k) for k in keep},
              "after": {k: after.get(k) for k in keep}}
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
