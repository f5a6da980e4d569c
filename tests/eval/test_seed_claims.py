"""benchmarks/seed_claims.py: its verdict rules and its minimum seed count, on synthetic runs."""

import json
import sys
from pathlib import Path

import pytest

from .helpers import benchmark_script, fake_run


@pytest.fixture(scope="module")
def claims():
    return benchmark_script("seed_claims")


def _grid(root: Path, env: str, n_base: int, methods: dict[str, tuple[int, float]]) -> None:
    """ppo returns 0..n_base-1; each method (seeds, offset) returns ppo's plus the offset."""
    for label, (n, off) in {"ppo": (n_base, 0.0), **methods}.items():
        for s in range(1, n + 1):
            curve = [(100 * k, float(s + off)) for k in range(1, 11)]
            extra = {100 * k: {"refgrpo-seed/L_cal_heldout": 1.0 - 0.05 * k} for k in range(1, 11)}
            fake_run(root / "runs" / env / label / f"seed_{s}", env, label, s, curve, final=float(s + off),
                     algo="refgrpo-seed" if label == "better" else "ppo", extra=extra)


def _main(claims, monkeypatch, *args) -> dict:
    monkeypatch.setattr(sys, "argv", ["seed_claims.py", *args])
    claims.main()
    return json.loads(Path(args[args.index("--json-out") + 1]).read_text())


def test_verdicts_follow_the_one_rule(claims, tmp_path, monkeypatch, capsys):
    """Ten seeds that each beat PPO by 10 (final and early) are "better", Holm over each table; L_cal falling in
    every seed is "better" (it falls); one seed is "too few seeds"; five such seeds cannot be better (the exact
    sign-flip p is 2/32 at best) and are "not lower"; equal gains on sparse and dense envs decide nothing."""
    _grid(tmp_path / "dense", "Dense-v0", 10, {"better": (10, 10.0), "single": (1, 10.0)})
    _grid(tmp_path / "sparse", "Sparse-v0", 10, {"better": (10, 10.0), "single": (1, 10.0)})
    js = str(tmp_path / "c.json")
    out = _main(claims, monkeypatch, "--dense", str(tmp_path / "dense"), "--sparse", str(tmp_path / "sparse"),
                "--json-out", js)
    better = out["envs"]["Dense-v0"]["methods"]["better"]
    assert better["seeds"] == 10
    assert better["p_final"][0] == pytest.approx(1.0)
    assert (better["final_verdict"], better["early_verdict"]) == ("better", "better")
    assert better["final_claim"]["p_holm"] == pytest.approx(2 * 2 / 1024)  # two envs in the family
    assert better["l_cal"]["verdict"] == "better"
    single = out["envs"]["Dense-v0"]["methods"]["single"]
    assert (single["final_verdict"], single["early_verdict"]) == ("too few seeds (1)", "too few seeds (1)")
    assert out["sparse_vs_dense"]["single"]["verdict"] == "too few seeds (1)"
    assert out["sparse_vs_dense"]["better"]["verdict"] == "inconclusive (10 seeds)"
    assert "too few seeds (1)" in capsys.readouterr().out

    five = tmp_path / "five"
    _grid(five, "Dense-v0", 5, {"better": (5, 10.0)})
    out = _main(claims, monkeypatch, "--dense", str(five), "--json-out", js)
    assert out["envs"]["Dense-v0"]["methods"]["better"]["final_verdict"] == "not lower"
    assert out["envs"]["Dense-v0"]["methods"]["better"]["early_verdict"] == "inconclusive (5 seeds)"


def test_rerender_equals_the_first_render(claims, tmp_path, monkeypatch, capsys):
    _grid(tmp_path / "d", "Dense-v0", 4, {"better": (4, 1.0)})
    js, md = tmp_path / "c.json", tmp_path / "c.md"
    _main(claims, monkeypatch, "--dense", str(tmp_path / "d"), "--json-out", str(js), "--md-out", str(md))
    first = md.read_text()
    _main(claims, monkeypatch, "--rerender", str(js), "--json-out", str(js), "--md-out", str(md))
    assert md.read_text() == first
