"""Tests for the untrusted-code sandbox: verdicts, and each attack contained with the right status."""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from reflectrl.tasks import sandbox as sb
from reflectrl.tasks.sandbox import SandboxError, SandboxPool, SandboxWarning, Verdict, run_tests
from reflectrl.tasks.sandbox_cli import main as cli_main

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.tasks.sandbox.SandboxWarning"), pytest.mark.timeout(60)]

SOLUTION = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(2, 0) == 2\n"


def _available(name: str) -> bool:
    try:
        return sb.sandbox_backend(name) == name
    except SandboxError:
        return False


@pytest.fixture(params=sb.BACKENDS)
def backend(request) -> str:
    """Each backend that works on this machine (others are skipped with the probe's reason)."""
    if not _available(request.param):
        pytest.skip(f"backend {request.param} unavailable here: {sb._PROBE_ERRORS.get(request.param)}")
    return request.param


def _require(backend: str, protection: str) -> None:
    if not sb.sandbox_capabilities(backend)[protection]:
        pytest.skip(f"protection {protection!r} does not hold with backend {backend!r} on this machine")


def _running_with(marker: str) -> list[int]:
    """Pids of processes whose command line contains `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


# ---------------------------------------------------------------------------- verdicts


def test_correct_solution_passes():
    v = run_tests(SOLUTION, TESTS)
    assert (v.status, v.passed, v.total) == ("passed", 3, 3)
    assert v.duration_s > 0


def test_wrong_solution_fails_with_counts():
    v = run_tests(WRONG, TESTS)
    assert (v.status, v.passed, v.total) == ("failed", 2, 3)


def test_failing_test_does_not_stop_the_rest():
    v = run_tests(SOLUTION, "assert add(1, 1) == 3\nassert undefined_name\nassert add(2, 2) == 4\n")
    assert (v.status, v.passed, v.total) == ("failed", 1, 3)


def test_non_assert_statements_in_tests_run_but_do_not_count():
    v = run_tests(SOLUTION, "import math\nx = add(2, 3)\nassert x == 5\nassert math.isqrt(x) == 2\n")
    assert (v.status, v.passed, v.total) == ("passed", 2, 2)


def test_syntax_error_is_error():
    v = run_tests("def add(a, b) return a", TESTS)
    assert (v.status, v.passed, v.total) == ("error", 0, 3)


def test_exception_at_definition_is_error():
    assert run_tests("raise ValueError('boom')", TESTS).status == "error"
    assert run_tests("import sys\nsys.exit(0)", TESTS).status == "error"


def test_stdout_is_captured_not_trusted():
    v = run_tests(SOLUTION + "print('hello')\nimport sys\nprint('oops', file=sys.stderr)", TESTS)
    assert v.status == "passed" and v.stdout == "hello\n" and v.stderr == "oops\n"


def test_verdict_json_round_trip():
    v = run_tests(SOLUTION, TESTS)
    data = json.loads(v.to_json())
    assert set(data) == {"status", "passed", "total", "stdout", "stderr", "duration_s"}
    assert Verdict(**data) == v


@pytest.mark.parametrize(
    "kwargs, tests",
    [({"timeout_s": 0}, TESTS), ({"timeout_s": -1}, TESTS), ({"memory_mb": 0}, TESTS), ({}, "x = 1"), ({}, "assert (")],
)
def test_bad_arguments_raise_value_error(kwargs, tests):
    with pytest.raises(ValueError):
        run_tests(SOLUTION, tests, **kwargs)


def test_capabilities_report():
    caps = sb.sandbox_capabilities()
    assert caps and all(isinstance(v, bool) for v in caps.values())
    assert caps["separate_process"] and caps["wall_timeout"] and caps["clean_env"] and caps["output_limit"]
    assert sb.sandbox_backend() in sb.BACKENDS


def test_weak_backend_warns_once():
    sb._WARNED.clear()
    with pytest.warns(SandboxWarning, match="NOT in force"):
        sb.sandbox_capabilities("none")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SandboxWarning)
        sb.sandbox_capabilities("none")  # only once per backend


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


def test_fork_bomb_is_contained(backend):
    _require(backend, "process_limit")
    _require(backend, "kill_all_descendants")
    marker, code = fork_bomb()
    v = run_tests(code, "assert bomb()", timeout_s=1.0, max_processes=32, backend=backend)
    assert v.status == "timeout"
    assert _running_with(marker) == []


# ---------------------------------------------------------------------------- isolation


def test_environment_is_clean(backend, monkeypatch):
    monkeypatch.setenv("REFLECTRL_TEST_SECRET", "hunter2-secret")
    code = "import os\nenv = dict(os.environ)\nprint(sorted(env))"
    v = run_tests(code, "assert 'REFLECTRL_TEST_SECRET' not in env\nassert 'hunter2' not in repr(env)", backend=backend)
    assert (v.status, v.passed) == ("passed", 2)
    assert "hunter2" not in v.stdout


def test_parent_environment_not_readable_via_proc(backend, monkeypatch):
    _require(backend, "parent_protected")
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
    _require(backend, "fs_readonly_outside_workdir")
    tag = f"reflectrl-sbx-probe-{random.randrange(10**9)}"
    targets = [tmp_path / tag, Path("/var/tmp") / tag, Path(sb.__file__).parent / tag, Path(sys.prefix) / tag]
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
    _require(backend, "network_isolated")
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
    _require(backend, "parent_protected")
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


# ---------------------------------------------------------------------------- forging a verdict


def test_closing_or_replacing_stdout_does_not_change_the_verdict():
    closing = "import os, sys\nos.close(1)\nos.close(2)\nsys.stdout = sys.stderr = None\n"
    assert run_tests(closing + SOLUTION, TESTS).status == "passed"
    v = run_tests(closing + WRONG, TESTS)
    assert (v.status, v.passed) == ("failed", 2)
    replacing = "import io, os, sys\nsys.stdout = io.StringIO()\nos.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
    assert run_tests(replacing + WRONG, TESTS).passed == 2


def test_printed_or_written_fake_verdict_is_not_counted():
    fake = json.dumps({"status": "passed", "passed": 3, "total": 3, "stdout": "", "stderr": "", "duration_s": 0.1})
    code = WRONG + textwrap.dedent(f"""
        import os
        print({fake!r})
        for fd in range(0, 256):
            for line in ({fake!r}, "0" * 32 + " test 0 1 -", "setup 0 1 -", "done 3 1 -"):
                try:
                    os.write(fd, (line + "\\n").encode())
                except OSError:
                    pass
    """)
    v = run_tests(code, TESTS)
    assert v.status != "passed" and v.passed <= 2


def test_os_exit_mid_tests_is_not_passed():
    code = SOLUTION + "import os\ndef leave():\n    os._exit(0)\n"
    v = run_tests(code, "assert add(1, 2) == 3\nassert leave()\nassert add(2, 2) == 4\n")
    assert (v.status, v.passed, v.total) == ("killed", 1, 3)
    assert run_tests(SOLUTION + "import os\nos._exit(0)", TESTS).status == "killed"


def test_system_exit_inside_a_test_only_fails_that_test():
    code = SOLUTION + "import sys\ndef leave():\n    sys.exit(0)\ndef interrupt():\n    raise KeyboardInterrupt\n"
    v = run_tests(code, "assert leave()\nassert interrupt()\nassert add(2, 2) == 4\n")
    assert (v.status, v.passed, v.total) == ("failed", 1, 3)


def test_monkeypatching_the_interpreter_does_not_forge_passes():
    code = WRONG + textwrap.dedent("""
        import builtins, os, sys
        class Fake(Exception):
            pass
        builtins.AssertionError = Fake
        builtins.isinstance = lambda *a: True
        builtins.str = lambda *a: "1"
        builtins.exec = builtins.compile = lambda *a, **k: None
        os.write = lambda fd, data: len(data)
        os._exit = lambda code: None
        sys.stdout.write = lambda text: 0
    """)
    v = run_tests(code, TESTS)
    assert (v.status, v.passed) == ("failed", 2)


def test_closing_the_result_channel_is_killed():
    code = SOLUTION + "import os\nfor fd in range(3, 256):\n    try: os.close(fd)\n    except OSError: pass\n"
    v = run_tests(code, TESTS)
    assert v.status == "killed" and v.passed == 0


# ---------------------------------------------------------------------------- pool and CLI


def test_pool_map_and_submit():
    with SandboxPool(max_workers=2, timeout_s=5) as pool:
        verdicts = pool.map([(SOLUTION, TESTS), (WRONG, TESTS), ("def add(", TESTS), (SOLUTION, TESTS)])
        future = pool.submit("while True: pass", TESTS, timeout_s=0.3)
        assert [v.status for v in verdicts] == ["passed", "failed", "error", "passed"]
        assert future.result().status == "timeout"


def test_cli_run_prints_json_verdict_last(tmp_path, capsys):
    (tmp_path / "code.py").write_text(WRONG)
    (tmp_path / "tests.py").write_text(TESTS)
    rc = cli_main(["run", "--code", str(tmp_path / "code.py"), "--tests", str(tmp_path / "tests.py"), "--timeout", "5"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0
    data = json.loads(last)
    assert (data["status"], data["passed"], data["total"]) == ("failed", 2, 3)
    assert {"stdout", "stderr", "duration_s"} <= set(data)


BAD_CLI_INPUT = [["--timeout", "0"], ["--timeout", "abc"], ["--memory-mb", "-5"], ["--code", "/nonexistent.py"]]


@pytest.mark.parametrize("extra", BAD_CLI_INPUT)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, extra):
    (tmp_path / "code.py").write_text(SOLUTION)
    (tmp_path / "tests.py").write_text(TESTS)
    argv = ["run", "--code", str(tmp_path / "code.py"), "--tests", str(tmp_path / "tests.py"), *extra]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err and "Traceback" not in err


def test_cli_rejects_tests_without_asserts(tmp_path, capsys):
    (tmp_path / "code.py").write_text(SOLUTION)
    (tmp_path / "tests.py").write_text("x = 1\n")
    assert cli_main(["run", "--code", str(tmp_path / "code.py"), "--tests", str(tmp_path / "tests.py")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_cli_capabilities(capsys):
    assert cli_main(["capabilities"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["backend"] in sb.BACKENDS and data["protections"]["separate_process"] is True


# ---------------------------------------------------------------------------- batch mode


@pytest.fixture
def batch_backend(backend) -> str:
    """Each backend that batches on this machine (the others run one sandbox per job, tested below)."""
    if not sb.batch_supported(backend):
        pytest.skip(f"backend {backend!r} runs one sandbox per job here (no PID namespace or runner failed)")
    return backend


def _key(v: Verdict) -> tuple:
    return v.status, v.passed, v.total


def _batch_only(jobs, backend, **kw):
    """The batch's own verdicts (None where it would fall back), without the fallback."""
    chosen = sb._select(backend)
    args = {"timeout_s": 5.0, "memory_mb": 512, "max_bytes": 4096, "max_processes": 64}
    args.update(kw)
    return sb._execute_batch(chosen, jobs, args["timeout_s"], args["memory_mb"], args["max_bytes"],
                             args["max_processes"])


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


def test_batch_verdicts_equal_single_runs(backend):
    kw = {"timeout_s": 1.0, "memory_mb": 128, "backend": backend}
    batch = sb.run_tests_batch(MIXED_JOBS, batch_size=len(MIXED_JOBS), **kw)
    single = [run_tests(code, tests, **kw) for code, tests in MIXED_JOBS]
    assert [_key(v) for v in batch] == [_key(v) for v in single]
    assert [v.status for v in batch] == ["passed", "failed", "error", "error", "timeout", "timeout", "memory",
                                         "passed", "killed", "passed"]
    huge = batch[7]
    assert len(huge.stdout) < 4200 and len(huge.stderr) < 4200 and "truncated" in huge.stdout
    assert batch[0].stdout == "" and all(v.duration_s > 0 for v in batch)


def test_batch_runs_without_fallback_and_keeps_order(batch_backend):
    jobs = [(SOLUTION if i % 3 else WRONG, TESTS) for i in range(7)]
    verdicts = _batch_only(jobs, batch_backend)
    assert None not in verdicts
    assert [v.status for v in verdicts] == ["failed" if i % 3 == 0 else "passed" for i in range(7)]


def test_batch_bad_job_raises_naming_it():
    with pytest.raises(ValueError, match="job 1"):
        sb.run_tests_batch([(SOLUTION, TESTS), (SOLUTION, "x = 1")])
    with pytest.raises(ValueError):
        sb.run_tests_batch([(SOLUTION, TESTS)], batch_size=0)
    assert sb.run_tests_batch([]) == []


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


def test_batch_leftover_processes_and_files_do_not_reach_the_next_job(batch_backend):
    marker, leave, look = leftover_jobs()
    verdicts = _batch_only([leave, look, look], batch_backend)
    assert [_key(v) for v in verdicts] == [("passed", 4, 4), ("passed", 6, 6), ("passed", 6, 6)]
    assert _running_with(marker) == []


def test_batch_fork_bomb_then_clean_job(batch_backend):
    _require(batch_backend, "process_limit")
    marker, bomb = fork_bomb()
    verdicts = _batch_only([(bomb, "assert bomb()"), (SOLUTION, TESTS)], batch_backend, timeout_s=1.0,
                           max_processes=32)
    assert [v.status for v in verdicts] == ["timeout", "passed"]
    assert _running_with(marker) == []


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
    assert [_key(v) for v in _batch_only([first, second], batch_backend)] == [("passed", 5, 5), ("passed", 4, 4)]


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
    verdicts = _batch_only([(peek, TESTS + "assert readable() == []\n"), (WRONG, TESTS), (WRONG, TESTS)],
                           batch_backend)
    assert [_key(v) for v in verdicts] == [("passed", 4, 4), ("failed", 2, 3), ("failed", 2, 3)]


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
    raw = _batch_only(jobs, batch_backend, timeout_s=2.0)
    truth = ["passed", None, "failed", "passed", "failed"]
    for got, want in zip(raw[2:], truth[2:]):
        assert got is None or got.status == want  # the rest: their own verdict, or "rerun me"
    assert [v.status for v in sb.run_tests_batch(jobs, timeout_s=2.0, backend=batch_backend)][2:] == truth[2:]


def test_batch_runner_death_makes_the_rest_fall_back(batch_backend, monkeypatch):
    # a runner that dies after job 1 ran (its records all say "passed") but before reporting it
    dying = sb._BATCH_RUNNER.replace('        say("end %d', '        if index == 1:\n            os._exit(1)\n'
                                     '        say("end %d', 1)
    assert dying != sb._BATCH_RUNNER
    monkeypatch.setattr(sb, "_BATCH_RUNNER", dying)
    jobs = [(SOLUTION, TESTS), (SOLUTION, TESTS), (SOLUTION, TESTS), (WRONG, TESTS)]
    raw = _batch_only(jobs, batch_backend)
    assert raw[0].status == "passed" and raw[1:] == [None, None, None]
    assert [v.status for v in sb.run_tests_batch(jobs, backend=batch_backend)] == ["passed"] * 3 + ["failed"]


def test_batch_falls_back_to_one_sandbox_per_job_without_pid_namespace():
    if not _available("none"):
        pytest.skip("backend none unavailable")
    assert not sb.batch_supported("none")
    verdicts = sb.run_tests_batch([(SOLUTION, TESTS), (WRONG, TESTS)], backend="none")
    assert [v.status for v in verdicts] == ["passed", "failed"]


def test_pool_map_batched():
    with SandboxPool(max_workers=2, timeout_s=5) as pool:
        items = [(SOLUTION, TESTS), (WRONG, TESTS), ("def add(", TESTS)] * 3
        verdicts = pool.map_batched(items, batch_size=4)
        assert [v.status for v in verdicts] == ["passed", "failed", "error"] * 3
        assert pool.submit_batch([(SOLUTION, TESTS)]).result()[0].status == "passed"


class _CountingRunner(sb._BatchRunner):
    launched = 0

    def __init__(self, *args, **kw):
        type(self).launched += 1
        super().__init__(*args, **kw)


def _warm_pool(monkeypatch, slots, **kw):
    counting = type("Counting", (_CountingRunner,), {"launched": 0})
    monkeypatch.setattr(sb, "_BatchRunner", counting)
    return SandboxPool(max_workers=1, warm_slots=slots, **kw), counting


def test_warm_pool_keeps_runners_between_calls_with_the_same_verdicts(batch_backend, monkeypatch):
    """A kept runner serves successive calls; when its slots are used up a fresh one is launched at
    once; every verdict equals the one-launch-per-batch verdict."""
    jobs = MIXED_JOBS[:4] + MIXED_JOBS[7:9]
    kw = {"timeout_s": 1.0, "memory_mb": 128, "backend": batch_backend}
    cold = [_key(v) for v in sb.run_tests_batch(jobs, batch_size=len(jobs), **kw)]
    pool, counting = _warm_pool(monkeypatch, 12, **kw)
    with pool:
        for call in range(3):
            assert [_key(v) for v in pool.map_batched(jobs, batch_size=len(jobs))] == cold
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
    assert [_key(v) for v in first + second] == [("passed", 4, 4)] + [("passed", 6, 6)] * 3
    assert _running_with(marker) == []


def test_warm_runner_fork_bomb_then_clean_call(batch_backend, monkeypatch):
    _require(batch_backend, "process_limit")
    marker, bomb = fork_bomb()
    pool, _ = _warm_pool(monkeypatch, 8, timeout_s=1.0, max_processes=32, backend=batch_backend)
    with pool:
        first = pool.map_batched([(bomb, "assert bomb()"), (SOLUTION, TESTS)], batch_size=2)
        second = pool.map_batched([(SOLUTION, TESTS), (WRONG, TESTS)], batch_size=2)
    assert [v.status for v in first + second] == ["timeout", "passed", "passed", "failed"]
    assert _running_with(marker) == []


def test_warm_runner_death_falls_back_and_is_not_kept(batch_backend, monkeypatch):
    dying = sb._BATCH_RUNNER.replace('        say("end %d', '        if index == 1:\n            os._exit(1)\n'
                                     '        say("end %d', 1)
    monkeypatch.setattr(sb, "_BATCH_RUNNER", dying)
    pool, counting = _warm_pool(monkeypatch, 8, backend=batch_backend)
    with pool:
        jobs = [(SOLUTION, TESTS), (SOLUTION, TESTS), (WRONG, TESTS)]
        assert [v.status for v in pool.map_batched(jobs, batch_size=3)] == ["passed", "passed", "failed"]
        assert pool._idle == [] and counting.launched == 1  # the broken runner is closed, not replaced
        assert [v.status for v in pool.map_batched(jobs[::-1], batch_size=3)] == ["failed", "passed", "passed"]
        assert counting.launched == 2
