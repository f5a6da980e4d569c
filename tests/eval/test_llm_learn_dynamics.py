"""benchmarks/llm_learn_dynamics.py on a synthetic llm_learn folder: five spans of updates, their means."""

import json

import pytest

from .helpers import benchmark_script


def test_spans_of_a_run(tmp_path):
    mod = benchmark_script("llm_learn_dynamics")
    d = tmp_path / "rag_s1"
    (d / "grpo").mkdir(parents=True)
    recs = [{"update": i + 1, "accuracy": i / 10, "groups/zero_std_frac": 0.5} for i in range(10)]
    recs[0]["groups/zero_std_frac"] = None  # logged as null: no value (the first span is the second update's)
    recs.insert(3, {"update": 3, "eval/accuracy": 0.3})  # a record without rollout metrics is left out
    (d / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "result.json").write_text(json.dumps({"task": "rag", "seed": 1, "gain_points": 16.0}))
    data = mod.measure([d])
    run = data["runs"][0]
    assert run["updates"] == 10 and run["seed"] == 1
    assert run["accuracy"] == pytest.approx([0.05, 0.25, 0.45, 0.65, 0.85])  # pairs of updates
    assert run["losses/entropy"] == [None] * 5  # not logged: no value, not a zero
    table = mod.render(data)
    assert "| rag | 1 | +16.0 | 10 | 0.05 -> 0.25 -> 0.45 -> 0.65 -> 0.85 | 0.50 -> " in table
    assert "n/a -> n/a" in table
    (tmp_path / "short" / "grpo").mkdir(parents=True)
    (tmp_path / "short" / "grpo" / "metrics.jsonl").write_text(json.dumps({"update": 1, "accuracy": 0.1}) + "\n")
    with pytest.raises(SystemExit, match="fewer than 5 updates"):
        mod.measure([tmp_path / "short"])
