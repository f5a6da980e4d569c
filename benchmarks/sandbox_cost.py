"""Milliseconds per sandbox verdict with each backend, in one run (so the ratios share the machine's load).

    python benchmarks/sandbox_cost.py --rounds 5 --json-out benchmarks/results/sandbox_cost.json

Per round and backend (the backend order rotates every round): ``--verdicts`` honest verdicts through
``SandboxPool.map_batched`` (``--workers`` threads, ``--batch-size`` jobs per call, the pool's kept batch
runners; the pool and a first call are set up before the clock starts, as in a training run), then
``--single`` verdicts one sandbox each through ``SandboxPool.map``. Reported per backend: the median over
rounds of ms per verdict in each mode, the per-round values, and the median over rounds of each round's
ratio to bubblewrap's figure of the same round, and the range of the 1-minute load average seen between
runs. Backends that do not work here are listed with the
probe's reason. The bar: ``unshare`` batched <= 1.5x ``bwrap`` batched.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

from reflectrl.sandbox import BACKENDS, SandboxError, SandboxPool, SandboxWarning, batch_supported, sandbox_backend
from reflectrl.sandbox import backends as sandbox_backends

CODE = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(2, 0) == 2\n"


def available() -> tuple[list[str], dict[str, str]]:
    """The backends that work on this machine, and why the others do not."""
    found, missing = [], {}
    for name in BACKENDS:
        try:
            if sandbox_backend(name) == name:
                found.append(name)
        except SandboxError:
            missing[name] = sandbox_backends.PROBE_ERRORS.get(name, "unavailable").strip()
    return found, missing


def timed(backend: str, verdicts: int, single: int, workers: int, batch_size: int) -> dict[str, float]:
    """ms per verdict in each mode for one backend (every verdict must pass)."""
    jobs = [(CODE, TESTS)] * verdicts
    with SandboxPool(max_workers=workers, backend=backend, timeout_s=5.0) as pool:
        pool.map_batched(jobs[: 2 * workers], batch_size=batch_size)  # the kept runners come up
        start = time.perf_counter()
        batched = pool.map_batched(jobs, batch_size=batch_size)
        batched_ms = (time.perf_counter() - start) * 1000 / verdicts
        start = time.perf_counter()
        one_each = pool.map(jobs[:single])
        single_ms = (time.perf_counter() - start) * 1000 / single
    bad = sorted({v.status for v in batched + one_each} - {"passed"})
    if bad:
        sys.exit(f"backend {backend}: honest jobs ended {bad}")
    return {"batched_ms": batched_ms, "one_per_sandbox_ms": single_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--verdicts", type=int, default=128, help="batched verdicts per round and backend")
    ap.add_argument("--single", type=int, default=32, help="one-sandbox-each verdicts per round and backend")
    ap.add_argument("--workers", type=int, default=2, help="SandboxPool threads")
    ap.add_argument("--batch-size", type=int, default=16, help="jobs per batch call")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    if min(a.rounds, a.verdicts, a.single, a.workers, a.batch_size) < 1:
        sys.exit("error: --rounds, --verdicts, --single, --workers and --batch-size must be >= 1")
    warnings.simplefilter("ignore", SandboxWarning)
    names, missing = available()
    if not names:
        sys.exit(f"error: no sandbox backend works here: {missing}")
    per_round: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    loads = [os.getloadavg()[0]]
    for rnd in range(a.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            per_round[name].append(timed(name, a.verdicts, a.single, a.workers, a.batch_size))
            loads.append(os.getloadavg()[0])
        print(f"round {rnd}: " + ", ".join(f"{n} {per_round[n][-1]['batched_ms']:.1f}/"
                                          f"{per_round[n][-1]['one_per_sandbox_ms']:.1f} ms" for n in names),
              file=sys.stderr, flush=True)
    result: dict = {"benchmark": "sandbox_cost", "rounds": a.rounds, "verdicts": a.verdicts, "single": a.single,
                    "workers": a.workers, "batch_size": a.batch_size, "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_average_1min": [round(min(loads), 2), round(max(loads), 2)],
                    "unavailable": missing, "backends": {}}
    for name in names:
        rows = per_round[name]
        entry = {"batch_mode": batch_supported(name)}
        for mode in ("batched_ms", "one_per_sandbox_ms"):
            entry[mode] = round(statistics.median(r[mode] for r in rows), 2)
            entry[f"rounds_{mode}"] = [round(r[mode], 2) for r in rows]
            if "bwrap" in per_round:
                entry[f"ratio_to_bwrap_{mode}"] = round(statistics.median(
                    r[mode] / b[mode] for r, b in zip(rows, per_round["bwrap"])), 3)
        result["backends"][name] = entry
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
