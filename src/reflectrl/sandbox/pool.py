"""``SandboxPool``: parallel verdicts on a thread pool, with batch runners kept between calls."""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from .backends import select
from .base import SandboxError
from .batch import BATCH_SIZE, BatchRunner, batch_key, batchable, verdicts_of
from .batch import warm_slots as default_warm_slots
from .run import rerun_alone, run_tests, run_tests_batch
from .verdicts import Verdict, check_jobs

log = logging.getLogger(__name__)

_POOLS: weakref.WeakSet[SandboxPool] = weakref.WeakSet()


@atexit.register
def _close_kept_runners() -> None:
    for pool in list(_POOLS):
        pool.close_runners()


class SandboxPool:
    """Parallel verdicts: a thread pool, each thread driving one sandboxed subprocess (or batch) at a time.

    With ``warm=True`` (default) batches go to batch runners the pool keeps between calls: a runner
    serves up to ``warm_slots`` jobs over successive calls, and when it is used up a replacement is
    launched at once, so it comes up while the caller does other work (see docs/sandbox.md, "Batch
    mode"). ``warm=False`` makes one sandbox launch per batch."""

    def __init__(self, max_workers: int | None = None, warm: bool = True, warm_slots: int | None = None,
                 **run_kwargs):
        self._kwargs = run_kwargs
        self.max_workers = max_workers or os.cpu_count() or 1
        self._executor = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="reflectrl-sandbox")
        self.warm = warm
        self.warm_slots = warm_slots or default_warm_slots(self.max_workers)
        self._idle: list[BatchRunner] = []
        self._idle_lock = threading.Lock()
        self._closed = False
        _POOLS.add(self)

    def submit(self, code: str, tests: str, **run_kwargs) -> Future:
        """Schedule one run; the Future resolves to a Verdict."""
        return self._executor.submit(run_tests, code, tests, **{**self._kwargs, **run_kwargs})

    def submit_batch(self, jobs: Sequence[tuple[str, str]], **run_kwargs) -> Future:
        """Schedule `run_tests_batch` on one worker; the Future resolves to a list of Verdicts."""
        kwargs = {**self._kwargs, **run_kwargs}
        if self.warm:
            return self._executor.submit(self._run_warm, list(jobs), kwargs)
        return self._executor.submit(run_tests_batch, list(jobs), **kwargs)

    def _run_warm(self, jobs: list[tuple[str, str]], kwargs: dict) -> list[Verdict]:
        """`run_tests_batch` on a kept runner (same checks, same verdicts, same fallback to one per job)."""
        kw = {"timeout_s": 5.0, "memory_mb": 512, "max_output_bytes": 4096, "max_processes": 64, **kwargs}
        backend_name, batch_size = kw.pop("backend", None), kw.pop("batch_size", BATCH_SIZE)
        chosen = select(backend_name)
        if len(jobs) < 2 or len(jobs) > min(batch_size, self.warm_slots) or not batchable(chosen) or self._closed:
            return run_tests_batch(jobs, backend=backend_name, batch_size=batch_size, **kw)
        check_jobs(jobs, kw["timeout_s"], kw["memory_mb"], kw["max_output_bytes"], kw["max_processes"])
        timeout_s, memory_mb = float(kw["timeout_s"]), kw["memory_mb"]
        key = (batch_key(chosen), timeout_s, memory_mb, kw["max_output_bytes"], kw["max_processes"])
        verdicts: list[Verdict | None] = [None] * len(jobs)
        try:
            runner = self._take(key, len(jobs)) or BatchRunner(chosen, self.warm_slots, timeout_s, memory_mb,
                                                               kw["max_output_bytes"], kw["max_processes"])
        except (SandboxError, OSError) as exc:
            log.warning("sandbox batch (%s) failed: %s; running its jobs one per sandbox", chosen.name, exc)
            runner = None
        if runner is not None:
            try:
                verdicts = verdicts_of(runner.run(jobs), jobs)
            except (SandboxError, OSError) as exc:
                log.warning("sandbox batch (%s) failed: %s; running its jobs one per sandbox", chosen.name, exc)
                runner.broken = True
            finally:
                self._give_back(runner, len(jobs))
        return rerun_alone(chosen, jobs, verdicts, timeout_s, memory_mb, kw["max_output_bytes"], kw["max_processes"])

    def _take(self, key: tuple, n: int) -> BatchRunner | None:
        """An idle runner for these limits with room for ``n`` jobs; one of them with too little room
        left is closed (calls this size would never use it)."""
        found, stale = None, []
        with self._idle_lock:
            for r in list(self._idle):
                if r.key == key and found is None and r.free >= n:
                    found = r
                    self._idle.remove(r)
                elif r.key == key and r.free < n:
                    stale.append(r)
                    self._idle.remove(r)
        for r in stale:
            r.close()
        return found

    def _give_back(self, runner: BatchRunner, n: int) -> None:
        """Keep a runner with room for another call like this one; else close it and launch its successor."""
        if runner.broken:
            runner.report_failure()
        if runner.free >= n and not self._closed:
            with self._idle_lock:
                self._idle.append(runner)
            return
        runner.close()
        if runner.broken or self._closed:
            return
        try:
            fresh = BatchRunner(runner.backend, self.warm_slots, *runner.key[1:])
        except (SandboxError, OSError):
            return  # the next call launches one (and reports what fails)
        with self._idle_lock:
            if not self._closed:
                self._idle.append(fresh)
                return
        fresh.close()

    def close_runners(self) -> None:
        """Close the kept batch runners (the pool stays usable; later batches launch new ones)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for r in idle:
            r.close()

    def map(self, items: Iterable[tuple[str, str]]) -> list[Verdict]:
        """Verdicts for (code, tests) pairs, in input order."""
        futures = [self.submit(code, tests) for code, tests in items]
        return [f.result() for f in futures]

    def map_batched(self, items: Iterable[tuple[str, str]], batch_size: int = BATCH_SIZE,
                    **run_kwargs) -> list[Verdict]:
        """Verdicts for (code, tests) pairs in batches of at most `batch_size` jobs per sandbox launch,
        spread over the workers (smaller batches when there are few jobs); input order kept."""
        items = list(items)
        if not items:
            return []
        size = max(1, min(batch_size, math.ceil(len(items) / self.max_workers)))
        futures = [self.submit_batch(items[i:i + size], batch_size=size, **run_kwargs)
                   for i in range(0, len(items), size)]
        return [v for f in futures for v in f.result()]

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work; optionally wait for running verdicts; close the kept batch runners."""
        self._closed = True
        self._executor.shutdown(wait=wait)
        self.close_runners()

    def __enter__(self) -> SandboxPool:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
