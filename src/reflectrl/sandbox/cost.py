"""The measured cost of a verdict with a backend: a few honest jobs, timed now, on this machine."""

from __future__ import annotations

import time

from .backends import select
from .base import SandboxError
from .batch import batchable
from .pool import SandboxPool
from .run import run_tests

COST_CODE = "def add(a, b):\n    return a + b\n"
COST_TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\n"


def verdict_cost(backend: str | None = None, batched: int = 16, single: int = 3) -> dict:
    """Milliseconds per verdict for trivial jobs: ``batched`` jobs in one batch on a kept runner of a
    one-worker ``SandboxPool`` (its launch not counted: a pool launches runners ahead of use), and
    ``single`` jobs one sandbox each (``run_tests``). Where the backend cannot batch, the batched jobs
    also run one sandbox each, as a pool would run them. A rough figure of this machine and its load."""
    if not (isinstance(batched, int) and isinstance(single, int) and batched >= 2 and single >= 1):
        raise ValueError(f"need at least 2 batched and 1 single verdicts, got {batched!r} and {single!r}")
    chosen = select(backend)
    jobs = [(COST_CODE, COST_TESTS)] * batched
    with SandboxPool(max_workers=1, warm_slots=batched + 2, backend=chosen.name) as pool:
        _expect_passed(pool.map_batched(jobs[:2], batch_size=2))  # launches the runner the timed batch uses
        start = time.perf_counter()
        _expect_passed(pool.map_batched(jobs, batch_size=batched))
        batch_ms = (time.perf_counter() - start) * 1000 / batched
    start = time.perf_counter()
    _expect_passed([run_tests(COST_CODE, COST_TESTS, backend=chosen.name) for _ in range(single)])
    single_ms = (time.perf_counter() - start) * 1000 / single
    return {"batched_ms": round(batch_ms, 2), "one_per_sandbox_ms": round(single_ms, 2),
            "batch_mode": batchable(chosen), "verdicts": {"batched": batched, "one_per_sandbox": single}}


def _expect_passed(verdicts: list) -> None:
    """A measurement counts only if the trivial jobs really passed."""
    bad = [v.status for v in verdicts if v.status != "passed"]
    if bad:
        raise SandboxError(f"cost measurement: trivial jobs ended {sorted(set(bad))}, not passed")
