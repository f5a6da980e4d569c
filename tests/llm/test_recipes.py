"""Recipes: `llm recipes` lists each with what it is expected to reach, read from benchmark result files (never typed
in), "not measured" without a file or when a file records other settings; `llm train --recipe NAME` fills defaults
that explicit flags override."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from reflectrl.cli import main
from reflectrl.experiments.recipe_results import RESULTS, expectation, flag_values
from reflectrl.experiments.recipes import REAL_RECIPES, RECIPES, recipe_names, train_recipe

ROOT = Path(__file__).resolve().parents[2]


def real_result(seed, before, after, ci, **settings):
    """A result file of `benchmarks/real_model.py learn --algo grpo` with the recipe's settings unless given."""
    base = {"lora_r": 16, "prompts_per_update": 8, "threads": 1, "group_size": 8, "temperature": 0.6}
    return {"benchmark": "real_learn", "model": "smollm2-135m-instruct", "algo": "grpo", "seed": seed, "task": "arith",
            "task_options": ["ops=+"], "cpu_seconds_budget": 3600, "before": {"accuracy": before},
            "after": {"accuracy": after, "ci": ci}, "n": 500, "settings": {**base, **settings}, "updates": 200 + seed}


def listing(capsys, results):
    assert main(["llm", "recipes", "--results", str(results), "--json"]) == 0
    return {d["name"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}


def test_the_listing_reads_what_each_recipe_reached_from_its_result_files(tmp_path, capsys):
    (tmp_path / "real_learn_grpo_s1.json").write_text(json.dumps(real_result(1, 0.123, 0.654, [0.61, 0.69])))
    (tmp_path / "real_learn_grpo_s2.json").write_text(json.dumps(real_result(2, 0.123, 0.701, [0.66, 0.74])))
    (tmp_path / "real_learn_rlcr_s1.json").write_text(json.dumps(real_result(1, 0.1, 0.999, [0.9, 1.0])))  # not grpo's
    got = listing(capsys, tmp_path)
    assert list(got) == recipe_names()
    real = got["real-arith"]
    assert real["model"] == "smollm2-135m-instruct" and real["task"] == "arith (ops=+)"
    assert real["budget"].startswith("3600 CPU-s")
    assert real["expected"]["after"] == [0.654, 0.701]
    assert real["expected"]["files"] == ["real_learn_grpo_s1.json", "real_learn_grpo_s2.json"]
    assert "0.123 -> 0.654 [0.610, 0.690] (seed 1), 0.123 -> 0.701 [0.660, 0.740] (seed 2) on 500 problems" in \
        real["expected"]["text"]
    assert "3600 CPU-s of training (201, 202 updates)" in real["expected"]["measured"]
    for name in RECIPES:  # no llm_learn file in this folder
        assert got[name]["expected"] == {"text": "not measured", "measured": "", "files": [], "after": []}
        assert got[name]["flags"].startswith(f"--algo grpo --task {name} ")
    # the human listing says the same
    assert main(["llm", "recipes", "--results", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^real-arith: .*\n  task +arith \(ops=\+\)\n  model +smollm2-135m-instruct\n", text, re.M)
    assert text.count("  expected  not measured\n") == len(RECIPES) and "0.123 -> 0.654" in text


def test_a_result_file_with_other_settings_does_not_count(tmp_path, capsys):
    (tmp_path / "real_learn_grpo_s1.json").write_text(json.dumps(real_result(1, 0.2, 0.7, [0.6, 0.8], lora_r=8)))
    (tmp_path / "real_learn_grpo_s2.json").write_text("{not json")
    exp = listing(capsys, tmp_path)["real-arith"]["expected"]
    assert exp["after"] == [] and exp["text"].startswith("not measured with these settings (real_learn_grpo_s1.json: ")
    assert "lora_r 8 (recipe: 16)" in exp["text"]


def test_the_listing_of_the_checkout_agrees_with_its_result_files(capsys):
    got = listing(capsys, RESULTS)
    for name in recipe_names():
        r = train_recipe(name)
        files = sorted(RESULTS.glob(r.results))
        exp = got[name]["expected"]
        assert set(exp["files"]) <= {f.name for f in files}
        for f, after in zip(exp["files"], exp["after"]):
            raw = json.loads((RESULTS / f).read_text())
            assert after == (raw["after"]["accuracy"] if isinstance(raw["after"], dict) else raw["after"])
            assert f"{after:.3f}" in exp["text"]
        if not files:
            assert exp["text"] == "not measured"


def test_a_missing_results_folder_is_one_clear_error(tmp_path, capsys):
    assert main(["llm", "recipes", "--results", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --results ") and "is not a folder" in err[0]


def test_the_real_recipe_is_the_benchmark_s_cpu_hour_settings():
    spec = importlib.util.spec_from_file_location("real_model", ROOT / "benchmarks" / "real_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = REAL_RECIPES["real-arith"]
    ours, theirs = flag_values(r.flags), flag_values(bench.LEARN_FLAGS)
    for key in ("lora_r", "prompts_per_update", "grad_accum", "threads", "sample_interval", "updates"):
        assert ours[key] == theirs[key], key
    assert (r.task, r.task_options) == (bench.LEARN_TASK[0], tuple(bench.LEARN_TASK[1])) and r.model == bench.MODEL
    assert ours["attention"] == "shared-prompt" and float(ours["cpu_time_limit_s"]) == 3600


def test_explicit_flags_override_a_recipe_s(tiny_dir, tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["llm", "train", "--recipe", "real-arith", "--model", str(tiny_dir), "--run-dir", str(run),
                 "--updates", "1", "--cpu-time-limit-s", "50", "--prompts-per-update", "2", "--group-size", "2",
                 "--grad-accum", "1", "--max-new-tokens", "3", "--set", "ops=-", "--no-progress",
                 "--no-tensorboard"]) == 0
    capsys.readouterr()
    cfg = json.loads((run / "config.json").read_text())
    recipe = flag_values(REAL_RECIPES["real-arith"].flags)
    # the recipe's where no flag is given
    assert cfg["lora_r"] == int(recipe["lora_r"]) and cfg["attention"] == recipe["attention"]
    assert cfg["threads"] == int(recipe["threads"]) and cfg["sample_interval"] == int(recipe["sample_interval"])
    assert cfg["algo"] == "grpo" and cfg["task"] == "arith"
    # the explicit flags everywhere else, the model and a task option included
    assert (cfg["updates"], cfg["cpu_time_limit_s"], cfg["grad_accum"], cfg["prompts_per_update"]) == (1, 50.0, 1, 2)
    assert cfg["model"] == str(Path(tiny_dir).resolve()) and cfg["task_options"] == ["ops=-"]


def test_another_task_drops_the_recipe_s_task_options(tiny_dir):
    from reflectrl.cli.llm import _new_run_defaults, _train_front

    for argv, options in ((["--task", "toy-add"], ()), ([], ("ops=+",)), (["--set", "digits=1"], ("ops=+", "digits=1"))):
        front, rest = _train_front(["--recipe", "real-arith", "--model", str(tiny_dir), *argv])
        _, default, _ = _new_run_defaults(front, rest, False)
        assert default.task_options == options, argv


@pytest.mark.parametrize("argv, pattern", [
    (["--recipe", "arith"], r"recipe arith trains a tiny model warmed up on arith: give it with --model DIR"),
    (["--recipe", "nope"], r"no recipe 'nope'; recipes: real-arith, arith"),
    (["--recipe", "arith", "--resume", "x"], r"own settings and task options; --recipe cannot be combined with it"),
])
def test_recipe_errors_are_one_line(capsys, argv, pattern):
    assert main(["llm", "train", *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and re.search(pattern, err[0]), err


def test_expectation_follows_the_file_not_the_code(tmp_path):
    r = REAL_RECIPES["real-arith"]
    assert expectation(r, tmp_path)["text"] == "not measured"
    (tmp_path / "real_learn_grpo_s3.json").write_text(json.dumps(real_result(3, 0.3, 0.456, None)))
    assert expectation(r, tmp_path)["after"] == [0.456] and "0.300 -> 0.456 (seed 3)" in expectation(r, tmp_path)["text"]
