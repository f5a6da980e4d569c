"""`reflectrl compare`: the grid through the CLI, skipping finished runs, resuming interrupted ones, failures.

Tiny budgets: CartPole-v1, 2 seeds x 256 steps (2 envs x 64 steps per update), 2 evaluation episodes."""

import json
import shutil

import pytest
from eval.helpers import fake_run

from reflectrl.cli import main as cli_main
from reflectrl.experiments import compare, runner
from reflectrl.experiments.compare import parse_method
from reflectrl.experiments.runner import RunSpec, plan

TRAIN = ["--num-envs", "2", "--num-steps", "64", "--no-tensorboard"]
PNG = b"\x89PNG\r\n\x1a\n"


def compare_args(out, methods=("ppo",), seeds=2, backend="local"):
    return ["compare", "--methods", *methods, "--env-ids", "CartPole-v1", "--seeds", str(seeds), "--total-timesteps",
            "256", "--out", str(out), "--eval-episodes", "2", "--bootstrap-reps", "500", "--backend", backend,
            "--extra", *TRAIN]


@pytest.fixture
def launches(monkeypatch):
    """Record every `reflectrl ...` process compare starts (still running them)."""
    seen = []
    real = runner._run_cli

    def counting(args, log, capture=False):
        seen.append(args)
        return real(args, log, capture)

    monkeypatch.setattr(runner, "_run_cli", counting)
    return seen


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished comparison: ppo x CartPole-v1 x seeds 1, 2."""
    out = tmp_path_factory.mktemp("cmp")
    assert cli_main(compare_args(out)) == 0
    return out


def run_path(out, method="ppo", seed=1):
    return out / "runs" / "CartPole-v1" / method / f"seed_{seed}"


def test_compare_writes_report_curves_and_run_dirs(finished):
    text = (finished / "report.md").read_text()
    assert "reflectrl compare --methods ppo --env-ids CartPole-v1 --seeds 2 --total-timesteps 256" in text
    assert "## CartPole-v1" in text and "| ppo | 2 |" in text and "(baseline)" in text
    assert (finished / "curves.png").read_bytes()[:8] == PNG
    for seed in (1, 2):
        d = run_path(finished, seed=seed)
        ev = json.loads((d / "eval.json").read_text())
        assert ev["episodes"] == 2 and ev["mean"] > 0
        assert "$ reflectrl train --algo ppo --env-id CartPole-v1" in (d / "train.log").read_text()
        info = json.loads((d / "run.json").read_text())
        assert info["method"] == "ppo" and info["train_args"] == TRAIN
        assert [a["kind"] for a in info["attempts"]] == ["train", "eval"]
        assert 0 < info["attempts"][0]["learn_s"] < info["attempts"][0]["wall_s"]


def test_rerun_skips_finished_runs(finished, launches, capsys):
    stamps = {p: p.stat().st_mtime_ns for p in finished.rglob("*") if p.is_file() and p.parent.name.startswith("seed")}
    assert cli_main(compare_args(finished)) == 0
    assert launches == []
    assert "2 runs: 2 finished (skipped), 0 to resume, 0 to train" in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}


def test_report_labels_runs_by_their_place_in_methods(finished, tmp_path, launches):
    """A finished run linked in from another comparison, where it had another label, is reported
    under the label --methods gives its folder (and is still skipped)."""
    out = tmp_path / "cmp"
    shutil.copytree(finished, out)
    shutil.move(out / "runs" / "CartPole-v1" / "ppo", out / "runs" / "CartPole-v1" / "base")
    for seed in (1, 2):
        info = json.loads((run_path(out, "base", seed) / "run.json").read_text())
        assert info["method"] == "ppo"
    assert cli_main(compare_args(out, methods=("base=ppo",))) == 0
    assert launches == []
    text = (out / "report.md").read_text()
    assert "| base | 2 |" in text and "| ppo | 2 |" not in text


def test_report_only_trains_nothing_and_lists_unfinished_runs(finished, tmp_path, launches):
    out = tmp_path / "cmp"
    shutil.copytree(finished, out)
    (run_path(out, seed=2) / "eval.json").unlink()  # seed 2 still training elsewhere
    run_path(out, seed=3).mkdir()  # seed 3's folder holds another algo's run
    (run_path(out, seed=3) / "config.json").write_text(json.dumps({"algo": "dqn", "total_timesteps": 256}))
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    args = compare_args(out, seeds=3)
    assert cli_main(args[:-len(TRAIN) - 1] + ["--report-only", *args[-len(TRAIN) - 1:]]) == 0
    assert launches == []
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    text = (out / "report.md").read_text()
    assert "| ppo | 1 |" in text and "--report-only" in text
    assert "1 of 3 runs not finished and left out (CartPole-v1/ppo/seed_2)" in text
    assert f"left out, in conflict: {run_path(out, seed=3)} holds a run of dqn, not ppo" in text
    assert (out / "curves.png").read_bytes()[:8] == PNG


def test_interrupted_comparison_resumes(finished, tmp_path, launches):
    out = tmp_path / "cmp"
    shutil.copytree(finished, out)
    # seed 1: interrupted after its first checkpoint (update 1 of 2): what compare leaves after Ctrl-C
    s1 = run_path(out, seed=1)
    uninterrupted = json.loads((s1 / "eval.json").read_text())["mean"]
    info = json.loads((s1 / "run.json").read_text())
    shutil.rmtree(s1)
    s1.mkdir()
    rc, _, _ = runner._run_cli(["train", "--env-id", "CartPole-v1", "--seed", "1", "--total-timesteps", "128",
                                 "--run-dir", str(s1), "--no-progress", *TRAIN], s1 / "train.log")
    assert rc == 0
    killed = {"kind": "train", "status": None, "at": "2026-01-01T00:00:00"}  # recorded at start, never ended
    (s1 / "run.json").write_text(json.dumps({**info, "attempts": [killed]}))
    first = (s1 / "metrics.jsonl").read_text().splitlines()
    seed2 = {p: p.stat().st_mtime_ns for p in run_path(out, seed=2).iterdir()}
    launches.clear()
    assert cli_main(compare_args(out)) == 0
    assert [a[:3] for a in launches] == [["train", "--resume", str(s1)], ["eval", str(s1), "--episodes"]]
    assert seed2 == {p: p.stat().st_mtime_ns for p in run_path(out, seed=2).iterdir()}  # finished: untouched
    lines = (s1 / "metrics.jsonl").read_text().splitlines()
    assert lines[:1] == first and json.loads(lines[-1])["global_step"] == 256 and len(lines) == 2
    # resume replays the env and restores optimizer and RNG state: same policy as the uninterrupted run
    assert json.loads((s1 / "eval.json").read_text())["mean"] == uninterrupted
    attempts = json.loads((s1 / "run.json").read_text())["attempts"]
    assert [(a["kind"], a["status"]) for a in attempts] == [("train", None), ("resume", 0), ("eval", 0)]
    text = (out / "report.md").read_text()
    assert "| ppo | 2 |" in text
    # the killed attempt's time is missing: the wall times are marked as lower bounds
    row = next(l for l in text.splitlines() if l.startswith("| ppo | 2 |"))
    assert row.endswith("+) |") and "| train (killed) + resume |" in text


def test_failing_run_is_reported_and_others_continue(finished, tmp_path, capsys):
    out = tmp_path / "cmp"
    shutil.copytree(finished, out)
    rc = cli_main(compare_args(out, methods=("ppo", "bad=ppo --learning-rate -1"), seeds=1))
    assert rc == 1
    err = capsys.readouterr().err
    log = run_path(out, "bad") / "train.log"
    assert (f"run CartPole-v1/bad/seed_1 failed: train exited with status 2: error: --learning-rate must be "
            f"positive (log: {log})") in err
    text = (out / "report.md").read_text()
    assert "## Failed runs (1)" in text and "CartPole-v1/bad/seed_1" in text and "| ppo | 1 |" in text


@pytest.mark.parametrize("args,pattern", [
    (["--methods", "nope"], "unknown --algo 'nope'"),
    (["--methods", "ppo", "ppo"], "names a method twice"),
    (["--methods", "a/b=ppo"], "bad --methods entry"),
    (["--methods", "ppo", "--extra", "--seed", "3"], "--seed is set by compare"),
    (["--methods", "x=ppo --total-timesteps=9"], "--total-timesteps is set by compare"),
    (["--methods", "ppo", "--seeds", "0"], "--seeds must be at least 1"),
])
def test_bad_input_gives_one_clear_error(args, pattern, tmp_path, capsys):
    base = ["compare", "--env-ids", "CartPole-v1", "--total-timesteps", "256", "--out", str(tmp_path)]
    assert cli_main(base + args) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and pattern in err[0], err


def test_method_variants():
    assert parse_method("ppo") == compare.MethodSpec("ppo", "ppo", ())
    assert parse_method("ppo-lr=ppo --learning-rate 1e-3") == compare.MethodSpec("ppo-lr", "ppo",
                                                                                ("--learning-rate", "1e-3"))


def test_an_attempt_is_recorded_before_it_starts(tmp_path, monkeypatch):
    """A compare killed mid-run leaves the attempt in run.json with status null (no time recorded)."""
    d = tmp_path / "r"
    d.mkdir()
    seen = []

    def killed(args, log, capture=False):
        seen.append(json.loads((d / "run.json").read_text())["attempts"])
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_run_cli", killed)
    with pytest.raises(KeyboardInterrupt):
        runner._attempt(RunSpec("E-v0", "ppo", "ppo", 1, 1000, str(d)), "train", d / "train.log")
    assert [(a["kind"], a["status"]) for a in seen[0]] == [("train", None)]
    assert json.loads((d / "run.json").read_text())["attempts"] == seen[0]


def test_plan_reads_the_run_directory(tmp_path):
    d = tmp_path / "r"
    spec = RunSpec("E-v0", "ppo", "ppo", 1, 1000, str(d))
    assert plan(spec)[0] == "train"
    fake_run(d, "E-v0", "ppo", 1, [(500, 1.0)], final=1.0, total=1000)
    assert plan(spec)[0] == "skip"
    (d / "eval.json").unlink()
    assert plan(spec)[0] == "train"  # no checkpoint: the attempt died before its first one
    (d / runner.CHECKPOINT).write_bytes(b"")
    assert plan(spec) == ("resume", "checkpoint without evaluation")
    assert plan(RunSpec("E-v0", "ppo", "ppo", 1, 2000, str(d))) == ("resume", "extend to 2000 steps")
    assert plan(RunSpec("E-v0", "ppo", "ppo", 1, 500, str(d)))[0] == "conflict"
    assert "--learning-rate" in plan(RunSpec("E-v0", "ppo", "ppo", 1, 1000, str(d), ("--learning-rate", "1")))[1]


def test_checkpoint_name_matches_the_trainer():
    from reflectrl.trainer import CHECKPOINT

    assert runner.CHECKPOINT == CHECKPOINT


def test_files_shipped_by_a_remote_worker_are_written_once(tmp_path):
    d = tmp_path / "r"
    files = {"run.json": '{"method": "ppo"}', "eval.json": '{"mean": 1.0}', "metrics.jsonl": ""}
    runner.materialize({"run_dir": str(d), "files": dict(files)})
    assert (d / "eval.json").read_text() == files["eval.json"]
    (d / "metrics.jsonl").write_text("local")
    runner.materialize({"run_dir": str(d), "files": dict(files)})  # same run.json: a shared disk, nothing written
    assert (d / "metrics.jsonl").read_text() == "local"
