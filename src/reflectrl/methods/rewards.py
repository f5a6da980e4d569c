"""The self-assessment rewards of refgrpo and rlcr as pure functions of outcomes and self-reports.

Inputs are per-rollout tensors ``[R]``: ``outcome`` / ``correct`` in {0, 1}, ``reflection`` in {0, 1}
(NaN: missing or malformed) and ``confidence`` in [0, 1] (NaN: missing or malformed). The LLM methods
(:mod:`reflectrl.methods.refgrpo`, :mod:`reflectrl.methods.rlcr`) and the verl reward functions
(:mod:`reflectrl.integrations.verl`) compute the same numbers with these.
"""

from __future__ import annotations

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


def balanced_reflection_bonus(correct: Tensor, reflection: Tensor, c: float, groups: Tensor) -> Tensor:
    """refgrpo's class-balanced agreement bonus ``[R]`` (docs/methods-llm.md): with ``p`` the share of successes in a
    row's group, ``b_i = c * 1[reflection_i == correct_i] / (2 * P(o = o_i))``, i.e. weight ``1 / (2p)`` on a
    success, ``1 / (2(1 - p))`` on a failure. Every constant reflection earns ``c / 2`` on the group's average, a
    perfect one ``c``. A group whose outcomes are all equal gives 0 to each of its rows (no signal), and so does a
    missing reflection (NaN).

    ``correct [R]`` in {0, 1}, ``reflection [R]`` in {0, 1} or NaN, ``groups [R]`` the rows' group ids (GRPO's
    groups: ``arange(R) // group_size``)."""
    ok = (correct > 0.5).to(correct.dtype)
    _, inv = torch.unique(groups, return_inverse=True)
    n = torch.zeros(int(inv.max()) + 1 if inv.numel() else 0, dtype=correct.dtype).index_add_(
        0, inv, torch.ones_like(ok))
    p = torch.zeros_like(n).index_add_(0, inv, ok)[inv] / n[inv]
    share = torch.where(ok > 0, p, 1 - p)  # P(o = o_i) in the row's group
    informative = (p > 0) & (p < 1)
    weight = torch.where(informative, 1.0 / (2 * share.clamp_min(1e-12)), torch.zeros_like(share))
    return reflection_bonus(ok, reflection, c) * weight


def group_rank_reward(correct: Tensor, report: Tensor, groups: Tensor, balanced: bool = False) -> Tensor:
    """The group rank reward ``[R]`` of stated reports (confidences, or reflections in {0, 1}; docs/methods-llm.md),
    coefficient 1: a success earns the share of its group's failures whose report it exceeds (ties count one half)
    minus 1/2; a failure the share of its group's successes whose report exceeds its own (ties one half) minus
    1/2. A constant reporter earns 0, a perfect one +1/2 on every row; the group's mean is its AUROC minus 1/2.
    A row with a missing report (NaN) earns 0 and is left out of the others' pairs; a row with no valid partner
    of the other outcome (a group whose outcomes are all equal) earns 0.

    ``balanced``: each row's term is weighted by ``(n_s + n_f) / (2 n_c)``, with n_s and n_f the group's valid
    successes and failures and n_c those of the row's own outcome, so that both outcomes carry the same total weight
    (a group of one success and three failures no longer pushes a shared report level down three times as hard as
    up). The group's mean is still its AUROC minus 1/2.

    ``correct [R]`` in {0, 1}, ``report [R]`` (NaN: missing), ``groups [R]`` the rows' group ids."""
    R = correct.shape[0]
    if R == 0:
        return torch.zeros_like(correct)
    _, inv = torch.unique(groups, return_inverse=True)
    valid = ~torch.isnan(report)
    ok = correct > 0.5
    succ, fail = valid & ok, valid & ~ok
    q = torch.where(valid, report, 0.0).to(torch.float64)
    lo, hi = (float(q[valid].min()), float(q[valid].max())) if valid.any() else (0.0, 0.0)
    width = hi - lo + 1.0
    key = inv.to(torch.float64) * width + (q - lo)  # pools apart, reports ordered within each pool
    below_f, tied_f, n_fail = _pool_counts(key, fail, inv, width)  # each row against its pool's failures
    below_s, tied_s, n_succ = _pool_counts(key, succ, inv, width)  # and against its pool's successes
    dt = report.dtype
    as_success = (below_f + 0.5 * tied_f).to(dt) / n_fail.to(dt).clamp_min(1) - 0.5
    above_s = n_succ - below_s - tied_s
    as_failure = (above_s + 0.5 * tied_s).to(dt) / n_succ.to(dt).clamp_min(1) - 0.5  # the successes above it
    if balanced:  # each class's rows weighted by (n_s + n_f) / (2 n_c)
        size = (n_succ + n_fail).to(dt)
        as_success = as_success * size / (2 * n_succ.to(dt).clamp_min(1))
        as_failure = as_failure * size / (2 * n_fail.to(dt).clamp_min(1))
    out = torch.where(succ & (n_fail > 0), as_success, torch.where(fail & (n_succ > 0), as_failure, 0.0))
    return out.to(correct.dtype)


def _pool_counts(key: Tensor, member: Tensor, pool: Tensor, width: float) -> tuple[Tensor, Tensor, Tensor]:
    """For every row: how many ``member`` rows of its pool have a key below its own, equal to it, and in all
    (``key = pool * width + value``, values within one width); O(R log R)."""
    ref = torch.sort(key[member]).values
    start = torch.searchsorted(ref, pool.to(torch.float64) * width, right=False)
    stop = torch.searchsorted(ref, (pool + 1).to(torch.float64) * width, right=False)
    left = torch.searchsorted(ref, key, right=False)
    right = torch.searchsorted(ref, key, right=True)
    return left - start, right - left, stop - start


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


