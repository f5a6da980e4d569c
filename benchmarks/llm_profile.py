"""Where an LLM update's time goes: a profile table from the ``time/*`` fields every ``reflectrl llm train`` run logs.

    python benchmarks/llm_profile.py RUN_DIR [RUN_DIR ...] [--skip 5] [--json-out F]
    python benchmarks/llm_profile.py --render F [F ...]

Per run (its task and algo from ``config.json``; runs of one task and algo are pooled), the mean seconds per
update of each phase, and its share of the whole update:

- generate: sampling every turn's tokens (``time/generate``), of which prefill: the prompts' and transcripts'
  forward passes before the sampling loop (``time/prefill``; the torch engine reports it);
- reward wait: what the rollout still waited for the environments after generating (``time/reward_wait``);
- no-grad passes: the old-log-prob, reference, hidden-state and teacher passes and the methods' fits
  (``time/prepare``);
- update: advantages, shaping and the optimizer steps (``time/update``);
- other: the rest of the update (rollout bookkeeping, building the batch).

A phase a run did not log (``time/prefill`` before it was added) reads "not logged".

The first ``--skip`` updates of each run are left out (start-up). The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resultio import main as run  # noqa: E402
from resultio import results_file  # noqa: E402

PHASES = [("generate", "time/generate"), ("prefill (of generate)", "time/prefill"),
          ("reward wait", "time/reward_wait"), ("no-grad passes", "time/prepare"), ("update", "time/update")]


def profile(run_dirs: list[str], skip: int) -> list[dict[str, Any]]:
    """One row per (task, algo): mean seconds per update of each phase, the update's mean and the updates pooled."""
    pooled: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for d in run_dirs:
        cfg = json.loads((Path(d) / "config.json").read_text())
        recs = [json.loads(line) for line in (Path(d) / "metrics.jsonl").read_text().splitlines() if line.strip()]
        recs = [r for r in recs[skip:] if "time/iteration" in r]
        pooled[(str(cfg.get("task")), str(cfg.get("algo", cfg.get("kind"))))].extend(recs)
    rows = []
    for (task, algo), recs in sorted(pooled.items()):
        if not recs:
            continue
        mean = lambda k, recs=recs: sum(float(r.get(k, 0.0)) for r in recs) / len(recs)  # noqa: E731
        whole = mean("time/iteration")
        phases = {name: mean(key) if any(key in r for r in recs) else None for name, key in PHASES}
        named = sum(phases[n] or 0.0 for n in ("generate", "reward wait", "no-grad passes", "update"))
        rows.append({"task": task, "algo": algo, "updates": len(recs), "update_s": whole, "phases_s": phases,
                     "other_s": max(whole - named, 0.0),
                     "tokens_per_update": mean("rollout/generated_tokens")})
    return rows


def measure(a: Any) -> dict[str, Any]:
    return {"rows": profile(a.runs, a.skip), "skip": a.skip,
            "command": " ".join(["python", "benchmarks/llm_profile.py", *sys.argv[1:]])}


def render(paths: list[str]) -> str:
    head = "| task | algo | updates | seconds per update | " + " | ".join(n for n, _ in PHASES) + " | other |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in paths:
        path = results_file(p)
        for r in json.loads(path.read_text())["rows"]:
            cells = ["not logged" if r["phases_s"][n] is None else f"{100 * r['phases_s'][n] / r['update_s']:.0f}%"
                     for n, _ in PHASES]
            lines.append(f"| {r['task']} | {r['algo']} | {r['updates']} | {r['update_s']:.3f} | " + " | ".join(cells)
                         + f" | {100 * r['other_s'] / r['update_s']:.0f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", metavar="RUN_DIR")
    ap.add_argument("--skip", type=int, default=5, help="updates left out at the start of each run")
    run(ap, measure, render, needs="runs")


if __name__ == "__main__":
    main()
