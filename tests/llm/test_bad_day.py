"""An LLM user's bad day: flags checked by their own names, task options with one meaning whatever their spelling,
evaluations that say what they measured."""

import json

import pytest

from reflectrl.cli import main

TRAIN = ["llm", "train", "--task", "arith", "--updates", "1", "--prompts-per-update", "2", "--group-size", "2",
         "--max-new-tokens", "2", "--no-progress", "--no-tensorboard"]


def one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("flags, says", [
    (["--eval-interval", "-1"], "--eval-interval must be >= 0"),
    (["--eval-problems", "0"], "--eval-problems must be >= 1"),
    (["--sample-interval", "-1"], "--sample-interval must be >= 0"),
    (["--samples-per-log", "-2"], "--samples-per-log must be >= 1"),
    (["--prompts-per-update", "0"], "--prompts-per-update must be >= 1"),
    (["--lora-dropout", "1.5"], "--lora-dropout in [0, 1)"),
])
def test_train_flags_are_checked_by_their_names(tiny_dir, tmp_path, capsys, flags, says):
    assert main([*TRAIN, "--model", str(tiny_dir), "--run-dir", str(tmp_path / "r"), *flags]) == 2
    assert says in one_error_line(capsys)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, says", [
    (["--max-turns", "0"], "--max-turns must be >= 1"),
    (["--max-turns", "-1"], "--max-turns must be >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--n", "4"], "give --samples k"),
    (["--temperature", "0.5"], "give --samples k"),
])
def test_eval_flags_are_checked_by_their_names(tiny_dir, capsys, flags, says):
    assert main(["llm", "eval", str(tiny_dir), "--task", "arith", "--limit", "1", *flags]) == 2
    assert says in one_error_line(capsys)


def test_task_option_spellings_agree_or_conflict_in_one_line(tiny_dir, tmp_path, capsys):
    assert main([*TRAIN, "--model", str(tiny_dir), "--run-dir", str(tmp_path / "c"), "--set", "digits=3",
                 "--task-options", "digits=2"]) == 2
    assert "task option digits is given twice" in one_error_line(capsys)
    assert main([*TRAIN, "--model", str(tiny_dir), "--run-dir", str(tmp_path / "a"), "--set", "digits=1",
                 "--task-options", "digits=1", "ops=+"]) == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["task_options"] == ["digits=1", "ops=+"]
    capsys.readouterr()
    assert main(["llm", "warmup", "--model", str(tiny_dir), "--task", "arith", "--out", str(tmp_path / "w"),
                 "--steps", "1", "--set", "digits=1", "--no-progress"]) == 0
    assert json.loads((tmp_path / "w" / "warmup.json").read_text())["config"]["task_options"] == ["digits=1"]


def test_eval_prints_the_calibration_and_warns_when_reports_are_missing(tiny_dir, capsys):
    assert main(["llm", "eval", str(tiny_dir), "--task", "arith", "--limit", "4", "--self-report", "both"]) == 0
    cap = capsys.readouterr()
    assert "reflection: accuracy" in cap.out and "confidence: mean" in cap.out
    assert "warning: 100% of the reflections asked for are missing" in cap.err  # a random model states none
    assert main(["llm", "eval", str(tiny_dir), "--task", "arith", "--limit", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ci_level"] == 0.95 and "confidence" not in res


def test_warmup_rate_follows_the_model_and_warns_for_a_pretrained_one(tiny_dir, tmp_path):
    from transformers import LlamaConfig

    from reflectrl.llm.warmup import PRETRAINED_WARMUP_LR, TINY_WARMUP_LR, warmup_learning_rate

    big = tmp_path / "big"
    LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30).save_pretrained(big)
    assert warmup_learning_rate(str(tiny_dir), None) == TINY_WARMUP_LR
    assert warmup_learning_rate(str(big), None) == PRETRAINED_WARMUP_LR
    with pytest.warns(UserWarning, match="a tiny model's rate"):
        assert warmup_learning_rate(str(big), 3e-3) == 3e-3


def test_the_filter_reads_the_trained_reward_not_the_task_score():
    """Groups whose task scores are equal but whose trained rewards differ (rlcr's Brier term) carry signal: they
    are kept; a group equal in both is left out."""
    from types import SimpleNamespace

    import torch

    from reflectrl.llm.episodes import _no_signal_rows, trained_reward

    mask = torch.tensor([[1, 1, 0]] * 4, dtype=torch.bool)
    rewards = torch.tensor([[0.0, -0.81, 0.0], [0.0, -0.04, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    batch = SimpleNamespace(index=torch.tensor([0, 0, 1, 1]), scores=torch.tensor([0.0, 0.0, 1.0, 1.0]),
                            token_rewards=rewards, completion_mask=mask)
    assert trained_reward(batch).tolist() == pytest.approx([-0.81, -0.04, 1.0, 1.0])
    assert _no_signal_rows(batch).tolist() == [False, False, True, True]


def test_eval_saves_transcripts_and_shows_progress(tiny_dir, tmp_path, capsys):
    path = tmp_path / "ep" / "episodes.jsonl"
    assert main(["llm", "eval", str(tiny_dir), "--task", "arith", "--limit", "3", "--transcripts", str(path)]) == 0
    cap = capsys.readouterr()
    assert "eval arith heldout" in cap.err and "problems/s" in cap.err
    episodes = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(episodes) == 3 and episodes[0]["transcript"][0][0] == "prompt"
    assert main(["llm", "eval", str(tiny_dir), "--task", "arith", "--limit", "1", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_eval_transcripts_name_the_report_asked_even_where_the_episode_ended_first(tiny_dir, tmp_path, capsys):
    """An episode whose answer spent the token budget ends before the report's turn: its transcript row still names
    the report asked for, so ``reflectrl calibration`` reads it as missing (as the eval's own metrics do), not as a
    row without a report."""
    path = tmp_path / "episodes.jsonl"
    assert main(["llm", "eval", str(tiny_dir), "--task", "arith", "--limit", "3", "--self-report", "both",
                 "--max-new-tokens", "4", "--transcripts", str(path), "--json", "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 6 and all("self_report" in r["infos"][-1] for r in rows)
    assert sorted(r["infos"][-1]["self_report"] for r in rows) == ["confidence"] * 3 + ["reflect"] * 3
    assert main(["calibration", str(path), "--json", "--reps", "20"]) == 0
    cal = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("reflection_missing_rate", "confidence_missing_rate"):
        assert cal[key]["value"] == pytest.approx(res[key]), key


def test_a_method_flag_on_another_algo_names_its_algo(tiny_dir, tmp_path, capsys):
    assert main([*TRAIN, "--algo", "grpo", "--model", str(tiny_dir), "--run-dir", str(tmp_path / "r"),
                 "--rlcr-credit", "split"]) == 2
    assert one_error_line(capsys) == "error: --rlcr-credit is a flag of --algo rlcr, not of --algo grpo"


def test_a_warmup_folder_evaluates_on_its_own_task_and_summaries_count_setup(tiny_dir, tmp_path, capsys):
    warm = tmp_path / "w"
    assert main(["llm", "warmup", "--model", str(tiny_dir), "--task", "arith", "--set", "digits=1", "--out", str(warm),
                 "--steps", "1", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["llm", "eval", str(warm), "--limit", "2", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["task"] == "arith"
    assert main([*TRAIN, "--model", str(tiny_dir), "--run-dir", str(tmp_path / "r")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["setup_s"] > 0
