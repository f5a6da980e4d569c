"""``codegen``: write a small Python function; the reward is the fraction of hidden unit tests passed.

Problems come from templated families (integer, list and string operations), e.g.::

    prompt      "# add 7 to x\\ndef f(x):\\n"
    completion  "    return x + 7\\n"

The program that is tested is ``assemble(prompt, completion, entry_point)`` (shared with ``humaneval``):
the completion is the function **body**, appended to the prompt, unless it defines the whole function
itself (see ``assemble``). Hidden tests are top-level ``assert`` statements, run in the sandbox
(``reflectrl.sandbox``); generated code never runs in this process.
"""

from __future__ import annotations

import os
import random
import re
import string
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..sandbox import BATCH_SIZE, SandboxPool, Verdict, check_job, run_tests
from .base import (
    VALIDATION_HINT,
    Problem,
    SingleTurnEnv,
    carve_validation,
    check_fraction,
    check_split,
    in_heldout,
    nonempty_split,
    register_task,
    stable_hash,
    step_info,
    strip_self_report,
)

MAX_COMPLETION_CHARS = 20_000  # longer completions are cut here (no reference solution comes close)
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#", "\nassert ")
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_WHOLE_STOP = re.compile(r"^(?:if\s+__name__|print\(|assert\s)", re.MULTILINE)


# ------------------------------------------------------------------------------------------------
# From a completion to the program that is tested (shared with the humaneval task).
# ------------------------------------------------------------------------------------------------
def _def_pattern(entry_point: str) -> re.Pattern:
    return re.compile(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", re.MULTILINE)


def assemble(prompt: str, completion: Any, entry_point: str) -> str:
    """The program to test for ``completion``, written after ``prompt`` (which ends in ``def entry_point(...):``).

    1. Self-report tags are removed, ``\\r\\n`` becomes ``\\n``, the text is cut to MAX_COMPLETION_CHARS.
    2. If it holds a fenced block (three backticks, optional language), only the first block is kept.
    3. **Whole-function form**: if its first non-blank line starts in column 0 and some line starts with
       ``def entry_point(``, the program is the prompt up to its own ``def entry_point`` line (imports,
       helpers) followed by the completion, cut before the first top-level ``if __name__``, ``print(``
       or ``assert`` line.
    4. **Body form** (otherwise): the completion is cut before its first non-blank line that starts in
       column 0, and appended to the prompt.
    """
    text = completion if isinstance(completion, str) else ""
    text = strip_self_report(text[: 2 * MAX_COMPLETION_CHARS]).replace("\r\n", "\n")[:MAX_COMPLETION_CHARS]
    if "```" in text and (fenced := _FENCE.search(text)):
        text = fenced.group(1) + "\n"
    first = next((line for line in text.split("\n") if line.strip()), "")
    if first and not first[0].isspace() and _def_pattern(entry_point).search(text):
        heads = list(_def_pattern(entry_point).finditer(prompt))
        header = prompt[: heads[-1].start()] if heads else prompt
        stop = _WHOLE_STOP.search(text)
        return header + (text[: stop.start()] if stop else text)
    return prompt + body_lines(text)


def body_lines(text: str) -> str:
    """The leading lines of ``text`` that are blank or indented (a function body), newline-terminated."""
    kept = []
    for line in text.split("\n"):
        if line.strip() and not line[:1].isspace():
            break
        kept.append(line)
    body = "\n".join(kept).rstrip()
    return body + "\n" if body else ""


class _PoolHolder:
    """One lazily created SandboxPool per task instance, for parallel verdicts."""

    def __init__(self, workers: int | None):
        self._workers, self._pool, self._lock = workers, None, threading.Lock()

    def get(self) -> SandboxPool:
        with self._lock:
            if self._pool is None:
                self._pool = SandboxPool(max_workers=self._workers or os.cpu_count() or 1)
            return self._pool


class SandboxedCodeTask:
    """Shared verifier of code tasks: ``problem.meta`` holds ``tests`` (top-level asserts) and ``entry_point``.

    ``sandbox_batch``: jobs per sandbox launch when many completions are scored at once (``verdicts_many``,
    ``score_many``, ``score_batch``); each job still runs in its own forked process with its own limits
    (docs/sandbox.md, "Batch mode"). 1 starts one sandbox per completion.
    """

    name = "code"
    multi_turn = False
    stop_sequences = STOP_SEQUENCES
    max_new_tokens = 40  # a synthetic problem's function body (character-level tiny models: one token a character)
    chat_stop_sequences: tuple[str, ...] = ()  # a chat answer is a fenced block, whose code holds the raw stops
    chat_max_new_tokens = 128  # a chat model's whole function in a fence (BPE tokens)
    timeout_s = 5.0
    memory_mb = 512

    def __init__(self, workers: int | None = None, sandbox_batch: int = BATCH_SIZE):
        if not (isinstance(sandbox_batch, int) and sandbox_batch >= 1):
            raise ConfigError(f"sandbox_batch must be an integer >= 1, got {sandbox_batch!r}")
        self._pool = _PoolHolder(workers)
        self.sandbox_batch = sandbox_batch

    def chat_prompt(self, problem: Problem) -> str:
        """The request for a chat model: the prompt (signature, docstring) in a fence, to be completed; the answer
        is the whole function in a fence (``assemble`` keeps the first fenced block)."""
        return ("Complete this Python function. Reply with only the complete function in a ```python code "
                f"block.\n\n```python\n{problem.prompt.rstrip()}\n```")

    def program(self, problem: Problem, completion: Any) -> str:
        """The source that is run against the hidden tests."""
        return assemble(problem.prompt, completion, problem.meta["entry_point"])

    def verdict(self, problem: Problem, completion: Any) -> Verdict:
        """The sandbox's verdict on the completion (status, passed, total)."""
        return _safe_run(self.program(problem, completion), problem.meta["tests"], self.timeout_s, self.memory_mb)

    def score(self, problem: Problem, completion: Any) -> float:
        """Fraction of hidden tests passed, in [0, 1]; junk output scores 0 and never raises.

        Raises ``SandboxError`` only if the sandbox itself cannot run (a broken machine, not a bad answer).
        """
        return _fraction(self.verdict(problem, completion))

    def verdicts_many(self, problems: Sequence[Problem], completions: Sequence[Any]) -> list[Verdict]:
        """Verdicts for many pairs, run in parallel in the task's sandbox pool (input order kept): in batches
        of ``sandbox_batch`` jobs per sandbox launch spread over the pool's workers, or one sandbox per job."""
        pool = self._pool.get()
        jobs = [(self.program(p, c), p.meta["tests"]) for p, c in zip(problems, completions)]
        limits = {"timeout_s": self.timeout_s, "memory_mb": self.memory_mb}
        if self.sandbox_batch <= 1:
            futures = [pool.submit(code, tests, **limits) for code, tests in jobs]
            out = []
            for future, (_, tests) in zip(futures, jobs):
                try:
                    out.append(future.result())
                except (ValueError, TypeError) as exc:
                    out.append(_refused(exc, tests))
            return out
        out: list[Verdict | None] = [None] * len(jobs)
        valid = []
        for i, (code, tests) in enumerate(jobs):
            try:
                check_job(code, tests, **limits)
                valid.append(i)
            except (ValueError, TypeError) as exc:
                out[i] = _refused(exc, tests)
        for i, verdict in zip(valid, pool.map_batched([jobs[i] for i in valid], self.sandbox_batch, **limits)):
            out[i] = verdict
        return out  # type: ignore[return-value]

    def score_many(self, problems: Sequence[Problem], completions: Sequence[Any]) -> list[float]:
        """``score`` for many pairs, in parallel."""
        return [_fraction(v) for v in self.verdicts_many(problems, completions)]

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[Any]) -> list[tuple[float, dict]]:
        """(reward, info) for many single-turn completions at once, as ``make_env().step`` would give each
        (the rollout scores a whole generated chunk with one call)."""
        return [(r, step_info(r, c)) for r, c in zip(self.score_many(problems, completions), completions)]

    def demonstration(self, problem: Problem) -> str:
        """The reference completion (body form)."""
        return problem.answer or ""

    def teacher_prompt(self, problem: Problem) -> str:
        """The prompt with a solved copy of it in front, for a self-teacher."""
        return f"{problem.prompt}{problem.answer}\n\n{problem.prompt}"

    def make_env(self) -> SingleTurnEnv:
        """A one-step environment whose reward is ``score``."""
        return SingleTurnEnv(self)


def _safe_run(code: str, tests: str, timeout_s: float, memory_mb: int) -> Verdict:
    """run_tests, with code the sandbox refuses to take counted as an error verdict (never a crash)."""
    try:
        return run_tests(code, tests, timeout_s=timeout_s, memory_mb=memory_mb)
    except (ValueError, TypeError) as exc:
        return _refused(exc, tests)


def _refused(exc: Exception, tests: str) -> Verdict:
    """The verdict for code the sandbox would not run: nothing passed."""
    return Verdict("error", 0, max(1, len(re.findall(r"^assert\b", tests, re.MULTILINE))), stderr=str(exc)[:400])


def _fraction(verdict: Verdict) -> float:
    return verdict.passed / verdict.total if verdict.total else 0.0


# ------------------------------------------------------------------------------------------------
# Synthetic families.
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """A templated function: ``doc`` and ``body`` are formatted with each parameter dict of ``grid``."""

    name: str
    arg: str  # "x" (int), "xs" (list of ints) or "s" (str)
    doc: str
    body: str
    fn: Callable[..., Any]  # trusted reference: fn(arg, **params)
    grid: tuple[dict, ...] = ({},)
    nonempty: bool = False  # inputs must be non-empty (max/min of a list)


def _ks(lo: int, hi: int) -> tuple[dict, ...]:
    return tuple({"k": k} for k in range(lo, hi + 1))


def _words(n: int, seed: str, length: tuple[int, int] = (1, 3)) -> tuple[dict, ...]:
    rng, out = random.Random(stable_hash(seed)), {}
    while len(out) < n:
        w = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(*length)))
        out[w] = {"w": w}
    return tuple(out.values())


def _pairs(letters: str) -> tuple[dict, ...]:
    return tuple({"a": a, "b": b} for a in letters for b in string.ascii_lowercase[:8] if a != b)


FAMILIES: tuple[Family, ...] = (
    # integers
    Family("add", "x", "add {k} to x", "return x + {k}", lambda x, k: x + k, _ks(1, 99)),
    Family("sub", "x", "subtract {k} from x", "return x - {k}", lambda x, k: x - k, _ks(1, 99)),
    Family("mul", "x", "multiply x by {k}", "return x * {k}", lambda x, k: x * k, _ks(2, 30)),
    Family("mod", "x", "remainder of x divided by {k}", "return x % {k}", lambda x, k: x % k, _ks(2, 30)),
    Family("div", "x", "x divided by {k} rounded down", "return x // {k}", lambda x, k: x // k, _ks(2, 30)),
    Family("affine", "x", "multiply x by {a} then add {b}", "return x * {a} + {b}", lambda x, a, b: x * a + b,
           tuple({"a": a, "b": b} for a in range(2, 10) for b in range(1, 13))),
    Family("max", "x", "the larger of x and {k}", "return max(x, {k})", lambda x, k: max(x, k), _ks(-10, 60)),
    Family("min", "x", "the smaller of x and {k}", "return min(x, {k})", lambda x, k: min(x, k), _ks(-10, 60)),
    Family("ismul", "x", "whether x is a multiple of {k}", "return x % {k} == 0", lambda x, k: x % k == 0, _ks(2, 20)),
    Family("gt", "x", "whether x is greater than {k}", "return x > {k}", lambda x, k: x > k, _ks(-10, 60)),
    Family("square", "x", "x squared", "return x * x", lambda x: x * x),
    Family("neg", "x", "x negated", "return -x", lambda x: -x),
    # lists of integers
    Family("ladd", "xs", "add {k} to each element of xs", "return [v + {k} for v in xs]",
           lambda xs, k: [v + k for v in xs], _ks(1, 40)),
    Family("lmul", "xs", "multiply each element of xs by {k}", "return [v * {k} for v in xs]",
           lambda xs, k: [v * k for v in xs], _ks(2, 20)),
    Family("lgt", "xs", "elements of xs greater than {k}", "return [v for v in xs if v > {k}]",
           lambda xs, k: [v for v in xs if v > k], _ks(0, 20)),
    Family("llt", "xs", "elements of xs less than {k}", "return [v for v in xs if v < {k}]",
           lambda xs, k: [v for v in xs if v < k], _ks(0, 20)),
    Family("lcount", "xs", "how many elements of xs equal {k}", "return xs.count({k})",
           lambda xs, k: xs.count(k), _ks(0, 9)),
    Family("lsumk", "xs", "sum of xs plus {k}", "return sum(xs) + {k}", lambda xs, k: sum(xs) + k, _ks(1, 40)),
    Family("lhead", "xs", "the first {k} elements of xs", "return xs[:{k}]", lambda xs, k: xs[:k], _ks(1, 5)),
    Family("ltail", "xs", "xs without its first {k} elements", "return xs[{k}:]", lambda xs, k: xs[k:], _ks(1, 5)),
    Family("lsum", "xs", "sum of xs", "return sum(xs)", lambda xs: sum(xs)),
    Family("lmax", "xs", "largest element of xs", "return max(xs)", lambda xs: max(xs), nonempty=True),
    Family("lmin", "xs", "smallest element of xs", "return min(xs)", lambda xs: min(xs), nonempty=True),
    Family("lrev", "xs", "xs reversed", "return xs[::-1]", lambda xs: xs[::-1]),
    Family("lsort", "xs", "xs sorted", "return sorted(xs)", lambda xs: sorted(xs)),
    Family("llen", "xs", "length of xs", "return len(xs)", lambda xs: len(xs)),
    # strings
    Family("srep", "s", "s repeated {k} times", "return s * {k}", lambda s, k: s * k, _ks(2, 6)),
    Family("sapp", "s", "s followed by '{w}'", "return s + '{w}'", lambda s, w: s + w, _words(60, "sapp")),
    Family("spre", "s", "'{w}' followed by s", "return '{w}' + s", lambda s, w: w + s, _words(60, "spre")),
    Family("scount", "s", "how many times '{w}' occurs in s", "return s.count('{w}')",
           lambda s, w: s.count(w), tuple({"w": c} for c in "abcdef")),
    Family("srepl", "s", "s with '{a}' replaced by '{b}'", "return s.replace('{a}', '{b}')",
           lambda s, a, b: s.replace(a, b), _pairs("abcde")),
    Family("shead", "s", "the first {k} characters of s", "return s[:{k}]", lambda s, k: s[:k], _ks(1, 6)),
    Family("stail", "s", "the last {k} characters of s", "return s[-{k}:]", lambda s, k: s[-k:], _ks(1, 6)),
    Family("sstart", "s", "whether s starts with '{w}'", "return s.startswith('{w}')",
           lambda s, w: s.startswith(w), tuple({"w": c} for c in "abcdef")),
    Family("srev", "s", "s reversed", "return s[::-1]", lambda s: s[::-1]),
    Family("supper", "s", "s in upper case", "return s.upper()", lambda s: s.upper()),
    Family("slen", "s", "length of s", "return len(s)", lambda s: len(s)),
)
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}


def _input(arg: str, rng: random.Random, nonempty: bool) -> Any:
    if arg == "x":
        return rng.randint(-20, 100)
    if arg == "xs":
        return [rng.randint(0, 20) for _ in range(rng.randint(1 if nonempty else 0, 6))]
    return "".join(rng.choice("abcde") for _ in range(rng.randint(1 if nonempty else 0, 8)))


def _tests(family: Family, params: dict, key: str, n: int) -> str:
    """``n`` top-level asserts on distinct inputs drawn with a seed derived from the problem id."""
    rng, seen, lines = random.Random(stable_hash("tests/" + key)), set(), []
    for _ in range(40 * n):
        value = _input(family.arg, rng, family.nonempty)
        if repr(value) in seen:
            continue
        seen.add(repr(value))
        lines.append(f"assert f({value!r}) == {family.fn(value, **params)!r}")
        if len(lines) == n:
            break
    return "\n".join(lines) + "\n"


def _param_key(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


@register_task("codegen")
class CodegenTask(SandboxedCodeTask):
    """Synthetic function-writing problems; held-out problems are unseen (family, parameter) pairs."""

    name = "codegen"
    timeout_s = 2.0
    memory_mb = 256

    def __init__(self, n_tests: int = 5, heldout_fraction: float = 0.2, families: Sequence[str] | None = None,
                 seed: int = 0, workers: int | None = None, sandbox_batch: int = BATCH_SIZE,
                 validation_fraction: float = 0.0):
        super().__init__(workers, sandbox_batch)
        self.validation_fraction = check_fraction("codegen", "validation_fraction", validation_fraction)
        if not 0.0 < heldout_fraction < 1.0:
            raise ConfigError(f"codegen heldout_fraction must be in (0, 1), got {heldout_fraction!r}")
        if not (isinstance(n_tests, int) and 1 <= n_tests <= 20):
            raise ConfigError(f"codegen n_tests must be an integer in 1..20, got {n_tests!r}")
        names = list(families) if families is not None else [f.name for f in FAMILIES]
        if isinstance(families, str):
            names = [n.strip() for n in families.split(",") if n.strip()]
        unknown = [n for n in names if n not in FAMILY_BY_NAME]
        if unknown or not names:
            raise ConfigError(f"unknown codegen families {unknown or names}; available: {', '.join(FAMILY_BY_NAME)}")
        self.families = [FAMILY_BY_NAME[n] for n in names]
        self.n_tests, self.heldout_fraction, self.seed = n_tests, heldout_fraction, seed
        self._cache: dict[str, list[Problem]] = {}

    def _build(self) -> None:
        salt = f"codegen/{self.seed}"
        splits: dict[str, list[Problem]] = {"train": [], "validation": [], "heldout": []}
        for family in self.families:
            for params in family.grid:
                pid = f"codegen:{family.name}" + (f":{_param_key(params)}" if params else "")
                prompt = f"# {family.doc.format(**params)}\ndef f({family.arg}):\n"
                answer = f"    {family.body.format(**params)}\n"
                meta = {"tests": _tests(family, params, pid, self.n_tests), "entry_point": "f",
                        "family": family.name, "params": dict(params)}
                split = "heldout" if in_heldout(pid, self.heldout_fraction, salt) else "train"
                splits[split].append(Problem(id=pid, prompt=prompt, answer=answer, meta=meta))
        for split, items in splits.items():
            random.Random(stable_hash(f"{salt}/{split}/order")).shuffle(items)
        splits["train"], splits["validation"] = carve_validation(splits["train"], self.validation_fraction, salt)
        self._cache = splits

    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split``: deterministic, and disjoint across splits (validation: the share
        ``validation_fraction`` of the train side, none by default)."""
        check_split(split)
        if not self._cache:
            self._build()
        return list(nonempty_split(self.name, split, self._cache[split], VALIDATION_HINT.format(task=self.name)))
