"""``data``: problems from a user's own file, scored by a named checker (docs/tasks.md, "Your own problems").

``get_task("data", path="problems.jsonl", checker="number")``. A row holds a question (column ``question``, or
``prompt``, or a chat ``messages`` list; ``question=COL`` names another) and a reference answer (``answer``, or
``answer=COL``); optional ``id``, ``split`` (train / validation / heldout; ``test`` reads as heldout, ``val``, ``valid``
and ``dev`` as validation), ``system`` (put before the question), ``choices`` or ``options`` (a list, shown as
``A. ...`` lines), ``demonstration`` (the warm-up's target instead of the answer); every other column is kept in
``Problem.meta``. A row without a split goes to heldout when a stable hash of ``(seed, id)`` (of its question and
answer where it has no id) falls in the ``heldout_fraction`` share, and of the rest to validation by a second hash
(``validation_fraction``), as the built-in tasks split theirs. The file is read and every row checked when the task
is made, so bad data fails before any work, in one line naming the file and the line or row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import SPLITS, EmptySplitError, Problem, SingleTurnEnv, check_fraction, check_split, in_heldout, register_task
from .checkers import LETTERS, Checker, extract, format_demonstration, reference_letter
from .datafile import read_rows

QUESTION_COLUMNS = ("question", "prompt", "messages")
"""The columns a question is read from, in this order, unless ``question=COL`` names one."""
SPLIT_ALIASES = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
                 "val": "validation", "dev": "validation", "heldout": "heldout", "test": "heldout"}
KNOWN = {"id", "split", "system", "choices", "options", "demonstration"}
_MAX_TOKENS = 1024


@register_task("data")
class DataTask:
    """Your own problems from a JSON lines, JSON, CSV or Parquet file (``path=FILE``), scored by ``checker``."""

    name = "data"
    multi_turn = False
    chat_stop_sequences: tuple[str, ...] = ()  # a chat answer may reason over lines; its turn ends at end-of-turn

    def __init__(self, path: str | None = None, checker: str = "exact", extract: str | None = None,
                 question: str | None = None, answer: str = "answer", instruction: str | None = None,
                 raw_instruction: bool = False, ignore_case: bool = False, tolerance: float = 1e-6,
                 heldout_fraction: float = 0.2, validation_fraction: float = 0.1, seed: int = 0):
        if path is None or not str(path).strip():
            raise ConfigError("task data needs a file of problems: --set path=FILE (JSON lines, JSON, CSV or Parquet)")
        self.path = Path(str(path)).expanduser()
        self.check = Checker(checker, extract, ignore_case, tolerance)
        self.heldout_fraction = check_fraction("data", "heldout_fraction", heldout_fraction)
        self.validation_fraction = check_fraction("data", "validation_fraction", validation_fraction)
        if instruction is not None and not isinstance(instruction, str):
            raise ConfigError(f"data instruction must be text, got {instruction!r}")
        self.instruction = self.check.instruction() if instruction is None else instruction.strip()
        self.raw_instruction, self.seed = bool(raw_instruction), seed
        self.question_column, self.answer_column = question, str(answer)
        self._splits: dict[str, list[Problem]] = {s: [] for s in SPLITS}
        self._demos: dict[str, str] = {}
        self._load()
        demos = list(self._demos.values())
        self.stop_sequences: tuple[str, ...] = () if any("\n" in d for d in demos) else ("\n",)
        self.max_new_tokens = min(_MAX_TOKENS, max(16, max(len(d) for d in demos) + 8))
        self.chat_max_new_tokens = max(64, self.max_new_tokens)

    # ------------------------------------------------------------------ reading
    def _where(self, where: str) -> str:
        return f"data file {self.path}, {where}"

    def _question_column(self, rows: list[tuple[str, dict[str, Any]]]) -> str:
        """The question's column; a ConfigError naming the columns the file has when it lacks it or the answer's."""
        columns = list(dict.fromkeys(k for _, r in rows for k in r))
        wanted = (self.question_column,) if self.question_column else QUESTION_COLUMNS
        found = next((c for c in wanted if c in columns), None)
        lacking = [] if found else [f"'{self.question_column}'" if self.question_column
                                    else "'question' (nor 'prompt' or 'messages')"]
        lacking += [] if self.answer_column in columns else [f"'{self.answer_column}'"]
        if found is None or lacking:
            raise ConfigError(f"data file {self.path} has no column {' and no column '.join(lacking)}; its columns: "
                              f"{', '.join(columns)}; name yours with --set question=COLUMN --set answer=COLUMN")
        return found

    def _load(self) -> None:
        rows = read_rows(self.path)
        qcol = self._question_column(rows)
        first_seen: dict[str, str] = {}
        problems = []
        for n, (where, row) in enumerate(rows, 1):
            problem, split = self._problem(n, where, row, qcol)
            if problem.id in first_seen:
                raise ConfigError(f"{self._where(where)}: duplicate id {problem.id!r} (first on "
                                  f"{first_seen[problem.id]})")
            first_seen[problem.id] = where
            self._splits[split].append(problem)
            problems.append(problem)
        self._probe(rows[0][0], problems[0])

    def _text(self, where: str, row: dict[str, Any], column: str, what: str) -> str:
        value = row.get(column)
        if isinstance(value, float) and value != value:  # a missing cell of a float column (Parquet from pandas)
            value = None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
            got = "is missing" if value is None else ("is empty" if isinstance(value, str) else
                                                      f"holds a {type(value).__name__}, not text")
            raise ConfigError(f"{self._where(where)}: no {what} (column {column!r} {got})")
        return str(value)

    def _problem(self, n: int, where: str, row: dict[str, Any], qcol: str) -> tuple[Problem, str]:
        system = row.get("system")
        if qcol == "messages":
            text, from_messages = _from_messages(row.get("messages"), self._where(where))
            system = from_messages or system
        else:
            text = self._text(where, row, qcol, "question")
        answer = self._text(where, row, self.answer_column, "answer")
        choices = _choices(row, self._where(where))
        if self.check.name == "choice" and choices and type(row[self.answer_column]) is int:
            answer = LETTERS[row[self.answer_column]] if 0 <= row[self.answer_column] < len(choices) else answer
        error = self.check.reference_error(answer, choices)
        if error:
            raise ConfigError(f"{self._where(where)}: {error}")
        if self.check.name == "choice":  # the reference as its letter: the demonstration a model should give
            answer = reference_letter(answer, choices) or answer
        given = row.get("id") is not None and str(row["id"]).strip() != ""
        pid = str(row["id"]).strip() if given else f"row{n}"
        split = self._split_of(where, row, pid if given else json.dumps([text, answer]))
        meta = {k: v for k, v in row.items() if k not in KNOWN | {qcol, self.answer_column}}
        meta.update({"question": text, "system": system if isinstance(system, str) else None, "choices": choices})
        demo = row.get("demonstration")
        demo = str(demo) if isinstance(demo, (str, int, float)) and str(demo).strip() else \
            format_demonstration(answer.strip(), self.check.extract)
        self._demos[pid] = demo
        return Problem(id=pid, prompt=self._raw_prompt(text, meta), answer=answer, meta=meta), split

    def _split_of(self, where: str, row: dict[str, Any], key: str) -> str:
        given = row.get("split")
        if given is not None and str(given).strip():
            split = SPLIT_ALIASES.get(str(given).strip().lower())
            if split is None:
                raise ConfigError(f"{self._where(where)}: split {given!r} is not one of train, validation, heldout "
                                  "(or test, val, dev)")
            return split
        salt = f"data/{self.seed}"
        if in_heldout(key, self.heldout_fraction, salt):
            return "heldout"
        return "validation" if in_heldout(key, self.validation_fraction, f"{salt}/validation") else "train"

    def _probe(self, where: str, first: Problem) -> None:
        """Score the first row's demonstration once, so that a user's function that raises or returns no number fails
        here, before any work."""
        try:
            self.check.score(self._demos[first.id], first.answer or "", first.meta)
        except ConfigError as exc:
            raise ConfigError(f"{self._where(where)}: {exc}") from None

    # ------------------------------------------------------------------ prompts
    def _body(self, question: str, meta: dict[str, Any]) -> str:
        lines = [question.strip()]
        if meta.get("choices"):
            lines += [f"{letter}. {option}" for letter, option in zip(LETTERS, meta["choices"])]
        return "\n".join(lines)

    def _raw_prompt(self, question: str, meta: dict[str, Any]) -> str:
        head = [meta["system"].strip()] if meta.get("system") else []
        if self.raw_instruction and self.instruction:
            head.append(self.instruction)
        return "\n".join([*head, self._body(question, meta), "answer: "])

    def chat_prompt(self, problem: Problem) -> str:
        """The user's message for a chat model: the row's system text, the question (and its options), then the
        request for the answer's format (``instruction``)."""
        body = self._body(problem.meta["question"], problem.meta)
        if self.instruction:
            body += ("\n\n" if "\n" in body else " ") + self.instruction
        system = problem.meta.get("system")
        return f"{system.strip()}\n\n{body}" if system else body

    # ------------------------------------------------------------------ protocol
    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split``, in file order; a split without any is a ConfigError that says how to get some."""
        check_split(split)
        if not self._splits[split]:
            counts = ", ".join(f"{s} {len(self._splits[s])}" for s in SPLITS)
            fraction = {"heldout": "heldout_fraction", "validation": "validation_fraction"}.get(split)
            hint = f"raise {fraction} or give rows split={split}" if fraction else f"give rows split={split}"
            raise EmptySplitError(f"data file {self.path} has no {split} problems ({counts}): {hint}")
        return list(self._splits[split])

    def score(self, problem: Problem, completion: str) -> float:
        """The checker's score of ``completion`` against the problem's reference answer; never raises on junk (a
        user's checker that raises or returns no number in [0, 1] is a ConfigError)."""
        return self.check.score(completion, problem.answer or "", problem.meta)

    def demonstration(self, problem: Problem) -> str:
        """The warm-up's target: the row's ``demonstration``, else its answer in the form ``extract`` asks for."""
        demo = self._demos.get(problem.id)
        return demo if demo is not None else format_demonstration((problem.answer or "").strip(), self.check.extract)

    def teacher_prompt(self, problem: Problem) -> str:
        """The raw prompt with the demonstration in context, for a self-teacher."""
        return f"Reference answer:\n{self.demonstration(problem)}\n\n{problem.prompt}"

    def answer_of(self, completion: str) -> str | None:
        """The part of ``completion`` the checker reads (``extract``), or None."""
        return extract(completion, self.check.extract)

    def make_env(self) -> SingleTurnEnv:
        """A one-step environment whose reward is ``score``."""
        return SingleTurnEnv(self)


def _choices(row: dict[str, Any], where: str) -> list[str] | None:
    value = row.get("choices", row.get("options"))
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{where}: choices must be a list (or its JSON), got {value[:60]!r}") from None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list) or not value or len(value) > len(LETTERS):
        raise ConfigError(f"{where}: choices must be a list of 1 to {len(LETTERS)} options, got {value!r}"[:300])
    return [str(v) for v in value]


def _from_messages(messages: Any, where: str) -> tuple[str, str | None]:
    """(question, system) of a chat ``messages`` list: the system messages' text, and the last user message with the
    turns before it (``user: ...`` / ``assistant: ...`` lines) in front."""
    if hasattr(messages, "tolist"):
        messages = messages.tolist()
    if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                 for m in messages):
        raise ConfigError(f"{where}: messages must be a list of {{'role', 'content'}} objects")
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None or not messages[last]["content"].strip():
        raise ConfigError(f"{where}: no question (messages has no user message with text)")
    system = "\n".join(m["content"] for m in messages if m.get("role") == "system") or None
    before = [f"{m.get('role')}: {m['content']}" for m in messages[:last] if m.get("role") != "system"]
    return "\n".join([*before, messages[last]["content"]]), system
