"""The self-assessment rewards of refgrpo and rlcr as pure functions of outcomes and self-reports.

Inputs are per-rollout tensors ``[R]``: ``outcome`` / ``correct`` in {0, 1}, ``reflection`` in {0, 1}
(NaN: missing or malformed) and ``confidence`` in [0, 1] (NaN: missing or malformed). The LLM methods
(:mod:`reflectrl.methods.refgrpo`, :mod:`reflectrl.methods.rlcr`) and the verl reward functions
(:mod:`reflectrl.integrations.verl`) compute the same numbers with these.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

RLCR_FORMAT_PENALTY = -2.0
"""The reward of a completion without a valid confidence, on the scale of R = 1[correct] - (q - 1[correct])^2.

The RLCR release gives a completion equal-weight format, accuracy and Brier rewards, 0.5 * (format +
accuracy + (1 - (correct - q)^2)), and all three are 0 when the confidence tag is missing or not a number in
[0, 1]. On a valid completion that sum is 1 + 0.5 * R; on an invalid one it is 0, which is R = -2: below
every valid outcome (the worst valid one, confidently wrong, is R = -1)."""


def reflection_bonus(correct: Tensor, reflection: Tensor, c: float) -> Tensor:
    """refgrpo's bonus ``c * 1[reflection == correct]`` (``correct`` in {0, 1}: the task's verdict, so a partial
    score such as a test pass fraction below 1 is "unsolved"); a missing reflection (NaN) earns nothing."""
    valid = ~torch.isnan(reflection)
    agree = valid & (reflection == correct.to(reflection.dtype))
    return c * agree.to(correct.dtype)


def refgrpo_reward(outcome: Tensor, reflection: Tensor, c: float, correct: Tensor | None = None) -> Tensor:
    """``R = outcome + c * 1[reflection == correct]`` (arXiv 2606.14211; ``correct`` defaults to the outcome,
    for binary outcomes)."""
    return outcome + reflection_bonus(outcome if correct is None else correct, reflection, c)


def brier_term(correct: Tensor, confidence: Tensor) -> Tensor:
    """``-(q - 1[correct])^2`` where the confidence is valid, 0 elsewhere."""
    valid = ~torch.isnan(confidence)
    q = torch.where(valid, confidence, torch.zeros_like(confidence))
    return torch.where(valid, -(q - correct) ** 2, torch.zeros_like(q))


def rlcr_reward(correct: Tensor, confidence: Tensor, format_penalty: float = RLCR_FORMAT_PENALTY) -> Tensor:
    """``R = 1[correct] - (q - 1[correct])^2`` (arXiv 2507.16806); ``format_penalty`` without a valid confidence."""
    valid = ~torch.isnan(confidence)
    return torch.where(valid, correct + brier_term(correct, confidence), torch.full_like(correct, format_penalty))


def bonus_schedule(c: float, kind: Literal["step", "linear", "constant"], progress: float,
                   until: float = 2.0 / 3.0) -> float:
    """The bonus coefficient at ``progress`` in [0, 1]: ``step``: c for the first ``until`` of training, then 0
    (the paper's two thirds); ``linear``: from c down to 0 over training; ``constant``: c throughout."""
    if kind == "constant":
        return c
    if kind == "step":
        return c if progress < until else 0.0
    if kind == "linear":
        return c * max(0.0, 1.0 - progress)
    raise ValueError(f"unknown bonus schedule {kind!r}; choose step, linear or constant")


def as_nan(values: list[float | int | None]) -> Tensor:
    """A float tensor with NaN for missing values."""
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
