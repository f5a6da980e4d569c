"""Every committed claims table is what the one verdict rule makes of its results file now: each
``benchmarks/results/llm_claims_*.json`` and ``seed_claims.json`` is decided again from its per-seed values and
rendered, and the result must equal the committed markdown, verdicts included."""

import json
from pathlib import Path

import pytest

from .helpers import BENCHMARKS, benchmark_script

RESULTS = BENCHMARKS / "results"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("llm_claims_*.json")), ids=lambda p: p.stem)
def test_llm_claims_table_is_a_fresh_render(path: Path):
    claims = benchmark_script("llm_claims")
    text = claims.render(claims.decide_result(json.loads(path.read_text()), min_seeds=3))
    assert path.with_suffix(".md").read_text().strip() == text.strip(), \
        f"re-render: python benchmarks/llm_claims.py --rerender {path.relative_to(BENCHMARKS.parent)} ..."


def test_seed_claims_table_is_a_fresh_render():
    claims = benchmark_script("seed_claims")
    out = claims.decide_claims(json.loads((RESULTS / "seed_claims.json").read_text()), min_seeds=3)
    assert (RESULTS / "seed_claims.md").read_text().strip() == "\n".join(claims.render(out)).strip()


def test_no_committed_verdict_outside_the_rule():
    """No claims results file holds a verdict word of the old rules ("holds", "level", "does not hold")."""
    changes = benchmark_script("verdict_changes")
    allowed = ("better", "worse", "not lower", "inconclusive (", "too few seeds (")
    for path in changes.claims_files():
        for claim, verdict in changes.verdicts(json.loads(path.read_text())).items():
            assert verdict.startswith(allowed), f"{path.name}: {claim}: {verdict!r}"


@pytest.mark.parametrize("n", [5, 10])
def test_the_claims_scripts_rarely_decide_on_null_data(n):
    """Null data (method and baseline drawn alike, per seed) through the claims scripts' own deciding functions:
    "better" or "worse" in at most 5% of the claims (plus three Monte-Carlo errors), at 5 and at 10 seeds."""
    import math

    import numpy as np

    llm, seed = benchmark_script("llm_claims"), benchmark_script("seed_claims")
    rng = np.random.default_rng(n)
    decided = total = 0
    for _ in range(60):
        metrics = {k: {"n": n, "per_seed": {str(s): [float(a), float(b)] for s, (a, b) in
                                            enumerate(rng.normal(0.5, 0.1, (n, 2)), 1)}}
                   for k in ("accuracy", "auroc", "ece", "brier")}
        result = {"methods": {"m": {"metrics": metrics}},
                  "self_knowledge": {"m": {"auroc": {"per_seed": {str(s): float(v) for s, v in
                                                                  enumerate(rng.normal(0.5, 0.05, n), 1)}}}}}
        llm.decide_result(result, min_seeds=3)
        verdicts = [*result["methods"]["m"]["verdicts"].values(), result["self_knowledge"]["m"]["auroc"]["verdict"]]
        envs = {f"E{i}": {"reward": "dense" if i else "sparse", "methods": {"m": {
            "finals": {str(s): float(v) for s, v in enumerate(rng.normal(100, 10, n), 1)},
            "ppo_finals": {str(s): float(v) for s, v in enumerate(rng.normal(100, 10, n), 1)},
            "aucs": {str(s): float(v) for s, v in enumerate(rng.normal(0, 1, n), 1)},
            "ppo_aucs": {str(s): float(v) for s, v in enumerate(rng.normal(0, 1, n), 1)}}}} for i in range(2)}
        out = seed.decide_claims({"envs": envs}, min_seeds=3)
        verdicts += [r[k] for e in out["envs"].values() for r in e["methods"].values()
                     for k in ("final_verdict", "early_verdict")] + [out["sparse_vs_dense"]["m"]["verdict"]]
        decided += sum(v in ("better", "worse") for v in verdicts)
        total += len(verdicts)
    assert total >= 600 and decided / total <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / total)
