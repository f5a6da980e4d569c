"""Soak: does a long run keep a flat resident memory? A 1M-step PPO run and a 500-update GRPO run, each
through the CLI (``python -m reflectrl.cli``) with its default logging (metrics.jsonl, TensorBoard,
checkpoints every 10 updates), while this process samples the trainer's resident set size (psutil, else
/proc/PID/statm) every ``--interval`` seconds and counts its metrics records. A third run is the GRPO run
with ``--reward-cache 0``: the difference is what the reward cache (an LRU of scored completions, bounded
by its entry count) holds.

The figure is the growth after the first tenth: the peak RSS of the samples taken once the run has logged
a tenth of its updates, over the RSS when it had; the bar is under 5%. (The first tenth holds the start-up:
imports, the model, allocator pools warming up.)

    nice -n 10 python benchmarks/soak.py --json-out benchmarks/results/soak.json     # all runs, minutes
    python benchmarks/soak.py --render                                             # the BENCHMARKS.md section
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "soak.json"
BAR = 0.05  # growth after the first tenth, at most
MAX_POINTS = 200  # samples kept in the JSON per run (evenly thinned)


def rss_bytes(pid: int) -> int | None:
    """Resident set size of process ``pid`` (None once it has exited)."""
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        pass
    except Exception:  # noqa: BLE001  (psutil.NoSuchProcess and kin)
        return None
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def soak(name: str, args: list[str], run_dir: Path, updates: int, interval: float) -> dict:
    """Run ``reflectrl ARGS`` and sample its RSS and progress until it exits."""
    cmd = [sys.executable, "-m", "reflectrl.cli", *args, "--run-dir", str(run_dir), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    samples: list[tuple[float, float, int]] = []  # (seconds, RSS MiB, records logged)
    while proc.poll() is None:
        rss = rss_bytes(proc.pid)
        if rss:  # None once gone; 0 while it has exited and is not yet reaped (a zombie holds no memory)
            samples.append((round(time.perf_counter() - t0, 2), round(rss / 2**20, 2),
                            count_lines(run_dir / "metrics.jsonl")))
        time.sleep(interval)
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{name}: `reflectrl {' '.join(args)}` exited {proc.returncode}: {err.strip()[-800:]}")
    summary = json.loads(out.strip().splitlines()[-1])
    tenth = max(1, updates // 10)
    after = [s for s in samples if s[2] >= tenth]
    if not after:
        sys.exit(f"{name}: no RSS sample after the first tenth of the run (sample more often: --interval)")
    base, peak, final = after[0][1], max(s[1] for s in after), after[-1][1]
    step = max(1, len(samples) // MAX_POINTS)
    return {"command": "reflectrl " + " ".join(args), "updates": updates, "wall_s": round(time.perf_counter() - t0, 1),
            "summary": summary, "samples_taken": len(samples), "first_tenth_updates": tenth,
            "rss_start_mib": samples[0][1], "rss_at_first_tenth_mib": base, "rss_peak_after_mib": peak,
            "rss_final_mib": final, "growth_after_first_tenth": round(peak / base - 1, 4),
            "ok": peak / base - 1 < BAR, "samples": samples[::step] + ([samples[-1]] if len(samples) % step else [])}


RUNS = ("ppo", "grpo", "grpo-reward-cache-0")


def runs(a: argparse.Namespace, work: Path) -> dict:
    """The runs named in ``a.runs``: PPO, GRPO, and GRPO without its reward cache (which tells the cache's
    share of GRPO's growth)."""
    out = {}
    if "ppo" in a.runs:
        ppo_batch = 4 * 128  # CartPole-v1's defaults: 4 envs x 128 steps
        out["ppo"] = soak("ppo", ["train", "--algo", "ppo", "--env-id", "CartPole-v1", "--total-timesteps",
                                  str(a.ppo_steps), "--seed", "1"], work / "ppo", max(1, a.ppo_steps // ppo_batch),
                          a.interval)
    from reflectrl.llm.tiny import init_tiny

    tiny = init_tiny(work / "tiny", seed=0, force=True)
    grpo = ["llm", "train", "--algo", "grpo", "--task", "arith", "--model", str(tiny), "--updates",
            str(a.grpo_updates), "--prompts-per-update", "8", "--group-size", "4", "--max-new-tokens", "8",
            "--learning-rate", "1e-4", "--seed", "1"]
    for name, extra in (("grpo", []), ("grpo-reward-cache-0", ["--reward-cache", "0"])):
        if name in a.runs:
            out[name] = soak(name, grpo + extra, work / name, a.grpo_updates, a.interval)
            out[name]["command"] = out[name]["command"].replace(str(tiny), "TINY")  # `reflectrl llm init-tiny TINY`
    for name, r in out.items():
        print(f"{name}: growth {r['growth_after_first_tenth']:.2%}", file=sys.stderr, flush=True)
    return out


def measure(a: argparse.Namespace) -> None:
    import torch

    with tempfile.TemporaryDirectory(prefix="reflectrl-soak-") as tmp:
        work = Path(a.work_dir) if a.work_dir else Path(tmp)
        done = runs(a, work)
        kept = {}
        if set(a.runs) != set(RUNS) and Path(a.json_out).is_file():  # a subset: keep the other runs' results
            kept = json.loads(Path(a.json_out).read_text())["runs"]
        result = {"benchmark": "soak", "bar": BAR, "interval_s": a.interval,
                  "runs": {n: done.get(n, kept.get(n)) for n in RUNS if n in done or n in kept},
                  "sampler": "psutil" if _has_psutil() else "/proc/PID/statm", "cpus": os.cpu_count(),
                  "python": platform.python_version(), "torch": torch.__version__,
                  "load_average_1min": round(os.getloadavg()[0], 1)}
    Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json_out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: {"growth": v["growth_after_first_tenth"], "ok": v["ok"]} for k, v in result["runs"].items()}))


def _has_psutil() -> bool:
    try:
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


def render(path: Path) -> str:
    """The BENCHMARKS.md table of a soak result."""
    if not path.exists():
        return "(no soak result: run `python benchmarks/soak.py --json-out benchmarks/results/soak.json`)"
    r = json.loads(path.read_text())
    rows = ["| run | command | updates | wall | RSS at start | RSS after the first tenth | peak after it | final | "
            "growth | bar |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, x in r["runs"].items():
        verdict = "met" if x["ok"] else "NOT met"
        rows.append(f"| {name} | `{x['command']}` | {x['updates']} | {x['wall_s'] / 60:.1f} min | "
                    f"{x['rss_start_mib']:.0f} MiB | {x['rss_at_first_tenth_mib']:.0f} MiB | "
                    f"{x['rss_peak_after_mib']:.0f} MiB | {final(x)} | "
                    f"**{x['growth_after_first_tenth']:+.1%}** | {verdict} (< {r['bar']:.0%}) |")
    counts = ", ".join(f"{k}: {v['samples_taken']} samples" for k, v in r["runs"].items())
    zombie = any(x["rss_final_mib"] == 0 for x in r["runs"].values())
    return "\n".join(rows) + (f"\n\nRSS of the trainer process sampled every {r['interval_s']:g} s ({r['sampler']}; "
                              f"{counts}); {r['cpus']} CPUs, Python {r['python']}, torch {r['torch']}, 1-minute "
                              f"load average {r['load_average_1min']} at the end." +
                              (" A final of n/a: the run's last sample caught the process after it had exited and "
                               "before it was reaped (RSS 0; the sampler now skips such samples)." if zombie else ""))


def final(x: dict) -> str:
    """The last sample's RSS; n/a where it was taken of an exited, unreaped process (RSS 0)."""
    return "n/a" if x["rss_final_mib"] == 0 else f"{x['rss_final_mib']:.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ppo-steps", type=int, default=1_000_000, help="PPO env steps (default 1000000)")
    ap.add_argument("--grpo-updates", type=int, default=500, help="GRPO updates (default 500)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between RSS samples (default 1)")
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS),
                    help="which runs (default all; a subset replaces those runs in --json-out, keeping the others)")
    ap.add_argument("--work-dir", default=None, help="keep the run directories here (default: a temporary one)")
    ap.add_argument("--json-out", default=str(RESULT), help=f"result file (default {RESULT.relative_to(HERE.parent)})")
    ap.add_argument("--render", action="store_true", help="print the BENCHMARKS.md table of --json-out and exit")
    a = ap.parse_args()
    if a.render:
        print(render(Path(a.json_out)))
        return
    measure(a)


if __name__ == "__main__":
    main()
