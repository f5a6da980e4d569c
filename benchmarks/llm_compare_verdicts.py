"""The verdict column of the committed ``reflectrl llm compare`` reports, decided in their set of runs' one family.

    python benchmarks/llm_compare_verdicts.py          # rewrites the verdict column of each report in REPORTS

A report (``benchmarks/results/llm_compare_*.md``, a copy of the comparison's ``report.md``) shows the accuracy
claims of a task; ``benchmarks/llm_claims.py`` decides every held-out metric of the same runs. Both decide one family
(``reflectrl.experiments.llm_report.heldout_family``), so a claim reads the same in both. The run folders behind the
committed reports are not kept, but the claims file of the same runs holds every per-seed value the family needs:
this script takes each method's decided accuracy claim from it and writes it into the report's verdict column, with
the line naming the family and the definition of the column that ``reflectrl llm compare`` writes today. Nothing
else in the report changes. ``tests/eval/test_rendered_claims.py`` checks that every report equals that refresh.
"""

from __future__ import annotations

import json
from pathlib import Path

from reflectrl.eval.stats import claim_text
from reflectrl.experiments.llm_report import VERDICT_DEFINITION, family_line

RES = Path(__file__).resolve().parent / "results"
REPORTS = {"llm_compare_arith17.md": "llm_claims_arith17.json", "llm_compare_arith18.md": "llm_claims_arith18.json",
           "llm_compare_arith19.md": "llm_claims_arith19.json", "llm_compare_arith19late.md": "llm_claims_arith19late.json",
           "llm_compare_arith20.md": "llm_claims_arith20.json"}
"""Each report with a verdict column, and the claims file of the same runs (the same methods, seeds and baseline)."""


def variants_note(claims: dict) -> str:
    """Where the claims file's family holds other variants of its question (benchmarks/results/variants.json)."""
    if claims.get("chosen_on_validation"):
        return (f" The variant was chosen on validation problems (question {claims['question']} of "
                "benchmarks/results/variants.json), so the family is these runs' alone.")
    if claims.get("family_with"):
        return (f" The family also holds every variant tried on the same held-out problems (question "
                f"{claims['question']} of benchmarks/results/variants.json: {', '.join(claims['family_with'])}).")
    return ""


def refreshed(report: str, claims: dict) -> str:
    """``report`` with its verdict column, family line and verdict definition from the decided ``claims``."""
    baseline, methods = claims["baseline"], claims["methods"]
    out: list[str] = []
    in_table = skip_blank = False
    for line in report.splitlines():
        if line.startswith("Verdicts: Holm over"):
            skip_blank = True  # written again below the table, with its blank line
            continue
        if skip_blank and not line:
            skip_blank = False
            continue
        if line.startswith("- Verdict (accuracy - baseline)"):
            out.append(VERDICT_DEFINITION)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells and "Holm p: verdict" in line:
            in_table = True
        elif in_table and not cells:
            in_table = False
            out += [line, family_line(claims["family_hypotheses"], baseline) + variants_note(claims)]  # blank: below
        elif in_table and cells[0] in methods:
            c = methods[cells[0]]["metrics"]["accuracy"]["claim"]
            if sorted(methods[cells[0]]["seeds"]) and "p_holm" in c:
                cells[4] = claim_text(c)
                line = "| " + " | ".join(cells) + " |"
        out.append(line)
    return "\n".join(out) + ("\n" if report.endswith("\n") else "")


def main() -> None:
    for md, js in REPORTS.items():
        path = RES / md
        path.write_text(refreshed(path.read_text(), json.loads((RES / js).read_text())))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
