"""Progress of a long loop on stderr (stdout carries the JSON summary): a rich bar on a terminal, plain log lines
elsewhere.

Where stderr is not a terminal (a log file, a pipe, a batch job) a bar cannot be redrawn, so :class:`TrainProgress`
prints one line each time another :data:`LOG_EVERY_FRACTION` of the total is done (every 5%) and at least every
:data:`LOG_EVERY_S` seconds (a minute) while nothing moves, and one at the end: what is done of the total, the time
elapsed, an estimate of the time left (at the rate up to the last update, counted down between updates), the rate
and the loop's own value::

    eval text2sql heldout (both): 44/294 (15%), 9m12s elapsed, about 52m left, 0.0797 problems/s, accuracy 0.227

A loop with a time limit (:class:`Budget`: a training's ``--cpu-time-limit-s`` or ``--time-limit-s``) also shows
what it has used of it, counts a log line each 5% of the budget as of the total, and estimates the time left as the
sooner of the two ends (a CPU budget turned into wall time at the pace of CPU to wall time so far)::

    grpo arith: 12/100000 (0%), 6m elapsed, about 54m left (CPU budget), CPU 6m of 1h00m used (10%), ...
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

LOG_EVERY_FRACTION = 0.05
"""A log line each time this share of the total more is done (off a terminal)."""
LOG_EVERY_S = 60.0
"""A log line at least this often, in seconds, while nothing else is printed (off a terminal)."""
_now = time.monotonic
"""The clock of elapsed times and estimates (replaceable in tests)."""


def format_duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``10m``, ``1h04m``: a duration to the precision that matters."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@dataclass(frozen=True)
class Budget:
    """A time limit the loop stops at: ``kind`` (``CPU`` or ``wall``), ``limit_s`` seconds, and ``used``, which
    reads the seconds of it used so far."""

    kind: str
    limit_s: float
    used: Callable[[], float]

    def share(self) -> float:
        """The share of the budget used, in [0, 1]."""
        return min(max(self.used() / max(self.limit_s, 1e-9), 0.0), 1.0)

    def wall_left(self, elapsed: float) -> float:
        """Wall seconds until the budget is spent: a CPU budget at the pace of CPU to wall time so far (``elapsed``
        wall seconds), one to one before any is measured."""
        used = self.used()
        left = max(self.limit_s - used, 0.0)
        return left * elapsed / used if self.kind != "wall" and used > 0 and elapsed > 0 else left

    def describe(self) -> str:
        """``CPU 6m of 1h00m used (10%)``."""
        return (f"{self.kind} {format_duration(self.used())} of {format_duration(self.limit_s)} used "
                f"({math.floor(100 * self.share() + 1e-9)}%)")


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _shown(value: float | str | None) -> str:
    if isinstance(value, str):
        return value
    return "-" if value is None else (f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}")


def _rate(rate: float) -> str:
    return f"{rate:.3g}" if rate < 100 else f"{rate:.0f}"


def _bar(stream: TextIO, rate_label: str, value_label: str) -> Any:
    """The ``rich`` bar: description, bar, count, rate and the time left, then what is used of each budget and the
    loop's value: beside them under its label, or (no label: a value that names its own parts, often long) on a line
    of their own below the bar."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.text import Text

    class TwoLines(Progress):
        def get_renderables(self) -> Any:
            yield self.make_tasks_table(self.tasks)
            for task in self.tasks:
                parts = [task.fields.get("budget", ""), "" if task.fields.get("value") == "-" else task.fields["value"]]
                if any(parts):
                    yield Text("  " + ", ".join(str(x) for x in parts if x), overflow="fold")

    columns = [TextColumn("[bold]{task.description}"), BarColumn(bar_width=24), TextColumn("{task.fields[count]}"),
               TextColumn("{task.fields[rate]:>7} " + rate_label, markup=False),
               TextColumn("{task.fields[left]}", markup=False)]
    if value_label:
        return Progress(*columns, TextColumn("{task.fields[budget]}", markup=False),
                        TextColumn(value_label + " {task.fields[value]}", markup=False), transient=False,
                        console=Console(file=stream))
    return TwoLines(*columns, transient=False, console=Console(file=stream))


class TrainProgress:
    """Context manager showing a loop's progress on stderr (nothing when not ``enabled``): a ``rich`` bar on a
    terminal, else the log lines of the module docstring. ``rate_label`` and ``value_label`` name the two numbers
    shown beside the count (steps/s and return by default; an empty label: the value names its own parts);
    ``start``: what was done before (a resumed run), which the estimate of the time left leaves out; ``budgets``:
    the time limits the loop stops at."""

    def __init__(self, total: int, enabled: bool = True, description: str = "train", rate_label: str = "steps/s",
                 value_label: str = "return", start: float = 0, stream: TextIO | None = None,
                 budgets: Sequence[Budget] = ()):
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stderr
        self._p = None
        self.terminal = enabled and _is_terminal(self._stream)
        self.budgets = tuple(budgets)
        if self.terminal:
            self._p = _bar(self._stream, rate_label, value_label)
        self._task: Any = None
        self._total, self._description = total, description
        self._rate_label, self._value_label = rate_label, value_label
        self._start = self.completed = float(start)
        self._rate_value: float | None = None
        self._value: float | str | None = None
        self._t0 = self._last_line = _now()
        self._updated_at = 0.0  # elapsed seconds at the last update
        self._last_mark = -1
        self._logged_at: float | None = None  # what the last log line showed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # ------------------------------------------------------------------ estimates
    @property
    def elapsed(self) -> float:
        """Seconds since the loop began."""
        return _now() - self._t0

    def time_left(self) -> float | None:
        """Seconds left, or None before anything is done and without a budget: at the rate up to the last update,
        counted down since then (a line while a long step runs keeps the estimate; past it, the rate so far); with
        budgets, the sooner of that and the wall time until a budget is spent."""
        left, (budget, _) = self._count_left(), self._budget_left()
        return budget if left is None or (budget is not None and budget < left) else left

    def _count_left(self) -> float | None:
        done = self.completed - self._start
        if done <= 0:
            return None
        remaining = max(self._total - self.completed, 0)
        now = self.elapsed
        left = self._updated_at * remaining / done - (now - self._updated_at)
        return left if left > 0 else now * remaining / done

    def _budget_left(self) -> tuple[float | None, str]:
        """Wall seconds until the first budget is spent, and its kind ((None, "") without budgets)."""
        return min(((b.wall_left(self.elapsed), b.kind) for b in self.budgets), default=(None, ""))

    def fraction(self) -> float:
        """The share done: of the total, or of a budget where more of that is used."""
        return max([self.completed / max(self._total, 1e-9), *(b.share() for b in self.budgets)])

    def projected(self) -> float | None:
        """Seconds the whole loop takes at the rate so far (elapsed + left), or None before anything is done."""
        left = self.time_left()
        return None if left is None else self.elapsed + left

    # ------------------------------------------------------------------ the loop's side
    def __enter__(self) -> TrainProgress:
        self._t0 = self._last_line = _now()
        if self._p is not None:
            self._p.start()
            self._task = self._p.add_task(self._description, total=self._total, rate="-", value="-",
                                          **self._fields())
        if self.enabled:
            self._ticker = threading.Thread(target=self._tick, name="progress-log", daemon=True)
            self._ticker.start()
        return self

    def update(self, completed: float, rate: float, value: float | str | None) -> None:
        """``completed`` of the total done (a fraction of one is fine), at ``rate``, with the loop's value."""
        if not self.enabled:
            return
        with self._lock:
            self.completed, self._rate_value, self._value = float(completed), rate, value
            self._updated_at = self.elapsed
        if self._p is not None:
            self._p.update(self._task, rate=_rate(rate), value=_shown(value), **self._fields())
            return
        mark = math.floor(self.fraction() / LOG_EVERY_FRACTION + 1e-9)
        if mark > self._last_mark:
            self._last_mark = mark
            self._log()

    def note(self, line: str) -> None:
        """Print one line on stderr (above the bar on a terminal)."""
        if not self.enabled:
            return
        if self._p is not None:
            self._p.console.print(line, markup=False, highlight=False)
        else:
            with self._lock:
                print(line, file=self._stream, flush=True)

    def __exit__(self, *exc: Any) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join(timeout=5)
        if self._p is not None:
            self._p.stop()
            return
        if self.enabled and exc[0] is None and self._logged_at != self.completed:
            self._log()

    def _fields(self) -> dict[str, Any]:
        """The bar's position and text fields (a terminal): the count, the time left and the budgets."""
        done = math.floor(self.completed + 1e-9)
        return {"completed": self.fraction() * self._total, "count": f"{done}/{self._total}",
                "left": self._left_text(), "budget": ", ".join(b.describe() for b in self.budgets)}

    def _left_text(self) -> str:
        """``about 4m left``, ``about 48m left (CPU budget)``, ``done``, ``CPU budget spent``, or empty before any
        estimate."""
        spent = [b.kind for b in self.budgets if b.share() >= 1]
        if self.completed >= self._total:
            return "done"
        if spent:
            return f"{spent[0]} budget spent"
        left, (budget, kind) = self._count_left(), self._budget_left()
        if budget is not None and (left is None or budget < left):
            return f"about {format_duration(budget)} left ({kind} budget)"
        return "" if left is None else f"about {format_duration(left)} left"

    # ------------------------------------------------------------------ the log lines
    def line(self) -> str:
        """The log line of the progress so far."""
        total = max(self._total, 1)
        done = math.floor(self.completed + 1e-9)  # a share of one in progress is not done yet
        parts = [f"{self._description}: {done}/{self._total} ({math.floor(100 * self.completed / total + 1e-9)}%)",
                 f"{format_duration(self.elapsed)} elapsed", self._left_text() or "time left not known yet",
                 *(b.describe() for b in self.budgets)]
        if self._rate_value is not None:
            parts.append(f"{_rate(self._rate_value)} {self._rate_label}")
        if self._value is not None:
            parts.append(f"{self._value_label} {_shown(self._value)}" if self._value_label else _shown(self._value))
        return ", ".join(parts)

    def _log(self) -> None:
        with self._lock:
            text = self.line()
            self._logged_at, self._last_line = self.completed, _now()
            with contextlib.suppress(OSError, ValueError):  # a closed stream: progress is never worth an error
                print(text, file=self._stream, flush=True)

    def _tick(self) -> None:
        """On a terminal: the budgets and the time left redrawn every second between updates. Elsewhere: a line
        whenever :data:`LOG_EVERY_S` seconds passed without one."""
        while not self._stop.wait(1.0 if self._p is not None else min(max(LOG_EVERY_S / 4, 0.01), 5.0)):
            if self._p is not None:
                with contextlib.suppress(Exception):  # progress is never worth an error
                    self._p.update(self._task, **self._fields())
            elif _now() - self._last_line >= LOG_EVERY_S:
                self._log()
