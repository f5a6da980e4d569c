"""The table of benchmarks/results/llm_overhead.json (benchmarks/llm_overhead.py) for render_all.py; ``--file NAME``
renders another results file of that script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

name = sys.argv[sys.argv.index("--file") + 1] if "--file" in sys.argv else "llm_overhead.json"
p = Path(__file__).resolve().parent / "results" / name
if not p.is_file():
    print(f"(not produced yet: benchmarks/results/{name})")
else:
    d = json.loads(p.read_text())
    print(f"{d['task']}, {d['updates']} updates per run, {d['rounds']} rounds; settings `{d['settings']}`.\n")
    print("| method | baseline | CPU per token, ratio (median) | per round | CPU per update, ratio | tokens per update, ratio "
          "| bar | within |")
    print("|---|---|---|---|---|---|---|---|")
    for m, r in d.items():
        if isinstance(r, dict) and "ratio_per_token" in r:
            rounds = ", ".join(f"{x:.3f}" for x in r["ratios_per_token"])
            bar = "n/a" if r["bar"] is None else f"{r['bar']:.2f}"
            within = "n/a" if r["within_bar"] is None else ("yes" if r["within_bar"] else "no")
            print(f"| {m} | {r['baseline']} | {r['ratio_per_token']:.3f} | {rounds} "
                  f"| {r['ratio_per_update']:.3f} | {r['tokens_per_update_ratio']:.3f} | {bar} | {within} |")
