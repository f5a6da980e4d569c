"""Each attack on resources or isolation is contained, with the right status, on each backend."""

from __future__ import annotations

import os
import random
import socket
import sys
import textwrap
from pathlib import Path

import pytest

import reflectrl.sandbox
from reflectrl.sandbox import run_tests

from .helpers import SOLUTION, TESTS, fork_bomb, require, running_with

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(60)]


# ---------------------------------------------------------------------------- resource attacks


def test_infinite_loop_times_out(backend):
    v = run_tests("while True:\n    pass", TESTS, timeout_s=0.5, backend=backend)
    assert (v.status, v.passed) == ("timeout", 0)
    assert v.duration_s < 5


def test_infinite_loop_in_one_test_keeps_earlier_results(backend):
    v = run_tests(SOLUTION + "def spin():\n    while True: pass", "assert add(1, 2) == 3\nassert spin()", timeout_s=0.5,
                  backend=backend)
    assert (v.status, v.passed, v.total) == ("timeout", 1, 2)


def test_memory_bomb(backend):
    assert run_tests("x = bytearray(8 * 1024**3)", TESTS, memory_mb=128, backend=backend).status == "memory"
    grow = "def grow():\n    chunks = []\n    while True:\n        chunks.append(bytearray(10**7))\n"
    v = run_tests(grow, "assert grow()", memory_mb=128, timeout_s=5, backend=backend)
    assert v.status == "memory"


def test_deep_recursion_does_not_crash_the_parent():
    v = run_tests("def f(n):\n    return f(n + 1)", "assert f(0)")
    assert v.status == "failed"  # RecursionError inside the test
    deep = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)"
    v = run_tests(deep, "assert f(0)", memory_mb=64, timeout_s=10)  # frames fill the 64 MiB: SystemError
    assert v.status in {"error", "failed", "memory"} and v.passed == 0


def test_huge_output_is_bounded():
    code = SOLUTION + "import sys\nprint('x' * 30_000_000)\nfor i in range(200_000):\n    print(i, file=sys.stderr)"
    v = run_tests(code, TESTS, timeout_s=10)
    assert v.status == "passed"
    assert len(v.stdout) < 4200 and len(v.stderr) < 4200 and "truncated" in v.stdout


def test_fork_bomb_is_contained(backend):
    require(backend, "process_limit")
    require(backend, "kill_all_descendants")
    marker, code = fork_bomb()
    v = run_tests(code, "assert bomb()", timeout_s=1.0, max_processes=32, backend=backend)
    assert v.status == "timeout"
    assert running_with(marker) == []


# ---------------------------------------------------------------------------- isolation


def test_environment_is_clean(backend, monkeypatch):
    monkeypatch.setenv("REFLECTRL_TEST_SECRET", "hunter2-secret")
    code = "import os\nenv = dict(os.environ)\nprint(sorted(env))"
    v = run_tests(code, "assert 'REFLECTRL_TEST_SECRET' not in env\nassert 'hunter2' not in repr(env)", backend=backend)
    assert (v.status, v.passed) == ("passed", 2)
    assert "hunter2" not in v.stdout


def test_parent_environment_not_readable_via_proc(backend, monkeypatch):
    require(backend, "parent_protected")
    monkeypatch.setenv("REFLECTRL_TEST_SECRET", "hunter2-secret")
    code = textwrap.dedent(f"""
        def leak():
            for pid in ({os.getpid()}, __import__("os").getppid()):
                try:
                    data = open(f"/proc/{{pid}}/environ", "rb").read()
                except OSError:
                    continue
                if b"hunter2" in data:
                    return True
            return False
    """)
    assert run_tests(code, "assert not leak()", backend=backend).status == "passed"


def test_writes_outside_workdir_fail(backend, tmp_path):
    require(backend, "fs_readonly_outside_workdir")
    tag = f"reflectrl-sbx-probe-{random.randrange(10**9)}"
    package = Path(reflectrl.sandbox.__file__).parent
    targets = [tmp_path / tag, Path("/var/tmp") / tag, package / tag, Path(sys.prefix) / tag]
    code = textwrap.dedent("""
        import os
        def write(path):
            try:
                with open(path, "w") as fh:
                    fh.write("pwned")
                return True
            except OSError:
                return False
        def write_local():
            with open("local.txt", "w") as fh:
                fh.write("ok")
            return os.path.exists("local.txt")
    """)
    tests = "".join(f"assert not write({str(t)!r})\n" for t in targets) + "assert write_local()\n"
    try:
        v = run_tests(code, tests, backend=backend)
        assert [t for t in targets if t.exists()] == []
        assert (v.status, v.passed, v.total) == ("passed", len(targets) + 1, len(targets) + 1)
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_network_is_blocked(backend):
    require(backend, "network_isolated")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = textwrap.dedent(f"""
            import socket
            def connect():
                try:
                    socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
                    return True
                except OSError:
                    return False
        """)
        v = run_tests(code, "assert not connect()", backend=backend)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert v.status == "passed"


def test_cannot_kill_the_parent(backend):
    require(backend, "parent_protected")
    pid, pgid = os.getpid(), os.getpgid(0)
    code = textwrap.dedent(f"""
        import os, signal
        def attack():
            for fn in (lambda: os.kill({pid}, signal.SIGKILL), lambda: os.killpg({pgid}, signal.SIGKILL),
                       lambda: os.kill(os.getppid(), signal.SIGKILL)):
                try:
                    fn()
                except OSError:
                    pass
            return True
    """)
    v = run_tests(code, "assert attack()", backend=backend)
    assert v.status in {"passed", "killed"}  # inside a pid namespace the code may only kill itself
    assert os.getpgid(0) == pgid  # we are still here


def test_killing_itself_is_not_passed(backend):
    code = "import os, signal\ndef die():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    v = run_tests(code, "assert True\nassert die()\nassert True", backend=backend)
    # as PID-namespace init (unshare) the signal is ignored and die() just returns None
    assert v.status in {"killed", "failed"} and v.passed < v.total
