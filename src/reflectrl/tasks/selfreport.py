"""Asking an agent how it did: a turn after the episode in which it states a reflection or a confidence.

:func:`with_self_report` wraps any task (single- or multi-turn) so that, when its episode ends (a final
answer given, or its turns used up), the environment asks one more question: ``reflect`` asks whether the
answer solved the problem (``solved`` / ``unsolved``), ``confidence`` asks for the probability that it is
right (a number in [0, 1]). The outcome is the inner episode's reward and is given at the answer's turn;
it is never part of the text the agent sees, and the self-report turn earns no reward of its own (a
method such as refgrpo or rlcr adds one). The last step's ``info`` holds the inner outcome and the parsed
report (``reflection`` 1 / 0, ``confidence`` q) or ``self_report_valid: False`` when the report is missing or
malformed.
"""

from __future__ import annotations

import re
from typing import Any

from .base import Problem, Reply, SingleTurnEnv, parse_confidence, parse_reflection

KINDS = ("reflect", "confidence")
INLINE_TOKENS = 32
"""Tokens added to a task's default completion budget when the answer itself carries its report
(``--self-report inline``): room for ``<confidence>0.75</confidence>`` with a character-level tokenizer."""


def default_new_tokens(task: Any, self_report: str | None, fallback: int = 32, chat: bool = False) -> int:
    """A completion's default token budget: the task's ``max_new_tokens`` (with a chat model its
    ``chat_max_new_tokens`` where it has one; else ``fallback``), plus :data:`INLINE_TOKENS` when answers may end
    with an inline report (``inline``; the warm-up's ``all``)."""
    own = getattr(task, "chat_max_new_tokens", None) if chat else None
    base = int(own) if own is not None else int(getattr(task, "max_new_tokens", fallback))
    return base + (INLINE_TOKENS if self_report in ("inline", "all") else 0)


QUESTIONS = {"reflect": "\nsolved or unsolved?\n", "confidence": "\nconfidence (0-1)?\n"}
CHAT_QUESTIONS = {"reflect": ("Is your answer correct? Reply with only yes or no.", "Answer:"),
                  "confidence": ("How confident are you that your answer is correct? Reply with only a number "
                                 "between 0 and 1.", "Confidence:")}
"""The question a chat model is asked (a user turn) and how its answer turn opens (context, not trained): a
general instruct model states a yes or no once its turn opens with "Answer:", and a number once it opens with
"Confidence:" (how many of SmolLM2-135M-Instruct's reports parse on each task: BENCHMARKS.md)."""
_WORD = re.compile(r"\s*([A-Za-z]{1,16})")
_NUMBER = re.compile(r"\s*([0-9](?:\.[0-9]{1,6})?)")
_PERCENT = re.compile(r"\s*([0-9]{1,3}(?:\.[0-9]{1,6})?)\s*%")
_WORDS: dict[str, float] = {"solved": 1.0, "unsolved": 0.0, "yes": 1.0, "no": 0.0}


def question(kind: str) -> Reply:
    """The self-report question of ``kind``: its raw text, and its chat form and prefill."""
    text, prefill = CHAT_QUESTIONS[kind]
    return Reply(QUESTIONS[kind], chat=text, prefill=prefill)


def turn_confidences(infos: list[dict[str, Any]]) -> list[float | None]:
    """The confidence each agent turn of an episode stated (its env ``info["confidence"]``; None where it stated
    none), in turn order; the asked self-report turn is not an agent step and is left out."""
    out: list[float | None] = []
    for i in infos:
        if "self_report" not in i:
            q = i.get("confidence")
            out.append(float(q) if isinstance(q, (int, float)) and not isinstance(q, bool) else None)
    return out


def parse_report(kind: str, text: Any) -> float | None:
    """The report of a self-report turn: ``reflect``: 1 (solved, yes) / 0 (unsolved, no) from the tag or the bare
    first word; ``confidence``: q in [0, 1] from the tag, a bare leading number or a leading percentage (``80%``);
    None when malformed."""
    if not isinstance(text, str):
        return None
    if kind == "reflect":
        tagged = parse_reflection(text)
        if tagged is not None:
            return float(tagged)
        m = _WORD.match(text[:64])
        return _WORDS.get(m.group(1).lower()) if m else None
    stated = parse_confidence(text)
    if stated is not None:
        return stated
    pct = _PERCENT.match(text[:64])
    if pct is not None:
        q = float(pct.group(1)) / 100.0
        return q if 0.0 <= q <= 1.0 else None
    m = _NUMBER.match(text[:64])
    if m is None:
        return None
    q = float(m.group(1))
    return q if 0.0 <= q <= 1.0 else None


class SelfReportEnv:
    """The inner task's environment followed by one self-report turn (see the module docstring)."""

    def __init__(self, inner: Any, kind: str):
        self.inner, self.kind = inner, kind
        self._final: dict[str, Any] | None = None

    def reset(self, problem: Problem) -> str:
        self._final = None
        return self.inner.reset(problem)

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._final is not None:  # the self-report turn
            report = parse_report(self.kind, text)
            info = dict(self._final)
            info["self_report"], info["self_report_valid"] = self.kind, report is not None
            if report is not None:
                info["reflection" if self.kind == "reflect" else "confidence"] = report
            self._final = None
            return "", 0.0, True, info
        feedback, reward, done, info = self.inner.step(text)
        if not done:
            return feedback, reward, False, info
        info = dict(info) if isinstance(info, dict) else {}
        info.setdefault("outcome", float(reward))
        # a report inside the answer itself is not the one asked for: the turn below decides
        info.pop("reflection", None)
        info.pop("confidence", None)
        self._final = info
        return question(self.kind), reward, False, {k: v for k, v in info.items() if k != "correct"}

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()


class SelfReportTask:
    """A task whose episodes end with a self-report turn; everything else is the inner task's."""

    multi_turn = True

    def __init__(self, task: Any, kind: str):
        if kind not in KINDS:
            raise ValueError(f"self-report kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.task, self.kind = task, kind
        self.name = getattr(task, "name", "task")
        inner_turns = int(getattr(task, "max_turns", 6)) if getattr(task, "multi_turn", False) else 1
        self.max_turns = inner_turns + 1
        self.stop_sequences = tuple(getattr(task, "stop_sequences", ()) or ())

    def __getattr__(self, name: str) -> Any:  # problems, score, teacher_prompt, max_new_tokens, ...
        return getattr(self.__dict__["task"], name)

    def make_env(self) -> SelfReportEnv:
        inner = self.task.make_env() if getattr(self.task, "multi_turn", False) else SingleTurnEnv(self.task)
        return SelfReportEnv(inner, self.kind)

    def inner_turns(self, problem: Problem) -> list[tuple[str, str]]:
        """The inner task's demonstration as (agent turn, environment reply) pairs."""
        turns = getattr(self.task, "demonstration_turns", None)
        if callable(turns) and getattr(self.task, "multi_turn", False):
            return list(turns(problem))
        return [(self.task.demonstration(problem), "")]


def with_self_report(task: Any, kind: str | None) -> Any:
    """``task`` with a self-report turn of ``kind`` after each episode (``None`` / ``off`` / ``inline``: the task
    itself; ``inline`` reports are the answer's own tags, which every task parses into its step ``info``)."""
    if kind in (None, "off", "inline"):
        return task
    return SelfReportTask(task, kind)
