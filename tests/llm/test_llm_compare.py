"""``reflectrl llm compare``: bad grids are one clear error before anything trains; a small grid trains every
(method, seed) from the given model, evaluates it with self-reports, writes report.md, and a rerun skips it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reflectrl.errors import ConfigError
from reflectrl.eval.llm_compare import main
from reflectrl.llm.tiny import init_tiny


@pytest.mark.parametrize("argv, pattern", [
    (["--methods", "grpo", "nosuch", "--tasks", "arith"], "unknown --algo 'nosuch'"),
    (["--methods", "grpo", "grpo", "--tasks", "arith"], "names a method twice"),
    (["--methods", "grpo", "a=grpo --seed 3", "--tasks", "arith"], "--seed is set by llm compare .* .use --tasks"),
    (["--methods", "grpo", "--tasks", "arith", "--seeds", "0"], "--seeds must be at least 1"),
    (["--methods", "grpo", "--tasks", "arith", "--updates", "0"], "--updates must be at least 1"),
    (["--methods", "grpo", "--tasks", "nosuchtask"], "nosuchtask"),
    (["--methods", "grpo", "--tasks", "arith", "--model", "no/such/dir"], "not a model directory"),
])
def test_bad_grid_is_one_error_and_writes_nothing(tmp_path: Path, argv: list[str], pattern: str):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=pattern):
        main([*argv, "--out", str(out)])
    assert not out.exists()


def test_small_grid_trains_reports_and_skips_on_rerun(tmp_path: Path, capsys):
    model = init_tiny(tmp_path / "tiny", layers=1, width=32, heads=2, max_positions=256)
    out = tmp_path / "cmp"
    argv = ["--methods", "grpo", "rlcr", "--tasks", "arith", "--seeds", "2", "--updates", "2", "--model", str(model),
            "--eval-limit", "4", "--workers", "2", "--bootstrap-reps", "100", "--out", str(out),
            "--extra", "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "4", "--no-tensorboard"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "4 runs: 0 finished (skipped), 0 to resume, 4 to train" in first
    for method in ("grpo", "rlcr"):
        for seed in (1, 2):
            rd = out / "runs" / "arith" / method / f"seed_{seed}"
            cfg = json.loads((rd / "config.json").read_text())
            assert cfg["seed"] == seed and cfg["algo"] == method
            assert len((rd / "metrics.jsonl").read_text().splitlines()) == 2
            ev = json.loads((rd / "eval.json").read_text())
            assert ev["n"] == 4 and 0.0 <= ev["accuracy"] <= 1.0
            assert "reflection_accuracy" in ev and "ece" in ev  # asked for a reflection and a confidence
    report = (out / "report.md").read_text()
    assert "grpo" in report and "rlcr" in report
    assert main(argv) == 0
    assert "4 runs: 4 finished (skipped), 0 to resume, 0 to train" in capsys.readouterr().out


def test_a_recipe_s_task_options_reach_every_run():
    """rag's recipe trains on a 1000-cluster knowledge base: its task options are in each run's train flags (and
    the recipe renders them for the warm-up and for evaluations)."""
    from reflectrl.eval.compare import parse_method
    from reflectrl.eval.llm_compare import build_grid
    from reflectrl.llm.recipes import recipe

    r = recipe("rag")
    assert r.task_flags() == ("--task-options", "n_companies=1000") and r.task_flags("--set") == ("--set", "n_companies=1000")
    assert recipe("arith").task_flags() == ()
    specs = build_grid([parse_method("grpo", "llm")], ["rag", "arith"], [1], Path("out"),
                       {("rag", 1): "m", ("arith", 1): "m"}, None, (), ())
    rag, arith = ([s for s in specs if s.env_id == t][0] for t in ("rag", "arith"))
    i = rag.train_args.index("--task-options")
    assert rag.train_args[i + 1] == "n_companies=1000" and "--task-options" not in arith.train_args
