"""Every algo's short run at a fixed seed reproduces its golden ``metrics.jsonl`` bit for bit (timing
fields aside): a redesign changes no behaviour it does not mean to. Re-record with
``python tests/golden/runs.py --record NAME`` only for a documented change of behaviour.

The runs go in one subprocess with PyTorch's AVX2 kernels, and each must equal one of the sets recorded per kind
of CPU (``tests/golden/runs.py`` says why), whatever kernels this test process uses."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("golden_runs", Path(__file__).parent / "golden" / "runs.py")
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    why = runs.kernels_available()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("golden")
    proc = runs.dump_fresh(list(runs.NAMES), out, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.mark.parametrize("name", runs.NAMES)
def test_metrics_equal_golden(name, dumped):
    err = dumped / f"{name}.error"
    assert not err.exists(), err.read_text()
    got = [json.loads(line) for line in (dumped / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    sets = runs.load_sets(name)
    assert sets, f"no golden file of {name}"
    if runs.cpu_set() not in sets:
        pytest.skip(f"{name}'s golden file was recorded on CPUs of another kind ({', '.join(w or 'default' for w in sets)}); "
                    f"this CPU's kernels give other last bits (tests/golden/runs.py)")
    if not any(got == want for want in sets.values()):
        want = sets[""] if "" in sets else next(iter(sets.values()))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g == w  # the diff against the default set
