"""`llm eval` and `llm train` off a terminal: log lines with the time left; a long evaluation suggests --limit before
most of its work (at its first generated batch); --no-progress silences both. The engine that counts the batches
generates the same tokens."""

import re

import pytest

from reflectrl import progress
from reflectrl.cli import main
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
    # the same evaluation with --no-progress: nothing on stderr, the same result
    quiet_out, quiet_err = run_eval(capsys, tiny_dir, "--self-report", "both", "--no-progress")
    assert not [line for line in quiet_err if not line.startswith("warning: ")] and quiet_out == out


def test_a_short_evaluation_suggests_nothing(tiny_dir, capsys):
    _, err = run_eval(capsys, tiny_dir)
    assert err and not any("--limit" in line for line in err)
    assert err[-1].startswith("eval toy-add heldout: 16/16 (100%), ") and "accuracy" in err[-1]


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
    assert re.match(r"grpo toy-add: 2/2 \(100%\), \S+ elapsed, done, \S+ updates/s, score \(trained reward\) ", err[1])
