"""`reflectrl compare --backend ray` on a local Ray instance."""

import json

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'reflectrl[ray]')")

from reflectrl.cli import main as cli_main  # noqa: E402


def test_ray_backend_runs_locally(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "local")  # never join a cluster someone else started on this machine
    args = ["compare", "--methods", "ppo", "--env-ids", "CartPole-v1", "--seeds", "1", "--total-timesteps", "256",
            "--out", str(tmp_path), "--eval-episodes", "2", "--bootstrap-reps", "500", "--backend", "ray",
            "--workers", "1", "--extra", "--num-envs", "2", "--num-steps", "64", "--no-tensorboard"]
    assert cli_main(args) == 0
    assert not ray.is_initialized()
    d = tmp_path / "runs" / "CartPole-v1" / "ppo" / "seed_1"
    assert json.loads((d / "eval.json").read_text())["episodes"] == 2
    assert "| ppo | 1 |" in (tmp_path / "report.md").read_text()
