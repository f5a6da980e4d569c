"""The real model's golden runs (slow; ``make test-slow``): SmolLM2-135M-Instruct with LoRA 16, 3 updates at one
thread (``tests/golden/runs.py``, ``REAL``), each run afresh and compared with its recorded ``metrics.jsonl``, timing
fields aside, within the tolerances below rather than bit for bit.

Why tolerances: the files were recorded before a chat model's defaults took the fast paths (the shared-prompt layout
of the training forward, the kept KV cache of an asked self-report turn), which compute the same numbers within
float32 rounding. On these runs that rounding reached only the update's float statistics (the entropy and the
gradient norm, by at most 4.2e-6 relative); every sampled token, reward, length and count came out the same. So
everything is compared exactly but those statistics, which may differ by :data:`REL` relative (:data:`ABS` absolute
near zero). A CPU of another kind rounds otherwise in its kernels, which sampling can turn into other tokens; as
for the tiny models' golden runs (``tests/golden/runs.py``), the runs are skipped where the files were not recorded
on this kind of CPU."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
_spec = importlib.util.spec_from_file_location("golden_runs",
                                               Path(__file__).resolve().parents[1] / "golden" / "runs.py")
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

FLOAT_STATS = ("losses/entropy", "losses/grad_norm", "losses/policy_loss", "losses/approx_kl")
"""The update's statistics that float32 rounding reaches without changing a sampled token."""
REL, ABS = 1e-4, 1e-7


def mismatches(got: list[dict], want: list[dict]) -> list[str]:
    """Each (update, key) whose values differ: beyond ``REL`` relative and ``ABS`` absolute for
    :data:`FLOAT_STATS`, at all for the rest; said in words."""
    out = []
    for g, w in zip(got, want):
        for k in sorted(set(g) | set(w)):
            a, b = g.get(k, "<absent>"), w.get(k, "<absent>")
            if a == b:
                continue
            if k in FLOAT_STATS and all(isinstance(x, (int, float)) for x in (a, b)) \
                    and abs(a - b) <= max(REL * abs(b), ABS):
                continue
            out.append(f"update {w.get('update')}: {k} {a!r}, recorded {b!r}")
    return out


def test_the_tolerances_catch_a_change_of_behaviour():
    want = [{"update": 1, "reward/mean": 0.25, "losses/policy_loss": 1e-9, "losses/grad_norm": 0.1}]
    assert mismatches(want, want) == []
    near = [{"update": 1, "reward/mean": 0.25, "losses/policy_loss": -5e-8, "losses/grad_norm": 0.100001}]
    assert mismatches(near, want) == []
    for k, v in (("reward/mean", 0.25 + 1 / 64), ("losses/policy_loss", 1e-5), ("losses/grad_norm", 0.1001),
                 ("update", 2)):
        assert mismatches([{**want[0], k: v}], want), k


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    why = runs.kernels_available()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("real-golden")
    proc = runs.dump_fresh(list(runs.REAL), out, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.mark.parametrize("name", list(runs.REAL))
def test_the_real_model_run_equals_its_golden_file_within_tolerances(name, dumped):
    err = dumped / f"{name}.error"
    assert not err.exists(), err.read_text()
    got = [json.loads(line) for line in (dumped / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    sets = runs.load_sets(name)
    assert sets, f"no golden file of {name}"
    if runs.cpu_set() not in sets:
        pytest.skip(f"{name}'s golden file was recorded on CPUs of another kind ({', '.join(w or 'default' for w in sets)})")
    want = sets[runs.cpu_set()]
    assert len(got) == len(want)
    assert mismatches(got, want) == []
