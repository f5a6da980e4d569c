"""Progress on stderr: a bar on a terminal; elsewhere log lines every 5% and at least every minute, with the time
left; an evaluation projected to be long suggests a --limit first; --no-progress silences all of it."""

import io
import re
import time

import pytest

from reflectrl import progress
from reflectrl.progress import TrainProgress, format_duration


class Terminal(io.StringIO):
    def isatty(self):
        return True


def fake_clock(monkeypatch, start=1000.0):
    now = [start]
    monkeypatch.setattr(progress, "_now", lambda: now[0])
    return now


def test_off_a_terminal_a_line_every_five_percent_with_the_time_left(monkeypatch):
    now = fake_clock(monkeypatch)
    out = io.StringIO()
    with TrainProgress(40, True, "train x", "updates/s", "return", stream=out) as bar:
        for i in range(1, 41):
            now[0] += 3.0
            bar.update(i, 1 / 3, float(i))
    lines = out.getvalue().splitlines()
    assert len(lines) == 21  # the first update, then each 2 of 40
    assert lines[0] == "train x: 1/40 (2%), 3s elapsed, about 1m57s left, 0.333 updates/s, return 1.000"
    assert lines[10] == "train x: 20/40 (50%), 1m elapsed, about 1m left, 0.333 updates/s, return 20.0"
    assert lines[-1] == "train x: 40/40 (100%), 2m elapsed, done, 0.333 updates/s, return 40.0"


def test_a_resumed_loop_estimates_from_what_it_did_itself(monkeypatch):
    now = fake_clock(monkeypatch)
    out = io.StringIO()
    with TrainProgress(10, True, "r", start=5, stream=out) as bar:
        now[0] += 10.0
        bar.update(6, 0.1, None)
        assert bar.time_left() == pytest.approx(40.0) and bar.projected() == pytest.approx(50.0)
    assert out.getvalue().splitlines()[0] == "r: 6/10 (60%), 10s elapsed, about 40s left, 0.1 steps/s"


def test_a_line_at_least_every_minute_while_nothing_moves(monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.05)
    out = io.StringIO()
    with TrainProgress(10, True, "slow", stream=out):
        time.sleep(0.5)
    lines = out.getvalue().splitlines()
    assert lines and all(re.fullmatch(r"slow: 0/10 \(0%\), \d+s elapsed, time left not known yet", line)
                         for line in lines), lines


def test_a_terminal_gets_the_bar_and_disabled_progress_prints_nothing(monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.01)
    tty, off = Terminal(), io.StringIO()
    with TrainProgress(4, True, "bar", stream=tty) as bar, TrainProgress(4, False, "off", stream=off) as quiet:
        for i in range(1, 5):
            bar.update(i, 1.0, 0.5)
            quiet.update(i, 1.0, 0.5)
            quiet.note("a note")
        time.sleep(0.05)
    assert bar.terminal and "bar" in tty.getvalue() and "elapsed" not in tty.getvalue()
    assert off.getvalue() == ""


def test_durations_read_at_the_precision_that_matters():
    assert [format_duration(s) for s in (0.4, 59, 60, 185, 3600, 3899)] == ["0s", "59s", "1m", "3m05s", "1h00m",
                                                                            "1h04m"]


def test_between_updates_the_estimate_counts_down_then_follows_the_rate(monkeypatch):
    now = fake_clock(monkeypatch)
    with TrainProgress(10, True, "c", stream=io.StringIO()) as bar:
        now[0] += 10.0
        bar.update(5, 0.5, None)
        assert bar.time_left() == pytest.approx(10.0)
        now[0] += 4.0  # a long step runs: the estimate of the last update, counted down
        assert bar.time_left() == pytest.approx(6.0) and "about 6s left" in bar.line()
        now[0] += 10.0  # past it: the rate so far (24 s for 5)
        assert bar.time_left() == pytest.approx(24.0)


def test_a_budget_shows_what_is_used_and_sets_the_time_left_and_the_log_cadence(monkeypatch):
    from reflectrl.progress import Budget

    now = fake_clock(monkeypatch)
    cpu = [0.0]
    out = io.StringIO()
    budget = Budget("CPU", 100.0, lambda: cpu[0])
    with TrainProgress(100000, True, "g", "updates/s", "", stream=out, budgets=[budget]) as bar:
        for i in range(1, 11):  # 10 updates of 10 wall-s and 5 CPU-s each: the budget ends first, at 20 updates
            now[0] += 10.0
            cpu[0] += 5.0
            bar.update(i, 0.1, f"reward {i}")
        assert bar.time_left() == pytest.approx((100 - 50) * 100 / 50)  # CPU left at 2 wall-s per CPU-s
        assert bar.fraction() == pytest.approx(0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10  # a line each 5% of the budget (each update), none more at the end
    assert lines[0] == "g: 1/100000 (0%), 10s elapsed, about 3m10s left (CPU budget), CPU 5s of 1m40s used (5%), " \
                       "0.1 updates/s, reward 1"
    assert lines[-1].startswith("g: 10/100000 (0%), 1m40s elapsed, about 1m40s left (CPU budget), CPU 50s of 1m40s "
                                "used (50%)")
    with TrainProgress(10, True, "w", stream=io.StringIO(), budgets=[Budget("wall", 60.0, lambda: 60.0)]) as spent:
        spent.update(3, 1.0, None)
        assert "wall budget spent" in spent.line() and spent.fraction() == 1.0
    with TrainProgress(10, True, "u", stream=io.StringIO(), budgets=[Budget("wall", 1e6, lambda: 0.0)]) as far:
        now[0] += 4.0
        far.update(2, 0.5, None)  # the count ends long before the budget: its estimate stands
        assert far.time_left() == pytest.approx(16.0) and "about 16s left," in far.line()


def test_a_terminal_bar_puts_a_self_labelled_value_and_the_budget_on_a_line_below():
    from reflectrl.progress import Budget

    tty = Terminal()
    with TrainProgress(100, True, "g", "updates/s", "", stream=tty, budgets=[Budget("CPU", 60.0, lambda: 30.0)]) as bar:
        bar.update(1, 0.5, "reward 0.250, accuracy 0.125")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", tty.getvalue()).replace("\r", "\n")
    assert "\n  CPU 30s of 1m used (50%), reward 0.250, accuracy 0.125\n" in plain, plain
    assert re.search(r"g .* 1/100 +0.5 updates/s", plain), plain
