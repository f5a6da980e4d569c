"""Batch mode: many jobs per sandbox launch, each job's verdict its own; leftovers never reach the next job."""

from __future__ import annotations

import os
import random
import textwrap
import time

import pytest

from reflectrl.sandbox import backends, batch_supported, run_tests, run_tests_batch, runner
from reflectrl.sandbox import batch as batch_module
from reflectrl.sandbox.batch import BatchRunner, verdicts_of

from .helpers import (
    MIXED_JOBS,
    SOLUTION,
    TESTS,
    WRONG,
    available,
    batch_only,
    counts,
    fork_bomb,
    leftover_jobs,
    require,
    running_with,
)

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(60)]


def test_batch_verdicts_equal_single_runs(backend):
    kw = {"timeout_s": 1.0, "memory_mb": 128, "backend": backend}
    batch = run_tests_batch(MIXED_JOBS, batch_size=len(MIXED_JOBS), **kw)
    single = [run_tests(code, tests, **kw) for code, tests in MIXED_JOBS]
    assert [counts(v) for v in batch] == [counts(v) for v in single]
    assert [v.status for v in batch] == ["passed", "failed", "error", "error", "timeout", "timeout", "memory",
                                         "passed", "killed", "passed"]
    huge = batch[7]
    assert len(huge.stdout) < 4200 and len(huge.stderr) < 4200 and "truncated" in huge.stdout
    assert batch[0].stdout == "" and all(v.duration_s > 0 for v in batch)


def test_batch_runs_without_fallback_and_keeps_order(batch_backend):
    jobs = [(SOLUTION if i % 3 else WRONG, TESTS) for i in range(7)]
    verdicts = batch_only(jobs, batch_backend)
    assert None not in verdicts
    assert [v.status for v in verdicts] == ["failed" if i % 3 == 0 else "passed" for i in range(7)]


def test_batch_bad_job_raises_naming_it():
    with pytest.raises(ValueError, match="job 1"):
        run_tests_batch([(SOLUTION, TESTS), (SOLUTION, "x = 1")])
    with pytest.raises(ValueError):
        run_tests_batch([(SOLUTION, TESTS)], batch_size=0)
    assert run_tests_batch([]) == []

def test_batch_leftover_processes_and_files_do_not_reach_the_next_job(batch_backend):
    marker, leave, look = leftover_jobs()
    verdicts = batch_only([leave, look, look], batch_backend)
    assert [counts(v) for v in verdicts] == [("passed", 4, 4), ("passed", 6, 6), ("passed", 6, 6)]
    assert running_with(marker) == []


def test_batch_fork_bomb_then_clean_job(batch_backend):
    require(batch_backend, "process_limit")
    marker, bomb = fork_bomb()
    verdicts = batch_only([(bomb, "assert bomb()"), (SOLUTION, TESTS)], batch_backend, timeout_s=1.0,
                           max_processes=32)
    assert [v.status for v in verdicts] == ["timeout", "passed"]
    assert running_with(marker) == []


def test_batch_ipc_objects_do_not_outlive_a_job(batch_backend):
    key = 0x5EED0000 + random.randrange(1 << 16)
    code = SOLUTION + textwrap.dedent(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def shm(flags):
            return libc.shmget({key}, 4096, flags)
        def mq_create():
            return libc.mq_open(b"/reflectrl-{key}", 0o100 | 2, 0o600, None)
    """)
    first = (code, TESTS + "assert shm(0o1000 | 0o600) >= 0\nassert mq_create() < 0\n")  # IPC_CREAT | mode
    second = (code, TESTS + "assert shm(0) < 0\n")
    assert [counts(v) for v in batch_only([first, second], batch_backend)] == [("passed", 5, 5), ("passed", 4, 4)]


def test_batch_job_cannot_reach_the_runner_or_forge_the_next_verdict(batch_backend):
    peek = SOLUTION + textwrap.dedent("""
        import os
        def readable():
            found, runner = [], os.getppid()
            for what in ("fd", "mem", "environ", "maps"):
                path = f"/proc/{runner}/{what}"
                try:
                    os.listdir(path) if what == "fd" else open(path, "rb").read(1)
                    found.append(what)
                except OSError:
                    pass
            return found
        if os.fork() == 0:  # keeps writing forged records to every descriptor it has
            import time
            while True:
                for fd in range(256):
                    for nonce in ("0" * 32, "f" * 32):
                        for line in ("setup 0 1 -", "define 0 1 -", "test 0 1 -", "test 1 1 -", "test 2 1 -",
                                     "done 3 1 -"):
                            try:
                                os.write(fd, (nonce + " " + line + "\\n").encode())
                            except OSError:
                                pass
                time.sleep(0.001)
    """)
    verdicts = batch_only([(peek, TESTS + "assert readable() == []\n"), (WRONG, TESTS), (WRONG, TESTS)],
                           batch_backend)
    assert [counts(v) for v in verdicts] == [("passed", 4, 4), ("failed", 2, 3), ("failed", 2, 3)]


def test_batch_job_attacking_the_runner_never_gives_a_pass(batch_backend):
    attack = textwrap.dedent("""
        import os, signal
        def attack():
            for fn in (lambda: os.kill(os.getppid(), signal.SIGKILL), lambda: os.kill(-1, signal.SIGKILL),
                       lambda: os.kill(os.getppid(), signal.SIGSTOP), lambda: os.kill(1, signal.SIGKILL)):
                try:
                    fn()
                except OSError:
                    pass
            return True
    """)
    jobs = [(SOLUTION, TESTS), (attack, "assert attack()"), (WRONG, TESTS), (SOLUTION, TESTS), (WRONG, TESTS)]
    raw = batch_only(jobs, batch_backend, timeout_s=2.0)
    truth = ["passed", None, "failed", "passed", "failed"]
    for got, want in zip(raw[2:], truth[2:]):
        assert got is None or got.status == want  # the rest: their own verdict, or "rerun me"
    assert [v.status for v in run_tests_batch(jobs, timeout_s=2.0, backend=batch_backend)][2:] == truth[2:]


def test_batch_runner_death_makes_the_rest_fall_back(batch_backend, monkeypatch):
    # a runner that dies after job 1 ran (its records all say "passed") but before reporting it
    dying = runner.BATCH.replace('        say(f"end ', '        if index == 1:\n            os._exit(1)\n'
                                 '        say(f"end ', 1)
    assert dying != runner.BATCH
    monkeypatch.setattr(runner, "BATCH", dying)
    jobs = [(SOLUTION, TESTS), (SOLUTION, TESTS), (SOLUTION, TESTS), (WRONG, TESTS)]
    raw = batch_only(jobs, batch_backend)
    assert raw[0].status == "passed" and raw[1:] == [None, None, None]
    assert [v.status for v in run_tests_batch(jobs, backend=batch_backend)] == ["passed"] * 3 + ["failed"]


def test_batch_falls_back_to_one_sandbox_per_job_without_pid_namespace():
    if not available("none"):
        pytest.skip("backend none unavailable")
    assert not batch_supported("none")
    verdicts = run_tests_batch([(SOLUTION, TESTS), (WRONG, TESTS)], backend="none")
    assert [v.status for v in verdicts] == ["passed", "failed"]


def _pipe_inodes(pid: int) -> set[int]:
    """Inodes of the pipes process `pid` holds open."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:["):
            found.add(int(target[6:-1]))
    return found


def test_namespace_wrapper_holds_no_job_pipe(batch_backend):
    """Only the runner holds a job's pipe ends (the wrapper never gets them), so they reach end-of-file
    as soon as the runner closes them after the job."""
    batch = BatchRunner(backends.select(batch_backend), 4, 5.0, 512, 4096, 64)
    try:
        assert [counts(st) for st in verdicts_of(batch.run([(SOLUTION, TESTS)] * 2), [(SOLUTION, TESTS)] * 2)] \
            == [("passed", 3, 3)] * 2
        job_pipes = {os.fstat(fd).st_ino for triple in batch.job_fds for fd in triple}
        assert job_pipes and not job_pipes & _pipe_inodes(batch.proc.pid)
    finally:
        batch.close()


def test_batch_call_returns_when_its_jobs_end(batch_backend, monkeypatch):
    """A call ends when its jobs' pipes close, not after the grace time allowed for a stuck runner."""
    monkeypatch.setattr(batch_module, "GRACE_S", 30.0)
    batch = BatchRunner(backends.select(batch_backend), 8, 5.0, 512, 4096, 64)
    try:
        batch.run([(SOLUTION, TESTS)] * 2)  # the runner is up
        start = time.monotonic()
        states = batch.run([(SOLUTION, TESTS), (WRONG, TESTS)])
        elapsed = time.monotonic() - start
    finally:
        batch.close()
    assert [counts(v) for v in verdicts_of(states, [(SOLUTION, TESTS), (WRONG, TESTS)])] == [("passed", 3, 3),
                                                                                            ("failed", 2, 3)]
    assert elapsed < 10.0
