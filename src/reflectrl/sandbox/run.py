"""The entry points that run jobs: one job per sandbox, or many jobs per sandbox launch."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from .backends import select
from .base import Backend, SandboxError
from .batch import BATCH_MAX, BATCH_SIZE, batchable, execute_batch
from .launch import execute
from .verdicts import Verdict, check_args, check_jobs, parse_tests

log = logging.getLogger(__name__)

def run_tests(code: str, tests: str, timeout_s: float = 5.0, memory_mb: int = 512, *, backend: str | None = None,
              max_output_bytes: int = 4096, max_processes: int = 64) -> Verdict:
    """Run `code`, then each top-level assert of `tests` in its namespace, in a sandboxed child process.

    `timeout_s` bounds the wall time of code + tests (interpreter start-up excluded); `backend` forces
    'bwrap', 'unshare' or 'none' (default: strongest available, or $REFLECTRL_SANDBOX_BACKEND).
    """
    check_args(code, tests, timeout_s, memory_mb, max_output_bytes, max_processes)
    parse_tests(tests)
    chosen = select(backend)
    return execute(chosen, code, tests, float(timeout_s), memory_mb, max_output_bytes, max_processes)[0]


def batch_supported(backend: str | None = None) -> bool:
    """Whether `run_tests_batch` really batches with this backend (else it runs one sandbox per job)."""
    return batchable(select(backend))


def run_tests_batch(jobs: Iterable[tuple[str, str]], timeout_s: float = 5.0, memory_mb: int = 512, *,
                    backend: str | None = None, max_output_bytes: int = 4096, max_processes: int = 64,
                    batch_size: int = BATCH_SIZE) -> list[Verdict]:
    """`run_tests` for many (code, tests) pairs, ``batch_size`` jobs per sandbox launch; input order kept.

    Each job still runs in its own freshly forked process with its own limits, work dir, nonce and result
    channel (see docs/sandbox.md, "Batch mode"). Jobs the batch cannot vouch for (the runner was killed or
    stopped) are rerun one per sandbox, so every verdict is the job's own. Backends without a PID namespace
    (``none``) always run one sandbox per job. Bad arguments raise like `run_tests`, naming the job.
    """
    jobs = list(jobs)
    check_jobs(jobs, timeout_s, memory_mb, max_output_bytes, max_processes)
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    chosen = select(backend)
    verdicts: list[Verdict | None] = [None] * len(jobs)
    size = min(batch_size, BATCH_MAX)
    for start in range(0, len(jobs), size):
        chunk = jobs[start:start + size]
        if len(chunk) < 2 or not batchable(chosen):
            continue
        try:
            verdicts[start:start + len(chunk)] = execute_batch(chosen, chunk, float(timeout_s), memory_mb,
                                                               max_output_bytes, max_processes)
        except (SandboxError, OSError) as exc:
            log.warning("sandbox batch (%s) failed: %s; running its jobs one per sandbox", chosen.name, exc)
    return rerun_alone(chosen, jobs, verdicts, float(timeout_s), memory_mb, max_output_bytes, max_processes)


def rerun_alone(backend: Backend, jobs: list[tuple[str, str]], verdicts: list[Verdict | None], timeout_s: float,
                memory_mb: int, max_bytes: int, max_processes: int) -> list[Verdict]:
    """Fill each verdict a batch could not vouch for (None) with the job's own single-sandbox run."""
    for i, verdict in enumerate(verdicts):
        if verdict is None:
            code, tests = jobs[i]
            verdicts[i] = execute(backend, code, tests, timeout_s, memory_mb, max_bytes, max_processes)[0]
    return verdicts  # type: ignore[return-value]
