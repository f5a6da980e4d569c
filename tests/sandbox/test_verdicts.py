"""Verdicts: counts and statuses for right, wrong and broken code; argument checks; capabilities."""

from __future__ import annotations

import json
import warnings

import pytest

from reflectrl.sandbox import (
    BACKENDS,
    SandboxWarning,
    Verdict,
    backends,
    run_tests,
    sandbox_backend,
    sandbox_capabilities,
)

from .helpers import SOLUTION, TESTS, WRONG

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(60)]


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
    caps = sandbox_capabilities()
    assert caps and all(isinstance(v, bool) for v in caps.values())
    assert caps["separate_process"] and caps["wall_timeout"] and caps["clean_env"] and caps["output_limit"]
    assert sandbox_backend() in BACKENDS


def test_weak_backend_warns_once():
    backends.WARNED.clear()
    with pytest.warns(SandboxWarning, match="NOT in force"):
        sandbox_capabilities("none")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SandboxWarning)
        sandbox_capabilities("none")  # only once per backend

