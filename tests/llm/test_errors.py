"""Bad input to `reflectrl llm ...` ends in one clear error line (exit status 2), no traceback."""

import json
import re

import pytest

from reflectrl.cli import main


def one_error(capsys, argv, pattern):
    code = main(argv)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize("extra,pattern", [
    (["--task", "nope"], "unknown task 'nope'"),
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--clip-low", "1.5"], r"--clip-low must be in \(0, 1\)"),
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--loss-agg-mode", "mean"], "unknown --loss-agg-mode"),
    (["--adv-estimator", "nope"], "unknown --adv-estimator"),
    (["--minibatches", "4", "--grad-accum", "4"], "exceeds the rows"),
])
def test_train_bad_hyperparameters(capsys, tiny_dir, extra, pattern):
    base = ["llm", "train", "--task", "toy-add", "--model", str(tiny_dir), "--prompts-per-update", "2",
            "--group-size", "4", "--no-progress"]
    one_error(capsys, base + extra, pattern)


@pytest.mark.parametrize("argv,pattern", [
    (["llm", "train", "--task", "toy-add", "--model", "/no/such/model"], "model path /no/such/model does not exist"),
    (["llm", "train", "--task", "toy-add"], "--model is required"),
    (["llm", "train", "--algo", "nope"], "unknown --algo 'nope'"),
    (["llm", "train", "--resume", "/no/such/run"], "does not exist"),
    (["llm", "eval", "/no/such/model", "--task", "toy-add"], "does not exist"),
    (["llm", "warmup", "--model", "/no/such/model", "--task", "toy-add", "--out", "/tmp/x"], "does not exist"),
    (["llm", "nope"], "unknown llm command"),
])
def test_bad_paths_and_commands(capsys, argv, pattern):
    one_error(capsys, argv, pattern)


def test_not_a_model_dir_and_existing_run(capsys, tmp_path, tiny_dir):
    one_error(capsys, ["llm", "eval", str(tmp_path), "--task", "toy-add"], "no config.json")
    run = tmp_path / "r"
    run.mkdir()
    (run / "checkpoint.safetensors").write_bytes(b"x")
    one_error(capsys, ["llm", "train", "--task", "toy-add", "--model", str(tiny_dir), "--run-dir", str(run)],
              "already holds a run")
    (run / "config.json").write_text(json.dumps({"kind": "llm", "task": "toy-add", "model": str(tiny_dir)}))
    one_error(capsys, ["llm", "train", "--resume", str(run)], "corrupt")
