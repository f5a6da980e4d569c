"""The task protocol shared by every verifiable task and by the LLM front end.

A task yields :class:`Problem` s per split, verifies a completion (``score``), writes a
demonstration for supervised warm-up, and opens a multi-turn environment over a problem:
``env.reset(problem) -> text`` then ``env.step(text) -> (text, reward, done, info)``; the text an
environment returns (execution results, errors) is fed back to the agent but masked out of the loss.

A single-turn task may also define ``score_batch(problems, completions) -> [(reward, info), ...]``: the
same rewards and infos as one ``SingleTurnEnv.step`` per completion, computed together (the rollout then
scores each generated chunk with one call; the code tasks run it as batched sandbox launches). See
:func:`batch_scorer`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ConfigError


@dataclass
class Problem:
    """One verifiable problem."""

    id: str
    prompt: str
    answer: str | None = None  # a reference answer or solution (warm-up demonstrations, teacher context)
    meta: dict[str, Any] = field(default_factory=dict)  # task-specific: unit tests, database, reference query


class TurnEnv(Protocol):
    """A multi-turn environment over one problem."""

    def reset(self, problem: Problem) -> str: ...

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]: ...


class Task(Protocol):
    """A verifiable task."""

    name: str
    multi_turn: bool

    def problems(self, split: str) -> list[Problem]: ...

    def score(self, problem: Problem, completion: str) -> float: ...

    def demonstration(self, problem: Problem) -> str: ...

    def make_env(self) -> TurnEnv: ...


class SingleTurnEnv:
    """The one-step environment of a single-turn task: the reward is the task's score."""

    def __init__(self, task: Task):
        self.task = task
        self.problem: Problem | None = None

    def reset(self, problem: Problem) -> str:
        self.problem = problem
        return problem.prompt

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.problem is None:
            raise RuntimeError("step() before reset(): the env has no problem")
        reward = float(self.task.score(self.problem, text))
        return "", reward, True, step_info(reward, text)


def step_info(reward: float, text: Any) -> dict[str, Any]:
    """The ``info`` of a single-turn step: the outcome and the completion's self-reports."""
    return {"outcome": float(reward), **self_report(text)}


def batch_scorer(task: Any) -> Callable[[list[Problem], list[str]], list[tuple[float, dict[str, Any]]]] | None:
    """The task's optional ``score_batch(problems, completions) -> [(reward, info), ...]`` (single-turn
    tasks only), or None when it has none."""
    if getattr(task, "multi_turn", False):
        return None
    fn = getattr(task, "score_batch", None)
    return fn if callable(fn) else None


# ---------------------------------------------------------------------------------------------
# Self-reports an agent may append to its answer, shared by every task: a binary reflection
# ``<reflect>solved|unsolved</reflect>`` and a stated confidence ``<confidence>0.8</confidence>``.
# Verifiers ignore them; methods read them from ``info`` (see docs/tasks.md).
# ---------------------------------------------------------------------------------------------
# A closing tag may be missing at the very end of a completion (a generator that stops on it drops it).
_REFLECT = re.compile(r"<reflect>\s*([A-Za-z]{1,16})\s*(?:</reflect>|\Z)", re.IGNORECASE)
_CONFIDENCE = re.compile(r"<confidence>\s*([0-9]{1,3}(?:\.[0-9]{1,12})?)\s*(?:</confidence>|\Z)", re.IGNORECASE)
_AUX = re.compile(r"<(reflect|confidence)>(?:[^<]{0,64}?</\1>|[^<]{0,64}\Z)", re.IGNORECASE)
_SCAN = 1 << 16  # self-report tags are looked for in the last 64 KiB of a completion only


def parse_reflection(text: str) -> int | None:
    """The last ``<reflect>solved|unsolved</reflect>`` of ``text`` as 1 / 0; None if absent or malformed."""
    found = _REFLECT.findall(text[-_SCAN:]) if isinstance(text, str) else []
    word = found[-1].lower() if found else ""
    return {"solved": 1, "unsolved": 0}.get(word)


def parse_confidence(text: str) -> float | None:
    """The last ``<confidence>q</confidence>`` of ``text`` with 0 <= q <= 1; None if absent or out of range."""
    found = _CONFIDENCE.findall(text[-_SCAN:]) if isinstance(text, str) else []
    value = float(found[-1]) if found else None
    return value if value is not None and 0.0 <= value <= 1.0 else None


def strip_self_report(text: str) -> str:
    """``text`` without its reflection / confidence tags (what a verifier should look at)."""
    return _AUX.sub("", text) if isinstance(text, str) else ""


def parse_tagged_turn(text: Any, opening: re.Pattern) -> tuple[str | None, str]:
    """(kind, content) of a multi-turn agent's turn: kind from the first tag ``opening`` matches (its group 1,
    lower-cased; self-report tags removed first), or None. The content runs to that tag's closing tag, or to
    the end of the text when it is missing (a generator that stops on the closing tag may have dropped it)."""
    if not isinstance(text, str):
        return None, ""
    text = strip_self_report(text)
    match = opening.search(text)
    if match is None:
        return None, ""
    kind = match.group(1).lower()
    close = re.compile(f"</{kind}>", re.IGNORECASE).search(text, match.end())
    return kind, text[match.end(): close.start() if close else len(text)].strip()


def self_report(text: str) -> dict[str, Any]:
    """``{"reflection": 1|0, "confidence": q}``, each key only when ``text`` states it."""
    out: dict[str, Any] = {}
    if (reflection := parse_reflection(text)) is not None:
        out["reflection"] = reflection
    if (confidence := parse_confidence(text)) is not None:
        out["confidence"] = confidence
    return out


# ---------------------------------------------------------------------------------------------
# Chat models (reflectrl.llm.chat): a task may say how its problems read as a user's message.
# ---------------------------------------------------------------------------------------------
class Reply(str):
    """An environment's reply whose form in a conversation differs from its raw text: a chat model reads ``chat``
    as the user's turn (default: the text without surrounding whitespace) and its answer turn opens with
    ``prefill`` (context, not trained). A plain ``str`` reply is its own chat form. A ``continuation`` is no turn
    at all: ``prefill`` continues the agent's own message (the inline self-report's opened tag). ``max_tokens``: the
    token budget of the agent's completion that follows (None: the rollout's per-turn budget)."""

    chat: str
    prefill: str
    continuation: bool
    max_tokens: int | None

    def __new__(cls, text: str, chat: str | None = None, prefill: str = "", continuation: bool = False,
                max_tokens: int | None = None) -> Reply:
        obj = super().__new__(cls, text)
        obj.chat = text.strip() if chat is None else chat
        obj.prefill = prefill
        obj.continuation = continuation
        obj.max_tokens = max_tokens
        return obj


def chat_reply(reply: str) -> tuple[str, str]:
    """(user turn text, prefill) of an environment reply for a chat model."""
    if isinstance(reply, Reply):
        return reply.chat, reply.prefill
    return str(reply).strip(), ""


def score_all(task: Any, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
    """The task's scores of many completions at once: its ``score_many`` where it has one (the code tasks run their
    tests in sandbox batches), else ``score`` one by one."""
    many = getattr(task, "score_many", None)
    if callable(many):
        return [float(s) for s in many(problems, completions)]
    return [float(task.score(p, c)) for p, c in zip(problems, completions)]


def chat_prompt(task: Any, problem: Problem) -> str:
    """The first user message of an episode for a chat model: the task's ``chat_prompt(problem)`` (an instruction
    that states the answer format, then the problem), else the raw prompt."""
    own = getattr(task, "chat_prompt", None)
    return own(problem) if callable(own) else problem.prompt.strip()


def stop_sequences(task: Any, chat: bool = False) -> tuple[str, ...]:
    """The text sequences that end an agent turn: with a chat model the task's ``chat_stop_sequences`` where it
    has them (a chat answer may open with a code fence that would hold a raw stop), else its ``stop_sequences``."""
    own = getattr(task, "chat_stop_sequences", None) if chat else None
    return tuple(own if own is not None else (getattr(task, "stop_sequences", ()) or ()))


def teacher_prompt(task: Task, problem: Problem, chat: bool = False) -> str:
    """The prompt with the reference answer in context (a self-teacher's view); a task may define its own. With
    ``chat``: the reference before the task's chat prompt, as the user's message."""
    if chat:
        return f"Reference answer:\n{problem.answer}\n\n{chat_prompt(task, problem)}" if problem.answer \
            else chat_prompt(task, problem)
    return _raw_teacher_prompt(task, problem)


def _raw_teacher_prompt(task: Task, problem: Problem) -> str:
    """The prompt with the reference answer in context (a self-teacher's view); a task may define its own."""
    own = getattr(task, "teacher_prompt", None)
    if callable(own):
        return own(problem)
    return f"Reference answer:\n{problem.answer}\n\n{problem.prompt}" if problem.answer else problem.prompt


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text`` that is the same in every process and run (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def in_heldout(key: str, fraction: float, salt: str = "") -> bool:
    """Deterministic split membership: True for about ``fraction`` of all keys, fixed per (salt, key)."""
    return stable_hash(f"{salt}\x00{key}") % 1_000_000 < round(fraction * 1_000_000)


TASKS: dict[str, Callable[..., Task]] = {}
SPLITS = ("train", "validation", "heldout")
"""Every task's splits, disjoint: ``train`` to learn on, ``validation`` to choose on (recipes, defaults,
coefficients, when to stop), ``heldout`` for final numbers only. Adding the validation split changed no task's
train or heldout problems (docs/tasks.md, "Splits")."""


def check_split(split: str) -> str:
    """``split`` if it is one of SPLITS, else a ConfigError naming them."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return split


def carve_validation(problems: list[Problem], fraction: float, salt: str) -> tuple[list[Problem], list[Problem]]:
    """(train, validation): about ``fraction`` of ``problems`` (by a stable hash of each id, fixed per ``salt``)
    moved to validation, in their order; ``fraction`` 0 leaves every problem in train."""
    if fraction <= 0:
        return problems, []
    held = [in_heldout(p.id, fraction, f"{salt}/validation") for p in problems]
    return [p for p, h in zip(problems, held) if not h], [p for p, h in zip(problems, held) if h]


def check_fraction(task: str, name: str, value: Any, high: float = 1.0) -> float:
    """``value`` as a float in [0, high), or a ConfigError naming ``task``'s option ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < high:
        raise ConfigError(f"{task} {name} must be a number in [0, {high:g}), got {value!r}")
    return float(value)


VALIDATION_HINT = ("set the task option validation_fraction=F (for example --task-option validation_fraction=0.2) to "
                   "move that share of the train problems to validation; the default keeps every {task} train problem")


class EmptySplitError(ConfigError):
    """A split asked for holds no problems (a user's file without heldout rows, say); :func:`split_problems` reads
    it as an empty split."""


def split_problems(task: Task, split: str) -> list[Problem]:
    """``task.problems(split)``, or [] for a split the task says is empty (:class:`EmptySplitError`) and for a
    validation split the task does not have (see :func:`nonempty_split`; a task written before the split existed
    may raise KeyError or ValueError for it)."""
    try:
        return task.problems(split)
    except EmptySplitError:
        return []
    except (ConfigError, KeyError, ValueError):
        if split != "validation":
            raise
        return []


def nonempty_split(task: str, split: str, problems: list[Problem], hint: str) -> list[Problem]:
    """``problems``, or a ConfigError when a split asked for has none (``hint``: how to get some)."""
    if not problems and split == "validation":
        raise ConfigError(f"task {task} has no validation problems: {hint}")
    return problems


def register_task(name: str):
    """Decorator: register a task factory under ``name``."""

    def deco(factory):
        TASKS[name] = factory
        return factory

    return deco


BUILTIN_TASKS = ("arith", "codegen", "humaneval", "text2sql", "rag", "data", "rgym")
"""The modules of the built-in tasks (``rgym``: the task ``reasoning-gym``)."""
_UNAVAILABLE: dict[str, str] = {}  # built-in task -> why its module could not be imported


def load_tasks() -> dict[str, Callable[..., Task]]:
    """Import the built-in task modules (each registers itself) and return the registry. A module that
    fails to import (a missing optional dependency) is remembered with its error, which
    :func:`get_task` reports when that task is asked for."""
    import importlib

    for mod in BUILTIN_TASKS:
        if mod in TASKS or mod in _UNAVAILABLE:
            continue
        try:
            importlib.import_module(f"reflectrl.tasks.{mod}")
        except ImportError as exc:
            _UNAVAILABLE[mod] = f"{type(exc).__name__}: {exc}"
    return TASKS


def parse_options(items: Sequence[str], flag: str = "--set") -> dict[str, Any]:
    """``KEY=VALUE`` strings (the values of option ``flag``) as keyword arguments; VALUE is read as JSON when it parses
    (``True`` and ``False``, in any case, as the booleans), else as text."""
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} expects KEY=VALUE, got {item!r}")
        if raw.strip().lower() in ("true", "false"):  # instructions=False must not read as the text "False"
            out[key.strip()] = raw.strip().lower() == "true"
            continue
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def absolute_option_paths(items: Sequence[str]) -> tuple[str, ...]:
    """``KEY=VALUE`` task options with each VALUE that names an existing file or folder by a relative path made
    absolute (``corpus=data/kb.jsonl``), so that a run records options that hold from any folder."""
    from pathlib import Path

    out = []
    for item in items:
        key, sep, raw = str(item).partition("=")
        p = Path(raw).expanduser()
        if sep and raw and not p.is_absolute() and ("/" in raw or "." in raw) and p.exists():
            item = f"{key}={p.resolve()}"
        out.append(item)
    return tuple(out)


def get_task(name: str, **kwargs: Any) -> Task:
    """Instantiate a registered task with options ``kwargs``, or raise ConfigError: an unknown task
    (listing the registered ones), one whose module failed to import (saying why), or an option the
    task does not have (naming the ones it has)."""
    import inspect

    load_tasks()
    if name not in TASKS and ":" in name:
        register_user_task(name)
    if name not in TASKS:
        if name in _UNAVAILABLE:
            raise ConfigError(f"task {name!r} is unavailable: {_UNAVAILABLE[name]} "
                              "(install the extra it needs: pip install 'reflectrl[llm]')")
        raise ConfigError(f"unknown task {name!r}; available: {', '.join(sorted(TASKS)) or 'none'}, or "
                          "MODULE:CLASS (a task class of your own)")
    factory = TASKS[name]
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    if params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ConfigError(f"task {name!r} has no option {', '.join(unknown)}; options: {', '.join(params)}")
    try:
        task = factory(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"bad options for task {name!r}: {exc}") from None
    return _complete(name, task) if ":" in name else task


TASK_METHODS = ("problems", "score", "demonstration")
"""What a task class of a user's own (``--task MODULE:CLASS``) must have; see :func:`register_user_task`."""


def import_object(spec: str, what: str) -> Any:
    """The object ``MODULE:NAME`` names (the current folder is importable, as with ``python -m``), or a ConfigError
    saying why not (``what``: what it is for, as the message names it)."""
    import importlib
    import os
    import sys

    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{what} {spec!r} must be MODULE:NAME")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module)
    except Exception as exc:  # an import error, or the user's module failing at import time
        raise ConfigError(f"{what} {spec!r}: cannot import {module!r}: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec!r}: module {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def register_user_task(spec: str) -> None:
    """Import the task class ``MODULE:CLASS`` (the current folder is importable) and register it under that name, or
    raise a ConfigError saying why it cannot be."""
    obj = import_object(spec, "task")
    lacking = [m for m in TASK_METHODS if not callable(getattr(obj, m, None))]
    if not callable(obj) or lacking:
        raise ConfigError(f"task {spec!r} is not a task class: it lacks {', '.join(lacking) or 'a constructor'} "
                          "(docs/tasks.md, \"A task class of your own\")")
    TASKS[spec] = obj


def _complete(spec: str, task: Any) -> Task:
    """A user's task with what it may leave out filled in: ``name`` (its ``MODULE:CLASS``), ``multi_turn`` (False) and,
    for a single-turn task, ``make_env`` (a one-step environment whose reward is ``score``)."""
    if not isinstance(getattr(task, "name", None), str):
        task.name = spec
    if not hasattr(task, "multi_turn"):
        task.multi_turn = False
    if not callable(getattr(task, "make_env", None)):
        if task.multi_turn:
            raise ConfigError(f"task {spec!r} is multi-turn but has no make_env()")
        task.make_env = lambda: SingleTurnEnv(task)
    return task
