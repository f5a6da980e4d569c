"""Which claims' verdicts the one verdict rule changed: every verdict of the claims tables before it, kept once
in ``benchmarks/results/verdicts_before_rule.json``, against the verdicts the results files hold now.

    python benchmarks/verdict_changes.py --snapshot   # once, before the results were decided by the rule
    python benchmarks/verdict_changes.py              # writes benchmarks/results/verdict_changes.md

Before the rule a claim "held" on a 95% percentile-bootstrap interval of P(method better) over 3-5 seeds (at 3
seeds that interval is [min, max]), "accuracy not lower" held unless that interval lay below 0.5, and nothing
was corrected for multiplicity; docs/compare.md ("How verdicts are decided") has the rule that replaced it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"
SNAPSHOT = RES / "verdicts_before_rule.json"


def claims_files() -> list[Path]:
    return sorted(RES.glob("llm_claims_*.json")) + [RES / "seed_claims.json"]


def verdicts(result: dict) -> dict[str, str]:
    """``claim -> verdict`` of one claims results file (LLM or seed-method layout)."""
    out: dict[str, str] = {}
    if "envs" in result:
        for env, e in result["envs"].items():
            for m, rec in e["methods"].items():
                out[f"{env} {m}: final >= ppo"] = rec["final_verdict"]
                out[f"{env} {m}: faster early learning"] = rec["early_verdict"]
                if rec.get("l_cal"):
                    out[f"{env} {m}: L_cal falls"] = rec["l_cal"]["verdict"]
        for m, v in result.get("sparse_vs_dense", {}).items():
            out[f"{m}: larger gains on sparse rewards"] = v["verdict"]
        return out
    for m, rec in result["methods"].items():
        for k, v in rec["verdicts"].items():
            out[f"{m} vs {result['baseline']}: {k}"] = v
    for m, checks in result["self_knowledge"].items():
        for name, e in checks.items():
            if "verdict" in e:
                out[f"{m}: {name} above chance"] = e["verdict"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snapshot", action="store_true", help="record the verdicts the results files hold now")
    a = ap.parse_args()
    now = {p.name: verdicts(json.loads(p.read_text())) for p in claims_files()}
    if a.snapshot:
        SNAPSHOT.write_text(json.dumps(now, indent=1) + "\n")
        return
    before = json.loads(SNAPSHOT.read_text())
    rows = ["| results file | claim | verdict before | verdict now |", "|---|---|---|---|"]
    counts: dict[tuple[str, str], int] = {}
    total = changed = 0
    for name, old in before.items():
        for claim, v in old.items():
            total += 1
            new = now.get(name, {}).get(claim, "(no longer a claim)")
            if new != v:
                changed += 1
                counts[(v, new)] = counts.get((v, new), 0) + 1
                rows.append(f"| {name} | {claim} | {v} | {new} |")
    summary = ["| verdict before | verdict now | claims |", "|---|---|---|"] + [
        f"| {a_} | {b_} | {n} |" for (a_, b_), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    text = "\n".join([f"{changed} of {total} verdicts changed.", "", *summary, "", *rows])
    (RES / "verdict_changes.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
