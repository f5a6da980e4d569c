"""report.md and the plots from synthetic run directories (no training)."""

import re

import pytest
from eval.helpers import fake_run

from reflectrl.cli import main as cli_main
from reflectrl.experiments.plots import plot_metric_over_time
from reflectrl.experiments.report import ReportOptions, build_report
from reflectrl.experiments.rundata import discover_runs, load_run

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def grid(tmp_path):
    """2 envs x {ppo, better} x 3 seeds; `better` wins every seed and learns faster."""
    for env in ("EnvA-v0", "EnvB-v0"):
        for seed in (1, 2, 3):
            fake_run(tmp_path / "runs" / env / "ppo" / f"seed_{seed}", env, "ppo", seed,
                     [(100, 0.0), (200, 10.0), (1000, 50.0)], final=10.0 + seed, wall=2.0)
            fake_run(tmp_path / "runs" / env / "better" / f"seed_{seed}", env, "better", seed,
                     [(100, 20.0), (200, 40.0), (1000, 90.0)], final=100.0 + seed, wall=4.0,
                     extra={100: {"reflection/L_cal": 1.0}, 1000: {"reflection/L_cal": 0.2}})
    return tmp_path


def test_report_tables(grid):
    runs = [load_run(d) for d in discover_runs([grid])]
    assert len(runs) == 12
    opts = ReportOptions(command="reflectrl compare --methods ppo better ...", methods=["ppo", "better"],
                         env_ids=["EnvA-v0", "EnvB-v0"], n_resamples=500)
    text = build_report(runs, grid, opts)
    assert "reflectrl compare --methods ppo better ..." in text
    assert "## EnvA-v0" in text and "## EnvB-v0" in text and "## Across environments" in text
    # IQM of 11, 12, 13 (nothing trimmed of 3) = 12; better beats ppo in every pair: P = 1 with CI [1, 1]
    ppo = re.search(r"\| ppo \| 3 \| 12\.00 \[(\S+), (\S+)\] \| \(baseline\) \|", text)
    assert ppo and 11.0 <= float(ppo[1]) < 12.0 < float(ppo[2]) <= 13.0
    assert re.search(r"\| better \| 3 \| 102\.0 \[\S+, \S+\] \| 1\.00 \[1\.00, 1\.00\] \|", text)
    # early AUC over [0, 200]: ppo holds 0 until 100 then rises to 10 -> (0*100 + 5*100) / 200 = 2.5
    # better: (20*100 + 30*100) / 200 = 25; wall times 2.0 and 4.0 s, a quarter of it in the training loop
    assert "| (baseline) | (baseline) | 2.50 [2.50, 2.50] | (baseline) | 2.0 (0.5) |" in text
    # every seed pair differs by +90, but three pairs cannot decide "better" (the exact sign-flip p is 2/8 at
    # best; Holm over the env's family of three hypotheses, final return's and early AUC's differences and final
    # return's non-inferiority, makes it 0.5): within the 5% margin of ppo's return it is "not lower"
    assert ("| 1.00 [1.00, 1.00] | +90.00 [+90.00, +90.00], p = 0.5, NI p = 0: not lower | 25.00 [25.00, 25.00] | "
            "+22.50 [+22.50, +22.50], p = 0.5: inconclusive (3 seeds) | 4.0 (1.0) |") in text
    assert "Verdicts: Holm over the 3 hypotheses of this env's family" in text
    assert "| better | 2 | 1.00 [1.00, 1.00] |" in text  # across envs
    assert "## Definitions" in text and "Mann-Whitney" in text
    assert text.index("| EnvA-v0 | ppo | 1 |") < text.index("| EnvA-v0 | better | 1 |")  # --methods order


def test_runs_linked_into_a_comparison_are_found_and_take_its_labels(grid, tmp_path):
    """A folder whose method folders are links to another comparison's (as when a comparison reuses
    finished runs): discovery follows the links, each real run is read once, and a run is labelled
    by the folder it sits in, not by the label its run.json got in the comparison that trained it."""
    mix = tmp_path / "mix" / "runs" / "EnvA-v0"
    mix.mkdir(parents=True)
    (mix / "ppo").symlink_to(grid / "runs" / "EnvA-v0" / "ppo")
    (mix / "renamed").symlink_to(grid / "runs" / "EnvA-v0" / "better")
    (mix / "again").symlink_to(mix)  # a loop is walked once
    runs = [load_run(d) for d in discover_runs([tmp_path / "mix"])]
    assert sorted((r.method, r.seed) for r in runs) == [(m, s) for m in ("ppo", "renamed") for s in (1, 2, 3)]
    assert {r.final_return for r in runs if r.method == "renamed"} == {101.0, 102.0, 103.0}
    loose = fake_run(tmp_path / "loose_run", "EnvA-v0", "mine", 1, [(100, 0.0)], final=1.0)
    assert load_run(loose).method == "mine"  # outside a comparison layout run.json's label stands


def test_plot_command_and_metric_over_time(grid, capsys):
    out = grid / "curves.png"
    assert cli_main(["plot", str(grid), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    one_run = grid / "runs" / "EnvA-v0" / "better" / "seed_1"
    p = plot_metric_over_time([grid / "runs" / "EnvA-v0", one_run], ["reflection/L_cal", "charts/episodic_return"],
                              grid / "refl.png")
    assert p.read_bytes()[:8] == PNG


def test_plot_unknown_metric_is_one_clear_error(grid, capsys):
    assert cli_main(["plot", str(grid), "--out", str(grid / "x.png"), "--metric", "nope/never"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: none of the 12 runs logged nope/never")
    assert cli_main(["plot", str(grid / "missing"), "--out", str(grid / "x.png")]) == 2
