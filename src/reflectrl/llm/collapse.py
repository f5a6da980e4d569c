"""The collapse alarm of a trained self-report: rings when a run's stated reports have been constant for K updates.

A reflection or confidence trained from a weak start tends to settle on one constant answer (docs/methods-llm.md,
refgrpo's "Measured"); once every sample of every group states it, no gradient moves it back. Every update the LLM
trainer shows the alarm the batch's per-row reports (:func:`reflectrl.llm.episodes.episode_info`): they are *constant*
when the valid reflections all say the same (or none is valid), or the valid stated confidences' standard deviation
(population) is below ``spread`` (or fewer than two are valid); with both kinds, when both are. A run that asks for
a report (``--self-report``) is watched in every update, also one where no episode stated it (all missing). It logs
``selfreport/constant`` (0 / 1, this update) and ``selfreport/collapse`` (1 while the reports have been constant for
``updates`` consecutive updates or more), and warns once per run, the first time it rings. A batch without
self-reports logs neither. Its state (the current run of constant updates, and whether it has warned) is part of
the trainer's checkpoint, so a resumed run rings where the uninterrupted one does.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

KEYS = ("reflection", "confidence")
ASKED = {"reflect": ("reflection",), "confidence": ("confidence",), "inline": ("confidence",)}
"""The reports each ``--self-report`` setting trains (a batch where no episode stated one has none at all)."""


def reports_constant(info: dict[str, Tensor], spread: float, asked: tuple[str, ...] = ()) -> bool | None:
    """Whether the batch's stated reports (``info["reflection"]`` and / or ``info["confidence"]``, ``[R]``, NaN where
    missing; a kind named in ``asked`` but absent from ``info``: none stated) are constant: the valid reflections take
    at most one value; the valid confidences' population standard deviation is below ``spread``. None when the batch
    has no self-reports and none is asked."""
    kinds = [k for k in KEYS if k in info or k in asked]
    if not kinds:
        return None
    constant = True
    for k in kinds:
        x = info[k][~torch.isnan(info[k])] if k in info else torch.zeros(0)
        if k == "reflection":
            constant &= int(x.unique().numel()) <= 1
        else:
            constant &= x.numel() < 2 or float(x.std(unbiased=False)) < spread
    return constant


class CollapseAlarm:
    """Counts consecutive updates whose self-reports are constant (:func:`reports_constant`) and rings once the
    count reaches ``updates``. ``self_report``: the run's ``--self-report`` (its reports are watched even in a batch
    where no episode stated one)."""

    def __init__(self, updates: int = 5, spread: float = 0.02, self_report: str = "off"):
        self.updates, self.spread, self.asked = updates, spread, ASKED.get(self_report, ())
        self.run = 0
        self.warned = False

    def observe(self, info: dict[str, Tensor], update: int) -> dict[str, float]:
        """This update's metrics (empty without self-reports), warning the first time the alarm rings."""
        constant = reports_constant(info, self.spread, self.asked)
        if constant is None:
            return {}
        self.run = self.run + 1 if constant else 0
        collapse = self.run >= self.updates
        if collapse and not self.warned:
            self.warned = True
            kinds = " and ".join(k for k in KEYS if k in info or k in self.asked)
            warnings.warn(f"self-report collapse at update {update}: the stated {kinds} has been constant (or missing) for "
                          f"{self.run} updates (metric selfreport/collapse; docs/methods-llm.md, the collapse alarm)",
                          stacklevel=2)
        return {"selfreport/constant": float(constant), "selfreport/collapse": float(collapse)}

    def state(self) -> dict[str, Any]:
        return {"run": self.run, "warned": self.warned}

    def load_state(self, meta: dict[str, Any] | None) -> None:
        """Inverse of :meth:`state`; a checkpoint from before the alarm (None) starts it afresh."""
        meta = meta or {}
        self.run, self.warned = int(meta.get("run", 0)), bool(meta.get("warned", False))
