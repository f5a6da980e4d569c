"""`llm eval` and `llm train` off a terminal: log lines with the time left; a long evaluation suggests --limit before
most of its work (at its first generated batch); --no-progress silences both. The engine that counts the batches
generates the same tokens."""

import json
import re

import pytest

from reflectrl import progress
from reflectrl.cli import main
from reflectrl.cli.eval_report import summary_lines
from reflectrl.llm import eval_progress
from reflectrl.llm.eval_progress import EvalMeter, limit_for


def slow_clock(monkeypatch, step=20.0):
    """A clock that moves ``step`` seconds each time it is read: a slow machine, at no cost."""
    now = [0.0]

    def read():
        now[0] += step
        return now[0]

    monkeypatch.setattr(progress, "_now", read)


EVAL = ["llm", "eval", "--task", "toy-add", "--max-new-tokens", "3", "--json"]


def run_eval(capsys, tiny_dir, *extra):
    assert main([*EVAL[:2], str(tiny_dir), *EVAL[2:], *extra]) == 0
    cap = capsys.readouterr()
    return cap.out, [line for line in cap.err.splitlines() if line.strip()]


def test_eval_logs_its_progress_and_suggests_a_limit_when_long(tiny_dir, capsys, monkeypatch):
    slow_clock(monkeypatch)
    monkeypatch.setattr(eval_progress, "LONG_EVAL_S", 30.0)
    out, err = run_eval(capsys, tiny_dir, "--self-report", "both")
    assert '"self_report": "both"' in out
    suggestion = [line for line in err if "--limit" in line]
    assert len(suggestion) == 1, err
    m = re.fullmatch(r"eval toy-add heldout \(both\): about (\S+) at the pace of its first batch \(16 problems x 2 "
                     r"passes\); --limit (\d+) would take about 30s", suggestion[0])
    assert m and 1 <= int(m.group(2)) < 16, suggestion
    assert err.index(suggestion[0]) == 1  # right after the first progress line, before the rest of the work
    logs = [line for line in err if line.startswith("eval toy-add heldout (both): ") and line not in suggestion]
    assert all(re.match(r"eval toy-add heldout \(both\): \d+/32 \(\d+%\), \S+ elapsed, (about \S+ left|done), "
                        r"\S+ problems/s", line) for line in logs), logs
    assert any(" left, " in line for line in logs) and logs[-1].startswith("eval toy-add heldout (both): 32/32 (100%)")
    # the same evaluation with --no-progress: the same result, and on stderr its warnings and the summary alone
    quiet_out, quiet_err = run_eval(capsys, tiny_dir, "--self-report", "both", "--no-progress")
    summary = summary_lines(json.loads(out), str(tiny_dir))
    assert quiet_out == out and [line for line in quiet_err if not line.startswith("warning: ")] == summary
    assert err[-len(summary):] == summary  # with progress, the summary ends it too


def test_a_short_evaluation_suggests_nothing(tiny_dir, capsys):
    _, err = run_eval(capsys, tiny_dir)
    assert err and not any("--limit" in line for line in err)
    logs = [line for line in err if line.startswith("eval toy-add heldout: ")]
    assert logs[-1].startswith("eval toy-add heldout: 16/16 (100%), ") and "accuracy" in logs[-1]


def test_limit_for_is_the_share_of_the_problems_that_fits_the_budget():
    assert limit_for(147, 3600.0) == 24 and limit_for(147, 3600.0, 1200.0) == 49
    assert limit_for(10, 1.0) == 10 and limit_for(10, 1e9) == 1


def test_the_meter_counts_batches_without_changing_them(tiny_policy):
    from reflectrl.llm.engines import make_engine

    meter = EvalMeter(4, 1, True, "m")
    engine = make_engine("torch", tiny_policy)
    counted = meter.engine(engine)
    import torch

    prompts = [[1, 5, 6], [1, 7]]
    a = engine.generate(prompts, 4, torch.Generator().manual_seed(0), greedy=True)
    with meter:
        meter.chunk(4, 4, 2)
        b = counted.generate(prompts, 4, torch.Generator().manual_seed(0), greedy=True)
        assert meter.bar.completed == pytest.approx(4 * 2 / (4 * 2))  # 2 of 4 rows x 2 turns: a quarter of 4
        meter.done(0.5)
        assert meter.bar.completed == 4
    assert a == b and EvalMeter(4, 1, False, "m").engine(engine) is engine


def test_train_off_a_terminal_logs_its_progress(tiny_dir, tmp_path, capsys):
    assert main(["llm", "train", "--task", "toy-add", "--model", str(tiny_dir), "--run-dir", str(tmp_path / "r"),
                 "--updates", "2", "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "2",
                 "--no-tensorboard"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 2 and err[0].startswith("grpo toy-add: 1/2 (50%), ") and " left, " in err[0], err
    assert re.fullmatch(r"grpo toy-add: 2/2 \(100%\), \S+ elapsed, done, \S+ updates/s, reward \d\.\d{3}, accuracy "
                        r"\d\.\d{3} \(mean of the last 2 updates\)", err[1]), err[1]


def test_train_shows_its_budget_rolling_means_and_last_evaluation(tiny_dir, tmp_path, capsys):
    """A CPU budget that ends the run before its updates: what is used of it on every line, a line each 5% of it,
    the rolling reward and accuracy as the metrics log them, and the latest evaluation's accuracy."""
    run = tmp_path / "r"
    assert main(["llm", "train", "--task", "toy-add", "--model", str(tiny_dir), "--run-dir", str(run),
                 "--updates", "100000", "--cpu-time-limit-s", "1.5", "--eval-interval", "3", "--eval-problems", "2",
                 "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "2", "--no-tensorboard"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("grpo toy-add: ")]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert 3 < len(recs) < 100000 and len(err) >= 10, err  # the budget stopped it, logged every 5% of it
    assert all(re.search(r", CPU \S+ of 2s used \(\d+%\), ", line) for line in err), err
    assert "left (CPU budget)" in err[0] and "CPU budget spent, CPU 2s of 2s used (100%)" in err[-1], err[-1]
    last = recs[-10:]
    mean = lambda key: sum(r[key] for r in last) / len(last)  # noqa: E731
    assert f"reward {mean('reward/mean'):.3f}, accuracy {mean('accuracy'):.3f} (mean of the last 10 updates)" in err[-1]
    evals = [(r["update"], r["eval/accuracy"]) for r in recs if "eval/accuracy" in r]
    assert evals[-1][0] == len(recs) and f"eval accuracy {evals[-1][1]:.3f} (update {len(recs)})" in err[-1]


def test_the_status_line_rolls_over_its_window_and_names_a_shaped_reward():
    from reflectrl.llm.train_status import TrainStatus

    status = TrainStatus(window=2)
    assert status.add({"reward/mean": 0.9, "accuracy": 0.5}, 1) == "reward 0.900, accuracy 0.500 (mean of the last 1 update)"
    status.add({"reward/mean": 0.2, "accuracy": 0.25, "eval/accuracy": 0.125}, 2)
    text = status.add({"reward/mean": 0.4, "reward/trained_mean": 0.1, "accuracy": 0.75}, 3)  # the first falls out
    assert text == ("reward 0.300, trained reward 0.100, accuracy 0.500 (mean of the last 2 updates), eval accuracy "
                    "0.125 (update 2)")
