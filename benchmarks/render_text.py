"""Print result files of benchmarks/results/ (markdown tables the benchmark scripts wrote) for render_all.py:
``<!-- render: render_text.py NAME... -->``; a missing file prints a line saying it has not been produced."""

from __future__ import annotations

import sys
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"

for name in sys.argv[1:]:
    p = RES / name
    print(p.read_text().strip() if p.is_file() else f"(not produced yet: benchmarks/results/{name})")
    print()
