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
