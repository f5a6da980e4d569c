"""Render the seed-method sections of BENCHMARKS.md from benchmarks/results/.

    python benchmarks/render_seed.py --collect runs/cmp/lander runs/cmp/mountaincar runs/sweep/refgrpo_lander
    python benchmarks/render_seed.py [--part compare_lander.md|overhead|claims]   # prints the markdown

``--collect DIR...`` copies each ``reflectrl compare --out DIR`` folder's ``report.md`` to
``benchmarks/results/compare_{DIR name}.md``. The printout has, per collected report, its per-env
tables (as `reflectrl compare` wrote them), then the overhead table (``overhead.json`` from
``benchmarks/overhead.py``) and the seed's claims (``seed_claims.md`` from ``benchmarks/seed_claims.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"


def collect(dirs: list[Path]) -> None:
    for d in dirs:
        src = d / "report.md"
        if not src.is_file():
            print(f"skip {d}: no report.md")
            continue
        dst = RES / f"compare_{d.name}.md"
        shutil.copyfile(src, dst)
        print(f"{src} -> {dst}")


def env_sections(report: str) -> tuple[str, str]:
    """The ``reflectrl compare`` command line and the per-env sections of a report.md (up to ``## Runs``)."""
    cmd = re.search(r"```\n(reflectrl compare .*?)\n```", report, re.S)
    body = report.split("\n## Runs")[0]
    parts = [p for p in re.split(r"\n(?=## )", body) if p.startswith("## ") and not p.startswith("## Runs")]
    text = "\n".join("##" + p.strip() + "\n" for p in parts)  # two heading levels down
    return (cmd.group(1) if cmd else "?"), text


def overhead_table() -> str:
    path = RES / "overhead.json"
    if not path.exists():
        return "(no overhead result)"
    r = json.loads(path.read_text())
    rows = ["| method | wall-time ratio (median) | per round | CPU-time ratio | share of an update inside the method "
            "| bar | holds |", "|---|---|---|---|---|---|---|"]
    for m in ("refgrpo-seed", "gear-seed", "exgrpo-seed", "refgrpo-seed@alpha0", "exgrpo-seed@background"):
        if m not in r:
            continue
        x = r[m]
        rows.append(f"| {m} | {x['wall_ratio']:.3f} | {', '.join(f'{v:.3f}' for v in x['wall_ratios'])} | "
                    f"{x['cpu_ratio']:.3f} | {100 * x['method_share_of_update']:.1f}% | <= {x['bar']:.2f} | "
                    f"{'yes' if x['within_bar'] else 'no'} |")
    return "\n".join(rows) + f"\n\nSettings: {r['settings']}; {r['rounds']} rounds of {r['total_timesteps']} steps."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collect", nargs="*", type=Path, default=None, metavar="DIR")
    ap.add_argument("--part", default=None, help="print one part: a compare_*.md name, 'overhead' or 'claims'")
    a = ap.parse_args()
    if a.collect is not None:
        collect(a.collect)
        return
    parts = [p.name for p in sorted(RES.glob("compare_*.md"))] + ["overhead", "claims"]
    for part in ([a.part] if a.part else parts):
        if part == "overhead":
            print(overhead_table())
        elif part == "claims":
            claims = RES / "seed_claims.md"
            print(claims.read_text().strip() if claims.exists() else "(no seed_claims result)")
        elif (RES / part).is_file():
            cmd, text = env_sections((RES / part).read_text())
            print(f"`{cmd}`\n\n{text}")
        else:
            print(f"({part}: not run)")


if __name__ == "__main__":
    main()
