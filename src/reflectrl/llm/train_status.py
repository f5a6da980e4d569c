"""What the progress of ``reflectrl llm train`` shows beside the count of updates: the reward and accuracy of the
rollouts of the last few updates (one update's batch is a few dozen samples: a single one jumps about), the trained
reward where a method adds terms to the task's, and the latest held-out evaluation (``--eval-interval``)::

    reward 0.412, accuracy 0.406 (mean of the last 10 updates), eval accuracy 0.350 (update 20)
"""

from __future__ import annotations

from collections import deque
from typing import Any

WINDOW = 10
"""Updates the rolling means cover."""


class TrainStatus:
    """The rolling means of a run's update records and its latest evaluation, as one line of text."""

    def __init__(self, window: int = WINDOW):
        self.recent: deque[tuple[float, float | None, float | None]] = deque(maxlen=window)
        self.evaluated: tuple[int, float] | None = None

    def add(self, rec: dict[str, Any], update: int) -> str:
        """Take update ``update``'s record; the text after it."""
        self.recent.append((float(rec["reward/mean"]), _opt(rec.get("reward/trained_mean")), _opt(rec.get("accuracy"))))
        if rec.get("eval/accuracy") is not None:
            self.evaluated = (update, float(rec["eval/accuracy"]))
        return self.text()

    def text(self) -> str:
        """``reward R[, trained reward T][, accuracy A] (mean of the last N updates)[, eval accuracy E (update U)]``."""
        parts = []
        if self.recent:
            n = len(self.recent)
            means = [_mean([r[i] for r in self.recent]) for i in range(3)]
            parts.append(f"reward {means[0]:.3f}")
            if means[1] is not None and abs(means[1] - (means[0] or 0.0)) > 1e-9:
                parts.append(f"trained reward {means[1]:.3f}")
            if means[2] is not None:
                parts.append(f"accuracy {means[2]:.3f}")
            parts[-1] += f" (mean of the last {n} update{'s' if n > 1 else ''})"
        if self.evaluated is not None:
            parts.append(f"eval accuracy {self.evaluated[1]:.3f} (update {self.evaluated[0]})")
        return ", ".join(parts)


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


__all__ = ["WINDOW", "TrainStatus"]
