"""benchmarks/seed_claims.py: its verdict rules and its minimum seed count, on synthetic runs."""

import json
import sys
from pathlib import Path

import pytest

from .helpers import benchmark_script, fake_run


@pytest.fixture(scope="module")
def claims():
    return benchmark_script("seed_claims")


def test_verdict_rules(claims):
    assert claims.verdict_final((0.9, 0.6, 1.0)) == "holds"
    assert claims.verdict_final((0.6, 0.24, 1.0)) == "level (within noise)"  # a point estimate alone holds nothing
    assert claims.verdict_final((0.3, 0.0, 0.49)) == "does not hold"
    assert claims.verdict_final((0.3, 0.0, 0.7)) == "level (within noise)"
    assert claims.verdict_early((0.9, 0.6, 1.0)) == "holds"
    assert claims.verdict_early((0.5, 0.2, 0.8)) == "does not hold"
    assert claims.verdict_early((0.7, 0.3, 1.0)) == "not resolved"
    assert claims.too_few(2, 3) == "too few seeds (2)"
    assert claims.too_few(3, 3) is None


def _grid(root: Path, env: str, n_base: int, methods: dict[str, tuple[int, float]]) -> None:
    """ppo returns 0..n_base-1; each method (seeds, offset) returns ppo's plus the offset."""
    for label, (n, off) in {"ppo": (n_base, 0.0), **methods}.items():
        for s in range(1, n + 1):
            curve = [(100 * k, float(s + off)) for k in range(1, 11)]
            extra = {100 * k: {"refgrpo/L_cal_heldout": 1.0 - 0.05 * k} for k in range(1, 11)}
            fake_run(root / "runs" / env / label / f"seed_{s}", env, label, s, curve, final=float(s + off),
                     algo="refgrpo-seed" if label == "better" else "ppo", extra=extra)


def _main(claims, monkeypatch, *args) -> dict:
    monkeypatch.setattr(sys, "argv", ["seed_claims.py", *args])
    claims.main()
    return json.loads(Path(args[args.index("--json-out") + 1]).read_text())


def test_too_few_seeds_replace_every_verdict(claims, tmp_path, monkeypatch, capsys):
    _grid(tmp_path / "dense", "Dense-v0", 5, {"better": (5, 10.0), "single": (1, 10.0)})
    _grid(tmp_path / "sparse", "Sparse-v0", 5, {"better": (5, 10.0), "single": (1, 10.0)})
    js = str(tmp_path / "c.json")
    out = _main(claims, monkeypatch, "--dense", str(tmp_path / "dense"), "--sparse", str(tmp_path / "sparse"),
                "--json-out", js)
    better = out["envs"]["Dense-v0"]["methods"]["better"]
    assert better["seeds"] == 5
    assert better["p_final"][0] == pytest.approx(1.0)
    assert (better["final_verdict"], better["early_verdict"]) == ("holds", "holds")
    assert better["l_cal"]["verdict"] == "holds"
    single = out["envs"]["Dense-v0"]["methods"]["single"]
    assert (single["final_verdict"], single["early_verdict"]) == ("too few seeds (1)", "too few seeds (1)")
    assert out["sparse_vs_dense"]["single"]["verdict"] == "too few seeds (1)"
    # equal gains on sparse and dense envs are not larger gains on sparse
    assert out["sparse_vs_dense"]["better"]["verdict"] == "does not hold"
    assert "too few seeds (1)" in capsys.readouterr().out

    out = _main(claims, monkeypatch, "--dense", str(tmp_path / "dense"), "--min-seeds", "1", "--json-out", js)
    # allowed a verdict, one seed still has no confidence interval: it cannot hold
    assert out["envs"]["Dense-v0"]["methods"]["single"]["final_verdict"] == "level (within noise)"
