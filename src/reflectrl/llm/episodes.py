"""What the GRPO trainer reads off a rollout batch, row by row: each episode's outcome and self-reports
(:func:`episode_info`), the per-token and per-row inputs a method reads (:func:`per_step_extras`,
:func:`row_extras`), the self-report and tool metrics of a batch, and which groups carry no signal."""

from __future__ import annotations

import torch

from ..contract.base import as_nan
from ..contract.fields import read_by
from ..tasks.selfreport import turn_confidences
from .batch import TokenBatch


def tool_calls(batch: TokenBatch, kinds: tuple[str, ...]) -> float:
    """Mean number of tool turns per episode: turns whose env info's ``kind`` is one of the task's ``tool_kinds``
    (text2sql's queries run, rag's searches made)."""
    if not batch.infos or not kinds:
        return 0.0
    return sum(sum(1 for i in rows if i.get("kind") in kinds) for rows in batch.infos) / max(len(batch.infos), 1)


def per_step_extras(batch: TokenBatch) -> dict[str, torch.Tensor]:
    """The per-token tensors a method may read (see :attr:`reflectrl.contract.base.StepBatch.per_step`)."""
    out = {}
    if batch.old_logp is not None:
        out["logp"] = batch.old_logp
    if batch.entropy is not None:
        out["entropy"] = batch.entropy
    out.update(read_by(batch.extras, "method", "token"))
    return out


def row_extras(batch: TokenBatch) -> dict[str, torch.Tensor]:
    """The per-row ``[R]`` tensors of the fields a hook registered for methods (a grader's scores), by key."""
    return read_by(batch.extras, "method", "row")


def episode_info(batch: TokenBatch) -> dict[str, torch.Tensor]:
    """Per-row ``outcome``, ``correct`` and, where any row has one, ``reflection`` / ``confidence`` (NaN
    where missing) and ``report_asked`` (1 where the episode ended with a self-report turn), from each row's
    last environment info; ``answered`` (1 where some turn's info says the episode answered) on tasks whose infos
    say it (rag, text2sql), and ``step_brier`` where turns state confidences."""
    last = [(rows[-1] if rows else {}) for rows in (batch.infos or [[] for _ in range(batch.rows)])]
    out = {"outcome": torch.tensor([float(i.get("outcome", s)) for i, s in zip(last, batch.scores.tolist())]),
           "correct": batch.correct.float()}
    for key, kind in (("reflection", "reflect"), ("confidence", "confidence")):
        if any(key in i or i.get("self_report") == kind for i in last):
            out[key] = as_nan([i.get(key) for i in last])
    if any("self_report" in i for i in last):
        out["report_asked"] = torch.tensor([1.0 if "self_report" in i else 0.0 for i in last])
    if any("answered" in i for rows in batch.infos or [] for i in rows):
        out["answered"] = torch.tensor([1.0 if any(i.get("answered") is True for i in rows) else 0.0
                                        for rows in batch.infos])
    stated = [turn_confidences(rows) for rows in batch.infos or []]
    if any(q is not None for qs in stated for q in qs):
        out["step_brier"] = step_brier(stated, out["correct"])
    return out


def step_brier(stated: list[list[float | None]], correct: torch.Tensor) -> torch.Tensor:
    """``[R]``: per row, the mean over its agent turns of ``(q_t - y)^2``, each turn's stated confidence
    (:func:`~reflectrl.tasks.selfreport.turn_confidences`) against the episode's outcome y; NaN for a row with a turn
    that states none."""
    ok = lambda qs: bool(qs) and None not in qs  # noqa: E731
    return torch.tensor([sum((q - y) ** 2 for q in qs) / len(qs) if ok(qs) else float("nan")
                         for qs, y in zip(stated, correct.tolist())])


def calibration_metrics(batch: TokenBatch, info: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """The self-report metrics of a rollout batch (``calibration/...``): of the reports asked after the episode,
    and ``calibration/step_ece`` of the confidences stated along it (every turn's, against the episode's
    outcome); with a task that says how many searches a question needs, ``rollout/premature_rate`` (answered
    wrong after fewer searches than needed). Empty without any."""
    from ..eval.calibration import ece, self_report_metrics

    info = episode_info(batch) if info is None else info
    out: dict[str, float] = {}
    if "reflection" in info or "confidence" in info:
        m = self_report_metrics(info["correct"], info.get("reflection"), info.get("confidence"))
        out.update({f"calibration/{k}": v for k, v in m.items() if k != "accuracy"})
    rows = batch.infos or []
    steps = [(q, float(c)) for r, c in zip(rows, batch.correct.tolist()) for q in turn_confidences(r) if q is not None]
    if steps:
        out["calibration/step_ece"] = ece([q for q, _ in steps], [y for _, y in steps])
        out["calibration/step_reports"] = len(steps) / max(len(rows), 1)
    finals = [r[-1] for r in rows if r and "premature" in r[-1]]
    if finals:
        out["rollout/premature_rate"] = sum(bool(f["premature"]) for f in finals) / len(finals)
    return out


def _zero_std_rows(batch: TokenBatch, values: torch.Tensor | None = None) -> torch.Tensor:
    """``[R]`` true for rows whose group's ``values`` (default: the task scores) are all equal."""
    values = batch.scores if values is None else values
    _, inv = torch.unique(batch.index, return_inverse=True)
    n = int(inv.max()) + 1
    lo = torch.full((n,), float("inf")).scatter_reduce(0, inv, values, "amin")
    hi = torch.full((n,), float("-inf")).scatter_reduce(0, inv, values, "amax")
    return (hi - lo)[inv] <= 1e-12


def trained_reward(batch: TokenBatch) -> torch.Tensor:
    """``[R]`` each row's reward as trained on: its token rewards summed, after the methods changed them (rlcr's
    Brier term, refgrpo's agreement bonus, ...); the task score when nothing changed them."""
    return (batch.token_rewards * batch.completion_mask).sum(1).to(batch.scores.dtype)


def _no_signal_rows(batch: TokenBatch) -> torch.Tensor:
    """``[R]`` true for rows of groups whose trained rewards (:func:`trained_reward`) are all equal: the group
    advantage, computed from them, is 0."""
    return _zero_std_rows(batch, trained_reward(batch))


def reward_metrics(batch: TokenBatch, trained: bool = False, tool_kinds: tuple[str, ...] = (),
                   info: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """Reward mean/std, accuracy, groups without signal (their trained rewards all equal), completion lengths
    and, when the rollouts carry self-reports, their calibration (``calibration/*``) of a rollout batch. With
    ``trained`` (methods changed the rewards), also the mean and std of the reward trained on; ``tool_kinds``: the
    task's (:func:`tool_calls`); ``info``: the batch's :func:`episode_info`, when the caller has it."""
    lens = batch.completion_lengths.float()
    _, inv = torch.unique(batch.index, return_inverse=True)
    n_groups = int(inv.max()) + 1
    zero = _no_signal_rows(batch)
    zero_groups = torch.zeros(n_groups, dtype=torch.bool).index_fill_(0, inv[zero], True)
    shaped = trained_reward(batch)
    both = {"reward/trained_mean": float(shaped.mean()), "reward/trained_std": float(shaped.std())} if trained else {}
    return {"reward/mean": float(batch.scores.mean()), "reward/std": float(batch.scores.std()), **both,
            "accuracy": float(batch.correct.float().mean()),
            "groups/zero_std_frac": float(zero_groups.float().mean()),
            "completion/mean_length": float(lens.mean()), "completion/max_length": float(lens.max()),
            "completion/truncated_frac": float(batch.truncated.float().mean()),
            "rollout/turns": float((batch.turn_ids.max(1).values + 1).float().mean()),
            "rollout/tool_calls": tool_calls(batch, tool_kinds),
            **calibration_metrics(batch, info)}
