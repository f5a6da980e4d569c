"""benchmarks/render_llm.py's episode table: only llm_learn results with per-step confidences, before -> after."""

import json

from .helpers import benchmark_script


def test_episode_table(tmp_path, monkeypatch):
    mod = benchmark_script("render_llm")
    base = {"benchmark": "llm_learn", "task": "rag", "seed": 2, "gain_points": 1.0}
    (tmp_path / "llm_learn_rag-x_s2.json").write_text(json.dumps({
        **base, "variant": "x", "before_tool_calls": 1.5, "after_tool_calls": 2.0, "before_step_reports": 2.5,
        "after_step_reports": 3.0, "before_step_ece": 0.4, "after_step_ece": 0.2, "before_step_auroc": 0.5,
        "after_step_auroc": None, "before_premature_rate": 0.1, "after_premature_rate": 0.0}))
    (tmp_path / "llm_learn_arith_s1.json").write_text(json.dumps({**base, "task": "arith", "seed": 1}))
    monkeypatch.setattr(mod, "RES", tmp_path)
    rows = mod.episode_table().splitlines()
    assert len(rows) == 3  # header, rule, the one rag row (arith states no confidences)
    assert rows[2] == "| rag (x) | 2 | 1.50 -> 2.00 | 2.50 -> 3.00 | 0.40 -> 0.20 | 0.50 -> n/a | 0.10 -> 0.00 |"
    monkeypatch.setattr(mod, "RES", tmp_path / "none")
    assert mod.episode_table().startswith("(no llm_learn result")
