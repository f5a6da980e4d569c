"""The progress of an evaluation: problems done, counted by the batches generated, and a warning when it is long.

An evaluation rolls out its problems in large chunks (a whole held-out split is often one chunk), each of several
generated batches per turn; :class:`EvalMeter` advances at every generated batch (through :meth:`EvalMeter.engine`,
which leaves what is generated unchanged), so that the bar or log lines of :class:`~reflectrl.progress.TrainProgress`
move and estimate the time left long before a chunk ends. Within a chunk a batch of ``m`` rows counts as ``m / (rows
x turns)`` of the chunk's problems: ``turns`` is the turns an episode may take until a chunk has ended, then the
batches per row measured so far: before then, episodes of a multi-turn task that end early make the estimate of the
time left too long.

Once the first batch is done the meter projects the whole evaluation's time; over :data:`LONG_EVAL_S` it prints one
line with the ``--limit`` that would take about that long.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..progress import TrainProgress, format_duration

LONG_EVAL_S = 600.0
"""An evaluation projected to take longer than this (seconds) gets a line suggesting ``--limit``."""


def limit_for(problems: int, projected_s: float, budget_s: float | None = None) -> int:
    """The ``--limit`` (problems) that an evaluation of ``problems`` projected to take ``projected_s`` seconds would
    finish in about ``budget_s`` (default :data:`LONG_EVAL_S`; at least 1, at most ``problems``)."""
    budget = LONG_EVAL_S if budget_s is None else budget_s
    return min(problems, max(1, int(problems * budget / max(projected_s, 1e-9))))


class EvalMeter:
    """Progress of an evaluation of ``problems`` problems in ``passes`` passes (``--self-report both``: two), on a
    :class:`TrainProgress` titled ``title``; a no-op unless ``enabled``. A pass calls :meth:`chunk` before each
    rollout, runs it with :meth:`engine`'s wrapper of its engine, and :meth:`done` after it."""

    def __init__(self, problems: int, passes: int, enabled: bool, title: str):
        self.problems, self.passes, self.enabled, self.title = problems, passes, enabled, title
        self.bar = TrainProgress(problems * passes, enabled, title, "problems/s", "accuracy")
        self.base = 0.0  # problems done in finished chunks (of every pass)
        self.size, self.rows, self.turns, self.generated = 0, 0, 1.0, 0
        self.measured = (0, 0)  # generated batches' rows, and rows, of the finished chunks
        self.checked = False
        self.accuracy: float | None = None

    def __enter__(self) -> EvalMeter:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def engine(self, engine: Any) -> Any:
        """``engine`` with every generated batch counted (the same calls, the same outputs); itself when disabled."""
        return _Counting(engine, self.batch) if self.enabled else engine

    def chunk(self, problems: int, rows: int, turns: int) -> None:
        """A rollout of ``problems`` problems (``rows`` episodes, up to ``turns`` turns each) begins."""
        self.size, self.rows, self.generated = problems, rows, 0
        generated, done_rows = self.measured
        self.turns = generated / done_rows if done_rows else float(turns)

    def batch(self, rows: int) -> None:
        """A batch of ``rows`` was generated."""
        self.generated += rows
        share = min(self.generated / max(self.rows * self.turns, 1e-9), 0.99)
        self._show(self.base + share * self.size)
        if not self.checked:
            self.checked = True
            self.check_length()

    def done(self, accuracy: float) -> None:
        """The chunk begun last has ended, with ``accuracy`` over the pass so far."""
        self.measured = (self.measured[0] + self.generated, self.measured[1] + self.rows)
        self.base += self.size
        self.accuracy = accuracy
        self._show(self.base)

    def _show(self, position: float) -> None:
        self.bar.update(position, position / max(self.bar.elapsed, 1e-9), self.accuracy)

    def check_length(self) -> None:
        """A line suggesting ``--limit`` when the evaluation is projected to take longer than :data:`LONG_EVAL_S`."""
        projected = self.bar.projected()
        if projected is None or projected <= LONG_EVAL_S:
            return
        passes = f" x {self.passes} passes" if self.passes > 1 else ""
        n = limit_for(self.problems, projected)
        self.bar.note(f"{self.title}: about {format_duration(projected)} at the pace of its first batch "
                      f"({self.problems} problems{passes}); --limit {n} would take about {format_duration(LONG_EVAL_S)}")


class _Counting:
    """A generation engine whose ``generate`` (and ``generate_with_logprobs``, where it has one) also reports the
    number of rows of each call; everything else is the engine's own."""

    def __init__(self, engine: Any, report: Callable[[int], None]):
        self._engine, self._report = engine, report
        if callable(getattr(engine, "generate_with_logprobs", None)):
            self.generate_with_logprobs = self._with_logprobs

    def generate(self, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._engine.generate(prompts, *args, **kwargs)
        self._report(len(prompts))
        return out

    def _with_logprobs(self, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._engine.generate_with_logprobs(prompts, *args, **kwargs)
        self._report(len(prompts))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


__all__ = ["LONG_EVAL_S", "EvalMeter", "limit_for"]
