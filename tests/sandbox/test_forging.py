"""Code cannot forge a verdict: fake reports, closed or replaced streams, a patched interpreter."""

from __future__ import annotations

import json
import textwrap

import pytest

from reflectrl.sandbox import run_tests

from .helpers import SOLUTION, TESTS, WRONG

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(60)]


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
