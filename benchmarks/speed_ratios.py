"""Every speed ratio of the results files as the median of its per-round paired ratios, recomputed from the rounds
each file keeps (nothing is run again).

    python benchmarks/speed_ratios.py            # rewrites the ratio fields of the files in FILES
    python benchmarks/speed_ratios.py --check    # exits 1 where a file's ratio is not that median

A speed benchmark runs its arms in rounds; a ratio of the arms' medians mixes rounds run under different load, so
every ratio is taken per round (both arms of a round ran under its load) and reported as the median and range of
those. The files written before that was the rule keep their per-round data, so their ratios are recomputed here:
``llm_throughput*.json`` (``llm_throughput.recompute``), ``llm_update_speed_*.json``, ``llm_decode_step_*.json`` and
``trl_overhead.json``. ``tests/test_speed_ratios.py`` checks every file with per-round data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_decode_step  # noqa: E402
import llm_throughput  # noqa: E402
import llm_update_speed  # noqa: E402
import trl_overhead  # noqa: E402
from resultio import RESULTS  # noqa: E402


def recomputed(path: Path) -> dict:
    """The results file at ``path`` with its ratios recomputed from its per-round data."""
    r = json.loads(path.read_text())
    bench = r.get("benchmark")
    if bench == "llm_throughput":
        return llm_throughput.recompute(path)
    if bench == "llm_update_speed":
        return llm_update_speed.speedups(r)
    if bench == "llm_decode_step":
        return {**r, **llm_decode_step.speedup(r["rounds"])}
    if bench == "trl_overhead":
        return {**r, **trl_overhead.ratios(r["runs"])}
    raise ValueError(f"{path.name}: no per-round ratio to recompute")


FILES = ("llm_throughput*.json", "llm_update_speed_*.json", "llm_decode_step_*.json", "trl_overhead.json")


BENCHMARKS = ("llm_throughput", "llm_update_speed", "llm_decode_step", "trl_overhead")


def files() -> list[Path]:
    """The results files of the benchmarks above (the A/B files beside them give one ratio per round already)."""
    return sorted(p for pattern in FILES for p in RESULTS.glob(pattern)
                  if json.loads(p.read_text()).get("benchmark") in BENCHMARKS)


def main() -> None:
    check = "--check" in sys.argv[1:]
    stale = []
    for path in files():
        fresh = recomputed(path)
        if json.loads(path.read_text()) != fresh:
            stale.append(path.name)
            if not check:
                indent = 1 if path.read_text().startswith('{\n "') else 2
                path.write_text(json.dumps(fresh, indent=indent) + "\n")
    print(("stale: " if check else "rewrote: ") + (", ".join(stale) or "none"))
    sys.exit(1 if check and stale else 0)


if __name__ == "__main__":
    main()
