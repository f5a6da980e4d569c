"""Verdicts: the tests' shape, the checks on a job's arguments, and the status read from validated records."""

from __future__ import annotations

import ast
import json
import math
import signal
import threading
from dataclasses import asdict, dataclass

from .channel import Outcome

STATUSES = ("passed", "failed", "error", "timeout", "memory", "killed")


@dataclass
class Verdict:
    """Outcome of running code against tests; ``passed`` counts only results the parent validated."""

    status: str
    passed: int
    total: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain-dict form (JSON-serialisable)."""
        return asdict(self)

    def to_json(self) -> str:
        """One-line JSON form."""
        return json.dumps(self.to_dict())


# CPython 3.11 before 3.11.8 keeps the AST constructor's recursion depth in shared state, so `ast.parse`
# from two threads at once can fail with "AST constructor recursion depth mismatch" (SystemError;
# CPython issue gh-106905): the pool's batch threads parse under one lock.
_AST_LOCK = threading.Lock()


def parse_tests(tests: str) -> tuple[list[int], int]:
    """Positions of the top-level `assert` statements in `tests` (each one is a test), and the statement count."""
    try:
        with _AST_LOCK:
            body = ast.parse(tests).body
    except SyntaxError as exc:
        raise ValueError(f"tests do not parse: {exc.msg} (line {exc.lineno})") from None
    indices = [i for i, stmt in enumerate(body) if isinstance(stmt, ast.Assert)]
    if not indices:
        raise ValueError("tests contain no top-level assert statement")
    return indices, len(body)


def verdict(outcome: Outcome, assert_indices: list[int], n_statements: int) -> Verdict:
    """Status and counts from the validated records only (never from stdout)."""
    chan = outcome.channel
    results = [chan.get("test", i) for i in assert_indices]
    passed = sum(1 for r in results if r and r[0])
    define = chan.get("define")
    excs = [r[1] for r in [*results, define] if r and not r[0]]
    died = chan.get("done", n_statements) is None
    xcpu = outcome.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU)
    if "MemoryError" in excs or (died and b"MemoryError" in bytes(outcome.stderr.data)):
        status = "memory"
    elif outcome.timed_out or (died and xcpu):
        status = "timeout"
    elif define is not None and not define[0]:
        status = "error"
    elif died:
        status = "killed"
    else:
        status = "passed" if passed == len(assert_indices) else "failed"
    return Verdict(status, passed, len(assert_indices), outcome.stdout.text(), outcome.stderr.text(),
                   round(outcome.duration_s, 4))


def check_args(code: str, tests: str, timeout_s: float, memory_mb: int, max_output_bytes: int,
               max_processes: int) -> None:
    """Reject bad arguments with a clear ValueError/TypeError."""
    if not isinstance(code, str) or not isinstance(tests, str):
        raise TypeError("code and tests must be str")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
    sizes = {"memory_mb": memory_mb, "max_output_bytes": max_output_bytes, "max_processes": max_processes}
    for name, value in sizes.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if "\x00" in tests:
        raise ValueError("tests contain a NUL byte")


def check_job(code: str, tests: str, timeout_s: float = 5.0, memory_mb: int = 512, *, max_output_bytes: int = 4096,
              max_processes: int = 64) -> None:
    """Raise the ValueError/TypeError that `run_tests` would raise for these arguments (nothing is run)."""
    check_args(code, tests, timeout_s, memory_mb, max_output_bytes, max_processes)
    parse_tests(tests)


def check_jobs(jobs: list, timeout_s: float, memory_mb: int, max_output_bytes: int, max_processes: int) -> None:
    """`check_job` for each (code, tests) pair; the error names the job."""
    for i, job in enumerate(jobs):
        try:
            code, tests = job
            check_job(code, tests, timeout_s, memory_mb, max_output_bytes=max_output_bytes,
                      max_processes=max_processes)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"job {i}: {exc}") from None
