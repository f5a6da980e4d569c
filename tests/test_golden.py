"""Every algo's short run at a fixed seed reproduces its golden ``metrics.jsonl`` bit for bit (timing
fields aside): a redesign changes no behaviour it does not mean to. Re-record with
``python tests/golden/runs.py --record NAME`` only for a documented change of behaviour."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("golden_runs", Path(__file__).parent / "golden" / "runs.py")
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("golden")


@pytest.mark.parametrize("name", runs.NAMES)
def test_metrics_equal_golden(name, workdir):
    got = runs.run(name, workdir)
    want = runs.load(name)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == w
