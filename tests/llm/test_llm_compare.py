"""``reflectrl llm compare``: bad grids are one clear error before anything trains; a small grid trains every
(method, seed) from the given model, evaluates it with self-reports, writes report.md, and a rerun skips it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reflectrl.errors import ConfigError
from reflectrl.experiments.llm_compare import main
from reflectrl.llm.tiny import init_tiny


@pytest.mark.parametrize("argv, pattern", [
    (["--methods", "grpo", "nosuch", "--tasks", "arith"], "unknown --algo 'nosuch'"),
    (["--methods", "grpo", "grpo", "--tasks", "arith"], "names a method twice"),
    (["--methods", "grpo", "a=grpo --seed 3", "--tasks", "arith"], "--seed is set by llm compare .* .use --tasks"),
    (["--methods", "grpo", "--tasks", "arith", "--seeds", "0"], "--seeds must be at least 1"),
    (["--methods", "grpo", "--tasks", "arith", "--updates", "0"], "--updates must be at least 1"),
    (["--methods", "grpo", "--tasks", "nosuchtask"], "nosuchtask"),
    (["--methods", "grpo", "--tasks", "arith", "--model", "no/such/dir"], "not a model directory"),
    (["--methods", "grpo", "--tasks", "arith", "--warmup-target", "0"], "--warmup-target must be in"),
    (["--methods", "grpo", "--tasks", "arith", "--warmup-target", "1.5"], "--warmup-target must be in"),
    (["--methods", "grpo", "--tasks", "arith", "--warmup-target", "0.1", "--model", "."], "not with --model"),
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
    # the verdict column: two paired seeds are below the 3 a verdict needs (and could never reach p < 0.05: the exact
    # sign-flip p is at least 2/4 = 0.5); the claim stays out of the family, which is then empty
    row = next(line for line in report.splitlines() if line.startswith("| rlcr | 2 |"))
    assert "accuracy - grpo: mean [95% t CI], Holm p: verdict" in report
    assert row.split("|")[5].strip() == "too few seeds (2)"
    assert "Verdicts: Holm over" not in report
    assert main(argv) == 0
    assert "4 runs: 4 finished (skipped), 0 to resume, 0 to train" in capsys.readouterr().out
    # the same folder, another model: every run conflicts; refused in one line, the report left as it was
    other = init_tiny(tmp_path / "other", layers=1, width=32, heads=2, max_positions=256, seed=1)
    before = (out / "report.md").read_text()
    with pytest.raises(ConfigError, match="conflict with what .* holds .*nothing was trained or rewritten"):
        main([a if a != str(model) else str(other) for a in argv])
    assert (out / "report.md").read_text() == before


def test_a_recipe_s_task_options_reach_every_run():
    """rag's recipe trains on a 1000-cluster knowledge base: its task options are in each run's train flags (and
    the recipe renders them for the warm-up and for evaluations)."""
    from reflectrl.experiments.compare import parse_method
    from reflectrl.experiments.llm_compare import build_grid
    from reflectrl.experiments.recipes import recipe

    r = recipe("rag")
    assert r.task_flags() == ("--task-options", "n_companies=1000") and r.task_flags("--set") == ("--set", "n_companies=1000")
    assert recipe("arith").task_flags() == ()
    specs = build_grid([parse_method("grpo", "llm")], ["rag", "arith"], [1], Path("out"),
                       {("rag", 1): "m", ("arith", 1): "m"}, None, (), ())
    rag, arith = ([s for s in specs if s.env_id == t][0] for t in ("rag", "arith"))
    i = rag.train_args.index("--task-options")
    # the search credit is the training's alone: not in the warm-up's or the evaluations' flags above
    assert rag.train_args[i + 1:i + 3] == ("n_companies=1000", "search_credit=1.0")
    assert "--task-options" not in arith.train_args


def test_a_user_s_task_option_overrides_a_training_only_one():
    """``with_options`` adds a user's options in every phase; one with the key of a training-only option replaces it
    (the later key wins when the flags are parsed, so the training would otherwise keep the recipe's)."""
    from reflectrl.experiments.recipes import recipe
    from reflectrl.tasks.base import parse_options

    r = recipe("rag").with_options(("search_credit=0", "report=steps"))
    train = r.task_flags(train=True)[1:]
    assert parse_options(train) == {"n_companies": 1000, "search_credit": 0, "report": "steps"}
    assert r.task_flags() == ("--task-options", "n_companies=1000", "search_credit=0", "report=steps")
    kept = recipe("rag").with_options(("report=steps",)).task_flags(train=True)[1:]
    assert parse_options(kept)["search_credit"] == 1.0 and recipe("rag").with_options(()) == recipe("rag")


def _fake_cli(calls: list[list[str]]):
    """A stand-in for the CLI runs of a model build: records each command; a warm-up writes the summary the real one
    writes (its target, task options and --step-confidence), so the next build can tell how it was made."""

    def run(args, log):
        calls.append(list(args))
        if args[:2] == ["llm", "warmup"]:
            warm = Path(args[args.index("--out") + 1])
            warm.mkdir(parents=True)
            opts = []
            if "--task-options" in args:
                for a in args[args.index("--task-options") + 1:]:
                    if a.startswith("--"):
                        break
                    opts.append(a)
            (warm / "warmup.json").write_text(json.dumps({"config": {
                "stop_at_accuracy": float(args[args.index("--stop-at-accuracy") + 1]), "task_options": opts,
                "step_confidence": "--step-confidence" in args}}))
        return 0, "", ""

    return run


def test_warmup_target_reaches_the_warmup_and_a_model_built_to_another_is_refused(tmp_path: Path, monkeypatch):
    """``--warmup-target`` is the warm-up's ``--stop-at-accuracy``; a folder whose model was warmed up to another
    target is not reused (its runs would not start from the models the command asks for)."""
    from reflectrl.experiments import llm_compare

    calls: list[list[str]] = []
    monkeypatch.setattr(llm_compare, "_run_cli", _fake_cli(calls))
    path, err = llm_compare.build_model(tmp_path, "arith", 1, 0.05)
    assert err is None and Path(path).name == "warmup"
    warmup = [c for c in calls if c[:2] == ["llm", "warmup"]][0]
    assert warmup[warmup.index("--stop-at-accuracy") + 1] == "0.05"
    calls.clear()
    assert llm_compare.build_model(tmp_path, "arith", 1, 0.05) == (path, None) and not calls  # built: skipped
    _, err = llm_compare.build_model(tmp_path, "arith", 1)  # the recipe's 0.2
    assert err is not None and "0.05" in err and "0.2" in err and "--out" in err and not calls
    _, err = llm_compare.build_model(tmp_path, "arith", 2)
    assert err is None
    warmup = [c for c in calls if c[:2] == ["llm", "warmup"]][0]
    assert warmup[warmup.index("--stop-at-accuracy") + 1] == "0.2"


def test_task_options_and_step_confidence_reach_warmups_and_runs(tmp_path: Path, monkeypatch):
    """``--task-option`` is added to the recipe's options in the warm-up and every run; ``--step-confidence`` reaches
    the warm-up; a model built otherwise is refused."""
    from reflectrl.experiments import llm_compare
    from reflectrl.experiments.compare import parse_method

    calls: list[list[str]] = []
    monkeypatch.setattr(llm_compare, "_run_cli", _fake_cli(calls))
    path, err = llm_compare.build_model(tmp_path, "rag", 1, None, ["report=steps"], True)
    warmup = [c for c in calls if c[:2] == ["llm", "warmup"]][0]
    i = warmup.index("--task-options")
    assert err is None and warmup[i + 1:i + 3] == ["n_companies=1000", "report=steps"] and "--step-confidence" in warmup
    calls.clear()
    assert llm_compare.build_model(tmp_path, "rag", 1, None, ["report=steps"], True) == (path, None) and not calls
    _, err = llm_compare.build_model(tmp_path, "rag", 1, None, ["report=steps"], False)
    assert err is not None and "--step-confidence" in err and not calls
    _, err = llm_compare.build_model(tmp_path, "rag", 1, None, (), True)
    assert err is not None and "report=steps" in err and not calls
    specs = llm_compare.build_grid([parse_method("grpo", "llm")], ["rag"], [1], tmp_path, {("rag", 1): path}, None, (),
                                   (), task_options=["report=steps"])
    i = specs[0].train_args.index("--task-options")
    assert specs[0].train_args[i + 1:i + 4] == ("n_companies=1000", "report=steps", "search_credit=1.0")
