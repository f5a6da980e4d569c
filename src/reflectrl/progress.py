"""A rich progress bar for training loops, on stderr (stdout carries the JSON summary)."""

from __future__ import annotations


class TrainProgress:
    """Context manager wrapping ``rich.progress``; a no-op when disabled (rich is then not imported).
    ``rate_label`` and ``value_label`` name the two numbers shown beside the bar (steps/s and return by
    default)."""

    def __init__(self, total: int, enabled: bool = True, description: str = "train", rate_label: str = "steps/s",
                 value_label: str = "return"):
        self.enabled = enabled
        self._p = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._p = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>7} " + rate_label), TextColumn(value_label + " {task.fields[value]}"),
                TimeRemainingColumn(), transient=False, console=Console(stderr=True),
            )
        self._task = None
        self._total, self._description = total, description

    def __enter__(self) -> TrainProgress:
        if self._p is not None:
            self._p.start()
            self._task = self._p.add_task(self._description, total=self._total, rate="-", value="-")
        return self

    def update(self, completed: int, rate: float, value: float | str | None) -> None:
        if self._p is not None:
            if isinstance(value, str):
                shown = value
            else:
                shown = "-" if value is None else (f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}")
            self._p.update(self._task, completed=completed, rate=f"{rate:.3g}" if rate < 100 else f"{rate:.0f}",
                           value=shown)

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.stop()
