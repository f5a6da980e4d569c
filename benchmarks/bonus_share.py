"""How large refgrpo-seed's calibration bonus is next to the reward, per run of a compare folder.

    python benchmarks/bonus_share.py runs/cmp/cheetah --method refgrpo-seed --last 50 \
        --json-out benchmarks/results/bonus_share_cheetah.json

For each run directory of METHOD under the folder: the mean over its last ``--last`` updates of
``refgrpo/bonus_to_reward`` (mean |bonus| / mean |reward| of the batch), ``refgrpo/bonus_clip_frac``
and ``refgrpo/b_cal_mean`` (from ``metrics.jsonl``), printed as one JSON line (and written to
``--json-out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from reflectrl.runlog import read_metrics

KEYS = ("refgrpo/bonus_to_reward", "refgrpo/bonus_clip_frac", "refgrpo/b_cal_mean")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="a `reflectrl compare --out` folder")
    ap.add_argument("--method", default="refgrpo-seed")
    ap.add_argument("--last", type=int, default=50, help="updates at the end of each run to average over")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    out: dict = {"folder": str(a.folder), "method": a.method, "last_updates": a.last, "runs": {}}
    for metrics in sorted(a.folder.glob(f"runs/*/{a.method}/seed_*/metrics.jsonl")):
        recs = [r for r in read_metrics(metrics) if KEYS[0] in r][-a.last:]
        if recs:
            name = f"{metrics.parent.parent.parent.name}/{metrics.parent.name}"
            out["runs"][name] = {k: round(statistics.mean(r[k] for r in recs if k in r), 4) for k in KEYS}
    line = json.dumps(out)
    print(line)
    if a.json_out:
        a.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
