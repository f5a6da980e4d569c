"""The in-sandbox runners: real modules of the package, sent as source, running without reflectrl."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from reflectrl.sandbox import run_tests, run_tests_batch, runner
from reflectrl.sandbox.runner import batch as batch_module
from reflectrl.sandbox.runner import job as job_module

from .helpers import SOLUTION, TESTS

pytestmark = [pytest.mark.filterwarnings("ignore::reflectrl.sandbox.SandboxWarning"), pytest.mark.timeout(60)]

NO_REFLECTRL = "import sys\nnames = sorted(sys.modules)\n"
NO_REFLECTRL_TESTS = "assert not [n for n in names if n.split('.')[0] == 'reflectrl']\n"


def test_runner_sources_are_the_modules_with_their_entry_calls():
    job_src = Path(job_module.__file__).read_text(encoding="utf-8")
    batch_src = Path(batch_module.__file__).read_text(encoding="utf-8")
    assert job_src + "\n\nmain()\n" == runner.SINGLE
    assert job_src + "\n\n" + batch_src + "\n\nbatch_main()\n" == runner.BATCH
    for source in (runner.SINGLE, runner.BATCH):
        compile(source, "<runner>", "exec", dont_inherit=True)


def test_batch_module_takes_the_job_helpers_from_the_job_module():
    assert batch_module.run_job is job_module.run_job and batch_module.isolate_fs is job_module.isolate_fs


def _top_level_imports(source: str) -> list[str]:
    """Modules a source imports when run as a script (``if __package__:`` blocks are skipped there)."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__package__":
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                names += [alias.name for alias in sub.names]
            elif isinstance(sub, ast.ImportFrom):
                names.append("." * sub.level + (sub.module or ""))
    return names


@pytest.mark.parametrize("name", ["SINGLE", "BATCH"])
def test_runner_sources_import_only_the_standard_library(name):
    imported = _top_level_imports(getattr(runner, name))
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert [m for m in imported if m.split(".")[0] not in stdlib] == []


def test_single_runner_runs_without_reflectrl(backend):
    verdict = run_tests(NO_REFLECTRL + SOLUTION, NO_REFLECTRL_TESTS + TESTS, backend=backend)
    assert (verdict.status, verdict.passed) == ("passed", 4)


def test_batch_runner_runs_without_reflectrl(batch_backend):
    jobs = [(NO_REFLECTRL + SOLUTION, NO_REFLECTRL_TESTS + TESTS)] * 2
    assert [v.status for v in run_tests_batch(jobs, backend=batch_backend, batch_size=2)] == ["passed", "passed"]
