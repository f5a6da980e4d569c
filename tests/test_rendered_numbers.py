"""README's summary and BENCHMARKS.md are what the render scripts make of benchmarks/results/ (no number
typed by hand can drift from its source)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_summary_is_rendered_from_results():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render_summary.py")], capture_output=True,
                         text=True, check=True).stdout.strip()
    block = re.search(r"<!-- summary -->\n(.*?)\n<!-- /summary -->", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block is not None and block.group(1).strip() == out


def test_benchmarks_md_is_rendered_from_results():
    """BENCHMARKS.md equals what benchmarks/render_all.py makes of BENCHMARKS.in.md and benchmarks/results/ now."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import render_all
    finally:
        sys.path.pop(0)
    fresh = render_all.benchmarks_text().splitlines()
    committed = (ROOT / "BENCHMARKS.md").read_text().splitlines()
    drift = [(i + 1, a, b) for i, (a, b) in enumerate(zip(committed, fresh)) if a != b]
    assert not drift and len(fresh) == len(committed), \
        f"BENCHMARKS.md is not a fresh render (python benchmarks/render_all.py): first difference {drift[:1]}"


def test_every_interval_the_prose_quotes_is_in_a_rendered_table():
    """The prose of BENCHMARKS.in.md and of docs/methods*.md quotes estimates with their intervals
    (``-0.273 [-0.479, -0.066]``): each must be printed by a render script from benchmarks/results/, so a quote
    cannot drift from its source."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import render_all
    finally:
        sys.path.pop(0)
    source = (ROOT / "benchmarks" / "BENCHMARKS.in.md").read_text()
    markers = re.findall(r"<!-- render: (.+?) -->", source)
    tables = "\n".join(render_all.rendered(m.split()[0], m.split()[1:]) for m in markers)
    prose = "\n".join([re.sub(r"<!-- render: .+? -->", "", source),
                       *((ROOT / "docs" / name).read_text() for name in ("methods.md", "methods-llm.md"))])
    prose = prose.replace("−", "-")
    quotes = re.findall(r"[-+]?\d[\d,]*\.?\d* \[[-+]?\d[\d,]*\.?\d*, [-+]?\d[\d,]*\.?\d*\]", prose)
    assert len(quotes) > 20  # the pattern finds the quotes
    unsourced = [q for q in quotes if q not in tables and q.lstrip("+") not in tables]
    assert not unsourced, f"intervals in the prose that no rendered table prints: {unsourced}"
