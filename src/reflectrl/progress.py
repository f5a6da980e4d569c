"""A rich progress bar for training loops: steps, steps/s and the recent return."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class TrainProgress:
    """Context manager wrapping ``rich.progress``; a no-op when disabled."""

    def __init__(self, total: int, enabled: bool = True, description: str = "train"):
        self.enabled = enabled
        self._p = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[sps]:>7} steps/s"), TextColumn("return {task.fields[ret]}"),
            TimeRemainingColumn(), transient=False,
        ) if enabled else None
        self._task = None
        self._total, self._description = total, description

    def __enter__(self) -> "TrainProgress":
        if self._p is not None:
            self._p.start()
            self._task = self._p.add_task(self._description, total=self._total, sps="-", ret="-")
        return self

    def update(self, completed: int, sps: float, recent_return: float | None) -> None:
        if self._p is not None:
            ret = "-" if recent_return is None else f"{recent_return:.1f}"
            self._p.update(self._task, completed=completed, sps=f"{sps:.0f}", ret=ret)

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.stop()
