"""Each decided claim the prose quotes reads as its row: where BENCHMARKS.in.md or docs/methods*.md quotes a claim's
interval (``+0.001 [-0.020, +0.022]``) and gives it a verdict word in the same clause, the word is the verdict the
one rule gives that claim in its results file, and the claim's method is named in the paragraph and (where the
clause names one) its metric in the clause."""

import json
import re

from reflectrl.eval.stats import difference

from .helpers import BENCHMARKS, benchmark_script

ROOT = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
QUOTE = re.compile(r"[-+]?\d[\d,]*\.?\d* \[[-+]?\d[\d,]*\.?\d*, [-+]?\d[\d,]*\.?\d*\]")
VERDICT = re.compile(r"not lower|not higher|inconclusive|\"better\"|\"worse\"")
"""Verdict words wherever they stand in the clause."""
AFTER = re.compile(VERDICT.pattern + r"|(?<=, )better\b|(?<=, )worse\b|(?<=\*\*)better(?=\*\*)|(?<=\*\*)worse(?=\*\*)")
"""After a quote, a bare "better" or "worse" after a comma gives it a verdict too ("+0.266 [...] over GRPO's, better")."""
METRICS = {"accuracy": r"(?<!reflection )accuracy", "reflection_accuracy": r"reflection accuracy|reflections",
           "ece": r"(?<!per-step )ECE", "step_ece": r"per-step ECE", "auroc": r"(?<!per-step )AUROC|confidence",
           "step_auroc": r"per-step AUROC|per-step confidence", "brier": r"Brier", "underconfidence": r"underconfidence",
           "overconfidence": r"overconfidence", "premature_rate": r"premature", "selective_score": r"selective",
           "final": r"final return", "early": r"early AUC|early learning|early"}
"""How the prose names each metric (a clause that names some must name the quoted claim's)."""
LOWER = ("ece", "brier", "underconfidence", "overconfidence", "step_ece", "premature_rate")


def _text(c: dict, digits: int, lower: bool) -> str:
    eff, lo, hi = difference(c, lower)
    return f"{eff:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def decided_claims() -> list[dict]:
    """Every decided claim of the results files: its interval as the tables print it, verdict, method and metric."""
    out = []
    for path in sorted(RESULTS.glob("llm_claims_*.json")):
        for m, rec in json.loads(path.read_text())["methods"].items():
            for k, c in rec["metrics"].items():
                cl = c.get("claim") or {}
                if "p_holm" in cl and "verdict" in cl:
                    out.append({"q": _text(cl, 3, k in LOWER), "verdict": cl["verdict"], "method": m, "metric": k,
                                "file": path.name})
    seed = json.loads((RESULTS / "seed_claims.json").read_text())
    for env, e in seed["envs"].items():
        for m, rec in e["methods"].items():
            for k in ("final", "early"):
                cl = rec[f"{k}_claim"]
                if "p_holm" in cl:
                    out.append({"q": _text(cl, 1, False), "verdict": cl["verdict"], "method": m, "metric": k,
                                "file": f"seed_claims.json {env}"})
    real = benchmark_script("real_equal")
    runs = list(json.loads((RESULTS / "real_equal.json").read_text()).get("runs", {}).values())
    for setting in real.settings_of(runs):
        rows, _ = real.setting_rows(runs, setting)
        for k, by in real.setting_claims(rows).items():
            for m, cl in by.items():
                if "p_holm" in cl:
                    out.append({"q": _text(cl, 3, k == "ece"), "verdict": cl["verdict"], "method": m, "metric": k,
                                "file": f"real_equal.json {setting}"})
    return out


def paragraphs() -> list[tuple[str, str, str]]:
    """(file, the heading it sits under, the paragraph on one line) of the prose."""
    source = re.sub(r"<!-- render: .+? -->", "", (BENCHMARKS / "BENCHMARKS.in.md").read_text())
    texts = [("BENCHMARKS.in.md", source)] + [(n, (ROOT / "docs" / n).read_text()) for n in ("methods.md", "methods-llm.md")]
    out = []
    for name, text in texts:
        levels: dict[int, str] = {}
        for para in re.split(r"\n\s*\n|\n(?=- |\d+\. )", text.replace("−", "-")):
            for line in para.splitlines():
                if line.startswith("#"):
                    depth = len(line) - len(line.lstrip("#"))
                    levels = {d: h for d, h in levels.items() if d < depth} | {depth: line}
            out.append((name, " ".join(levels.values()), " ".join(para.split())))
    return out


def clause_verdict(para: str, start: int, end: int) -> str | None:
    """The verdict word the clause of the quote at ``para[start:end]`` gives it: the first after the quote before
    the next quote or the clause's end, else the last before it after the previous quote or the clause's start."""
    bounds = [m.end() for m in re.finditer(r"\. |; ", para)]
    lo = max([b for b in bounds if b <= start], default=0)
    hi = min([b for b in bounds if b >= end], default=len(para))
    quotes = [m.span() for m in QUOTE.finditer(para)]
    after_end = min([s for s, _ in quotes if s >= end] + [hi])
    before_start = max([e for _, e in quotes if e <= start] + [lo])
    after = [m.group(0) for m in AFTER.finditer(para, end, after_end)]  # pos, endpos: lookbehinds see the quote
    if after:
        return after[0].strip('"')
    before = [m.group(0) for m in VERDICT.finditer(para, before_start, start)]
    return before[-1].strip('"') if before else None


def test_each_quoted_claim_reads_as_its_row():
    claims = decided_claims()
    by_quote: dict[str, list[dict]] = {}
    for c in claims:
        by_quote.setdefault(c["q"], []).append(c)
    checked, wrong = 0, []
    paras = paragraphs()
    for i, (name, heading, para) in enumerate(paras):
        for m in QUOTE.finditer(para):
            q = m.group(0) if m.group(0)[0] in "+-" else "+" + m.group(0)
            if not by_quote.get(q):
                continue  # not a decided claim (a gain, an interval over problems): test_rendered_numbers covers it
            near = " ".join([heading] + [p for *_, p in paras[max(0, i - 3):i + 1]])  # its heading, the 3 before
            rows = [c for c in by_quote[q] if re.search(rf"(?<![\w-]){re.escape(c['method'].split('-')[0])}", near)]
            if not rows:
                wrong.append(f"{name}: {q}: none of {sorted({c['method'] for c in by_quote[q]})} named near: {para[:160]}")
                continue
            bounds = [b.end() for b in re.finditer(r"\. |; ", para)]
            clause = para[max([b for b in bounds if b <= m.start()], default=0):
                          min([b for b in bounds if b >= m.end()], default=len(para))]
            named = [k for k, pattern in METRICS.items() if re.search(pattern, clause)]
            if named and not any(c["metric"] in named for c in rows):
                wrong.append(f"{name}: {q}: metric {sorted(named)} but the row is {rows[0]['metric']}: {clause[:160]}")
            word = clause_verdict(para, m.start(), m.end())
            checked += 1
            if word is not None and not any(c["verdict"].startswith(word) for c in rows):
                wrong.append(f"{name}: {q}: the prose says {word!r}, the row {[c['verdict'] for c in rows]} "
                             f"({rows[0]['file']}): {clause[:200]}")
    assert checked > 20  # the quotes are found
    assert not wrong, "\n".join(wrong)
