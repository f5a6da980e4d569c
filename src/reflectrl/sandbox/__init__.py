"""Run untrusted, model-generated Python code against assert-style tests in an isolated child process.

The strongest isolation the OS offers is chosen at runtime (bubblewrap, then ``unshare``, then plain
rlimits); see ``docs/sandbox.md`` for the threat model and ``sandbox_capabilities()`` for what holds.

Modules: ``base`` (errors, the backend record), ``backends`` (probe, choice, protections), ``launch``
(one sandboxed run), ``uids`` (dedicated uids), ``channel`` (the result channel), ``verdicts``,
``batch`` (many jobs per launch), ``run`` (the entry points), ``pool`` (``SandboxPool``), ``cost``
(the measured cost of a verdict), ``cli`` (``reflectrl sandbox``) and ``runner`` (the programs that
run inside the sandbox).
"""

from __future__ import annotations

from .backends import sandbox_backend, sandbox_capabilities
from .base import BACKENDS, SandboxError, SandboxWarning
from .batch import BATCH_SIZE
from .pool import SandboxPool
from .run import batch_supported, run_tests, run_tests_batch
from .verdicts import STATUSES, Verdict, check_job

__all__ = [
    "BACKENDS",
    "BATCH_SIZE",
    "STATUSES",
    "SandboxError",
    "SandboxPool",
    "SandboxWarning",
    "Verdict",
    "batch_supported",
    "check_job",
    "run_tests",
    "run_tests_batch",
    "sandbox_backend",
    "sandbox_capabilities",
]
