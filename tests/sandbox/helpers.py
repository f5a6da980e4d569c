"""Shared jobs and checks of the sandbox tests."""

from __future__ import annotations

import os
import random
import textwrap
from pathlib import Path

import pytest

from reflectrl.sandbox import SandboxError, Verdict, backends, sandbox_backend, sandbox_capabilities
from reflectrl.sandbox.batch import execute_batch

SOLUTION = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(2, 0) == 2\n"


def available(name: str) -> bool:
    """Whether backend `name` works on this machine."""
    try:
        return sandbox_backend(name) == name
    except SandboxError:
        return False


def require(backend: str, protection: str) -> None:
    """Skip unless `protection` holds with `backend` here."""
    if not sandbox_capabilities(backend)[protection]:
        pytest.skip(f"protection {protection!r} does not hold with backend {backend!r} on this machine")


def running_with(marker: str) -> list[int]:
    """Pids of processes whose command line contains `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def fork_bomb() -> tuple[str, str]:
    """A unique ``sleep`` argument and code whose ``bomb()`` forks detached ``sleep MARKER`` processes forever."""
    marker = f"{3000 + random.randrange(1000)}.{random.randrange(10**6):06d}"
    return marker, textwrap.dedent(f"""
        import os
        def bomb():
            while True:
                try:
                    if os.fork() == 0:
                        os.setsid()
                        if os.fork() == 0:
                            os.execv("/bin/sleep", ["sleep", "{marker}"])
                except OSError:
                    pass
    """)


def counts(v: Verdict) -> tuple:
    """What a verdict says, without its output and time."""
    return v.status, v.passed, v.total


def batch_only(jobs: list[tuple[str, str]], backend: str, **kw) -> list[Verdict | None]:
    """The batch's own verdicts (None where it would fall back), without the fallback."""
    chosen = backends.select(backend)
    args = {"timeout_s": 5.0, "memory_mb": 512, "max_bytes": 4096, "max_processes": 64}
    args.update(kw)
    return execute_batch(chosen, jobs, args["timeout_s"], args["memory_mb"], args["max_bytes"], args["max_processes"])


MIXED_JOBS = [
    (SOLUTION, TESTS),
    (WRONG, TESTS),
    ("def add(a, b) return a", TESTS),
    ("raise ValueError('boom')", TESTS),
    ("while True:\n    pass", TESTS),
    (SOLUTION + "def spin():\n    while True: pass", "assert add(1, 2) == 3\nassert spin()"),
    ("x = bytearray(8 * 1024**3)", TESTS),
    (SOLUTION + "import sys\nprint('x' * 1_000_000)\nprint('e' * 100_000, file=sys.stderr)", TESTS),
    (SOLUTION + "import os\ndef leave():\n    os._exit(0)\n", "assert add(1, 2) == 3\nassert leave()\n"),
    (SOLUTION, TESTS),
]


def leftover_jobs() -> tuple[str, tuple[str, str], tuple[str, str]]:
    """A job that leaves a daemonized process, files (one in an unreadable dir) and a /tmp write
    attempt behind, and a job whose tests check that none of it is there: (marker, leave, look)."""
    marker = f"{3000 + random.randrange(1000)}.{random.randrange(10**6):06d}"
    leave = SOLUTION + textwrap.dedent(f"""
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "{marker}"])
            os._exit(0)
        os.makedirs("sub/deeper", exist_ok=True)
        open("sub/deeper/secret.txt", "w").write("answer=42")
        os.chmod("sub", 0)
        open("left.txt", "w").write("answer=42")
        def tmp_write():
            try:
                open("/tmp/reflectrl-left-{marker}", "w").write("x")
                return True
            except OSError:
                return False
    """)
    look = SOLUTION + textwrap.dedent(f"""
        import os
        def others():
            found = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if b"{marker}" in open(f"/proc/{{pid}}/cmdline", "rb").read():
                        found.append(pid)
                except OSError:
                    pass
            return found
    """)
    checks = (TESTS + "assert others() == []\nassert os.listdir('.') == []\n"
              f"assert not os.path.exists('/tmp/reflectrl-left-{marker}')\n")
    return marker, (leave, TESTS + "assert not tmp_write()\n"), (look, checks)
