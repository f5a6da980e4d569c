"""Checkers of the ``data`` task: how a completion's answer is found (``extract``) and compared with a row's reference
answer (``checker``). docs/tasks.md, "Your own problems", describes each with examples.

Extraction (self-report tags removed first; an extracted answer is stripped of surrounding whitespace):

- ``auto``: the last ``<answer>...</answer>``, else the last ``\\boxed{...}``, else the text after the last ``####``
  (to the end of its line), else the whole completion;
- ``answer-tag``, ``boxed``, ``hash``: that form alone; a completion without it has no answer (score 0);
- ``last-line`` / ``first-line``: the last / first non-blank line;
- ``none``: the whole completion.

A reference answer is read with ``auto`` whatever ``extract`` is, so a reference ``... #### 72`` (GSM8K's form) is 72.

Checkers (each returns a score in [0, 1] and never raises on junk output):

- ``exact``: the answer equals the reference (``ignore_case`` folds case);
- ``number``: both read as numbers (``1,000``, ``1e3``, ``$5``, ``5.0``, ``50%``, ``3/4``, ``\\frac{3}{4}``; an answer that
  is not one number gives its last number) and ``|x - y| <= tolerance * max(1, |y|)``;
- ``math``: symbolic equivalence by the ``math-verify`` library;
- ``choice``: the option letter of the answer (``B``, ``(B)``, ``B.``, ``B. Paris``, ``the answer is B``, or the
  option's own text) equals the reference's;
- ``regex``: the reference is a regular expression that the whole answer must match;
- ``MODULE:FUNCTION``: a function of the user's, ``fn(answer, reference)`` or ``fn(answer, reference, meta)``, that
  returns a number in [0, 1].
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import re
import threading
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from ..errors import ConfigError
from .base import import_object, strip_self_report

EXTRACTS = ("auto", "answer-tag", "boxed", "hash", "last-line", "first-line", "none")
CHECKERS = ("exact", "number", "math", "choice", "regex")
_SCAN = 1 << 15  # the forms are looked for in the last 32 KiB of a completion (first-line: the first)
_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.IGNORECASE | re.DOTALL)
_HASH = re.compile(r"####[ \t]*([^\n]*)")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_CHARS = 4096


# ------------------------------------------------------------------------------------------------ extraction
def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text`` (braces balanced, at most 4 KiB), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts[-16:]):  # the last few only: junk of nested boxes must not cost quadratic time
        depth, i, end = 1, start, min(len(text), start + _BOXED_CHARS)
        while i < end and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start:i - 1]
    return None


def _tag(text: str) -> str | None:
    tags = _ANSWER_TAG.findall(text)
    return tags[-1] if tags else None


def _hash(text: str) -> str | None:
    found = _HASH.findall(text)
    return found[-1] if found else None


_FORMS = {"answer-tag": _tag, "boxed": _boxed, "hash": _hash}


def extract(completion: Any, mode: str = "auto") -> str | None:
    """The answer part of a completion under ``mode`` (see the module docstring), or None where it has none."""
    if not isinstance(completion, str):
        return None
    text = strip_self_report(completion[:_SCAN] if mode == "first-line" else completion[-_SCAN:])
    for form in ("answer-tag", "boxed", "hash") if mode == "auto" else (mode,) if mode in _FORMS else ():
        found = _FORMS[form](text)
        if found is not None:
            return found.strip()
    if mode in _FORMS:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if mode in ("last-line", "first-line"):
        return (lines[-1] if mode == "last-line" else lines[0]) if lines else None
    return text.strip()


def format_demonstration(answer: str, mode: str) -> str:
    """A reference answer written in the form ``mode`` asks for (``\\boxed{42}``, ``<answer>42</answer>``,
    ``#### 42``), unless it is already in that form."""
    if mode == "boxed" and _boxed(answer) is None:
        return f"\\boxed{{{answer}}}"
    if mode == "answer-tag" and not _ANSWER_TAG.search(answer):
        return f"<answer>{answer}</answer>"
    if mode == "hash" and not _HASH.search(answer):
        return f"#### {answer}"
    return answer


# ------------------------------------------------------------------------------------------------ numbers
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
_NUMBER_TOKEN = re.compile(rf"(?<![\w.])[-+]?(?:{_NUM})(?:\s*/\s*(?:{_NUM}))?")
_WHOLE = re.compile(rf"\s*([-+]?)\s*(?:{_NUM})\s*")
_FRAC = re.compile(r"^([-+]?)\\[dt]?frac\s*\{\s*([-+]?[\d.]+)\s*\}\s*\{\s*([-+]?[\d.]+)\s*\}$")
_UNIT = re.compile(r"^(?:\\\$|\$|€|£|¥|\\%|%|\\!|\\,|\\;|\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\\left|\\right|[()])")
_MAX_NUMBER_CHARS = 64
_MAX_EXPONENT = 400


def _decimal(token: str) -> Fraction | None:
    """A number token (``1,000.5``, ``1e3``, ``3/4``) as an exact fraction; None past :data:`_MAX_NUMBER_CHARS`
    characters or an exponent of 400 (a number no float holds, and an exact one too costly to build)."""
    token = token.replace(",", "").replace(" ", "")
    if len(token) > _MAX_NUMBER_CHARS:
        return None
    try:
        parts = [Decimal(t) for t in token.split("/", 1)]
        if any(not p.is_finite() or abs(p.adjusted()) > _MAX_EXPONENT for p in parts):
            return None
        if len(parts) == 2:
            return None if parts[1] == 0 else Fraction(parts[0]) / Fraction(parts[1])
        return Fraction(parts[0])
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None


def _bare(text: str) -> str:
    """``text`` without currency signs, percent signs, LaTeX spacing / text wrappers, ``$`` delimiters and a final
    period: what is left of ``$1,000.`` or ``\\$5\\text{ dollars}`` is the number."""
    text = text.strip().replace("\u2212", "-")
    if text.endswith("."):
        text = text[:-1]
    out, i = [], 0
    while i < len(text):
        m = _UNIT.match(text, i) if text[i] in "\\$€£¥%()" else None
        if m:
            i = m.end()
            continue
        out.append(text[i])
        i += 1
    return "".join(out).strip()


def parse_number(text: Any, whole_only: bool = False) -> Fraction | None:
    """The number ``text`` states: all of it read as one number (see the module docstring), else (unless
    ``whole_only``) its last number; None without one."""
    if not isinstance(text, str):
        return None
    bare = _bare(text[-_SCAN:])
    frac = _FRAC.match(bare)
    if frac:
        num, den = _decimal(frac.group(2)), _decimal(frac.group(3))
        if num is not None and den:
            return (-1 if frac.group(1) == "-" else 1) * num / den
    squeezed = re.sub(r"(?<=[-+])\s+", "", bare)
    if _NUMBER_TOKEN.fullmatch(squeezed):
        return _decimal(squeezed)
    if whole_only:
        return None
    tokens = _NUMBER_TOKEN.findall(text[-_SCAN:].replace("\u2212", "-"))
    return _decimal(tokens[-1]) if tokens else None


def numbers_equal(got: Fraction | None, want: Fraction | None, tolerance: float) -> bool:
    """``|got - want| <= tolerance * max(1, |want|)`` (False when either is missing)."""
    if got is None or want is None:
        return False
    return abs(float(got - want)) <= tolerance * max(1.0, abs(float(want)))


# ------------------------------------------------------------------------------------------------ choices
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LONE = re.compile(r"^\(?([A-Za-z])\)?[.):]?$")
_LEADING = re.compile(r"^(?:\(([A-Z])\)|([A-Z])[.):])\s")
_STATED = re.compile(r"\b(?:answer|option|choice)(?:\s+is)?\s*[:=]?\s*\(?([A-Z])\)?(?![A-Za-z])", re.IGNORECASE)


def choice_letter(text: Any, choices: list[str] | None = None) -> str | None:
    """The option letter an answer gives (see the module docstring), or None when it gives none or is ambiguous."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    if choices:
        folded = t.rstrip(".").strip().casefold()
        for letter, option in zip(LETTERS, choices):
            if folded == str(option).strip().casefold():
                return letter
    for pattern in (_LONE, _LEADING):
        m = pattern.match(t)
        if m:
            return next(g for g in m.groups() if g).upper()
    stated = _STATED.findall(t[-2000:])
    return stated[-1].upper() if stated else None


def reference_letter(answer: str, choices: list[str] | None) -> str | None:
    """A reference answer as an option letter: a letter, the option's text, or (with ``choices``) its 0-based index."""
    text = answer.strip()
    letter = choice_letter(text, choices)
    if letter is None and choices and text.isdigit() and int(text) < len(choices):
        letter = LETTERS[int(text)]
    return letter if letter is not None and (not choices or LETTERS.index(letter) < len(choices)) else None


# ------------------------------------------------------------------------------------------------ math
def _math_verify() -> tuple[Callable[..., Any], Callable[..., Any]]:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ConfigError("checker math needs the math-verify package: pip install 'reflectrl[tasks]' "
                          "(or pip install math-verify)") from None
    # math-verify logs every text it fails to parse in time, whole, as a warning; a failure scores 0 here
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return parse, verify


_MATH_CHARS = 2000  # an answer's last 2000 characters go to math-verify (sympy's time grows fast with the text)


_MAX_DEPTH = 32


def _depth(text: str) -> int:
    """The deepest nesting of brackets in ``text`` (closing ones that match nothing ignored)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}" and depth:
            depth -= 1
    return deepest


def _timeout() -> int | None:
    """math-verify's time limit per parse and comparison: 5 s on the main thread (it uses SIGALRM), none on others."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_parse(text: str) -> list[Any]:
    """``math_verify.parse`` of ``text``; a text without ``$`` or ``\\boxed`` is tried as one LaTeX formula first
    (``\\sqrt{2}/2``, ``x^2+1``), then as it is."""
    parse, _ = _math_verify()
    tries = [text]
    if "$" not in text and "\\boxed" not in text and "\\(" not in text and "\\[" not in text:
        tries.insert(0, f"${text}$")
    for t in tries:
        found = parse(t, parsing_timeout=_timeout())
        if found:
            return found
    return []


def math_equal(answer: str | None, gold: list[Any]) -> bool:
    """Whether ``answer`` is equivalent to the parsed reference ``gold`` (math-verify's ``verify``)."""
    if answer is None or not gold:
        return False
    _, verify = _math_verify()
    text = answer[-_MATH_CHARS:]
    if _depth(text) > _MAX_DEPTH:  # brackets this deep are junk that costs sympy seconds (and no limit on a thread)
        return False
    got = math_parse(text)
    return bool(got) and bool(verify(gold, got, timeout_seconds=_timeout()))


# ------------------------------------------------------------------------------------------------ user scorers
def user_scorer(spec: str) -> Callable[[str, str, dict[str, Any]], float]:
    """The user's function ``MODULE:FUNCTION`` as a scorer ``(answer, reference, meta) -> float``: one that raises or
    returns anything but a number in [0, 1] ends in a ConfigError naming it."""
    fn = import_object(spec, "checker")
    if not callable(fn):
        raise ConfigError(f"checker {spec!r} is not a function")
    try:
        params = inspect.signature(fn).parameters.values()
        three = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= 3 or any(
            p.kind is p.VAR_POSITIONAL for p in params)
    except (TypeError, ValueError):
        three = False

    def score(answer: str, reference: str, meta: dict[str, Any]) -> float:
        try:
            value = fn(answer, reference, meta) if three else fn(answer, reference)
        except Exception as exc:
            raise ConfigError(f"checker {spec} raised {type(exc).__name__}: {exc} (on the answer "
                              f"{answer[:60]!r})") from None
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)) or not 0 <= float(value) <= 1:
            raise ConfigError(f"checker {spec} returned {value!r} (on the answer {answer[:60]!r}); it must return a "
                              "number in [0, 1]")
        return float(value)

    return score


def check_extract(mode: Any) -> str:
    """``mode`` if it is one of :data:`EXTRACTS`, else a ConfigError naming them."""
    if mode not in EXTRACTS:
        raise ConfigError(f"unknown extract {mode!r}; choose one of {', '.join(EXTRACTS)}")
    return str(mode)


def check_checker(name: Any) -> str:
    """``name`` if it is a checker (one of :data:`CHECKERS` or ``MODULE:FUNCTION``), else a ConfigError."""
    if not isinstance(name, str) or (name not in CHECKERS and ":" not in name):
        raise ConfigError(f"unknown checker {name!r}; choose one of {', '.join(CHECKERS)} or MODULE:FUNCTION "
                          "(a function of your own)")
    return name


# ------------------------------------------------------------------------------------------------ the checker
DEFAULT_INSTRUCTIONS = {"exact": "Reply with only the answer.", "number": "Reply with only the number.",
                        "math": "Reply with only the final answer.", "regex": "Reply with only the answer.",
                        "choice": "Reply with only the letter of the correct option."}
"""What a chat prompt asks for after the question, per checker, when ``extract`` is ``auto`` or ``none`` (a user's
function: as ``exact``)."""
FORM_INSTRUCTIONS = {"boxed": "Put the final answer in \\boxed{}.",
                     "answer-tag": "Put the final answer between <answer> and </answer>.",
                     "hash": "Write the final answer last, after ####.",
                     "last-line": "Write the final answer alone on the last line.",
                     "first-line": "Write the final answer alone on the first line."}
"""What a chat prompt asks for after the question when ``extract`` names one form (whatever the checker)."""


class Checker:
    """One checker with its extraction and options: ``score(completion, reference, meta)`` in [0, 1], never raising on
    junk output (a user's function that raises is a ConfigError); ``reference_error(reference, choices)`` says why a
    reference answer cannot be checked (None when it can)."""

    def __init__(self, name: str = "exact", extract: str | None = None, ignore_case: bool = False,
                 tolerance: float = 1e-6):
        self.name = check_checker(name)
        self.user = ":" in self.name
        self.extract = check_extract(extract if extract is not None else ("none" if self.user else "auto"))
        if not isinstance(ignore_case, bool):
            raise ConfigError(f"ignore_case must be true or false, got {ignore_case!r}")
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
            raise ConfigError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
        self.ignore_case, self.tolerance = ignore_case, float(tolerance)
        self._fn = user_scorer(self.name) if self.user else None
        if self.name == "math":
            _math_verify()  # a missing package fails here, before any work
        self._cache: dict[Any, Any] = {}

    def instruction(self) -> str:
        """The default request for the answer's format (see :data:`DEFAULT_INSTRUCTIONS`)."""
        if self.extract in FORM_INSTRUCTIONS:
            return FORM_INSTRUCTIONS[self.extract]
        return DEFAULT_INSTRUCTIONS.get(self.name, DEFAULT_INSTRUCTIONS["exact"])

    def _reference(self, reference: str, choices: list[str] | None) -> Any:
        """The reference in the checker's terms (a number, a letter, a parsed formula, a compiled pattern), cached."""
        key = (reference, tuple(choices) if choices else None)
        if key not in self._cache:
            gold = extract(reference, "auto") or reference.strip()
            if self.name == "number":
                value: Any = parse_number(gold, whole_only=True)
            elif self.name == "choice":
                value = reference_letter(gold, choices)
            elif self.name == "math":
                value = math_parse(gold)
            elif self.name == "regex":
                try:
                    value = re.compile(reference.strip(), re.IGNORECASE if self.ignore_case else 0)
                except re.error as exc:
                    value = exc
            else:
                value = gold.casefold() if self.ignore_case else gold
            self._cache[key] = value
        return self._cache[key]

    def reference_error(self, reference: str, choices: list[str] | None = None) -> str | None:
        """Why ``reference`` cannot be checked by this checker (not a number, no option letter, a bad pattern, no
        formula math-verify reads), or None."""
        value = self._reference(reference, choices)
        if isinstance(value, re.error):
            return f"answer {reference[:60]!r} is not a regular expression ({value})"
        if value is None or (self.name == "math" and not value):
            what = {"number": "a number", "choice": "an option letter" + (f" (A-{LETTERS[len(choices) - 1]})"
                                                                          if choices else ""),
                    "math": "a formula math-verify can read"}[self.name]
            return f"answer {reference[:60]!r} is not {what} (checker {self.name})"
        return None

    def score(self, completion: Any, reference: str, meta: dict[str, Any] | None = None) -> float:
        """The score of ``completion`` against ``reference`` (``meta``: the row's other columns; ``choices``)."""
        meta = meta or {}
        answer = extract(completion, self.extract)
        if answer is None:
            return 0.0
        if self._fn is not None:
            return self._fn(answer, reference, meta)
        choices = meta.get("choices") if isinstance(meta.get("choices"), list) else None
        want = self._reference(reference, choices)
        if want is None or isinstance(want, re.error):
            return 0.0
        if self.name == "number":
            return float(numbers_equal(parse_number(answer), want, self.tolerance))
        if self.name == "choice":
            return float(choice_letter(answer, choices) == want)
        if self.name == "math":
            return float(math_equal(answer, want))
        if self.name == "regex":
            return float(want.fullmatch(answer.strip()) is not None)
        return float((answer.casefold() if self.ignore_case else answer) == want)
