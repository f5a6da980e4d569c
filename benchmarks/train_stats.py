"""Training statistics of each method of a compare folder, averaged over a window of updates.

    python benchmarks/train_stats.py runs/cmp/cheetah1m --keys losses/explained_variance losses/value_loss \
        --from 0.75 --json-out benchmarks/results/train_stats_cheetah1m.json
    python benchmarks/train_stats.py runs/cmp/cheetah1m --methods refgrpo-seed --last 50 \
        --keys refgrpo-seed/bonus_to_reward refgrpo-seed/bonus_clip_frac refgrpo-seed/b_cal_mean   # the bonus next to the reward

For every run directory under the folder (any layout that `reflectrl plot` reads), the mean of each
``--keys`` metric from ``metrics.jsonl`` over the updates from fraction ``--from`` to ``--to`` of the
run, or over its last ``--last`` updates that logged the metric (finished runs only, those with an
evaluation; ``--methods`` keeps only those labels); then, per env and method (the run's compare label), the per-seed
means and their mean. Printed
as a markdown table (and written as JSON to ``--json-out``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from reflectrl.experiments.rundata import discover_runs, group_runs, load_run


def window_mean(run, key: str, lo: float, hi: float, last: int | None = None) -> float:
    """Mean of ``key`` over the updates in [lo, hi) of the run's length, or over its last ``last`` values
    (nan when it never logged it)."""
    _, v = run.series(key)
    n = len(v)
    part = v[-last:] if last else v[int(lo * n):max(int(hi * n), int(lo * n) + 1)]
    return float(np.mean(part)) if len(part) else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+", help="compare --out folders (or folders of run directories)")
    ap.add_argument("--keys", nargs="+", default=["losses/explained_variance", "losses/value_loss"])
    ap.add_argument("--from", dest="lo", type=float, default=0.75, help="window start, fraction of the run")
    ap.add_argument("--to", dest="hi", type=float, default=1.0, help="window end, fraction of the run")
    ap.add_argument("--last", type=int, default=None, help="average the last N logged values instead")
    ap.add_argument("--methods", nargs="*", default=None, help="only these method labels (default: all)")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    if not 0 <= a.lo < a.hi <= 1:
        ap.error("need 0 <= --from < --to <= 1")
    if a.last is not None and a.last < 1:
        ap.error("--last must be at least 1")
    runs = (load_run(d) for d in discover_runs(a.folders))
    groups = group_runs(r for r in runs if r.final_return is not None)  # finished (evaluated) runs only
    out: dict = {"window": {"last": a.last} if a.last else [a.lo, a.hi], "envs": {}}
    rows = ["| env | method | seeds | " + " | ".join(f"{k}: mean (per seed)" for k in a.keys) + " |",
            "|---|---|---|" + "---|" * len(a.keys)]
    for env, by_method in groups.items():
        out["envs"][env] = {}
        for m, runs in by_method.items():
            if a.methods is not None and m not in a.methods:
                continue
            rec = {k: [window_mean(r, k, a.lo, a.hi, a.last) for r in runs] for k in a.keys}
            out["envs"][env][m] = {"seeds": len(runs), **{k: {"per_seed": v, "mean": float(np.nanmean(v))}
                                                          for k, v in rec.items()}}
            cells = [f"{np.nanmean(v):.3g} ({', '.join(f'{x:.3g}' for x in v)})" for v in rec.values()]
            rows.append(f"| {env} | {m} | {len(runs)} | " + " | ".join(cells) + " |")
    print("\n".join(rows))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
