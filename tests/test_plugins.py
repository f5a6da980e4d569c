"""A method of a user's own module, named in REFLECTRL_PLUGINS, is an --algo of the command: it trains, is
listed, resumes as itself; a module that cannot be imported is one clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PLUGIN = '''
from dataclasses import dataclass

import torch

from reflectrl.control.config import PPOConfig
from reflectrl.control.ppo import PPO
from reflectrl.contract.base import MethodRunner, Shaping
from reflectrl.algos.registry import Algo, register_algo


@dataclass
class BonusConfig(PPOConfig):
    bonus: float = 0.5
    exp_name: str = "plug-bonus"


class ConstantBonus:
    fit_first = True

    def __init__(self, bonus):
        self.bonus, self.fits = bonus, 0

    def fit(self, batch):
        self.fits += 1

    def shape(self, batch):
        return Shaping(reward_delta=torch.full_like(batch.rewards, self.bonus))

    def metrics(self):
        return {"plug/fits": float(self.fits)}

    def state(self):
        return {}, {"fits": self.fits}

    def load_state(self, tensors, meta):
        self.fits = int(meta["fits"])


register_algo(Algo("plug-bonus", "control", BonusConfig,
                   lambda cfg: PPO(cfg, [MethodRunner(ConstantBonus(cfg.bonus), lambda t, b: (b.obs, b.obs))]),
                   "PPO + a constant bonus (a plugin)"))
'''


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reflectrl.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_plugin_algo_trains_lists_and_resumes(tmp_path: Path):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "REFLECTRL_PLUGINS": "my_plugin"}
    listed = run(["train", "--help"], env)
    assert listed.returncode == 0 and "plug-bonus" in listed.stdout
    rd = tmp_path / "r"
    p = run(["train", "--algo", "plug-bonus", "--env-id", "CartPole-v1", "--total-timesteps", "256", "--num-envs", "2",
             "--num-steps", "64", "--bonus", "0.25", "--run-dir", str(rd), "--no-progress"], env)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
    assert [r["plug/fits"] for r in recs] == [1.0, 2.0]
    assert json.loads((rd / "config.json").read_text())["bonus"] == 0.25
    r = run(["train", "--resume", str(rd), "--total-timesteps", "384", "--no-progress"], env)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["plug/fits"] == 3.0  # the counter came back from the checkpoint


def test_unimportable_plugin_is_one_clear_error(tmp_path: Path):
    env = {**os.environ, "REFLECTRL_PLUGINS": "no_such_module_here"}
    p = run(["train", "--algo", "ppo", "--total-timesteps", "64", "--run-dir", str(tmp_path / "x")], env)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "no_such_module_here" in p.stderr
    assert not (tmp_path / "x").exists()
