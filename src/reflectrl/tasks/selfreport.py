"""Asking an agent how it did: a turn after the episode in which it states a reflection or a confidence, or (the
inline form on a chat model) the report in the answer's own assistant message.

:func:`with_self_report` wraps any task (single- or multi-turn) so that, when its episode ends (a final
answer given, or its turns used up), the environment asks one more question: ``reflect`` asks whether the
answer solved the problem (``solved`` / ``unsolved``), ``confidence`` asks for the probability that it is
right (a number in [0, 1]). The outcome is the inner episode's reward and is given at the answer's turn;
it is never part of the text the agent sees, and the self-report turn earns no reward of its own (a
method such as refgrpo or rlcr adds one). The last step's ``info`` holds the inner outcome and the parsed
report (``reflection`` 1 / 0, ``confidence`` q) or ``self_report_valid: False`` when the report is missing or
malformed.

The inline form (``inline``: a confidence, ``inline-reflect``: a reflection; the RLCR paper's form) asks for the report
in the answer itself: the chat instruction asks for the answer followed by ``<confidence>q</confidence>`` (or
``<reflect>solved|unsolved</reflect>``). A model with raw prompts must have learnt to write the tag (the warm-up's
``inline``), and the task's own verifier parses it. A chat model gets :func:`inline_report`: when its answer ends,
the environment opens the tag in the same assistant message (:data:`INLINE_OPENINGS`, context, not trained; the
end-of-turn token the model sampled after its answer is dropped) and the model completes it: no user turn, no
second prompt, a few tokens more per row. Base instruct models of this size do not write the tag from the
instruction alone; with the opened tag nearly every report parses (BENCHMARKS.md, "The inline form").
"""

from __future__ import annotations

import re
from typing import Any

from .base import Problem, Reply, SingleTurnEnv, chat_prompt, parse_confidence, parse_reflection

KINDS = ("reflect", "confidence")
INLINE_FORMS = {"inline": "confidence", "inline-reflect": "reflect"}
"""The inline self-report forms and the kind of report each asks for."""
INLINE_ASKS = {"confidence": "Then write <confidence>p</confidence>.",
               "reflect": "Then write <reflect>solved</reflect> or <reflect>unsolved</reflect>."}
"""What a chat model's first message asks for in the inline form, after the task's own instruction. The wording was
chosen on validation sums for the answers' accuracy first (a longer request cost SmolLM2-135M-Instruct right
answers), then the share of reports that parse (``benchmarks/inline_form.py``, rendered in BENCHMARKS.md)."""
INLINE_OPENINGS = {"confidence": " <confidence>0.", "reflect": " <reflect>"}
"""How the environment opens the report's tag after a chat model's answer (inline form): the confidence's tag with
its leading ``0.`` (the model writes its digits, so that every well-formed report is a number in [0, 1)), the
reflection's tag alone (the model writes solved or unsolved)."""
INLINE_REPORT_TOKENS = 3
"""A chat model's budget for completing the opened tag (inline form): its report is the first word or digits it
writes there (``95`` after ``<confidence>0.``, ``solved`` or ``unsolved`` after ``<reflect>``: 1 to 2 tokens with
SmolLM2's tokenizer), so its message is cut after this many tokens and the closing tag is neither waited for nor
trained. Every row of a batch decodes until its longest ends, so a report that runs on to its closing tag and the
end of its turn (6 tokens) costs every row (``benchmarks/inline_cost.py``)."""
INLINE_ROOM = 16
"""Tokens of a chat model's response budget kept for the inline report: the opened tag and its completion."""
INLINE_TOKENS = 32
"""Tokens added to a task's default completion budget when the answer itself carries its report
(``--self-report inline``): room for ``<confidence>0.75</confidence>`` with a character-level tokenizer."""


def default_new_tokens(task: Any, self_report: str | None, fallback: int = 32, chat: bool = False) -> int:
    """A completion's default token budget: the task's ``max_new_tokens`` (with a chat model its
    ``chat_max_new_tokens`` where it has one; else ``fallback``), plus :data:`INLINE_TOKENS` when a raw-prompt
    model's answers may end with an inline report (``inline``, ``inline-reflect``; the warm-up's ``all``)."""
    own = getattr(task, "chat_max_new_tokens", None) if chat else None
    base = int(own) if own is not None else int(getattr(task, "max_new_tokens", fallback))
    # a chat model completes an inline report in a turn of its own (the opened tag): its answer needs no more room
    return base + (INLINE_TOKENS if self_report in ("inline", "inline-reflect", "all") and not chat else 0)


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
_INLINE_DIGITS = re.compile(r"([0-9]{1,6})(?![0-9])")
_INLINE_WORD = re.compile(r"\s?((?:un)?solved)\b", re.IGNORECASE)


def question(kind: str) -> Reply:
    """The self-report question of ``kind``: its raw text, and its chat form and prefill."""
    text, prefill = CHAT_QUESTIONS[kind]
    return Reply(QUESTIONS[kind], chat=text, prefill=prefill)


def inline_report(kind: str) -> Reply:
    """The inline form's continuation of a chat model's answer: the opened tag of ``kind``, in the same message."""
    return Reply(INLINE_OPENINGS[kind], chat="", prefill=INLINE_OPENINGS[kind], continuation=True,
                 max_tokens=INLINE_REPORT_TOKENS)


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

    def __init__(self, inner: Any, kind: str, inline: bool = False):
        self.inner, self.kind, self.inline = inner, kind, inline
        self._final: dict[str, Any] | None = None

    def reset(self, problem: Problem) -> str:
        self._final = None
        return self.inner.reset(problem)

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._final is not None:  # the self-report turn (inline: the rest of the tag the environment opened)
            report = parse_inline(self.kind, text) if self.inline else parse_report(self.kind, text)
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
        ask = inline_report(self.kind) if self.inline else question(self.kind)
        return ask, reward, False, {k: v for k, v in info.items() if k != "correct"}

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()


def parse_inline(kind: str, text: Any) -> float | None:
    """The report a chat model completed after the opened tag of :data:`INLINE_OPENINGS` (``text``: what it wrote
    after it, whether or not it closed the tag): the digits after the confidence's ``0.``, the word after
    ``<reflect>``; None when it wrote something else first."""
    if not isinstance(text, str):
        return None
    if kind == "reflect":
        word = _INLINE_WORD.match(text)
        return None if word is None else _WORDS[word.group(1).lower()]
    digits = _INLINE_DIGITS.match(text)
    return None if digits is None else float("0." + digits.group(1))


class SelfReportTask:
    """A task whose episodes end with a self-report turn; everything else is the inner task's. ``inline``: the
    report is asked for in the first message and completed in the answer's own message (a chat model)."""

    multi_turn = True

    def __init__(self, task: Any, kind: str, inline: bool = False):
        if kind not in KINDS:
            raise ValueError(f"self-report kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.task, self.kind, self.inline = task, kind, inline
        self.name = getattr(task, "name", "task")
        inner_turns = int(getattr(task, "max_turns", 6)) if getattr(task, "multi_turn", False) else 1
        self.max_turns = inner_turns + 1
        # a chat model's inline report continues the answer's message: the inner task's response budget, plus this
        self.inline_room = INLINE_ROOM if inline else None
        self.stop_sequences = tuple(getattr(task, "stop_sequences", ()) or ())

    def __getattr__(self, name: str) -> Any:  # problems, score, teacher_prompt, max_new_tokens, ...
        return getattr(self.__dict__["task"], name)

    def make_env(self) -> SelfReportEnv:
        inner = self.task.make_env() if getattr(self.task, "multi_turn", False) else SingleTurnEnv(self.task)
        return SelfReportEnv(inner, self.kind, self.inline)

    def chat_prompt(self, problem: Problem) -> str:
        """The first message: the task's own; in the inline form, followed by what the report should look like."""
        own = chat_prompt(self.task, problem)
        return f"{own} {INLINE_ASKS[self.kind]}".rstrip() if self.inline else own

    def inner_turns(self, problem: Problem) -> list[tuple[str, str]]:
        """The inner task's demonstration as (agent turn, environment reply) pairs."""
        turns = getattr(self.task, "demonstration_turns", None)
        if callable(turns) and getattr(self.task, "multi_turn", False):
            return list(turns(problem))
        return [(self.task.demonstration(problem), "")]


def with_self_report(task: Any, kind: str | None, chat: bool = False) -> Any:
    """``task`` with a self-report turn of ``kind`` after each episode. ``None`` / ``off``: the task itself; an inline
    form (:data:`INLINE_FORMS`): with a ``chat`` model, the report asked for in the first message and completed in
    the answer's own message; with raw prompts the task itself (the answer's own tags, which every task parses into
    its step ``info``)."""
    if kind in (None, "off"):
        return task
    if kind in INLINE_FORMS:
        return SelfReportTask(task, INLINE_FORMS[kind], inline=True) if chat else task
    return SelfReportTask(task, kind)
