"""Write BENCHMARKS.md: the prose of benchmarks/BENCHMARKS.in.md with every ``<!-- render: SCRIPT ARGS -->``
marker replaced by that script's output (render_ppo.py, render_seed.py, render_llm.py: tables from the
JSON and report files in benchmarks/results/); and README.md's summary between its ``<!-- summary -->``
markers (render_summary.py).

    python benchmarks/render_all.py            # rewrites BENCHMARKS.md
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rendered(script: str, args: list[str]) -> str:
    buf, argv = io.StringIO(), sys.argv
    sys.argv = [script, *args]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(str(HERE / script), run_name="__main__")
    finally:
        sys.argv = argv
    return buf.getvalue().strip()


def benchmarks_text() -> str:
    """The text BENCHMARKS.md should hold: the prose with every marker replaced by its script's output."""
    text = (HERE / "BENCHMARKS.in.md").read_text()
    for marker in re.findall(r"<!-- render: (.+?) -->", text):
        script, *args = marker.split()
        text = text.replace(f"<!-- render: {marker} -->", rendered(script, args))
    return text


def main() -> None:
    (HERE.parent / "BENCHMARKS.md").write_text(benchmarks_text())
    print(f"wrote {HERE.parent / 'BENCHMARKS.md'}")
    readme = HERE.parent / "README.md"
    summary = rendered("render_summary.py", [])
    body = re.sub(r"<!-- summary -->.*?<!-- /summary -->", lambda _: f"<!-- summary -->\n{summary}\n<!-- /summary -->",
                  readme.read_text(), flags=re.DOTALL)
    readme.write_text(body)
    print(f"wrote the summary of {readme}")


if __name__ == "__main__":
    main()
