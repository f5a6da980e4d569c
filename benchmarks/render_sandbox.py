"""Render the sandbox-cost table of BENCHMARKS.md from benchmarks/results/sandbox_cost.json (sandbox_cost.py).

    python benchmarks/render_sandbox.py      # print the markdown
"""

from __future__ import annotations

import json
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"
BAR = 1.5  # unshare's batched cost per verdict over bwrap's, at most


def cost_table() -> str:
    path = RES / "sandbox_cost.json"
    if not path.exists():
        return "(no sandbox_cost result)"
    r = json.loads(path.read_text())
    rows = ["| backend | ms per verdict, batched (per round) | vs bwrap | ms per verdict, one sandbox each "
            "(per round) | vs bwrap |", "|---|---|---|---|---|"]
    for name, x in r["backends"].items():
        cells = []
        for mode in ("batched_ms", "one_per_sandbox_ms"):
            ratio = x.get(f"ratio_to_bwrap_{mode}")
            cells += [f"{x[mode]:.1f} ({', '.join(f'{v:.1f}' for v in x[f'rounds_{mode}'])})",
                      "-" if ratio is None else f"{ratio:.2f}x"]
        label = name if x["batch_mode"] else f"{name} (no batch mode: one sandbox each)"
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    unshare = r["backends"].get("unshare", {}).get("ratio_to_bwrap_batched_ms")
    verdict = "" if unshare is None else (f" unshare batched / bwrap batched: **{unshare:.2f}x** (median of the "
                                          f"rounds' ratios; the bar is <= {BAR}x).")
    skipped = "".join(f" Not run ({name} unavailable): {why}." for name, why in r.get("unavailable", {}).items())
    return "\n".join(rows) + (f"\n\nMedians over {r['rounds']} rounds; per round and backend {r['verdicts']} "
                              f"batched verdicts ({r['workers']} workers, {r['batch_size']} jobs per call) and "
                              f"{r['single']} one sandbox each, {r['cpus']} CPUs, Python {r['python']}{_load(r)}."
                              f"{verdict}{skipped}")


def _load(r: dict) -> str:
    """The load-average range of a result, as a clause (empty for results that predate it)."""
    low, high = r.get("load_average_1min", (None, None))
    return "" if low is None else f", 1-minute load average {low:.1f}-{high:.1f} between runs"


def main() -> None:
    print(cost_table())


if __name__ == "__main__":
    main()
