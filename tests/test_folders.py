"""No command writes into a folder that holds a model, a run or a comparison of another kind, --force included: each
refusal is one line naming the folder and what it holds, and the folder is left as it was."""

import json

import pytest

from reflectrl.cli import main
from reflectrl.runlog import folder_kind


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from reflectrl.llm.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("m") / "tiny", layers=1, width=16, heads=2, max_positions=64)


def llm_run(tmp_path, tiny):
    run = tmp_path / "run"
    assert main(["llm", "train", "--task", "arith", "--model", str(tiny), "--run-dir", str(run), "--updates", "1",
                 "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "2", "--no-progress",
                 "--no-tensorboard"]) == 0
    return run


def test_folder_kinds(tiny, tmp_path):
    assert folder_kind(tiny) == "model" and folder_kind(tmp_path / "none") is None
    assert folder_kind(llm_run(tmp_path, tiny)) == "llm run"


@pytest.mark.parametrize("argv", [
    lambda tiny, run: ["llm", "train", "--task", "arith", "--model", str(tiny), "--run-dir", str(tiny), "--updates", "1"],
    lambda tiny, run: ["llm", "init-tiny", str(run), "--force"],
    lambda tiny, run: ["llm", "warmup", "--model", str(tiny), "--out", str(run), "--force", "--steps", "1"],
    lambda tiny, run: ["train", "--env-id", "CartPole-v1", "--run-dir", str(tiny), "--total-timesteps", "64"],
    lambda tiny, run: ["llm", "compare", "--methods", "grpo", "--tasks", "arith", "--seeds", "1", "--out", str(run)],
])
def test_writing_into_a_folder_of_another_kind_is_refused(tiny, tmp_path, capsys, argv):
    run = llm_run(tmp_path, tiny)
    capsys.readouterr()
    before_model, before_run = snapshot(tiny), snapshot(run)
    assert main(argv(tiny, run)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a" in err[0] and "--force does not change that" in err[0], err
    assert snapshot(tiny) == before_model and snapshot(run) == before_run
    assert json.loads((tiny / "config.json").read_text())["model_type"] == "llama"


def test_runs_record_absolute_model_paths_and_evaluate_from_another_folder(tiny, tmp_path, monkeypatch, capsys):
    import shutil

    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(tiny, work / "tw")
    monkeypatch.chdir(work)
    assert main(["llm", "train", "--task", "arith", "--model", "tw", "--run-dir", "runs/r", "--updates", "1",
                 "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "2", "--no-progress",
                 "--no-tensorboard", "--lora-r", "2"]) == 0
    assert json.loads((work / "runs/r/config.json").read_text())["model"] == str(work / "tw")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["llm", "eval", "work/runs/r", "--limit", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 2
    (work / "tw").rename(work / "moved")
    assert main(["llm", "eval", "work/runs/r", "--limit", "2", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model PATH" in err[0], err
    assert main(["llm", "eval", "work/runs/r", "--limit", "2", "--json", "--model", "work/moved"]) == 0
    # a run folder as --model: its exported model; a control folder: one line saying what to pass
    assert main(["llm", "eval", "work/runs/r", "--model", "work/moved", "--limit", "1", "--json"]) == 0
    capsys.readouterr()
    assert main(["llm", "eval", "work/runs/r/..", "--task", "arith", "--limit", "1"]) == 2
    assert "config.json" in capsys.readouterr().err


def test_a_run_folder_as_model_means_its_exported_model(tiny, tmp_path, capsys):
    run = llm_run(tmp_path, tiny)
    capsys.readouterr()
    assert main(["llm", "eval", str(tiny), "--task", "arith", "--limit", "1", "--json"]) == 0
    capsys.readouterr()
    out = tmp_path / "warm"
    assert main(["llm", "warmup", "--model", str(run), "--task", "arith", "--out", str(out), "--steps", "1",
                 "--no-progress"]) == 0
    assert json.loads((out / "warmup.json").read_text())["config"]["model"] == str(run)


def test_task_options_that_name_files_are_recorded_absolute(tmp_path, monkeypatch):
    from reflectrl.tasks.base import absolute_option_paths

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "kb.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    assert absolute_option_paths(["corpus=data/kb.jsonl", "ops=+", "k=2", "questions=missing.jsonl"]) == (
        f"corpus={tmp_path / 'data' / 'kb.jsonl'}", "ops=+", "k=2", "questions=missing.jsonl")


def test_a_run_written_before_the_seed_methods_had_their_own_names_reads_under_today_s(tmp_path):
    """refgrpo-seed, gear-seed and exgrpo-seed log under their own names; a run that logged them under the paper
    methods' names reads the same under today's, and the paper methods' own metrics keep theirs."""
    import json

    from reflectrl.experiments.rundata import read_records
    from reflectrl.runlog import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"refgrpo/L_cal_heldout": 0.5, "refgrpo/c": 0.1, "gear/omega_std": 0.2,
                                "gear/weight_mean": 1.0, "exgrpo/coef": 0.3, "exgrpo/replay_on": 1.0}) + "\n")
    want = {"refgrpo-seed/L_cal_heldout": 0.5, "refgrpo/c": 0.1, "gear-seed/omega_std": 0.2, "gear/weight_mean": 1.0,
            "exgrpo-seed/coef": 0.3, "exgrpo/replay_on": 1.0}
    assert read_metrics(path) == [want] and read_records(path) == [want]


def test_a_named_model_run_records_its_folder_and_resumes_from_another_folder(tiny, tmp_path, monkeypatch, capsys):
    """A run given a named model records the folder it was converted into (absolute) and the name; it resumes and
    evaluates from any working folder, and, once the converted folder is gone, from the name (converted again)."""
    import shutil

    from reflectrl.llm import models

    conversions = []

    def convert(name, out=None, force=False):  # a named model's conversion, with the tiny model as its "GGUF file"
        dst = models.cache_root() / name
        if not dst.is_dir():
            conversions.append(name)
            shutil.copytree(tiny, dst)
        return dst

    monkeypatch.setenv("REFLECTRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(models.NAMED_MODELS, "tiny-named", models.NAMED_MODELS["smollm2-135m-instruct"])
    monkeypatch.setattr(models, "get_model", convert)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    flags = ["--task", "arith", "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "2",
             "--no-progress", "--no-tensorboard"]
    assert main(["llm", "train", "--model", "tiny-named", "--run-dir", "runs/r", "--updates", "1", *flags]) == 0
    cfg = json.loads((tmp_path / "a/runs/r/config.json").read_text())
    folder = tmp_path / "cache" / "models" / "tiny-named"
    assert cfg["model"] == str(folder) and cfg["model_name"] == "tiny-named" and conversions == ["tiny-named"]
    monkeypatch.chdir(tmp_path / "b")  # another working folder
    assert main(["llm", "train", "--resume", "../a/runs/r", "--updates", "2", "--no-progress"]) == 0
    shutil.rmtree(folder)  # the cache was cleared: the name converts the model again
    assert main(["llm", "train", "--resume", "../a/runs/r", "--updates", "3", "--no-progress"]) == 0
    assert conversions == ["tiny-named", "tiny-named"]
    capsys.readouterr()
    shutil.rmtree(folder)
    assert main(["llm", "eval", "../a/runs/r", "--limit", "2", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 2
    # the resumed run equals one that never stopped
    monkeypatch.chdir(tmp_path)
    assert main(["llm", "train", "--model", "tiny-named", "--run-dir", "whole", "--updates", "3", *flags]) == 0
    from reflectrl.runlog import behaviour, read_metrics

    assert behaviour(read_metrics(tmp_path / "whole/metrics.jsonl")) == \
        behaviour(read_metrics(tmp_path / "a/runs/r/metrics.jsonl"))
