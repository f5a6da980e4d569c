"""How much of a GRPO step waits for codegen rewards, per sandbox backend: one sandbox per completion or batches.

    python benchmarks/reward_overlap.py [--model DIR] [--rounds 2] [--updates 15] [--sandbox-batch 16]
                                        [--backends bwrap,unshare,none] [--json-out FILE]

For each sandbox backend (``REFLECTRL_SANDBOX_BACKEND``; a backend that does not work here is reported
and skipped) and each mode, ``--rounds`` short GRPO runs on ``codegen`` from a warm-up checkpoint, all
in one loop whose order rotates every round (so drift of a shared machine's load hits every
configuration alike); the modes are

* ``per_job``: ``--sandbox-batch 1`` (one sandbox launch per completion, one env step per reward thread), and
* ``batch``:   ``--sandbox-batch N`` (the rollout scores each generated chunk with one call; the task runs
  the chunk's tests N jobs per sandbox launch, each job in its own forked process; the task's sandbox
  pool keeps its batch runners between calls),

and prints one JSON line (also written to ``--json-out``): per backend and mode the reward-wait fraction
(sum of ``time/reward_wait`` over sum of ``time/iteration``), seconds per step, seconds of reward calls
per step (``time/reward``, summed over the reward threads, wall time; key ``reward_cpu_s_per_step``), the
per-round values, per backend the batch/per-job ratios, and the range of the 1-minute load average seen
between runs. The default model is the codegen warm-up checkpoint of ``benchmarks/llm_learn.py``
(runs/bench/llm_learn/codegen_s1/warmup); if it is missing, it is made with that benchmark's first two
steps (init-tiny, warm-up) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "runs/bench/llm_learn/codegen_s1/warmup"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_learn import PRESETS  # noqa: E402  (the codegen recipe's settings)

from reflectrl.sandbox import BACKENDS, SandboxError, SandboxWarning, sandbox_backend  # noqa: E402
from reflectrl.sandbox import backends as sandbox_backends  # noqa: E402


def reflectrl(args: list[str], log: Path, backend: str | None = None) -> str:
    """Run ``reflectrl ARGS`` (stderr appended to ``log``; sandbox ``backend`` if given) and return its stdout."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if backend:
        env["REFLECTRL_SANDBOX_BACKEND"] = backend
    print(f"$ REFLECTRL_SANDBOX_BACKEND={backend or 'auto'} reflectrl " + " ".join(args), file=sys.stderr, flush=True)
    with open(log, "a") as err:
        proc = subprocess.run([sys.executable, "-m", "reflectrl.cli", *args], stdout=subprocess.PIPE, stderr=err,
                              text=True, env=env, cwd=ROOT, check=False)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): reflectrl {' '.join(args)}; see {log}")
    return proc.stdout


def ensure_model(model: Path, out: Path, log: Path, threads: int) -> Path:
    """The warm-up checkpoint, made with llm_learn's init-tiny + warm-up steps if it does not exist."""
    if (model / "config.json").exists():
        return model
    p = PRESETS["codegen"]
    made = out / "warmup"
    if not (made / "config.json").exists():
        reflectrl(["llm", "init-tiny", str(out / "tiny"), *p["tiny"], "--seed", "1"], log)
        reflectrl(["llm", "warmup", "--model", str(out / "tiny"), "--task", "codegen", "--out", str(made),
                   *p["warmup"], "--stop-at-accuracy", str(p["warmup_target"]), "--max-new-tokens",
                   str(p["max_new_tokens"]), "--seed", "1", "--threads", str(threads), "--no-progress"], log)
    return made


def sums(metrics: Path) -> dict[str, float]:
    """Sums of the step timings over a run's updates."""
    tot = {"steps": 0, "wait": 0.0, "iteration": 0.0, "reward": 0.0, "generate": 0.0}
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        if "time/iteration" not in rec:
            continue
        tot["steps"] += 1
        tot["wait"] += rec.get("time/reward_wait", 0.0)
        tot["iteration"] += rec["time/iteration"]
        tot["reward"] += rec.get("time/reward", 0.0)
        tot["generate"] += rec.get("time/generate", 0.0)
    return tot


def working_backends(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The named backends that work on this machine, and why the others do not."""
    found, missing = [], {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxWarning)
        for name in names:
            try:
                if sandbox_backend(name) == name:
                    found.append(name)
                    continue
            except SandboxError:
                pass
            missing[name] = sandbox_backends.PROBE_ERRORS.get(name, "unavailable").strip()
    return found, missing


def summary(runs: list[dict[str, float]]) -> dict:
    total = {k: sum(r[k] for r in runs) for k in runs[0]}
    steps = max(total["steps"], 1)
    return {
        "reward_wait_fraction": round(total["wait"] / max(total["iteration"], 1e-9), 4),
        "step_s": round(total["iteration"] / steps, 3),
        "reward_wait_s_per_step": round(total["wait"] / steps, 3),
        "reward_cpu_s_per_step": round(total["reward"] / steps, 3),
        "generate_s_per_step": round(total["generate"] / steps, 3),
        "steps": int(total["steps"]),
        "rounds_wait_fraction": [round(r["wait"] / max(r["iteration"], 1e-9), 4) for r in runs],
        "rounds_step_s": [round(r["iteration"] / max(r["steps"], 1), 3) for r in runs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="warm-up checkpoint (HF model directory)")
    ap.add_argument("--out", type=Path, default=None, help="where runs go (default: a temporary directory)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating (default 2)")
    ap.add_argument("--updates", type=int, default=15)
    ap.add_argument("--sandbox-batch", type=int, default=16, help="jobs per sandbox launch in batch mode")
    ap.add_argument("--prompts-per-update", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backends", default=",".join(BACKENDS), help="sandbox backends, comma-separated")
    ap.add_argument("--modes", default="per_job,batch", help="per_job and/or batch, comma-separated")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the result here")
    a = ap.parse_args()
    asked = [b for b in a.backends.split(",") if b]
    modes_asked = [m for m in a.modes.split(",") if m]
    if not asked or any(b not in BACKENDS for b in asked):
        sys.exit(f"error: --backends takes names from {', '.join(BACKENDS)}, got {a.backends!r}")
    if not modes_asked or any(m not in ("per_job", "batch") for m in modes_asked):
        sys.exit(f"error: --modes takes per_job and/or batch, got {a.modes!r}")
    if min(a.rounds, a.updates, a.sandbox_batch) < 1:
        sys.exit("error: --rounds, --updates and --sandbox-batch must be >= 1")
    names, missing = working_backends(asked)
    if not names:
        sys.exit(f"error: none of the sandbox backends {asked} works here: {missing}")
    out = a.out or Path(tempfile.mkdtemp(prefix="reward_overlap-"))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "stderr.log"
    model = ensure_model(a.model, out, log, a.threads)
    sizes = {"per_job": 1, "batch": a.sandbox_batch}
    configs = [(b, m) for b in names for m in modes_asked]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {c: [] for c in configs}
    loads = [os.getloadavg()[0]]
    for rnd in range(a.rounds):
        for backend, mode in configs[rnd % len(configs):] + configs[:rnd % len(configs)]:
            size = sizes[mode]
            run_dir = out / f"{backend}_{mode}_{rnd}"
            shutil.rmtree(run_dir, ignore_errors=True)
            reflectrl(["llm", "train", "--algo", "grpo", "--task", "codegen", "--model", str(model),
                       "--run-dir", str(run_dir), "--updates", str(a.updates),
                       "--prompts-per-update", str(a.prompts_per_update), "--group-size", str(a.group_size),
                       "--max-new-tokens", str(a.max_new_tokens), "--gen-batch", str(a.gen_batch),
                       "--threads", str(a.threads), "--seed", str(a.seed), "--sandbox-batch", str(size),
                       "--save-interval", "0", "--sample-interval", "0", "--no-tensorboard", "--no-export-model",
                       "--no-progress"], log, backend)
            runs[(backend, mode)].append(sums(run_dir / "metrics.jsonl"))
            loads.append(os.getloadavg()[0])
            print(f"{backend} {mode} round {rnd}: {json.dumps(runs[(backend, mode)][-1])}", file=sys.stderr,
                  flush=True)
    per_backend: dict[str, dict] = {}
    for backend in names:
        res = {m: summary(runs[(backend, m)]) for m in modes_asked}
        if len(res) == 2:
            for key, field in (("step_s", "step_s"), ("reward_wait_fraction", "reward_wait_fraction"),
                               ("reward_cpu_s", "reward_cpu_s_per_step")):
                res[f"ratio_{key}"] = round(res["batch"][field] / max(res["per_job"][field], 1e-9), 3)
        per_backend[backend] = res
    result = {
        "benchmark": "reward_overlap", "task": "codegen", "model": str(model), "rounds": a.rounds,
        "updates": a.updates, "rows_per_update": a.prompts_per_update * a.group_size, "gen_batch": a.gen_batch,
        "sandbox_batch": a.sandbox_batch, "cpus": os.cpu_count(), "modes": modes_asked,
        "load_average_1min": [round(min(loads), 2), round(max(loads), 2)],
        "backends": per_backend, "unavailable": missing,
    }
    if a.out is None:
        shutil.rmtree(out, ignore_errors=True)
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
