"""Methods started from each seed's GRPO-trained model instead of the recipe's weak warm-up.

    python benchmarks/late_start.py --from runs/cmp_llm/arith13 --task arith --updates 300 --seeds 10 \
        --methods grpo-late=grpo 'rlcr-rankbal-late=rlcr --rlcr-calibration rank-balanced --rlcr-credit split' \
        --out runs/cmp_llm/arith13_late --workers 2

For every seed N and method ``LABEL=ALGO [flags]``: ``reflectrl llm train --algo ALGO --task TASK --model
FROM/runs/TASK/grpo/seed_N/model`` with the task recipe's train flags, ``--updates``, ``--seed N`` and the method's
flags, into ``OUT/runs/TASK/LABEL/seed_N``, then ``reflectrl llm eval RUN --json --self-report both`` into that
run's ``eval.json``: the folder layout ``benchmarks/llm_claims.py`` reads (pair a method with the GRPO run continued
for the same updates from the same model, ``grpo-late=grpo``). A run whose ``eval.json`` exists is kept; one
without it is trained again from the start. Each command is printed before it runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reflectrl.experiments.recipes import recipe


def parse_method(spec: str) -> tuple[str, str, list[str]]:
    """``LABEL=ALGO --flag value ...`` (or a bare algo) as (label, algo, flags)."""
    label, _, rest = spec.partition("=")
    words = shlex.split(rest) if rest else [label]
    return label, words[0], words[1:]


def commands(a: argparse.Namespace, label: str, algo: str, flags: list[str], seed: int) -> tuple[Path, list, list]:
    start = Path(a.from_dir) / "runs" / a.task / "grpo" / f"seed_{seed}" / "model"
    if not start.is_dir():
        sys.exit(f"no GRPO-trained model at {start}: run the comparison ({a.from_dir}) with grpo first")
    run = Path(a.out) / "runs" / a.task / label / f"seed_{seed}"
    train = ["llm", "train", "--algo", algo, "--task", a.task, "--model", str(start), *recipe(a.task).train,
             "--updates", str(a.updates), "--seed", str(seed), "--run-dir", str(run), "--no-progress", *flags]
    return run, train, ["llm", "eval", str(run), "--json", "--self-report", "both"]


def one(a: argparse.Namespace, spec: str, seed: int) -> str:
    label, algo, flags = parse_method(spec)
    run, train, evaluate = commands(a, label, algo, flags, seed)
    if (run / "eval.json").is_file():
        return f"{label} seed {seed}: kept"
    if run.exists():
        shutil.rmtree(run)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run.parent.mkdir(parents=True, exist_ok=True)
    log = run.parent / f"seed_{seed}.log"
    for args in (train, evaluate):
        print("$ reflectrl " + shlex.join(args), flush=True)
        with open(log, "a") as err:
            proc = subprocess.run([sys.executable, "-m", "reflectrl.cli", *args], stdout=subprocess.PIPE,
                                  stderr=err, text=True, env=env)
        if proc.returncode != 0:
            return f"{label} seed {seed}: failed ({proc.returncode}), see {log}"
    (run / "eval.json").write_text(proc.stdout.strip().splitlines()[-1] + "\n")
    return f"{label} seed {seed}: done"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="from_dir", required=True, help="a comparison folder with grpo's seed_N/model")
    p.add_argument("--task", default="arith")
    p.add_argument("--methods", nargs="+", required=True, help="LABEL=ALGO [flags], quoted")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()
    jobs = [(m, s) for s in range(1, a.seeds + 1) for m in a.methods]
    for m, s in jobs:  # every start model is there before any work is spent
        commands(a, *parse_method(m), s)
    failed = False
    with ThreadPoolExecutor(max(1, a.workers)) as pool:
        for result in pool.map(lambda job: one(a, *job), jobs):
            print(result, flush=True)
            failed |= "failed" in result
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
