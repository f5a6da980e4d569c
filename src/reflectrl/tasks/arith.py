"""``arith``: integer arithmetic with one exact answer, e.g. prompt ``12+7=`` and completion ``19``.

Answer format: the first line of the completion (up to the first newline, or the end), with any
self-report tags removed; the answer is its first number (optionally signed, optionally with a fractional
part) after the line's last ``=``, or its first number when it has no ``=`` (a chat model often restates the sum:
``86 + 66 = 152``). The reward is 1 when that number equals the expression's value, else 0.

A chat model is asked ``What is 86 + 66? Reply with only the number.`` (:meth:`ArithTask.chat_prompt`).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from ..errors import ConfigError
from .base import (
    Problem,
    SingleTurnEnv,
    check_split,
    in_heldout,
    nonempty_split,
    register_task,
    stable_hash,
    strip_self_report,
)

OPERATORS = "+-*"
_NUMBER = re.compile(r"[-+]?[0-9]+(?:\.[0-9]+)?")
_SCAN_CHARS = 4096  # only the start of a completion can hold its first line's answer
_MAX_NUMBER_CHARS = 64
_ENUMERATE_UP_TO = 300_000  # expression spaces up to this size are enumerated, larger ones sampled


def evaluate(operands: Sequence[int], ops: Sequence[str]) -> int:
    """Value of ``operands[0] ops[0] operands[1] ...`` with the usual precedence (``*`` before ``+ -``)."""
    total, term = 0, operands[0]
    sign = 1
    for op, value in zip(ops, operands[1:]):
        if op == "*":
            term *= value
        else:
            total += sign * term
            sign, term = (1 if op == "+" else -1), value
    return total + sign * term


def parse_answer(completion: Any) -> Decimal | None:
    """The first number after the last ``=`` of the completion's first line (self-report tags removed), or the
    line's first number when it has no ``=``; None without one."""
    if not isinstance(completion, str):
        return None
    line = strip_self_report(completion[:_SCAN_CHARS]).split("\n", 1)[0]
    match = _NUMBER.search(line.rsplit("=", 1)[-1])
    if match is None or len(match.group()) > _MAX_NUMBER_CHARS:
        return None
    try:
        return Decimal(match.group())
    except InvalidOperation:  # pragma: no cover - the pattern only matches valid decimals
        return None


@register_task("arith")
class ArithTask:
    """Exact-answer arithmetic: ``terms`` operands below ``10**digits`` joined by operators from ``ops``."""

    name = "arith"
    multi_turn = False
    stop_sequences = ("\n",)
    max_new_tokens = 10  # an answer (at most 8 characters) or a self-report ("unsolved", "0.25") and its end
    chat_max_new_tokens = 24  # a chat model's first line: "86 + 66 = 152" or a short sentence

    def __init__(self, digits: int = 2, ops: str = "+-", terms: int = 2, n_train: int = 5000, n_heldout: int = 500,
                 heldout_fraction: float = 0.1, seed: int = 0, n_validation: int = 500):
        if not (isinstance(digits, int) and 1 <= digits <= 6):
            raise ConfigError(f"arith digits must be an integer in 1..6, got {digits!r}")
        if not ops or not isinstance(ops, str) or set(ops) - set(OPERATORS):
            raise ConfigError(f"arith ops must be a non-empty string of {OPERATORS!r}, got {ops!r}")
        if not (isinstance(terms, int) and 2 <= terms <= 4):
            raise ConfigError(f"arith terms must be an integer in 2..4, got {terms!r}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ConfigError(f"arith heldout_fraction must be in (0, 1), got {heldout_fraction!r}")
        if min(n_train, n_heldout, n_validation) < 0:
            raise ConfigError("arith n_train, n_validation and n_heldout must be non-negative")
        self.digits, self.ops, self.terms = digits, "".join(sorted(set(ops), key=OPERATORS.index)), terms
        self.sizes = {"train": int(n_train), "validation": int(n_validation), "heldout": int(n_heldout)}
        self.heldout_fraction, self.seed = heldout_fraction, seed
        self._cache: dict[str, list[Problem]] = {}

    # ------------------------------------------------------------------ problems
    def _salt(self) -> str:
        return f"arith/{self.seed}"

    def _split_of(self, expr: str) -> str:
        return "heldout" if in_heldout(expr, self.heldout_fraction, self._salt()) else "train"

    def _space(self) -> int:
        return (10 ** self.digits) ** self.terms * len(self.ops) ** (self.terms - 1)

    def _expressions(self, split: str) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
        """Up to ``sizes[split]`` distinct expressions of that split, in a seeded order. Validation expressions are
        train-side ones (by the hash) that the train sample left out, so adding them changed no train problem."""
        pool = "train" if split == "validation" else split
        n, top = self.sizes[split], 10 ** self.digits
        if self._space() <= _ENUMERATE_UP_TO:
            if split == "validation":  # the rest of the train split's own shuffle
                return self._enumerated("train")[self.sizes["train"]:][:n]
            return self._enumerated(split)[:n]
        taken = {p.prompt[:-1] for p in self.problems("train")} if split == "validation" else set()
        rng = random.Random(stable_hash(f"{self._salt()}/{split}/{self.digits}/{self.ops}/{self.terms}"))
        found: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {}
        attempts = 0
        while len(found) < n and attempts < 50 * n + 1000:
            attempts += 1
            vals = tuple(rng.randrange(top) for _ in range(self.terms))
            ops = tuple(rng.choice(self.ops) for _ in range(self.terms - 1))
            text = _text(vals, ops)
            if text not in found and text not in taken and self._split_of(text) == pool:
                found[text] = (vals, ops)
        return list(found.values())

    def _enumerated(self, split: str) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
        """Every expression of ``split`` ('train' or 'heldout' by the hash), in that split's seeded order."""
        top = 10 ** self.digits
        rng = random.Random(stable_hash(f"{self._salt()}/{split}/{self.digits}/{self.ops}/{self.terms}"))
        every = [(vals, ops) for vals in itertools.product(range(top), repeat=self.terms)
                 for ops in itertools.product(self.ops, repeat=self.terms - 1)]
        mine = [e for e in every if self._split_of(_text(*e)) == split]
        rng.shuffle(mine)
        return mine

    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split`` (train, validation or heldout): deterministic, and disjoint across splits."""
        check_split(split)
        if split not in self._cache:
            out = []
            for vals, ops in self._expressions(split):
                expr, value = _text(vals, ops), evaluate(vals, ops)
                out.append(Problem(id=f"arith:{expr}", prompt=f"{expr}=", answer=str(value),
                                   meta={"value": value, "operands": list(vals), "ops": list(ops)}))
            self._cache[split] = nonempty_split(self.name, split, out, "every expression of these digits and "
                                                "operators is in train or heldout; lower n_train or add digits")
        return list(self._cache[split])

    # ------------------------------------------------------------------ verifier
    def score(self, problem: Problem, completion: str) -> float:
        """1.0 if the completion's answer (see the module docstring) equals the value, else 0.0; never raises."""
        got = parse_answer(completion)
        return 1.0 if got is not None and got == int(problem.meta["value"]) else 0.0

    def score_many(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
        """``score`` for each (problem, completion) pair."""
        return [self.score(p, c) for p, c in zip(problems, completions)]

    def demonstration(self, problem: Problem) -> str:
        """The target completion for supervised warm-up: the value alone."""
        return str(problem.meta["value"])

    def chat_prompt(self, problem: Problem) -> str:
        """The question for a chat model: ``What is 86 + 66? Reply with only the number.``"""
        vals, ops = problem.meta["operands"], problem.meta["ops"]
        expr = str(vals[0]) + "".join(f" {op} {v}" for op, v in zip(ops, vals[1:]))
        return f"What is {expr}? Reply with only the number."

    def teacher_prompt(self, problem: Problem) -> str:
        """The prompt with the answer in context, for a self-teacher."""
        return f"answer {problem.meta['value']}\n{problem.prompt}"

    def make_env(self) -> SingleTurnEnv:
        """A one-step environment whose reward is ``score``."""
        return SingleTurnEnv(self)


def _text(vals: Sequence[int], ops: Sequence[str]) -> str:
    """``12+7`` from (12, 7) and ('+',)."""
    return str(vals[0]) + "".join(op + str(v) for op, v in zip(ops, vals[1:]))
