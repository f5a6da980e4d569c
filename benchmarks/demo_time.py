"""How long does the main job take? Runs ``reflectrl demo --out OUT`` and writes its wall time, with what its LLM half
showed (the real model's held-out accuracy and calibration before and after, from ``OUT/llm/summary.json``).

    python benchmarks/demo_time.py --out runs/demo_timing --json-out benchmarks/results/demo_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="demo output folder (emptied first)")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rc = subprocess.run([sys.executable, "-m", "reflectrl.cli", "demo", "--out", str(a.out)],
                        env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
    wall, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)  # the demo and every process it waited for
    res = {"benchmark": "demo_time", "rc": rc, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cpus": os.cpu_count(),
           "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "command": "reflectrl demo"}
    summary = a.out / "llm" / "summary.json"
    if summary.is_file():
        res["llm"] = json.loads(summary.read_text())
    print(json.dumps(res))
    if a.json_out:
        a.json_out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
