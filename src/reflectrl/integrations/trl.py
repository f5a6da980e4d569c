"""reflectrl's self-assessment inside TRL's ``GRPOTrainer``, with no change to TRL: reward functions, a task's
problems as a dataset, and a callback that logs the calibration of the self-reports the rewards read.

.. code-block:: python

    from trl import GRPOConfig, GRPOTrainer
    from reflectrl.integrations.trl import CalibrationCallback, RewardLog, rlcr_reward, task_dataset

    log = RewardLog()
    trainer = GRPOTrainer(model=MODEL, reward_funcs=[rlcr_reward("arith", log=log)],
                          train_dataset=task_dataset("arith", self_report="confidence"),
                          args=GRPOConfig(...), callbacks=[CalibrationCallback(log)])

Each reward function has TRL's signature (``prompts, completions, **columns -> list[float]``) and reads the dataset's
``problem_id`` column to find the problem. The answer is scored by the task's own verifier (code tasks in
reflectrl's sandbox, never in the trainer's process). On any dataset of your own with an answer column, name a checker
of the ``data`` task instead of a task (:mod:`reflectrl.tasks.checkers`: ``exact``, ``number``, ``math``, ``choice``,
``regex`` or ``MODULE:FUNCTION``): ``rlcr_reward(checker="number", answer_column="answer")`` reads each completion's
reference from that column (a ``choices`` or ``options`` column gives the choice checker the options' texts), and
``checker_options`` holds its ``extract``, ``ignore_case`` and ``tolerance``. A self-report is the answer's own
``<reflect>`` or ``<confidence>`` tag (the dataset's prompts ask for one). The formulas are
:mod:`reflectrl.methods.rewards`, the same as reflectrl's own trainer and its verl rewards use:

- :func:`outcome_reward`: the task's score (what GRPO trains on);
- :func:`rlcr_reward`: ``acc - (q - acc)^2`` with a stated confidence q, ``format_penalty`` (-2) without one (RLCR,
  Damani et al. 2025, arXiv 2507.16806);
- :func:`brier_reward`: the Brier term alone, ``-(q - acc)^2`` (0 without a confidence), beside an outcome reward;
- :func:`reflection_reward`: refgrpo's agreement bonus ``c * 1[reflection == outcome]`` (c = 0.1), inline;
- :func:`format_reward`: 1 when the requested self-report parses, else 0.

A :class:`RewardLog` given to one of them records every completion's outcome and self-reports; the
:class:`CalibrationCallback` turns the records of each logging window into ``calibration/*`` metrics
(:func:`reflectrl.eval.calibration.self_report_metrics`) and a collapse alarm. :func:`write_records` writes records
as strict JSON lines (a report not stated is ``null``), the rows ``reflectrl calibration`` reads.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..methods.rewards import RLCR_FORMAT_PENALTY, brier_term
from ..methods.rewards import reflection_bonus as _reflection_bonus
from ..methods.rewards import rlcr_reward as _rlcr_reward
from ..runlog import strict
from ..tasks.base import SPLITS, Problem, chat_prompt, parse_confidence, parse_reflection, score_all, split_problems
from ..tasks.checkers import Checker
from ..tasks.selfreport import INLINE_ASKS, INLINE_FORMS, parse_inline
from .verl_rewards import task_instance as _task

SELF_REPORTS = ("off", "reflect", "confidence", "inline", "inline-reflect")
ASK = {"off": "",
       "reflect": "After the answer, write <reflect>solved</reflect> if you are sure it is right, else "
                  "<reflect>unsolved</reflect>.",
       "confidence": "After the answer, on the same line, write <confidence>P</confidence>, where P is the "
                     "probability from 0 to 1 that your answer is right."}
"""What a dataset's prompt adds to ask for a self-report inside the answer (the answer's own tag is the report).
``inline`` and ``inline-reflect`` ask as reflectrl's trainer asks a chat model (:data:`INLINE_ASKS`), whose tag
:func:`reflectrl.integrations.trl_inline.inline_rollout` opens after the answer."""


# ------------------------------------------------------------------------------------------------ data
def task_dataset(task: str, split: str = "train", self_report: str = "off", task_options: dict[str, Any] | None = None,
                 limit: int | None = None, chat: bool = True) -> Any:
    """A task's problems as a ``datasets.Dataset`` for TRL: ``prompt`` (with ``chat`` a one-message conversation
    holding the task's chat prompt, which TRL renders with the model's chat template; else the raw prompt text),
    ``problem_id`` (what the reward functions read) and ``task``. ``self_report`` asks for a reflection or a
    confidence at the end of the answer (:data:`ASK`, with ``chat``; a raw-prompt model learns where the tag goes
    in its warm-up, ``reflectrl llm warmup --self-report inline``)."""
    from datasets import Dataset

    if self_report not in SELF_REPORTS:
        raise ConfigError(f"self_report must be one of {', '.join(SELF_REPORTS)}, got {self_report!r}")
    t = _task(task, task_options or {})
    problems = t.problems(split)[:limit] if limit is not None else t.problems(split)
    inline = INLINE_FORMS.get(self_report)
    ask = ASK.get(self_report, "")
    rows = []
    for p in problems:
        if chat and inline:
            text = f"{chat_prompt(t, p)} {INLINE_ASKS[inline]}"
            prompt: Any = [{"role": "user", "content": text}]
        elif chat:
            text = chat_prompt(t, p) + (f"\n\n{ask}" if ask else "")
            prompt = [{"role": "user", "content": text}]
        else:  # a raw-prompt model learns the tag's place in its warm-up (reflectrl llm warmup --self-report inline)
            prompt = p.prompt
        rows.append({"prompt": prompt, "problem_id": p.id, "task": task, "answer": p.answer or ""})
    return Dataset.from_list(rows)


# ------------------------------------------------------------------------------------------------ records
class RewardLog:
    """The outcome and self-reports of every completion a reward function scored (thread-safe); the
    :class:`CalibrationCallback` reads and clears it at each logging step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []

    def add(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self.records.extend(rows)

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self.records = self.records, []
        return out


class _TaskReward:
    """A TRL reward function over one reflectrl task, or over any dataset with an answer column and a ``checker`` (see
    the module docstring); subclasses give ``value``."""

    name = "reflectrl_reward"

    def __init__(self, task: str | None = None, task_options: dict[str, Any] | None = None,
                 log: RewardLog | None = None, *, checker: str | Checker | None = None, answer_column: str = "answer",
                 checker_options: dict[str, Any] | None = None):
        if (task is None) == (checker is None):
            raise ConfigError("a reflectrl reward needs a task (its problems, keyed by problem_id) or a checker (e.g. "
                              "checker='number': any dataset with an answer column), not both")
        self.log = log
        self.checker = checker if isinstance(checker, Checker) else \
            Checker(checker, **(checker_options or {})) if checker is not None else None
        self.answer_column = answer_column
        self.task: Any = _task(task, task_options or {}) if task is not None else None
        self._problems: dict[str, Problem] = {p.id: p for s in SPLITS for p in split_problems(self.task, s)} \
            if self.task is not None else {}
        self.__name__ = self.name  # TRL names each reward's metrics after it

    def _problem(self, pid: Any) -> Problem:
        try:
            return self._problems[str(pid)]
        except KeyError:
            raise ConfigError(f"problem id {pid!r} is not a problem of task {self.task.name!r}: build the dataset "
                              "with reflectrl.integrations.trl.task_dataset") from None

    def parts(self, completions: Sequence[Any], problem_id: Sequence[Any], prompts: Sequence[Any] | None = None,
              completion_ids: Sequence[Sequence[int]] | None = None, inline: dict[str, Any] | None = None,
              references: Sequence[Any] | None = None, metas: Sequence[dict[str, Any]] | None = None
              ) -> list[dict[str, Any]]:
        """Per completion: ``outcome`` (the task's score), ``acc`` (1 for a full score), ``reflection`` and
        ``confidence`` (NaN where not stated); recorded in the log when there is one, with the prompt as the trainer
        gave it and the completion's token ids as sampled (where TRL passes them). ``inline``: the columns of
        :func:`~reflectrl.integrations.trl_inline.inline_rollout` (the answer's text, scored alone, and the report's).
        ``references`` (with a checker): each completion's reference answer; ``metas``: its row's other columns."""
        texts = [completion_text(c) for c in completions]
        answers = list(inline["inline_answer"]) if inline else texts
        if references is not None and self.checker is not None:
            ids = [None if i >= len(problem_id) else problem_id[i] for i in range(len(texts))]
            scores = [self.checker.score(a, str(ref), m) for a, ref, m in zip(answers, references, metas or
                                                                               [{}] * len(texts))]
        else:
            problems = [self._problem(pid) for pid in problem_id]
            ids, scores = [p.id for p in problems], score_all(self.task, problems, answers)
        rows: list[dict[str, Any]] = []
        for i, (pid, t, s) in enumerate(zip(ids, texts, scores)):
            r, q = _reports(t, inline, i)
            rows.append({"problem_id": pid, "completion": t, "outcome": float(s), "acc": 1.0 if float(s) >= 1.0 else 0.0,
                         "reflection": math.nan if r is None else float(r),
                         "confidence": math.nan if q is None else float(q)})
            if references is not None:
                rows[-1]["answer"] = str(references[i])
            if prompts is not None and i < len(prompts):
                rows[-1]["prompt"] = prompts[i]
            if completion_ids is not None and i < len(completion_ids):
                rows[-1]["completion_ids"] = [int(x) for x in completion_ids[i]]
        if self.log is not None:
            self.log.add(rows)
        return rows

    def value(self, rows: list[dict[str, Any]]) -> list[float]:
        raise NotImplementedError

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), problem_id: Sequence[Any] = (),
                 **kwargs: Any) -> list[float]:
        inline = {k: kwargs[k] for k in ("inline_answer", "inline_report", "inline_kind")} \
            if "inline_report" in kwargs else None
        if self.checker is not None:
            references = kwargs.get(self.answer_column)
            if references is None or len(references) != len(completions):
                raise ConfigError(f"a reflectrl reward with a checker needs the dataset's {self.answer_column!r} column "
                                  f"(answer_column=...); the columns given: {', '.join(sorted(kwargs)) or 'none'}")
            metas = [{"choices": _listed(kwargs[c][i])} for i in range(len(completions))] \
                if (c := next((k for k in ("choices", "options") if k in kwargs), None)) else None
            return self.value(self.parts(completions, problem_id or (), prompts, kwargs.get("completion_ids"), inline,
                                         references, metas))
        if len(problem_id) != len(completions):
            raise ConfigError("a reflectrl reward needs the dataset's problem_id column (task_dataset writes it), or a "
                              "checker and an answer column (checker='number', answer_column='answer')")
        return self.value(self.parts(completions, problem_id, prompts, kwargs.get("completion_ids"), inline))


def _listed(value: Any) -> list[str] | None:
    """A row's choices as a list of texts (a list, or its JSON), or None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else None


def _reports(text: str, inline: dict[str, Any] | None, i: int) -> tuple[float | None, float | None]:
    """(reflection, confidence) of completion ``i``: the answer's own tags, or the inline report completed after the
    tag the rollout opened."""
    if inline is None:
        return parse_reflection(text), parse_confidence(text)
    kind = inline["inline_kind"][i]
    value = parse_inline(kind, inline["inline_report"][i])
    return (value, None) if kind == "reflect" else (None, value)


def _vec(rows: list[dict[str, Any]], key: str) -> torch.Tensor:
    return torch.tensor([r[key] for r in rows], dtype=torch.float64)


class outcome_reward(_TaskReward):  # noqa: N801 - a function to its users
    """The task's own score."""

    name = "reflectrl_outcome"

    def value(self, rows: list[dict[str, Any]]) -> list[float]:
        return [r["outcome"] for r in rows]


class rlcr_reward(_TaskReward):  # noqa: N801
    """RLCR: ``acc - (q - acc)^2`` with a stated confidence, ``format_penalty`` without one."""

    name = "reflectrl_rlcr"

    def __init__(self, task: str | None = None, task_options: dict[str, Any] | None = None,
                 log: RewardLog | None = None, format_penalty: float = RLCR_FORMAT_PENALTY, **checker: Any):
        super().__init__(task, task_options, log, **checker)
        self.format_penalty = float(format_penalty)

    def value(self, rows: list[dict[str, Any]]) -> list[float]:
        return _rlcr_reward(_vec(rows, "acc"), _vec(rows, "confidence"), self.format_penalty).tolist()


class brier_reward(_TaskReward):  # noqa: N801
    """The Brier term alone, ``-(q - acc)^2`` (0 without a stated confidence), beside an outcome reward."""

    name = "reflectrl_brier"

    def value(self, rows: list[dict[str, Any]]) -> list[float]:
        return brier_term(_vec(rows, "acc"), _vec(rows, "confidence")).tolist()


class reflection_reward(_TaskReward):  # noqa: N801
    """refgrpo's agreement bonus, inline: ``c * 1[reflection == outcome]``; a missing reflection earns nothing."""

    name = "reflectrl_reflection"

    def __init__(self, task: str | None = None, task_options: dict[str, Any] | None = None,
                 log: RewardLog | None = None, c: float = 0.1, **checker: Any):
        super().__init__(task, task_options, log, **checker)
        if not c >= 0:
            raise ConfigError(f"the reflection bonus c must be >= 0, got {c!r}")
        self.c = float(c)

    def value(self, rows: list[dict[str, Any]]) -> list[float]:
        return _reflection_bonus(_vec(rows, "acc"), _vec(rows, "reflection"), self.c).tolist()


class format_reward(_TaskReward):  # noqa: N801
    """1 when the requested self-report (``reflect`` or ``confidence``) parses from the answer, else 0."""

    name = "reflectrl_format"

    def __init__(self, task: str | None = None, kind: str = "confidence", task_options: dict[str, Any] | None = None,
                 log: RewardLog | None = None, **checker: Any):
        super().__init__(task, task_options, log, **checker)
        if kind not in ("reflect", "confidence"):
            raise ConfigError(f"format_reward's kind must be reflect or confidence, got {kind!r}")
        self.key = "reflection" if kind == "reflect" else "confidence"

    def value(self, rows: list[dict[str, Any]]) -> list[float]:
        return [0.0 if math.isnan(r[self.key]) else 1.0 for r in rows]


# ------------------------------------------------------------------------------------------------ callback
def calibration_of(records: list[dict[str, Any]]) -> dict[str, float]:
    """``calibration/*`` metrics of recorded completions: :func:`~reflectrl.eval.calibration.self_report_metrics`
    of their outcomes and whichever self-reports they stated, the missing rates, and ``collapse`` (1 when at least
    8 reports were stated, right and wrong answers both occur, and every stated report is the same: a reporter
    that no longer tells them apart)."""
    from ..eval.calibration import self_report_metrics

    if not records:
        return {}
    y = np.array([r["acc"] for r in records], float)
    refl = np.array([r["reflection"] for r in records], float)
    conf = np.array([r["confidence"] for r in records], float)
    m = self_report_metrics(y, refl if (~np.isnan(refl)).any() else None, conf if (~np.isnan(conf)).any() else None)
    m["reflection_missing_rate"] = float(np.isnan(refl).mean())
    m["confidence_missing_rate"] = float(np.isnan(conf).mean())
    collapse = 0.0
    for v in (refl, conf):
        stated = v[~np.isnan(v)]
        if stated.size >= 8 and 0 < y.mean() < 1 and float(np.ptp(stated)) == 0.0:
            collapse = 1.0
    m["collapse"] = collapse
    m["completions"] = float(len(records))
    return {f"calibration/{k}": float(v) for k, v in m.items() if v is not None and math.isfinite(float(v))}


def _trainer_callback_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - transformers is in the llm extra
        raise ConfigError("the calibration callback needs transformers: pip install 'reflectrl[llm]'") from None
    return TrainerCallback


class CalibrationCallback(_trainer_callback_base()):  # type: ignore[misc]
    """At each logging step: the calibration (:func:`calibration_of`) of the completions the :class:`RewardLog`
    recorded since the last one, added to the step's logs (and to ``trainer.state.log_history``) and kept in
    ``history``; a warning when the collapse alarm rings. Reporters that run after it (callbacks given with
    ``callbacks=``, W&B or TensorBoard when added after it) see the metrics too; ``jsonl`` also appends each step's
    metrics to a file; ``keep`` keeps every record (its completion, outcome and reports) in ``kept``."""

    def __init__(self, log: RewardLog, jsonl: str | None = None, warn: Callable[[str], None] | None = None,
                 keep: bool = False):
        self.log, self.jsonl, self.history, self.keep = log, jsonl, [], keep
        self._warn = warn
        self.kept: list[dict[str, Any]] = []  # with ``keep``: every record, with the step it was logged at

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        records = self.log.take()
        metrics = calibration_of(records)
        if not metrics:
            return
        step = int(getattr(state, "global_step", 0))
        if self.keep:
            self.kept += [{"step": step, **r} for r in records]
        if logs is not None:
            logs.update(metrics)
        if getattr(state, "log_history", None):
            state.log_history[-1].update(metrics)
        self.history.append({"step": step, **metrics})
        if self.jsonl:
            with open(self.jsonl, "a") as fh:
                fh.write(json.dumps({"step": step, **metrics}) + "\n")  # finite: calibration_of drops NaN
        if metrics.get("calibration/collapse"):
            import warnings

            message = (f"step {step}: every stated self-report is the same while answers are right and wrong: the "
                       "reports no longer discriminate (calibration/collapse)")
            (self._warn or (lambda m: warnings.warn(m, stacklevel=2)))(message)


def write_records(path: str | Path, records: Sequence[dict[str, Any]]) -> Path:
    """Write records (a :class:`RewardLog`'s, or a :class:`CalibrationCallback`'s ``kept``) to ``path``, one strict
    JSON object per line: a report not stated (NaN in memory) is ``null``, which ``reflectrl calibration`` reads as
    missing."""
    out = Path(path)
    with open(out, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(strict(r), allow_nan=False) + "\n" for r in records)
    return out


# ------------------------------------------------------------------------------------------------ helpers
def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversation whose last message's content it is."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        return content if isinstance(content, str) else ""
    return ""


