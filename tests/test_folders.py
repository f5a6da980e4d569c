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
