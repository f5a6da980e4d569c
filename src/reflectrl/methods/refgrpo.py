"""refgrpo: a reflection-agreement bonus (arXiv 2606.14211, "Closing the Reflection Gap").

When an episode ends the environment asks the agent for a binary reflection, solved or unsolved
(:mod:`reflectrl.tasks.selfreport`); the outcome is used for the reward and never shown to the agent.
The reward becomes ``R = outcome + c * 1[reflection == correct]`` (for a binary outcome, the paper's
``1[reflection == outcome]``): the bonus is added to the outcome at the
episode's last token, *before* group normalization (a ``reward_delta`` of the method contract), with ``c``
on a schedule (the paper: 0.1 for the first two thirds of training, then 0). A missing or malformed
reflection earns no bonus and is counted (``refgrpo/missing_rate``).

``--refgrpo-credit split`` (not the paper's form; docs/methods-llm.md) trains the two parts of an episode on
their own signals: the answer's tokens on the outcome's group advantage alone, the reflection turn's tokens on
the group advantage of the bonus alone (:func:`split_credit`), so that the reflection of a right answer is no
longer reinforced by the outcome whatever it says.

``--refgrpo-reward`` (reflectrl's, not the paper's; docs/methods-llm.md) picks the bonus: ``agreement`` (the
paper's), ``balanced`` (the agreement weighted by the inverse frequency of the row's outcome in its group, so that
every constant reflection earns c/2 and only discrimination earns more) or ``rank`` (c times the group rank reward
of :func:`~reflectrl.methods.rewards.group_rank_reward`: a constant reflection earns 0) or ``rank-balanced`` (the
same, each outcome's rows weighted by the inverse of their count in the group; under split credit scaled by one
std over the batch, :func:`~reflectrl.core.advantages.batch_scaled_advantages`) or ``batch-rank`` (rank-balanced
over the whole batch as one group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from ..contract.base import Shaping, StepBatch, last_turn_tokens, row_groups
from ..core.advantages import batch_scaled_advantages, group_advantages
from .rewards import balanced_reflection_bonus, bonus_schedule, group_rank_reward, reflection_bonus

Credit = Literal["episode", "split"]


@dataclass
class RefGRPOOptions:
    """Options of refgrpo (each a ``reflectrl llm train --algo refgrpo`` flag)."""

    refgrpo_c: float = 0.1
    """Bonus c in R = outcome + c * 1[reflection == outcome] (the paper's 0.1)."""
    refgrpo_schedule: Literal["step", "linear", "constant"] = "step"
    """step: c for the first --refgrpo-until of training, then 0; linear: c down to 0; constant: c throughout."""
    refgrpo_until: float = 2.0 / 3.0
    """The share of training the step schedule keeps the bonus on (the paper's two thirds)."""
    refgrpo_credit: Credit = "episode"
    """episode: the bonus joins the outcome and every token takes the episode's advantage (the paper); split: the
    answer's tokens take the outcome's group advantage, the reflection turn's the bonus's (a bonus the same
    across a group, or c = 0 after the step schedule, gives them 0)."""
    refgrpo_reward: Literal["agreement", "balanced", "rank", "rank-balanced", "batch-rank"] = "agreement"
    """The bonus: agreement: c * 1[reflection == outcome] (the paper); balanced: the agreement weighted by
    1 / (2 P(o = o_i)) within the row's group (every constant reflection earns c/2, a perfect one c); rank: c times
    the group rank reward (a constant reflection earns 0, a perfect one c/2); rank-balanced: the same, each
    outcome's rows weighted by the inverse of their count in the group and, under split credit, the reflection
    turn's advantage scaled by one std over the batch instead of each group's; batch-rank: rank-balanced with the
    whole batch as one group (a reflection is also judged against other questions' episodes). balanced and the
    rank forms give 0 in a group (a batch, for batch-rank) whose outcomes are all equal (docs/methods-llm.md)."""

    def validate_refgrpo(self) -> list[tuple[bool, str]]:
        return [(self.refgrpo_c >= 0, "--refgrpo-c must be non-negative"),
                (0 < self.refgrpo_until <= 1, "--refgrpo-until must be in (0, 1]")]


def last_step_delta(batch: StepBatch, per_row: Tensor) -> Tensor:
    """``[R, T]`` holding ``per_row [R]`` at each row's episode end (an LLM row's last policy token)."""
    return batch.episode_end.to(per_row.dtype) * per_row[:, None]


def report_turn_mask(batch: StepBatch) -> Tensor:
    """``[R, T]`` bool: the tokens of each row's self-report turn (its last agent turn, where the episode ended with
    the self-report question: ``info["report_asked"]``)."""
    if batch.turn_ids is None:
        raise ValueError("split credit needs the batch's turn ids (an LLM token batch)")
    mask = (batch.mask if batch.mask is not None else torch.ones_like(batch.rewards)).bool()
    return last_turn_tokens(batch.turn_ids, mask, batch.info.get("report_asked", torch.zeros(mask.shape[0])))


RANK_KINDS: tuple[str, ...] = ("rank", "rank-balanced", "batch-rank")


def rank_pools(kind: str, batch: StepBatch) -> Tensor:
    """``[R]`` the pools a rank reward of ``kind`` pairs its rows within: each row's group (rank, rank-balanced), or
    the whole batch as one pool (batch-rank: a report is also judged against other questions' episodes, so a
    report that tracks how hard its question is earns too)."""
    groups = row_groups(batch)
    return torch.zeros_like(groups) if kind == "batch-rank" else groups


def rank_reward(kind: str, correct: Tensor, report: Tensor, batch: StepBatch) -> Tensor:
    """``[R]`` the rank reward of ``kind`` (balanced for rank-balanced and batch-rank) in its pools."""
    return group_rank_reward(correct, report, rank_pools(kind, batch), balanced=kind != "rank")


def rank_credit(batch: StepBatch, per_row: Tensor, kind: str, weight: float = 1.0) -> Shaping:
    """Split credit of a rank term: GRPO's per-group scale for rank, one std over the batch for the balanced forms,
    centred in the pools the term was computed in."""
    return split_credit(batch, per_row, "group" if kind == "rank" else "batch", rank_pools(kind, batch), weight)


def split_credit(batch: StepBatch, per_row: Tensor, scale: Literal["group", "batch"] = "group",
                 groups: Tensor | None = None, weight: float = 1.0) -> Shaping:
    """The shaping that gives the self-report turn's tokens the group advantage of ``per_row [R]`` in place of the
    episode's, and leaves every other token's advantage as the estimator gave it (the outcome's).

    ``scale``: group: GRPO's, centred in the group and divided by the group's std; batch: centred in the group and
    divided by one std over the rows of every group whose centred terms are not all 0 (the balanced rank forms: a
    per-group std is a function of the group's reports and, measured, moves a reporter's shared level even where
    the term's expectation does not; docs/methods-llm.md). ``groups``: the pools to centre in (default: each row's
    group). ``weight``: multiplies the report turn's advantage (1: as it is)."""
    report = report_turn_mask(batch)
    groups = row_groups(batch) if groups is None else groups
    if scale == "group":
        adv = group_advantages(per_row.to(batch.advantages.dtype), groups)
    else:
        adv = batch_scaled_advantages(per_row.to(batch.advantages.dtype), groups)
    return Shaping(advantage_delta=report.to(adv.dtype) * (weight * adv[:, None] - batch.advantages))


class RefGRPO:
    """The reflection-agreement bonus on the rollouts' reflections (no learned part)."""

    fit_first = True
    reads_states = False  # it shapes from outcomes and self-reports, not hidden states

    def __init__(self, opts: RefGRPOOptions):
        self.o = opts
        self._metrics: dict[str, float] = {}

    def fit(self, batch: StepBatch) -> None:
        """Nothing to learn."""

    def shape(self, batch: StepBatch) -> Shaping:
        correct = batch.info["correct"]
        reflection = batch.info.get("reflection", torch.full_like(correct, float("nan")))
        c = bonus_schedule(self.o.refgrpo_c, self.o.refgrpo_schedule, batch.progress, self.o.refgrpo_until)
        bonus = self.bonus(batch, correct, reflection, c)
        missing = torch.isnan(reflection).float().mean()
        self._metrics = {"refgrpo/c": c, "refgrpo/bonus_mean": float(bonus.mean()),
                         "refgrpo/missing_rate": float(missing)}
        if self.o.refgrpo_credit == "split":
            if self.o.refgrpo_reward in RANK_KINDS:
                return rank_credit(batch, bonus, self.o.refgrpo_reward)
            return split_credit(batch, bonus)
        return Shaping(reward_delta=last_step_delta(batch, bonus))

    def bonus(self, batch: StepBatch, correct: Tensor, reflection: Tensor, c: float) -> Tensor:
        """``[R]`` the bonus of ``--refgrpo-reward`` at coefficient ``c``."""
        if self.o.refgrpo_reward == "balanced":
            return balanced_reflection_bonus(correct, reflection, c, row_groups(batch))
        if self.o.refgrpo_reward in RANK_KINDS:
            return c * rank_reward(self.o.refgrpo_reward, correct, reflection, batch)
        return reflection_bonus(correct, reflection, c)

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return {}, {}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        """Stateless: the schedule follows the batch's progress."""
