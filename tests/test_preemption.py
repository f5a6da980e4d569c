"""Preemption: SIGTERM (or SIGINT) stops every trainer at the next safe point with a checkpoint and exit
status 143 (130); ``--resume`` then ends exactly where an uninterrupted run ends (timing fields aside).
Also: TensorBoard has no repeated steps at a resume seam, and ``reflectrl compare --retries`` retries a
run that failed (it resumes from the failed attempt's checkpoint)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import in_process_cli

from reflectrl.checkpoint import load_checkpoint
from reflectrl.cli import main

ROOT = Path(__file__).resolve().parents[1]
PPO_FLAGS = ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2",
             "--update-epochs", "1", "--no-progress"]


def timing(key: str) -> bool:
    return key.startswith("time/") or key in ("charts/SPS", "charts/samples_per_s", "charts/tokens_per_s")


def read_records(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(l).items() if not timing(k)} for l in path.read_text().splitlines()]


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "reflectrl.cli", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stop_after(proc: subprocess.Popen, metrics: Path, n: int, signum: int,
               timeout: float = 240) -> tuple[int, int, str]:
    """Send ``signum`` once ``metrics`` holds ``n`` records; return (records seen then, exit status, stderr)."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline and proc.poll() is None:
        seen = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        if seen >= n:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before the signal: {proc.communicate()}"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=timeout)
    return seen, proc.returncode, err


def assert_stopped(err: str, signum: int, rc: int, run: Path, resume: str, seen: int) -> int:
    """The stop message and what is on disk: returns the update the checkpoint holds."""
    name = signal.Signals(signum).name
    assert rc == 128 + signum, err
    assert "Traceback" not in err, err
    assert f"{name}: stopping after this update with a checkpoint" in err
    last = err.strip().splitlines()[-1]
    prefix = f"stopped by {name} after update "
    assert last.startswith(prefix), err
    update = int(last[len(prefix):].split(";")[0])
    assert last.endswith(f"the checkpoint in {run} holds it: continue with `{resume} {run}`"), last
    assert update >= seen  # the update running at the signal was finished and kept
    assert int(load_checkpoint(run / "checkpoint.safetensors")[1]["update"]) == update
    assert [r["update"] for r in read_records(run / "metrics.jsonl")] == list(range(1, update + 1))
    return update


# ------------------------------------------------------------------------------------------ control
def test_ppo_stops_on_sigterm_and_resumes_to_the_uninterrupted_run(tmp_path, capsys):
    budget = ["--total-timesteps", str(64 * 40), "--save-interval", "0", "--no-tensorboard"]
    run, ref = tmp_path / "a", tmp_path / "b"
    seen, rc, err = stop_after(start(["train", *PPO_FLAGS, *budget, "--run-dir", str(run)]), run / "metrics.jsonl",
                               3, signal.SIGTERM)
    update = assert_stopped(err, signal.SIGTERM, rc, run, "reflectrl train --resume", seen)
    assert update < 40
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert main(["train", *PPO_FLAGS, *budget, "--run-dir", str(ref)]) == 0
    capsys.readouterr()
    assert read_records(run / "metrics.jsonl") == read_records(ref / "metrics.jsonl")


def test_dqn_stops_on_sigint_and_resumes_to_the_uninterrupted_run(tmp_path, capsys):
    flags = ["--algo", "dqn", "--env-id", "CartPole-v1", "--total-timesteps", "2000", "--learning-starts", "200",
             "--log-interval", "50", "--save-interval", "7", "--no-progress", "--no-tensorboard"]
    run, ref = tmp_path / "a", tmp_path / "b"
    seen, rc, err = stop_after(start(["train", *flags, "--run-dir", str(run)]), run / "metrics.jsonl", 3,
                               signal.SIGINT)
    assert_stopped(err, signal.SIGINT, rc, run, "reflectrl train --resume", seen)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert main(["train", *flags, "--run-dir", str(ref)]) == 0
    capsys.readouterr()
    assert read_records(run / "metrics.jsonl") == read_records(ref / "metrics.jsonl")


# ---------------------------------------------------------------------------------------------- LLM
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from reflectrl.llm.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny") / "m", layers=1, width=32, heads=2, max_positions=128)


def llm_flags(tiny: Path, updates: int) -> list[str]:
    return ["llm", "train", "--task", "arith", "--model", str(tiny), "--prompts-per-update", "2", "--group-size", "2",
            "--max-new-tokens", "3", "--learning-rate", "1e-3", "--updates", str(updates), "--sample-interval", "2",
            "--no-progress"]


def test_grpo_stops_on_sigterm_and_resumes_to_the_uninterrupted_run(tiny, tmp_path, capsys):
    flags = [*llm_flags(tiny, 25), "--save-interval", "0", "--no-tensorboard"]
    run, ref = tmp_path / "a", tmp_path / "b"
    seen, rc, err = stop_after(start([*flags, "--run-dir", str(run)]), run / "metrics.jsonl", 3, signal.SIGTERM)
    update = assert_stopped(err, signal.SIGTERM, rc, run, "reflectrl llm train --resume", seen)
    assert update < 25
    assert main(["llm", "train", "--resume", str(run), "--no-progress"]) == 0
    assert main([*flags, "--run-dir", str(ref)]) == 0
    capsys.readouterr()
    assert read_records(run / "metrics.jsonl") == read_records(ref / "metrics.jsonl")
    assert (run / "samples.jsonl").read_text() == (ref / "samples.jsonl").read_text()


# ------------------------------------------------------------------------------- TensorBoard seams
def tb_steps(run: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def crash_after_checkpoint(run: Path, resume: list[str]) -> None:
    """Keep the checkpoint of now, train on (logging past it), then put it back: the state a run killed
    after logging those updates but before its next checkpoint leaves."""
    kept = run.parent / "kept.safetensors"
    shutil.copy(run / "checkpoint.safetensors", kept)
    assert main(resume) == 0
    shutil.copy(kept, run / "checkpoint.safetensors")


def test_tensorboard_has_no_repeated_steps_at_a_resume_seam(tiny, tmp_path, capsys):
    run = tmp_path / "c"
    assert main(["train", *PPO_FLAGS, "--total-timesteps", "128", "--run-dir", str(run)]) == 0
    crash_after_checkpoint(run, ["train", "--resume", str(run), "--total-timesteps", "256", "--no-progress"])
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert tb_steps(run, "losses/value_loss") == [64, 128, 192, 256]
    llm = tmp_path / "g"
    assert main([*llm_flags(tiny, 2), "--run-dir", str(llm)]) == 0
    crash_after_checkpoint(llm, ["llm", "train", "--resume", str(llm), "--updates", "4", "--no-progress"])
    assert main(["llm", "train", "--resume", str(llm), "--no-progress"]) == 0
    capsys.readouterr()
    assert tb_steps(llm, "reward/mean") == [4, 8, 12, 16]  # global_step counts completions


# ------------------------------------------------------------------------------ compare --retries


def preempted_once(monkeypatch) -> list[list[str]]:
    """Every compare process runs in this process; the first ``train`` is preempted halfway (it trains half
    its budget, keeps that checkpoint and exits 143)."""
    from reflectrl.experiments import runner

    seen: list[list[str]] = []

    def fake(args, log, capture=False):
        seen.append(list(args))
        if args[0] == "train" and "--resume" not in args and len(seen) == 1:
            i = args.index("--total-timesteps") + 1
            half = [*args[:i], str(int(args[i]) // 2), *args[i + 1:]]
            in_process_cli(half, log, capture)
            with open(log, "a") as fh:
                fh.write("stopped by SIGTERM after update 2\n")
            return 143, "", 0.1
        return in_process_cli(args, log, capture)

    monkeypatch.setattr(runner, "_run_cli", fake)
    return seen


@pytest.mark.parametrize("retries", [0, 1])
def test_compare_retries_a_failed_run_from_its_checkpoint(tmp_path, monkeypatch, capsys, retries):
    seen = preempted_once(monkeypatch)
    out = tmp_path / "cmp"
    rc = main(["compare", "--methods", "ppo", "--env-ids", "CartPole-v1", "--seeds", "1", "--total-timesteps", "256",
               "--out", str(out), "--workers", "1", "--eval-episodes", "1", "--bootstrap-reps", "100",
               "--retries", str(retries), "--extra", "--num-envs", "2", "--num-steps", "32", "--no-tensorboard"])
    err = capsys.readouterr().err
    d = out / "runs" / "CartPole-v1" / "ppo" / "seed_1"
    info = json.loads((d / "run.json").read_text())
    if retries == 0:
        assert rc == 1 and "train exited with status 143" in err and not (d / "eval.json").exists()
        assert [a["kind"] for a in info["attempts"]] == ["train"]
        return
    assert rc == 0, err
    assert [(a["kind"], a["status"]) for a in info["attempts"]] == [("train", 143), ("resume", 0), ("eval", 0)]
    assert [a[:2] for a in seen] == [["train", "--algo"], ["train", "--resume"], ["eval", str(d)]]
    assert [r["global_step"] for r in read_records(d / "metrics.jsonl")] == [64, 128, 192, 256]


# ------------------------------------------------------------------------------------- double Ctrl-C
def double_sigint(tiny: Path, tmp_path: Path, tries: int) -> None:
    """``tries`` double Ctrl-Cs (two SIGINTs 20 ms apart) in a row, each at a random point of an update of a fresh
    or resumed run: each process ends within 30 s, with one line and status 130, never a traceback; the run then
    resumes from its last checkpoint."""
    import random

    run = tmp_path / "dbl"
    rng = random.Random(0)
    for i in range(tries):
        args = ["llm", "train", "--resume", str(run), "--no-progress"] if i else \
            [*llm_flags(tiny, 100000), "--save-interval", "1", "--no-tensorboard", "--run-dir", str(run)]
        proc = start(args)
        metrics = run / "metrics.jsonl"
        have = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) > have + 1:
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"try {i}: still running 30 s after a double Ctrl-C (a hang)")
        assert time.monotonic() - t0 < 30
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        last = err.strip().splitlines()[-1]
        assert ("stopped at once" in last and "continue with `reflectrl llm train --resume" in last) or \
            last.startswith("stopped by SIGINT after update"), err
    done = int(load_checkpoint(run / "checkpoint.safetensors")[1]["update"])
    assert main(["llm", "train", "--resume", str(run), "--updates", str(done + 1), "--no-progress"]) == 0
    assert [r["update"] for r in read_records(run / "metrics.jsonl")] == list(range(1, done + 2))


def test_a_double_ctrl_c_ends_in_one_line_and_resumes(tiny, tmp_path, capsys):
    double_sigint(tiny, tmp_path, tries=3)


@pytest.mark.slow
def test_twenty_double_ctrl_cs_in_a_row(tiny, tmp_path, capsys):
    double_sigint(tiny, tmp_path, tries=20)


def test_a_late_ctrl_c_while_the_interpreter_shuts_down_keeps_status_130(monkeypatch):
    """Python's shutdown resets its signal handlers to the default, under which a Ctrl-C arriving after a stopped
    run has printed its line would kill the process (status -2). A command-line process that was stopped by SIGINT
    ignores SIGINT as it returns; one that was not keeps the default."""
    from reflectrl import trainer

    monkeypatch.setattr(trainer, "SECOND_INTERRUPT_EXITS", True)
    before = signal.getsignal(signal.SIGINT)
    try:
        with trainer.StopRequests():
            pass
        trainer.ignore_late_interrupts()
        assert signal.getsignal(signal.SIGINT) is before  # nothing requested: untouched
        with trainer.StopRequests() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert stop.requested
        assert signal.getsignal(signal.SIGINT) is not before  # a further Ctrl-C would end at once
        trainer.ignore_late_interrupts()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
