"""verl reward functions on reflectrl's tasks: the task's verifier, refgrpo's reflection bonus, rlcr's Brier reward.

verl calls a reward function once per response as ``compute_score(data_source, solution_str, ground_truth,
extra_info, **kwargs)``; select one with::

    reward.custom_reward_function.path=pkg://reflectrl.integrations.verl_rewards
    reward.custom_reward_function.name=compute_score      # or outcome_score, refgrpo_score, rlcr_score
    +reward.custom_reward_function.reward_kwargs.method=refgrpo   # with compute_score; bonus=0.1, ...

It needs no verl. A row of verl's dataset names its task and carries its problem (:func:`verl_rows` writes them):
``data_source`` ``reflectrl/<task>`` (or ``extra_info["task"]``), ``extra_info["meta"]`` the problem's ``meta``
(a JSON string or a dict), ``extra_info["problem_prompt"]`` the task's prompt text and
``extra_info["task_options"]`` the task's options (JSON or dict). The response is scored by the task's own
``score``; its self-reports are read with :func:`reflectrl.tasks.base.parse_reflection` /
:func:`~reflectrl.tasks.base.parse_confidence`; the formulas are :mod:`reflectrl.methods.rewards`.

Every function returns verl's dict form with the same keys, so one batch may mix methods and tasks:

- ``score``: the reward verl trains on; ``score = base + bonus``, where the base is ``outcome`` (``outcome``,
  ``refgrpo``) or ``acc`` (``rlcr``);
- ``acc``: 1.0 when the outcome is full (a score of 1, as reflectrl counts a correct answer), else 0.0;
- ``outcome``: the task's score in [0, 1] (codegen: the fraction of tests passed);
- ``reflection``: the stated ``<reflect>solved|unsolved</reflect>`` as 1.0 / 0.0, -1.0 when missing or malformed;
- ``confidence``: the stated ``<confidence>q</confidence>``, -1.0 when missing, malformed or outside [0, 1];
- ``bonus``: what the method adds to the base (refgrpo: ``c * 1[reflection == outcome]``; rlcr: the Brier term
  ``-(q - acc)^2``, or ``format_penalty - acc`` without a valid confidence).

Settings come from keyword arguments (verl's ``reward_kwargs``) first, then ``extra_info``, then the defaults:
``method`` (``outcome``), ``bonus`` (refgrpo's c, 0.1), ``bonus_schedule`` (``constant``; ``step`` / ``linear``
need ``progress`` in [0, 1], which verl does not give a reward function: see docs/integrations.md),
``bonus_until`` (2/3), ``format_penalty`` (rlcr, -2), ``task_options``.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ConfigError
from ..methods.rewards import RLCR_FORMAT_PENALTY, bonus_schedule, rlcr_reward
from ..methods.rewards import reflection_bonus as _reflection_bonus
from ..tasks.base import Problem, Task, get_task, parse_confidence, parse_reflection

DATA_SOURCE_PREFIX = "reflectrl/"
METHODS = ("outcome", "refgrpo", "rlcr")
DEFAULT_BONUS = 0.1
MISSING = -1.0
"""The value of ``reflection`` / ``confidence`` in the result when the response states none (or a malformed one)."""
SELF_REPORT_INSTRUCTIONS = {
    "off": "",
    "reflect": "After the answer, add <reflect>solved</reflect> or <reflect>unsolved</reflect>.",
    "confidence": "After the answer, add <confidence>P</confidence>: the probability, from 0 to 1, that it is right.",
}
"""The line :func:`verl_row` appends to the chat prompt to ask for a self-report in the same response."""
_PROMPT_TASKS = frozenset({"codegen", "humaneval"})  # their verifiers assemble the program from the prompt
_TASKS: dict[tuple[str, str], Task] = {}
_LOCK = threading.Lock()


# ------------------------------------------------------------------------------------------------
# Dataset rows.
# ------------------------------------------------------------------------------------------------
def verl_row(task_name: str, problem: Problem, task_options: dict[str, Any] | None = None, split: str = "train",
             index: int = 0, self_report: str = "off") -> dict[str, Any]:
    """One row of a verl RL dataset for ``problem``: ``data_source``, a one-message chat ``prompt`` (the task's
    prompt, plus the request of :data:`SELF_REPORT_INSTRUCTIONS` for ``self_report`` ``reflect`` / ``confidence``),
    ``reward_model.ground_truth`` (the reference answer) and the ``extra_info`` the reward functions read."""
    if self_report not in SELF_REPORT_INSTRUCTIONS:
        raise ConfigError(f"self_report must be one of {', '.join(SELF_REPORT_INSTRUCTIONS)}, got {self_report!r}")
    ask = SELF_REPORT_INSTRUCTIONS[self_report]
    content = problem.prompt + ("" if not ask else ("" if problem.prompt.endswith("\n") else "\n") + ask + "\n")
    try:
        meta = json.dumps(problem.meta, sort_keys=True)
        options = json.dumps(task_options or {}, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"problem {problem.id} of task {task_name!r} does not fit in a verl row: {exc}") from None
    return {
        "data_source": DATA_SOURCE_PREFIX + task_name,
        "prompt": [{"role": "user", "content": content}],
        "ability": task_name,
        "reward_model": {"style": "rule", "ground_truth": problem.answer or ""},
        "extra_info": {"task": task_name, "task_options": options, "split": split, "index": index,
                       "problem_id": problem.id, "problem_prompt": problem.prompt, "meta": meta},
    }


def verl_rows(task_name: str, split: str = "train", task_options: dict[str, Any] | None = None,
              limit: int | None = None, self_report: str = "off") -> list[dict[str, Any]]:
    """Rows (:func:`verl_row`) for the problems of ``split`` of a task, the first ``limit`` of them if given."""
    task = task_instance(task_name, task_options or {})
    problems = task.problems(split)
    if limit is not None:
        problems = problems[: max(0, int(limit))]
    return [verl_row(task_name, p, task_options, split, i, self_report) for i, p in enumerate(problems)]


def problem_from_verl(task_name: str, ground_truth: Any, extra_info: dict[str, Any]) -> Problem:
    """The Problem a verl row describes (see :func:`verl_row`)."""
    meta = _json_field(extra_info.get("meta"), "extra_info['meta']")
    if meta is None:
        if task_name != "arith":
            raise ConfigError(f"the verl row of a {task_name!r} problem has no extra_info['meta']; write the dataset "
                              "with reflectrl.integrations.verl_rewards.verl_rows")
        try:
            meta = {"value": int(str(ground_truth).strip())}
        except ValueError:
            raise ConfigError(f"an arith row needs an integer ground_truth or extra_info['meta'], got "
                              f"{ground_truth!r}") from None
    prompt = extra_info.get("problem_prompt")
    if task_name in _PROMPT_TASKS and not isinstance(prompt, str):
        raise ConfigError(f"the verl row of a {task_name!r} problem has no extra_info['problem_prompt'] (its "
                          "verifier needs the prompt); write the dataset with verl_rows")
    return Problem(id=str(extra_info.get("problem_id", "")), prompt=prompt if isinstance(prompt, str) else "",
                   answer=None if ground_truth is None else str(ground_truth), meta=meta)


# ------------------------------------------------------------------------------------------------
# Reward functions (verl's signature).
# ------------------------------------------------------------------------------------------------
def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, float]:
    """The reward of ``method`` (``outcome``, ``refgrpo`` or ``rlcr``, from the keyword arguments or
    ``extra_info``; default ``outcome``) for one response."""
    method = _setting("method", kwargs, extra_info or {}, "outcome")
    if method not in _SCORERS:
        raise ConfigError(f"unknown reward method {method!r}; choose one of {', '.join(METHODS)}")
    return _SCORERS[method](data_source, solution_str, ground_truth, extra_info, **kwargs)


def outcome_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, float]:
    """The task's own reward (GRPO, Dr.GRPO, DAPO): ``score = outcome``."""
    parts = _parts(data_source, solution_str, ground_truth, extra_info or {}, kwargs)
    return _result(parts["outcome"], parts, 0.0)


def refgrpo_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, float]:
    """refgrpo: ``score = outcome + c * 1[reflection == outcome]``; a missing reflection earns no bonus."""
    info = extra_info or {}
    parts = _parts(data_source, solution_str, ground_truth, info, kwargs)
    c = bonus_coefficient(kwargs, info)
    reflection = math.nan if parts["reflection"] == MISSING else parts["reflection"]
    bonus = float(_reflection_bonus(_one(parts["outcome"]), _one(reflection), c)[0])
    return _result(parts["outcome"] + bonus, parts, bonus)


def rlcr_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
               **kwargs: Any) -> dict[str, float]:
    """rlcr: ``score = acc - (q - acc)^2`` with a valid confidence q, else ``format_penalty`` (default -2)."""
    info = extra_info or {}
    parts = _parts(data_source, solution_str, ground_truth, info, kwargs)
    penalty = _number("format_penalty", _setting("format_penalty", kwargs, info, RLCR_FORMAT_PENALTY))
    confidence = math.nan if parts["confidence"] == MISSING else parts["confidence"]
    score = float(rlcr_reward(_one(parts["acc"]), _one(confidence), penalty)[0])
    return _result(score, parts, score - parts["acc"])


_SCORERS: dict[str, Callable[..., dict[str, float]]] = {"outcome": outcome_score, "refgrpo": refgrpo_score,
                                                        "rlcr": rlcr_score}


def bonus_coefficient(kwargs: dict[str, Any], extra_info: dict[str, Any]) -> float:
    """refgrpo's c from ``bonus``, ``bonus_schedule``, ``progress`` and ``bonus_until`` (see the module docstring)."""
    c = _number("bonus", _setting("bonus", kwargs, extra_info, DEFAULT_BONUS))
    if c < 0:
        raise ConfigError(f"the refgrpo bonus must be >= 0, got {c!r}")
    kind = _setting("bonus_schedule", kwargs, extra_info, "constant")
    if kind == "constant":
        return c
    progress = _setting("progress", kwargs, extra_info, None)
    if progress is None:
        raise ConfigError(f"bonus_schedule={kind!r} needs progress= (0..1): verl does not tell a reward function "
                          "how far training is; use bonus_schedule=constant and change bonus between stages")
    progress = _number("progress", progress)
    if not 0.0 <= progress <= 1.0:
        raise ConfigError(f"progress must be in [0, 1], got {progress!r}")
    until = _number("bonus_until", _setting("bonus_until", kwargs, extra_info, 2.0 / 3.0))
    try:
        return bonus_schedule(c, kind, progress, until)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# ------------------------------------------------------------------------------------------------
# Helpers.
# ------------------------------------------------------------------------------------------------
def task_name_of(data_source: Any, extra_info: dict[str, Any]) -> str:
    """The task a row belongs to: ``extra_info["task"]``, else ``data_source`` without its ``reflectrl/`` prefix."""
    name = extra_info.get("task") or data_source
    if not isinstance(name, str) or not name:
        raise ConfigError("a verl row needs its reflectrl task in extra_info['task'] or data_source "
                          f"('reflectrl/<task>'); got data_source={data_source!r}")
    return name[len(DATA_SOURCE_PREFIX):] if name.startswith(DATA_SOURCE_PREFIX) else name


def _parts(data_source: Any, solution_str: Any, ground_truth: Any, extra_info: dict[str, Any],
           kwargs: dict[str, Any]) -> dict[str, float]:
    name = task_name_of(data_source, extra_info)
    options = _json_field(_setting("task_options", kwargs, extra_info, None), "task_options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f"task_options must be a dict (or its JSON), got {options!r}")
    task = task_instance(name, options)
    problem = problem_from_verl(name, ground_truth, extra_info)
    text = solution_str if isinstance(solution_str, str) else ""
    outcome = float(task.score(problem, text))
    reflection, confidence = parse_reflection(text), parse_confidence(text)
    return {"outcome": outcome, "acc": 1.0 if outcome >= 1.0 else 0.0,
            "reflection": MISSING if reflection is None else float(reflection),
            "confidence": MISSING if confidence is None else float(confidence)}


def _result(score: float, parts: dict[str, float], bonus: float) -> dict[str, float]:
    return {"score": float(score), "acc": parts["acc"], "outcome": parts["outcome"],
            "reflection": parts["reflection"], "confidence": parts["confidence"], "bonus": float(bonus)}


def task_instance(name: str, options: dict[str, Any]) -> Task:
    """One task instance per (name, options), shared by every call (verl scores responses on threads)."""
    key = (name, json.dumps(options, sort_keys=True))
    with _LOCK:
        if key not in _TASKS:
            _TASKS[key] = get_task(name, **options)
        return _TASKS[key]


def _one(value: float) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float64)


def _setting(key: str, kwargs: dict[str, Any], extra_info: dict[str, Any], default: Any) -> Any:
    if kwargs.get(key) is not None:
        return kwargs[key]
    if extra_info.get(key) is not None:
        return extra_info[key]
    return default


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return float(value)


def _json_field(value: Any, what: str) -> Any:
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{what} is not valid JSON: {exc}") from None
    raise ConfigError(f"{what} must be a dict or a JSON string, got {type(value).__name__}")
