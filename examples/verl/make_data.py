"""Write a reflectrl task's problems as verl RL datasets: DIR/train.parquet and DIR/heldout.parquet (or .jsonl).

    python examples/verl/make_data.py --task arith --out data/arith
    python examples/verl/make_data.py --task arith --self-report confidence --out data/arith-conf
    python examples/verl/make_data.py --task text2sql --set n_train_dbs=48 --out data/text2sql --format jsonl

Each row is reflectrl.integrations.verl_rewards.verl_row: the reward functions of that module read its task and
problem back. Parquet needs pandas and pyarrow (verl installs both); jsonl needs nothing (verl reads either).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reflectrl.integrations.verl_rewards import SELF_REPORT_INSTRUCTIONS, verl_rows
from reflectrl.tasks.base import SPLITS, parse_options


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True, help="a reflectrl task: arith, codegen, humaneval, text2sql, rag")
    ap.add_argument("--out", required=True, type=Path, help="directory for train.* and heldout.*")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="task options")
    ap.add_argument("--self-report", default="off", choices=sorted(SELF_REPORT_INSTRUCTIONS),
                    help="append a request for a reflection or a confidence to each prompt")
    ap.add_argument("--limit", type=int, default=None, help="at most this many problems per split")
    ap.add_argument("--format", default="parquet", choices=("parquet", "jsonl"))
    a = ap.parse_args(argv)
    options = parse_options(a.set)
    a.out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        rows = verl_rows(a.task, split, options, a.limit, a.self_report)
        path = a.out / f"{split}.{a.format}"
        if a.format == "jsonl":
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        else:
            import pandas as pd

            pd.DataFrame(rows).to_parquet(path)
        print(f"{path}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
