"""The method algos end to end through the CLI, resume equals uninterrupted, and DQN's specifics."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from reflectrl.algos import algo_names, get_algo, resume
from reflectrl.checkpoint import load_checkpoint
from reflectrl.cli import main as cli_main
from reflectrl.control.dqn import DQN, DQNConfig, linear_schedule
from reflectrl.control.ppo import CHECKPOINT, PPO
from reflectrl.errors import ConfigError
from reflectrl.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[2]
PPO_ARGS = ["--num-envs", "4", "--num-steps", "32", "--total-timesteps", "384", "--update-epochs", "2"]
DQN_ARGS = ["--total-timesteps", "600", "--learning-starts", "200", "--buffer-size", "500", "--log-interval", "200",
            "--target-network-frequency", "50", "--train-frequency", "4", "--batch-size", "32"]
ALGO_ARGS = {
    "refgrpo-seed": PPO_ARGS,
    "gear-seed": PPO_ARGS,
    "exgrpo-seed": PPO_ARGS + ["--refl-min-memory", "4"],
    "dqn": DQN_ARGS,
    "exgrpo-seed-dqn": DQN_ARGS + ["--refl-every", "100", "--refl-min-memory", "4"],
}
KEYS = {
    "refgrpo-seed": ["refgrpo-seed/L_cal_train", "refgrpo-seed/L_cal_heldout", "refgrpo-seed/b_cal_mean",
                     "refgrpo-seed/b_cal_std", "refgrpo-seed/bonus_to_reward", "losses/entropy", "losses/approx_kl"],
    "gear-seed": ["gear-seed/omega_mean", "gear-seed/omega_std", "gear-seed/omega_min", "gear-seed/omega_max",
                  "gear-seed/omega_clip_frac", "gear-seed/winners"],
    "exgrpo-seed": ["exgrpo-seed/buffer_size", "exgrpo-seed/priority_max", "exgrpo-seed/refl_mean", "exgrpo-seed/refl_std"],
    "dqn": ["charts/SPS", "losses/td_loss", "losses/q_values", "charts/episodic_return"],
    "exgrpo-seed-dqn": ["losses/td_loss", "exgrpo-seed/buffer_size", "exgrpo-seed/refl_loss", "exgrpo-seed/refl_mean"],
}


ACTIVE = {  # a metric that shows the method's learned part is in use (before the resume point too)
    "refgrpo-seed": lambda r: "refgrpo-seed/L_cal_heldout" in r,
    "gear-seed": lambda r: r.get("gear-seed/omega_std", 0.0) > 0,
    "exgrpo-seed": lambda r: "exgrpo-seed/refl_mean" in r,
    "exgrpo-seed-dqn": lambda r: "exgrpo-seed/refl_mean" in r,
    "dqn": lambda r: "losses/td_loss" in r,
}


def strip_timing(recs):
    return [{k: v for k, v in r.items() if "SPS" not in k and "time" not in k} for r in recs]


def test_every_method_is_registered():
    assert {"ppo", "refgrpo-seed", "gear-seed", "exgrpo-seed", "dqn", "exgrpo-seed-dqn"} <= set(algo_names("control"))


@pytest.mark.parametrize("algo", list(ALGO_ARGS))
def test_algo_trains_through_the_cli(tmp_path, capsys, algo):
    run = tmp_path / algo
    code = cli_main(["train", "--algo", algo, "--env-id", "CartPole-v1", *ALGO_ARGS[algo], "--run-dir", str(run),
                     "--no-progress", "--no-tensorboard"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["global_step"] in (384, 600)
    assert json.loads((run / "config.json").read_text())["algo"] == algo
    recs = read_metrics(run / "metrics.jsonl")
    seen = set().union(*recs)
    missing = [k for k in KEYS[algo] if k not in seen]
    assert not missing, missing
    assert (run / CHECKPOINT).exists()


def test_dqn_cli_subprocess_then_eval(tmp_path):
    run = tmp_path / "d"
    p = subprocess.run([sys.executable, "-m", "reflectrl.cli", "train", "--algo", "exgrpo-seed-dqn", "--env-id",
                        "CartPole-v1", *ALGO_ARGS["exgrpo-seed-dqn"], "--run-dir", str(run), "--no-progress"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert cli_main(["eval", str(run), "--episodes", "3", "--json"]) == 0
    assert cli_main(["eval", str(run), "--episodes", "2", "--stochastic"]) == 0


def interrupt(trainer, update: int | None = None, step: int | None = None):
    """Make ``trainer`` raise KeyboardInterrupt when it starts update ``update`` or (DQN) reaches env step
    ``step``: a crash mid-way between checkpoints."""
    if update is not None:
        run = trainer.iteration

        def iteration():
            if trainer.update_idx + 1 == update:
                raise KeyboardInterrupt
            return run()

        trainer.iteration = iteration
    if step is not None:
        take = trainer.step

        def one_step():
            take()
            if trainer.global_step == step:
                raise KeyboardInterrupt

        trainer.step = one_step
    return trainer


def _ppo_cfg(algo, tmp_path, name, **options):
    extra = {"refl_min_memory": 4, **options} if algo == "exgrpo-seed" else dict(options)
    return get_algo("control", algo).config_cls(env_id="CartPole-v1", num_envs=4, num_steps=32, total_timesteps=128 * 6,
                                     update_epochs=2, num_minibatches=2, run_dir=str(tmp_path / name), progress=False,
                                     tensorboard=False, save_interval=2, **extra)


@pytest.mark.parametrize("algo,options", [("refgrpo-seed", {}), ("gear-seed", {}), ("exgrpo-seed", {}),
                                          ("exgrpo-seed", {"refl_background": True})],
                         ids=["refgrpo-seed", "gear-seed", "exgrpo-seed", "exgrpo-seed-background"])
def test_ppo_method_resume_equals_uninterrupted(tmp_path, algo, options):
    """Save at update 2, interrupt in update 4, resume: the same metrics and final state. In the
    background mode the checkpoint at update 2 holds a finished fit that is not live yet."""
    a = get_algo("control", algo)
    a.make(_ppo_cfg(algo, tmp_path, "full", **options)).learn()
    cut = interrupt(a.make(_ppo_cfg(algo, tmp_path, "cut", **options)), update=4)
    with pytest.raises(KeyboardInterrupt):
        cut.learn()
    resume(tmp_path / "cut").learn()
    full = strip_timing(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    got = strip_timing(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
    assert len(full) == 6 and got == full
    lag = 1 if options.get("refl_background") else 0  # the first background fit goes live one update later
    assert all(ACTIVE[algo](r) for r in full[1 + lag:])
    ta, _ = load_checkpoint(tmp_path / "full" / CHECKPOINT)
    tb, _ = load_checkpoint(tmp_path / "cut" / CHECKPOINT)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.parametrize("algo", ["ppo", "refgrpo-seed", "gear-seed"])
def test_extending_a_finished_run_equals_a_fresh_run_of_the_larger_budget(tmp_path, algo, recwarn):
    """Nothing in these runs follows the budget (constant learning rate), so training 3 updates and
    then resuming with a budget of 6 is the 6-update run, metric for metric and bit for bit."""
    a = get_algo("control", algo)
    short = _ppo_cfg(algo, tmp_path, "short", anneal_lr=False)
    short.total_timesteps = 128 * 3
    a.make(short).learn()
    resume(tmp_path / "short", 128 * 6).learn()
    a.make(_ppo_cfg(algo, tmp_path, "fresh", anneal_lr=False)).learn()
    assert not [w for w in recwarn if "follow the budget" in str(w.message)]
    fresh = strip_timing(read_metrics(tmp_path / "fresh" / "metrics.jsonl"))
    assert len(fresh) == 6 and strip_timing(read_metrics(tmp_path / "short" / "metrics.jsonl")) == fresh
    ta, _ = load_checkpoint(tmp_path / "fresh" / CHECKPOINT)
    tb, _ = load_checkpoint(tmp_path / "short" / CHECKPOINT)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.parametrize("algo,options,flags", [
    ("ppo", {}, "--anneal-lr"),
    ("exgrpo-seed", {"anneal_lr": False}, "--refl-coef-ramp"),
    ("exgrpo-seed", {}, "--anneal-lr, --refl-coef-ramp"),
    ("dqn", None, "--exploration-fraction")])
def test_extending_warns_when_a_schedule_follows_the_budget(tmp_path, algo, options, flags):
    a = get_algo("control", algo)
    cfg = _dqn_cfg(algo, tmp_path, "run") if options is None else _ppo_cfg(algo, tmp_path, "run", **options)
    cfg.total_timesteps //= 2
    a.make(cfg).learn()
    with pytest.warns(UserWarning, match=f"schedule of {flags}, which follow the budget"):
        resume(tmp_path / "run", cfg.total_timesteps * 2)
    with warnings.catch_warnings():  # the same budget (an interrupted run resuming) is not a change
        warnings.filterwarnings("error", message=".*follow the budget")
        resume(tmp_path / "run", cfg.total_timesteps)
        resume(tmp_path / "run")


def _dqn_cfg(algo, tmp_path, name):
    extra = {"refl_every": 100, "refl_min_memory": 4} if algo == "exgrpo-seed-dqn" else {}
    return get_algo("control", algo).config_cls(env_id="CartPole-v1", total_timesteps=1200, learning_starts=300, buffer_size=400,
                                     log_interval=200, target_network_frequency=50, train_frequency=4, batch_size=32,
                                     save_interval=1, run_dir=str(tmp_path / name), progress=False, tensorboard=False,
                                     **extra)


@pytest.mark.parametrize("algo", ["dqn", "exgrpo-seed-dqn"])
def test_dqn_resume_equals_uninterrupted(tmp_path, algo):
    a = get_algo("control", algo)
    a.make(_dqn_cfg(algo, tmp_path, "full")).learn()
    cut = interrupt(a.make(_dqn_cfg(algo, tmp_path, "cut")), step=750)
    with pytest.raises(KeyboardInterrupt):
        cut.learn()
    assert len(read_metrics(tmp_path / "cut" / "metrics.jsonl")) == 3
    resume(tmp_path / "cut").learn()
    full = strip_timing(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    got = strip_timing(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
    assert len(full) == 6 and got == full
    assert all(ACTIVE[algo](r) for r in full[1:])
    ta, _ = load_checkpoint(tmp_path / "full" / CHECKPOINT)
    tb, _ = load_checkpoint(tmp_path / "cut" / CHECKPOINT)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


class ConstEnv(gym.Env):
    """Reward 1 every step; never terminates; a TimeLimit truncates it after 5 steps."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t / 10, 1.0], np.float32), 1.0, False, False, {}


gym.register("reflectrl-test/ConstDQN-v0", entry_point=ConstEnv, max_episode_steps=5)


@pytest.mark.parametrize("bootstrap", [True, False])
def test_dqn_stores_final_observation_and_bootstraps_truncation(tmp_path, bootstrap):
    cfg = DQNConfig(env_id="reflectrl-test/ConstDQN-v0", total_timesteps=12, learning_starts=100, buffer_size=20,
                    bootstrap_truncation=bootstrap, run_dir=str(tmp_path / "c"), progress=False, tensorboard=False)
    t = DQN(cfg)
    for _ in range(6):
        t.step()
    b = t.buffer
    assert b.next_obs[4].tolist() == pytest.approx([0.5, 1.0])  # the final observation, not the reset one
    assert b.obs[5].tolist() == [0.0, 0.0]
    assert bool(b.terminal[4]) is (not bootstrap) and not bool(b.terminal[:4].any())


def test_dqn_epsilon_schedule_and_config_errors():
    assert linear_schedule(1.0, 0.05, 100, 0) == 1.0
    assert linear_schedule(1.0, 0.05, 100, 50) == pytest.approx(0.525)
    assert linear_schedule(1.0, 0.05, 100, 500) == 0.05
    with pytest.raises(ConfigError, match="discrete action space"):
        DQN(DQNConfig(env_id="Pendulum-v1", total_timesteps=10, progress=False, tensorboard=False))
    with pytest.raises(ConfigError, match="seed-group-size"):
        gear = get_algo("control", "gear-seed")
        gear.make(gear.config_cls(num_envs=6, num_steps=16, total_timesteps=96))


def test_gear_groups_start_from_one_state(tmp_path):
    cfg = get_algo("control", "gear-seed").config_cls(env_id="LunarLander-v3", num_envs=8, num_steps=8, total_timesteps=64,
                                           run_dir=str(tmp_path / "g"), progress=False, tensorboard=False)
    t = get_algo("control", "gear-seed").make(cfg)
    obs = t.raw_obs
    assert np.array_equal(obs[0], obs[3]) and np.array_equal(obs[4], obs[7]) and not np.array_equal(obs[0], obs[4])
    assert isinstance(t, PPO) and t.algo_name == "gear-seed"


@pytest.mark.parametrize("env_id,kind", [("CartPole-v1", "obs_action_hidden"), ("CartPole-v1", "trunk_head"),
                                         ("Pendulum-v1", "obs_action")])
def test_refgrpo_predictor_inputs_and_continuous_actions(tmp_path, env_id, kind):
    a = get_algo("control", "refgrpo-seed")
    cfg = a.config_cls(env_id=env_id, num_envs=2, num_steps=32, total_timesteps=128, num_minibatches=2,
                       update_epochs=1, reflection_input=kind, cal_credit="advantage" if kind == "trunk_head" else "gae",
                       run_dir=str(tmp_path / "r"), progress=False, tensorboard=False)
    a.make(cfg).learn()
    recs = read_metrics(tmp_path / "r" / "metrics.jsonl")
    assert len(recs) == 2 and all(np.isfinite(r["refgrpo-seed/L_cal_train"]) for r in recs)


def test_docs_methods_lists_every_option():
    import dataclasses

    from reflectrl.control.config import PPOConfig

    doc = (ROOT / "docs" / "methods.md").read_text()
    from reflectrl.trainer import RunOptions

    base = {f.name for f in dataclasses.fields(PPOConfig)} - {"seed_group_size"}
    run_options = {f.name for f in dataclasses.fields(RunOptions)}
    missing = []
    for algo in ("refgrpo-seed", "gear-seed", "exgrpo-seed", "dqn", "exgrpo-seed-dqn"):
        for f in dataclasses.fields(get_algo("control", algo).config_cls):
            flag = "--" + f.name.replace("_", "-")
            if ((algo == "dqn" and f.name not in run_options) or f.name not in base) and f"`{flag}`" not in doc:
                missing.append(flag)
    assert not missing, f"docs/methods.md lacks {sorted(set(missing))}"


def test_bcal_map_of_a_lander_run(tmp_path):
    """reflectrl plot --bcal-map: one refgrpo-seed run's bonus at every step of a fresh batch, at the
    lander's raw (x, y); b_cal <= 0 everywhere; a run of another algo gets one clear error."""
    from reflectrl.experiments.bcal_map import bcal_samples

    run = tmp_path / "ref"
    assert cli_main(["train", "--algo", "refgrpo-seed", "--env-id", "LunarLander-v3", *PPO_ARGS, "--run-dir", str(run),
                     "--no-progress", "--cal-target", "normalized", "--cal-alpha", "0.05"]) == 0
    metrics_before = (run / "metrics.jsonl").read_text()
    s = bcal_samples(run, rollouts=2)
    assert s["pos"].shape == (2 * 4 * 32, 2) and s["b_cal"].shape == (2 * 4 * 32,)
    assert np.all(s["b_cal"] <= 0) and np.any(s["b_cal"] < 0)
    np.testing.assert_allclose(s["b_cal"], -0.05 * (s["f"] - s["target"]) ** 2, rtol=1e-5, atol=1e-9)
    assert np.all(np.abs(s["pos"][:, 0]) < 2.0) and np.all(s["pos"][:, 1] > -1.0)  # raw lander coordinates
    assert abs(float(np.mean(s["target"]))) < 1e-4  # the normalized target has mean 0 within each batch
    assert (run / "metrics.jsonl").read_text() == metrics_before
    out = tmp_path / "map.png"
    assert cli_main(["plot", str(run), "--out", str(out), "--bcal-map"]) == 0
    assert out.stat().st_size > 10_000
    ppo = tmp_path / "ppo"
    assert cli_main(["train", "--env-id", "CartPole-v1", *PPO_ARGS, "--run-dir", str(ppo), "--no-progress"]) == 0
    assert cli_main(["plot", str(ppo), "--out", str(tmp_path / "x.png"), "--bcal-map"]) == 2


def test_gear_ranking_option_runs_and_logs(tmp_path):
    run = tmp_path / "g"
    assert cli_main(["train", "--algo", "gear-seed", "--env-id", "CartPole-v1", *PPO_ARGS, "--run-dir", str(run),
                     "--no-progress", "--gear-rank-coef", "0.1"]) == 0
    recs = read_metrics(run / "metrics.jsonl")
    assert any(r.get("gear-seed/rank_pairs", 0) > 0 for r in recs)
    assert any(np.isfinite(r.get("gear-seed/rank_loss", np.nan)) for r in recs)
    assert cli_main(["train", "--algo", "gear-seed", "--env-id", "CartPole-v1", *PPO_ARGS, "--run-dir",
                     str(tmp_path / "bad"), "--no-progress", "--gear-rank-scale", "0"]) == 2
