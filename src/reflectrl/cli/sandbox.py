"""``reflectrl sandbox``: run untrusted code against assert tests, or show the protections in force.

``run`` prints one JSON verdict as its last line and exits 0 whatever the status; bad input ends in
one ``error: ...`` line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

from ..sandbox.backends import sandbox_backend, sandbox_capabilities
from ..sandbox.base import BACKENDS, SandboxError
from ..sandbox.cost import verdict_cost
from ..sandbox.run import run_tests


class _UsageError(Exception):
    """Bad command-line input (reported as one line, exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing usage and exiting."""

    def error(self, message: str) -> None:
        raise _UsageError(message)


def _positive(kind):
    """argparse type: a positive number of the given kind."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _parser() -> _Parser:
    """The `run` and `capabilities` sub-commands."""
    ap = _Parser(prog="reflectrl sandbox", description="Run untrusted Python code against assert tests, sandboxed.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run code against tests; prints a JSON verdict as its last line")
    run.add_argument("--code", required=True, metavar="FILE", help="file with the untrusted code")
    run.add_argument("--tests", required=True, metavar="FILE", help="file of top-level asserts, one test each")
    run.add_argument("--timeout", type=_positive(float), default=5.0, metavar="S", help="wall-time limit (default 5)")
    run.add_argument("--memory-mb", type=_positive(int), default=512, metavar="M",
                     help="address-space limit in MiB (default 512)")
    run.add_argument("--backend", choices=("auto", *BACKENDS), default=None, help="force an isolation backend")
    caps = sub.add_parser("capabilities", help="print the protections in force and the measured cost of a "
                                                  "verdict as JSON")
    caps.add_argument("--backend", choices=("auto", *BACKENDS), default=None, help="inspect a given backend")
    return ap


def _read(path: str, what: str) -> str:
    """Text of a UTF-8 file, or a usage error naming the file."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _UsageError(f"{what} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _UsageError(f"cannot read {what} file {path}: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    """Run the code and print the verdict as JSON."""
    code, tests = _read(args.code, "code"), _read(args.tests, "tests")
    try:
        verdict = run_tests(code, tests, timeout_s=args.timeout, memory_mb=args.memory_mb, backend=args.backend)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    print(verdict.to_json())
    return 0


def _capabilities(args: argparse.Namespace) -> int:
    """Print the backend, the protections in force and the measured cost of a verdict."""
    report = {"backend": sandbox_backend(args.backend), "protections": sandbox_capabilities(args.backend)}
    cost = verdict_cost(args.backend)
    report["cost_per_verdict"] = {**cost, "measured": cost_label(cost)}
    print(json.dumps(report))
    return 0


def cost_label(cost: dict) -> str:
    """What the cost figures of ``verdict_cost`` are, in one sentence."""
    n = cost["verdicts"]
    how = "in one batch on a kept runner" if cost["batch_mode"] else "one sandbox each, as this backend cannot batch"
    return (f"milliseconds per verdict of trivial jobs, measured just now on this machine: {n['batched']} through "
            f"SandboxPool.map_batched ({how}; batched_ms) and {n['one_per_sandbox']} through run_tests (one sandbox "
            "each; one_per_sandbox_ms); rough figures that depend on the backend, the machine and its load")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``reflectrl sandbox``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *a, **k: print(f"warning: {message}", file=sys.stderr)
        try:
            return _run(args) if args.command == "run" else _capabilities(args)
        except _UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except SandboxError as exc:
            print(f"error: sandbox unavailable: {exc}", file=sys.stderr)
            return 1
