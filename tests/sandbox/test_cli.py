"""``reflectrl sandbox``: a JSON verdict, one-line errors for bad input, the capabilities report."""

from __future__ import annotations

import json

import pytest

from reflectrl.cli.sandbox import main as cli_main
from reflectrl.sandbox import BACKENDS, batch_supported
from reflectrl.sandbox.cost import verdict_cost

from .helpers import SOLUTION, TESTS, WRONG

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(60)]


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
    assert data["backend"] in BACKENDS and data["protections"]["separate_process"] is True
    cost = data["cost_per_verdict"]
    assert cost["batched_ms"] > 0 and cost["one_per_sandbox_ms"] > 0
    assert cost["batch_mode"] is batch_supported(data["backend"])
    assert cost["verdicts"] == {"batched": 16, "one_per_sandbox": 3}
    assert "measured just now" in cost["measured"] and "depend on the backend" in cost["measured"]


def test_cli_capabilities_of_each_backend_label_their_cost(backend, capsys):
    assert cli_main(["capabilities", "--backend", backend]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["backend"] == backend
    batched = "one batch on a kept runner" in data["cost_per_verdict"]["measured"]
    assert batched is data["cost_per_verdict"]["batch_mode"] is batch_supported(backend)


@pytest.mark.parametrize("batched, single", [(1, 3), (16, 0), (2.5, 3), (16, "3")])
def test_verdict_cost_rejects_bad_counts(batched, single):
    with pytest.raises(ValueError, match="batched"):
        verdict_cost(batched=batched, single=single)
