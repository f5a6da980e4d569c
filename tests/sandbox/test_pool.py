"""SandboxPool: parallel verdicts, batches spread over workers, batch runners kept between calls."""

from __future__ import annotations

import time

import pytest

from reflectrl.sandbox import SandboxPool, run_tests_batch, runner
from reflectrl.sandbox import pool as pool_module
from reflectrl.sandbox.batch import BatchRunner

from .helpers import MIXED_JOBS, SOLUTION, TESTS, WRONG, counts, fork_bomb, leftover_jobs, require, running_with

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(60)]


def test_pool_map_and_submit():
    with SandboxPool(max_workers=2, timeout_s=5) as pool:
        verdicts = pool.map([(SOLUTION, TESTS), (WRONG, TESTS), ("def add(", TESTS), (SOLUTION, TESTS)])
        future = pool.submit("while True: pass", TESTS, timeout_s=0.3)
        assert [v.status for v in verdicts] == ["passed", "failed", "error", "passed"]
        assert future.result().status == "timeout"


def test_pool_map_batched():
    with SandboxPool(max_workers=2, timeout_s=5) as pool:
        items = [(SOLUTION, TESTS), (WRONG, TESTS), ("def add(", TESTS)] * 3
        verdicts = pool.map_batched(items, batch_size=4)
        assert [v.status for v in verdicts] == ["passed", "failed", "error"] * 3
        assert pool.submit_batch([(SOLUTION, TESTS)]).result()[0].status == "passed"


class _CountingRunner(BatchRunner):
    launched = 0

    def __init__(self, *args, **kw):
        type(self).launched += 1
        super().__init__(*args, **kw)


def _warm_pool(monkeypatch, slots, **kw):
    counting = type("Counting", (_CountingRunner,), {"launched": 0})
    monkeypatch.setattr(pool_module, "BatchRunner", counting)
    return SandboxPool(max_workers=1, warm_slots=slots, **kw), counting


def test_warm_pool_keeps_runners_between_calls_with_the_same_verdicts(batch_backend, monkeypatch):
    """A kept runner serves successive calls; when its slots are used up a fresh one is launched at
    once; every verdict equals the one-launch-per-batch verdict."""
    jobs = MIXED_JOBS[:4] + MIXED_JOBS[7:9]
    kw = {"timeout_s": 1.0, "memory_mb": 128, "backend": batch_backend}
    cold = [counts(v) for v in run_tests_batch(jobs, batch_size=len(jobs), **kw)]
    pool, counting = _warm_pool(monkeypatch, 12, **kw)
    with pool:
        for call in range(3):
            assert [counts(v) for v in pool.map_batched(jobs, batch_size=len(jobs))] == cold
            assert counting.launched == (1 if call == 0 else 2)  # the successor comes after call 2
            kept = pool._idle[0]
            assert len(pool._idle) == 1 and kept.used == (6, 0, 6)[call]
    assert pool._idle == []  # shutdown closed it
    assert kept.proc.poll() is not None


def test_warm_runner_leftovers_do_not_reach_the_next_call(batch_backend, monkeypatch):
    marker, leave, look = leftover_jobs()
    pool, counting = _warm_pool(monkeypatch, 8, timeout_s=5.0, backend=batch_backend)
    with pool:
        first = pool.map_batched([leave, look], batch_size=2)
        time.sleep(0.3)  # the runner idles between calls
        second = pool.map_batched([look, look], batch_size=2)
    assert counting.launched == 1
    assert [counts(v) for v in first + second] == [("passed", 4, 4)] + [("passed", 6, 6)] * 3
    assert running_with(marker) == []


def test_warm_runner_fork_bomb_then_clean_call(batch_backend, monkeypatch):
    require(batch_backend, "process_limit")
    marker, bomb = fork_bomb()
    pool, _ = _warm_pool(monkeypatch, 8, timeout_s=1.0, max_processes=32, backend=batch_backend)
    with pool:
        first = pool.map_batched([(bomb, "assert bomb()"), (SOLUTION, TESTS)], batch_size=2)
        second = pool.map_batched([(SOLUTION, TESTS), (WRONG, TESTS)], batch_size=2)
    assert [v.status for v in first + second] == ["timeout", "passed", "passed", "failed"]
    assert running_with(marker) == []


def test_warm_runner_death_falls_back_and_is_not_kept(batch_backend, monkeypatch):
    dying = runner.BATCH.replace('        say(f"end ', '        if index == 1:\n            os._exit(1)\n'
                                 '        say(f"end ', 1)
    monkeypatch.setattr(runner, "BATCH", dying)
    pool, counting = _warm_pool(monkeypatch, 8, backend=batch_backend)
    with pool:
        jobs = [(SOLUTION, TESTS), (SOLUTION, TESTS), (WRONG, TESTS)]
        assert [v.status for v in pool.map_batched(jobs, batch_size=3)] == ["passed", "passed", "failed"]
        assert pool._idle == [] and counting.launched == 1  # the broken runner is closed, not replaced
        assert [v.status for v in pool.map_batched(jobs[::-1], batch_size=3)] == ["failed", "passed", "passed"]
        assert counting.launched == 2
