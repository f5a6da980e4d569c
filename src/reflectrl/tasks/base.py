"""The task protocol shared by every verifiable task and by the LLM front end.

A task yields :class:`Problem` s per split, verifies a completion (``score``), writes a
demonstration for supervised warm-up, and opens a multi-turn environment over a problem:
``env.reset(problem) -> text`` then ``env.step(text) -> (text, reward, done, info)``; the text an
environment returns (execution results, errors) is fed back to the agent but masked out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

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
        self.task, self.problem = task, None

    def reset(self, problem: Problem) -> str:
        self.problem = problem
        return problem.prompt

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        return "", float(self.task.score(self.problem, text)), True, {}


TASKS: dict[str, Callable[..., Task]] = {}
SPLITS = ("train", "heldout")


def register_task(name: str):
    """Decorator: register a task factory under ``name``."""

    def deco(factory):
        TASKS[name] = factory
        return factory

    return deco


def get_task(name: str, **kwargs: Any) -> Task:
    """Instantiate a registered task, or raise ConfigError listing the registered ones."""
    import importlib

    for mod in ("arith", "codegen", "text2sql"):
        try:
            importlib.import_module(f"reflectrl.tasks.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"reflectrl.tasks.{mod}":
                raise
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; available: {', '.join(sorted(TASKS)) or 'none'}")
    return TASKS[name](**kwargs)
