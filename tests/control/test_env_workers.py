"""``--env-workers``: the envs step in worker processes and the run is the synchronous run bit for bit, checkpoints
and resume included; a worker that dies ends the run with one error naming it."""

import os
import signal

import numpy as np
import pytest
import torch

from reflectrl.algos import resume
from reflectrl.checkpoint import load_checkpoint
from reflectrl.control import PPO, PPOConfig
from reflectrl.control.env_workers import WorkerVectorEnv
from reflectrl.control.envs import EpisodeTracker, make_vector_env, replay, reset_all, reset_done
from reflectrl.control.ppo import CHECKPOINT
from reflectrl.errors import ConfigError, ReflectRLError
from reflectrl.runlog import read_metrics


def cfg(tmp_path, name, **kw) -> PPOConfig:
    base = dict(env_id="CartPole-v1", num_envs=5, num_steps=64, total_timesteps=320 * 4, update_epochs=2,
                num_minibatches=2, run_dir=str(tmp_path / name), progress=False, tensorboard=False, save_interval=1)
    return PPOConfig(**{**base, **kw})


def behaviour(path):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "charts/SPS"} for r in read_metrics(path)]


@pytest.mark.parametrize("env_id,workers", [("CartPole-v1", 1), ("CartPole-v1", 4), ("Pendulum-v1", 2)])
def test_workers_give_the_synchronous_run_bit_for_bit(tmp_path, env_id, workers):
    extra = {"num_steps": 128, "total_timesteps": 640 * 3} if env_id == "Pendulum-v1" else {}
    PPO(cfg(tmp_path, "sync", env_id=env_id, **extra)).learn()
    PPO(cfg(tmp_path, "workers", env_id=env_id, env_workers=workers, **extra)).learn()
    sync, work = behaviour(tmp_path / "sync" / "metrics.jsonl"), behaviour(tmp_path / "workers" / "metrics.jsonl")
    assert len(sync) >= 3 and work == sync
    assert any("charts/episodic_return" in r for r in sync)  # episodes ended and were reset in the workers


def test_resume_with_workers_equals_the_uninterrupted_synchronous_run(tmp_path):
    PPO(cfg(tmp_path, "full", anneal_lr=False)).learn()  # no schedule that follows the budget: a larger one resumes exactly
    PPO(cfg(tmp_path, "cut", env_workers=2, total_timesteps=320 * 2, anneal_lr=False)).learn()
    resume(tmp_path / "cut", 320 * 4).learn()  # the envs rebuilt by replaying each one's episode in its worker
    assert behaviour(tmp_path / "cut" / "metrics.jsonl") == behaviour(tmp_path / "full" / "metrics.jsonl")
    ta, _ = load_checkpoint(tmp_path / "full" / CHECKPOINT)
    tb, _ = load_checkpoint(tmp_path / "cut" / CHECKPOINT)
    assert all(torch.equal(ta[k], tb[k]) for k in ta if k.startswith("model/"))


@pytest.mark.parametrize("shared_signal", [True, False])  # a step announced in shared memory (x86-64), or on the pipe
def test_the_worker_env_steps_resets_and_replays_as_the_synchronous_one(shared_signal):
    sync, work = make_vector_env("CartPole-v1", 4), WorkerVectorEnv("CartPole-v1", 4, 3, shared_signal=shared_signal)
    try:
        ta, tb = EpisodeTracker(7, 4), EpisodeTracker(7, 4)
        oa, ob = reset_all(sync, ta), reset_all(work, tb)
        rng = np.random.default_rng(0)
        for _ in range(60):
            act = rng.integers(0, 2, 4)
            ra, rb = sync.step(act), work.step(act)
            for x, y in zip(ra[:4], rb[:4]):
                assert x.dtype == y.dtype and np.array_equal(x, y)
            for t, out in ((ta, ra), (tb, rb)):
                t.record(act, out[1])
            done = ra[2] | ra[3]
            if done.any():
                ta.finish(done), tb.finish(done)
                oa, ob = reset_done(sync, ta, ra[0], done), reset_done(work, tb, rb[0], done)
                assert np.array_equal(oa, ob)
        assert np.array_equal(replay(sync, ta), replay(work, tb))
    finally:
        sync.close()
        work.close()


@pytest.mark.parametrize("shared_signal", [True, False])
def test_a_worker_that_dies_is_one_error_naming_it(shared_signal):
    env = WorkerVectorEnv("CartPole-v1", 5, 2, shared_signal=shared_signal)
    try:
        assert env.local == (0, 2) and env.shards == [(2, 3), (3, 5)]  # the trainer's shard, then the workers'
        env.reset(seed=[1, 2, 3, 4, 5])
        os.kill(env.procs[1].pid, signal.SIGKILL)
        env.procs[1].join(5)
        with pytest.raises(ReflectRLError, match=r"env worker 1 \(envs 3-4\) died"):
            env.step(np.zeros(5, np.int64))
        assert not any(p.is_alive() for p in env.procs)  # the others were closed with it
    finally:
        env.close()


def test_impossible_worker_counts_are_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="--env-workers 5 needs more than --num-envs 5"):
        PPO(cfg(tmp_path, "x", env_workers=5))
    with pytest.raises(ConfigError, match="--env-workers must be 0"):
        PPO(cfg(tmp_path, "y", env_workers=-1))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.parametrize("shared_signal", [True, False])
def test_a_worker_whose_env_raises_is_one_error_naming_it(shared_signal):
    env = WorkerVectorEnv("CartPole-v1", 5, 2, shared_signal=shared_signal)
    try:
        env.reset(seed=[1, 2, 3, 4, 5])
        env.step(np.zeros(5, np.int64))
        with pytest.raises(ReflectRLError, match=r"env worker 1 \(envs 3-4\) failed"):
            env.step(np.array([0, 0, 0, 0, 7]))  # CartPole refuses an action outside its two
        assert not any(p.is_alive() for p in env.procs)
    finally:
        env.close()
