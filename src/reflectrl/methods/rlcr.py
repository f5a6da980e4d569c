"""rlcr: a calibration reward (arXiv 2507.16806, RLCR).

The agent answers, then states a confidence q in [0, 1]: in a turn the environment asks for
(``--self-report confidence``, the default: any model reflectrl warms up can answer it;
:mod:`reflectrl.tasks.selfreport`) or at the end of the answer itself, ``<confidence>q</confidence>``
(``--self-report inline``, the paper's form: no extra turn; the model must have learnt to write the tag, as
``reflectrl llm warmup --self-report inline`` teaches it). The reward
becomes ``R = 1[correct] - (q - 1[correct])^2``, the accuracy reward plus a Brier score, a proper scoring
rule, so that the best policy is both right and calibrated. A completion without a valid confidence gets
:data:`~reflectrl.methods.rewards.RLCR_FORMAT_PENALTY` (the RLCR release's format rule, on this scale).
Applied as a ``reward_delta`` at the episode's last token (before group normalization). ``--rlcr-credit split``
(not the paper's form) trains the answer's tokens on the accuracy term's group advantage alone and the confidence
turn's tokens on the calibration term's (the Brier term, or the format penalty), as refgrpo's split credit does.
``--rlcr-confidence steps`` (not the paper's form) scores every turn's stated confidence of a multi-turn episode
(rag ``report=steps``: one after each retrieval and before the answer) by the mean of their Brier terms.
``--rlcr-no-answer penalty`` gives an episode that ends without an answer (its turns used up) the format penalty,
as the release's format rule does (its patterns require the answer tag); ``score`` (the default, the behaviour
before the option) scores it as a wrong answer with its stated confidence(s), which under ``steps`` lets a policy
that never answers and states low confidences earn about 0.
``--rlcr-calibration rank`` (reflectrl's, not the paper's; docs/methods-llm.md) puts the group rank reward
(:func:`~reflectrl.methods.rewards.group_rank_reward`) in place of the Brier term on the confidence turn's tokens
(it takes ``--rlcr-credit split``): a confidence earns by ranking its own episode against the group's episodes of
the other outcome, so that a constant confidence earns 0 whatever the accuracy; ``rank-balanced`` weights each
outcome's rows by the inverse of their count in the group and scales the turn's advantage by one std over the batch
(:func:`~reflectrl.core.advantages.batch_scaled_advantages`); ``batch-rank`` is rank-balanced over the whole batch as
one group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from ..contract.base import Shaping, StepBatch
from .refgrpo import Credit, last_step_delta, rank_credit, rank_reward, split_credit
from .rewards import RLCR_FORMAT_PENALTY, brier_term, rlcr_reward


@dataclass
class RLCROptions:
    """Options of rlcr (each a ``reflectrl llm train --algo rlcr`` flag)."""

    rlcr_format_penalty: float = RLCR_FORMAT_PENALTY
    """Reward of a completion without a valid confidence (the RLCR release's rule: below every valid one)."""
    rlcr_confidence: Literal["final", "steps"] = "final"
    """final: the Brier term of the episode's confidence (the asked one, or the answer's inline one: the paper);
    steps: the mean Brier term of every agent turn's stated confidence against the outcome (a multi-turn task whose
    turns each open with one: rag ``report=steps``), the format penalty when a turn states none."""
    rlcr_no_answer: Literal["score", "penalty"] = "score"
    """An episode that ends without an answer (a multi-turn task's turns used up): score: a wrong answer, its stated
    confidence(s) scored as any other; penalty: the format penalty (the release's format rule requires the answer
    tag). Use penalty with --rlcr-confidence steps: under score a policy that never answers and states low
    confidences earns about 0 (BENCHMARKS.md, rag)."""
    rlcr_credit: Credit = "episode"
    """episode: R = 1[correct] - (q - 1[correct])^2 on every token (the paper); split: the answer's tokens take the
    accuracy term's group advantage, the confidence turn's tokens the calibration term's."""
    rlcr_calibration: Literal["brier", "rank", "rank-balanced", "batch-rank"] = "brier"
    """The calibration term: brier: -(q - 1[correct])^2 (the paper); rank: the group rank reward (within each
    group, a right answer's confidence against the wrong answers', a wrong answer's against the right answers':
    1 above, 1/2 tied, minus 1/2; a constant confidence earns 0; docs/methods-llm.md); rank-balanced: the same with
    each outcome's rows weighted by the inverse of their count in the group and the confidence turn's advantage
    scaled by one std over the batch instead of each group's, so that the many failures of a weak start do not
    pull the shared level down; batch-rank: rank-balanced with the whole batch as one group (a confidence is also
    judged against other questions' episodes, so one that tracks how hard its question is earns too). The rank
    forms take --rlcr-credit split."""
    rlcr_report_weight: float = 1.0
    """Under --rlcr-credit split, the confidence turn's advantage is multiplied by this weight (1: as the term gives
    it; below 1 the confidence turn pulls less on the weights it shares with the answer)."""

    def validate_rlcr(self) -> list[tuple[bool, str]]:
        return [(self.rlcr_format_penalty <= 0, "--rlcr-format-penalty must be <= 0"),
                (self.rlcr_confidence != "steps" or self.rlcr_credit == "episode",
                 "--rlcr-confidence steps takes --rlcr-credit episode (the turns' confidences share them with actions)"),
                (self.rlcr_calibration == "brier" or self.rlcr_credit == "split",
                 f"--rlcr-calibration {self.rlcr_calibration} takes --rlcr-credit split (the rank term goes on the "
                 "confidence turn's tokens; the answer's tokens keep the accuracy term's advantage)"),
                (self.rlcr_report_weight >= 0, "--rlcr-report-weight must be >= 0"),
                (self.rlcr_report_weight == 1.0 or self.rlcr_credit == "split",
                 "--rlcr-report-weight takes --rlcr-credit split (it weights the confidence turn's own advantage)")]


class RLCR:
    """The Brier calibration reward on the rollouts' stated confidences (no learned part)."""

    fit_first = True
    reads_states = False  # it shapes from outcomes and self-reports, not hidden states

    def __init__(self, opts: RLCROptions):
        self.o = opts
        self._metrics: dict[str, float] = {}

    def fit(self, batch: StepBatch) -> None:
        """Nothing to learn."""

    def shape(self, batch: StepBatch) -> Shaping:
        correct, outcome = batch.info["correct"], batch.info["outcome"]
        nan = torch.full_like(correct, float("nan"))
        if self.o.rlcr_confidence == "steps":
            err = batch.info.get("step_brier", nan)  # mean (q_t - y)^2 over the turns; NaN where a turn has no q
            valid = ~torch.isnan(err)
            target = torch.where(valid, correct - err, torch.full_like(correct, self.o.rlcr_format_penalty))
            brier = float(err[valid].mean()) if valid.any() else float("nan")
        else:
            q = batch.info.get("confidence", nan)
            target = rlcr_reward(correct, q, self.o.rlcr_format_penalty)
            valid = ~torch.isnan(q)
            brier = float(((q[valid] - correct[valid]) ** 2).mean()) if valid.any() else float("nan")
        missing = float((~valid).float().mean())
        answered = batch.info.get("answered")
        unanswered = answered < 0.5 if self.o.rlcr_no_answer == "penalty" and answered is not None else None
        if unanswered is not None:  # the release's format rule: no answer tag, the format penalty
            target = torch.where(unanswered, torch.full_like(target, self.o.rlcr_format_penalty), target)
            valid = valid & ~unanswered
        self._metrics = {"rlcr/reward_mean": float(target.mean()), "rlcr/missing_rate": missing, "rlcr/brier": brier,
                         **({} if unanswered is None else {"rlcr/unanswered_rate": float(unanswered.float().mean())})}
        if self.o.rlcr_credit == "split":
            kind = self.o.rlcr_calibration
            if kind == "brier":
                term = brier_term(correct, q)
            else:  # rows with the format penalty stay out of the others' pairs
                term = rank_reward(kind, correct, torch.where(valid, q, nan), batch)
                self._metrics["rlcr/rank_mean"] = float(term[valid].mean()) if valid.any() else float("nan")
            calibration = torch.where(valid, term, torch.full_like(q, self.o.rlcr_format_penalty))
            w = self.o.rlcr_report_weight
            if kind == "brier":
                return split_credit(batch, calibration, weight=w)
            return rank_credit(batch, calibration, kind, w)
        return Shaping(reward_delta=last_step_delta(batch, target - outcome))

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return {}, {}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        """Stateless."""
