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
