import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "reflectrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def assert_clean_error(proc, pattern):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_train_then_eval_smoke(tmp_path):
    run = tmp_path / "r"
    p = cli("train", "--algo", "ppo", "--env-id", "CartPole-v1", "--seed", "1", "--total-timesteps", "256",
            "--num-envs", "2", "--num-steps", "64", "--run-dir", str(run), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["global_step"] == 256
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["num_envs"] == 2 and cfg["learning_rate"] == 2.5e-4
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    for key in ("global_step", "charts/SPS", "losses/value_loss", "losses/policy_loss", "losses/entropy",
                "losses/approx_kl", "losses/clipfrac", "losses/explained_variance"):
        assert key in recs[-1]
    assert any("charts/episodic_return" in r for r in recs)
    assert list((run / "tb").glob("events.out.tfevents.*"))
    e = cli("eval", str(run), "--episodes", "3", "--json")
    assert e.returncode == 0, e.stderr
    out = json.loads(e.stdout.strip().splitlines()[-1])
    assert out["episodes"] == 3 and out["mean"] > 0 and out["std"] >= 0
    # resume a finished run to a larger budget
    r = cli("train", "--resume", str(run), "--total-timesteps", "384", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_preset_values_and_explicit_override(tmp_path):
    run = tmp_path / "p"
    p = cli("train", "--preset", "LunarLander-v3", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2",
            "--total-timesteps", "128", "--run-dir", str(run), "--no-progress")
    assert p.returncode == 0, p.stderr
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["env_id"] == "LunarLander-v3" and cfg["gamma"] == 0.999 and cfg["num_envs"] == 2


@pytest.mark.parametrize("args,pattern", [
    (["train", "--env-id", "NoSuchEnv-v0"], "unknown Gymnasium env id"),
    (["train", "--num-envs", "4", "--num-minibatches", "3"], "not divisible"),
    (["train", "--learning-rate", "-0.1"], "learning-rate must be positive"),
    (["train", "--preset", "NoSuchPreset"], "unknown preset"),
    (["train", "--algo", "nope"], "unknown --algo"),
    (["train", "--resume", "/nonexistent/run"], "does not exist"),
    (["eval", "/nonexistent/run"], "does not exist"),
])
def test_bad_input_gives_one_clear_error(args, pattern):
    assert_clean_error(cli(*args), pattern)


def test_corrupt_checkpoint_gives_one_clear_error(tmp_path):
    run = tmp_path / "c"
    assert cli("train", "--env-id", "CartPole-v1", "--total-timesteps", "128", "--num-envs", "2", "--num-steps", "64",
               "--run-dir", str(run), "--no-progress").returncode == 0
    (run / "checkpoint.safetensors").write_bytes(b"garbage")
    assert_clean_error(cli("eval", str(run)), "corrupt")
    assert_clean_error(cli("train", "--resume", str(run)), "corrupt")
    (run / "config.json").write_text("{not json")
    assert_clean_error(cli("eval", str(run)), "corrupt")


def test_docs_cli_lists_every_flag_of_the_help():
    doc = (ROOT / "docs" / "cli.md").read_text()
    for cmd in (["train", "--help"], ["eval", "--help"]):
        p = cli(*cmd)
        assert p.returncode == 0
        flags = set(re.findall(r"--[a-z][a-z0-9-]+", p.stdout))
        missing = sorted(f for f in flags if f not in doc)
        assert not missing, f"docs/cli.md lacks {missing}; regenerate it with `make docs`"
