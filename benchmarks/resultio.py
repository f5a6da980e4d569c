"""What the measuring scripts share: a results file named as given or under benchmarks/results/, and a result
written to ``--json-out`` and printed as the last line of output."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def results_file(name: str) -> Path:
    """``name`` as a path where it exists, else the file of that name in benchmarks/results/."""
    return Path(name) if Path(name).exists() else RESULTS / name


def emit(result: dict[str, Any], json_out: str | None) -> None:
    """Write ``result`` to ``json_out`` (when given) and print it as one JSON line."""
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


def paired_ratios(num: list[float], den: list[float]) -> dict[str, Any]:
    """A speed ratio as the speed benchmarks report it: per round, ``num`` over ``den`` measured in the same round (a
    paired ratio: both arms ran under that round's load), then the median and range of those ratios."""
    ratios = [a / b for a, b in zip(num, den)]
    return {"median": statistics.median(ratios), "range": [min(ratios), max(ratios)], "rounds": ratios}


def load_average() -> list[float]:
    """The machine's 1-, 5- and 15-minute load averages now (recorded before each round of a speed benchmark)."""
    return [round(x, 2) for x in os.getloadavg()]


def main(ap: Any, measure: Any, render: Any, needs: str | None = None) -> None:
    """A measuring script's command line: ``ap`` with ``--json-out F`` and ``--render F [F ...]`` added; renders the
    results files given, or measures (``needs``: an argument the measurement cannot go without) and emits."""
    ap.add_argument("--json-out", help="write the result here too")
    ap.add_argument("--render", nargs="+", metavar="JSON", help="print the table of these results files instead")
    a = ap.parse_args()
    if a.render:
        print(render(a.render))
        return
    if needs and not getattr(a, needs):
        ap.error(f"nothing to measure: give {needs.replace('_', ' ')} (or --render)")
    emit(measure(a), a.json_out)
