"""``experiments.runner._run_cli`` in this process, for the top-level test modules (``from cli_helpers import ...``)."""

import contextlib
import io
import shlex
import time
from pathlib import Path


def in_process_cli(args: list[str], log: Path, capture: bool = False) -> tuple[int, str, float]:
    """``experiments.runner._run_cli`` in this process: the same command through ``reflectrl.cli.main``, its output
    appended to ``log``; ``(exit status, stdout if capture else "", seconds)``."""
    from reflectrl.cli import main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    with open(log, "a") as fh:
        fh.write(f"\n$ reflectrl {shlex.join(args)}\n{err.getvalue()}{out.getvalue()}")
    return rc, out.getvalue() if capture else "", time.perf_counter() - t0
