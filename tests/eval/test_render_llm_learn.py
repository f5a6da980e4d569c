"""benchmarks/render_llm.py's learn table: each seed's gain with Newcombe's interval, and how many seeds clear the
bar by point estimate and by interval."""

import json
import math

import pytest

from .helpers import benchmark_script


def wilson(k: int, n: int, z: float = 1.959963984540054) -> list[float]:
    p, den = k / n, 1 + z * z / n
    c, h = (p + z * z / (2 * n)) / den, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [c - h, c + h]


def test_gain_interval_is_newcombe_s_hybrid_score_interval():
    """Newcombe (1998), Table II, example (a): 56/70 against 48/80, method 10 gives 0.0524 to 0.3339."""
    mod = benchmark_script("render_llm")
    r = {"before": 48 / 80, "after": 56 / 70, "before_ci": wilson(48, 80), "after_ci": wilson(56, 70)}
    lo, hi = mod.gain_interval(r)
    assert lo == pytest.approx(5.24, abs=0.005) and hi == pytest.approx(33.39, abs=0.005)


def test_learn_table_counts_seeds_above_the_bar_by_interval(tmp_path, monkeypatch):
    mod = benchmark_script("render_llm")
    base = {"benchmark": "llm_learn", "task": "rag", "n_heldout": 4000, "budget_seconds": 600.0, "clock": "cpu",
            "updates": 200, "train_seconds": 600.0, "reward_wait_fraction": 0.01}
    for seed, (b, a) in enumerate([(400, 1200), (400, 1050)], start=1):  # gains of 20 and 16.25 points
        (tmp_path / f"llm_learn_rag_s{seed}.json").write_text(json.dumps({
            **base, "seed": seed, "before": b / 4000, "after": a / 4000, "gain_points": 100 * (a - b) / 4000,
            "before_ci": wilson(b, 4000), "after_ci": wilson(a, 4000)}))
    monkeypatch.setattr(mod, "RES", tmp_path)
    rows = mod.learn_tables().splitlines()
    assert "+20.0 [+18.3, +21.7]" in rows[2] and "+16.2 [+14.6, +17.9]" in rows[3]
    assert rows[-1].endswith("| 2 of 2 | 1 of 2 |")  # both above +15 by point estimate, one by its interval
