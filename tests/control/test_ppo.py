import multiprocessing as mp
import os
import signal

import gymnasium as gym
import numpy as np
import pytest
import torch

from reflectrl.algos import resume
from reflectrl.checkpoint import load_checkpoint, save_checkpoint
from reflectrl.control import PPO, PPOConfig
from reflectrl.control.ppo import CHECKPOINT
from reflectrl.errors import CheckpointError, ConfigError
from reflectrl.runlog import read_metrics


def tiny(tmp_path, name="run", **kw) -> PPOConfig:
    base = dict(env_id="CartPole-v1", num_envs=2, num_steps=32, total_timesteps=64 * 6, update_epochs=2,
                num_minibatches=2, run_dir=str(tmp_path / name), progress=False, tensorboard=False, save_interval=2)
    base.update(kw)
    return PPOConfig(**base)


def strip_timing(recs):
    return [{k: v for k, v in r.items() if "SPS" not in k and "time" not in k} for r in recs]


def test_same_seed_gives_identical_metrics(tmp_path):
    PPO(tiny(tmp_path, "a")).learn()
    PPO(tiny(tmp_path, "b")).learn()
    a = strip_timing(read_metrics(tmp_path / "a" / "metrics.jsonl"))
    b = strip_timing(read_metrics(tmp_path / "b" / "metrics.jsonl"))
    assert len(a) == 6 and a == b
    PPO(tiny(tmp_path, "c", seed=2)).learn()
    assert strip_timing(read_metrics(tmp_path / "c" / "metrics.jsonl")) != a


def interrupt_at(trainer, update: int):
    """Make ``trainer`` raise KeyboardInterrupt when it starts update ``update`` (a crash between checkpoints)."""
    run = trainer.iteration

    def iteration():
        if trainer.update_idx + 1 == update:
            raise KeyboardInterrupt
        return run()

    trainer.iteration = iteration
    return trainer


def test_the_loop_freezes_the_heap_while_it_runs(tmp_path):
    """What exists when learn() starts is out of the collector's scans during the updates, and given back after,
    also when an update raises."""
    import gc

    before, seen = gc.get_freeze_count(), []
    trainer = PPO(tiny(tmp_path, "a"))
    run = trainer.iteration
    marker = [object()]  # a container the collector tracks, made before the loop starts

    def iteration():
        seen.append((gc.get_freeze_count(), gc.is_tracked(marker), any(o is marker for o in gc.get_objects())))
        return run()

    trainer.iteration = iteration
    trainer.learn()
    assert seen and all(count > before and tracked and not listed for count, tracked, listed in seen)
    assert gc.get_freeze_count() == before and any(o is marker for o in gc.get_objects())
    crashing = interrupt_at(PPO(tiny(tmp_path, "b")), 2)
    with pytest.raises(KeyboardInterrupt):
        crashing.learn()
    assert gc.get_freeze_count() == before


@pytest.mark.parametrize("env_id,extra", [("CartPole-v1", {}), ("Pendulum-v1", {"num_minibatches": 4})])
def test_resume_equals_uninterrupted(tmp_path, env_id, extra):
    cfg_full = tiny(tmp_path, "full", env_id=env_id, save_interval=1, **extra)
    PPO(cfg_full).learn()
    cfg_cut = tiny(tmp_path, "cut", env_id=env_id, save_interval=1, **extra)
    with pytest.raises(KeyboardInterrupt):
        interrupt_at(PPO(cfg_cut), 4).learn()
    assert len(read_metrics(tmp_path / "cut" / "metrics.jsonl")) == 3
    resume(tmp_path / "cut").learn()
    full = strip_timing(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    cut = strip_timing(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
    assert cut == full
    ta, _ = load_checkpoint(tmp_path / "full" / CHECKPOINT)
    tb, _ = load_checkpoint(tmp_path / "cut" / CHECKPOINT)
    for k in ta:
        if k.startswith("model/"):
            assert torch.equal(ta[k], tb[k]), k


class ConstEnv(gym.Env):
    """Reward 1 every step, never terminates; a TimeLimit truncates it."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t / 10, 1.0], np.float32), 1.0, False, False, {}


gym.register("reflectrl-test/Const-v0", entry_point=ConstEnv, max_episode_steps=5)


def test_truncation_bootstraps_from_final_observation_value(tmp_path):
    trainer = PPO(tiny(tmp_path, env_id="reflectrl-test/Const-v0", num_steps=12))
    batch, _ = trainer.rollout()
    trunc = batch.episode_end & ~batch.terminated
    assert trunc[:, 4].all() and trunc[:, 9].all() and trunc.sum() == 4
    final_obs = torch.tensor([[0.5, 1.0]])
    with torch.no_grad():
        v_final = trainer.model.value(final_obs)
    assert torch.allclose(batch.next_values[trunc], v_final.expand(4))
    # inside an episode, next_values is the next step's value
    assert torch.equal(batch.next_values[:, :4], batch.values[:, 1:5])


def test_cleanrl_mode_treats_truncation_as_termination(tmp_path):
    trainer = PPO(tiny(tmp_path, env_id="reflectrl-test/Const-v0", num_steps=12, bootstrap_truncation=False))
    batch, _ = trainer.rollout()
    assert torch.equal(batch.terminated, batch.episode_end)


@pytest.mark.parametrize("kw,msg", [
    (dict(num_minibatches=3), "not divisible"),
    (dict(learning_rate=-1.0), "learning-rate"),
    (dict(gamma=1.5), "gamma"),
    (dict(total_timesteps=10), "smaller than one batch"),
    (dict(env_id="NoSuchEnv-v0"), "unknown Gymnasium env id"),
])
def test_impossible_config_is_refused(tmp_path, kw, msg):
    with pytest.raises(ConfigError, match=msg):
        PPO(tiny(tmp_path, **kw))


def test_missing_and_corrupt_run_dirs(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        resume(tmp_path / "nope")
    PPO(tiny(tmp_path, total_timesteps=64)).learn()
    ck = tmp_path / "run" / CHECKPOINT
    ck.write_bytes(ck.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt"):
        resume(tmp_path / "run")


def _slow_writer(path: str):
    """Write a new checkpoint but get SIGKILLed before it is renamed into place."""
    real_replace = os.replace

    def stalled(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    os.replace = stalled
    save_checkpoint(path, {"w": torch.full((1000,), 2.0)}, {"version": 2})
    os.replace = real_replace


def test_sigkill_mid_write_keeps_previous_checkpoint(tmp_path):
    path = tmp_path / "ck.safetensors"
    save_checkpoint(path, {"w": torch.ones(1000)}, {"version": 1})
    proc = mp.get_context("spawn").Process(target=_slow_writer, args=(str(path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    tensors, meta = load_checkpoint(path)
    assert meta == {"version": 1} and torch.equal(tensors["w"], torch.ones(1000))


def test_checkpoint_holds_normalizer_statistics(tmp_path):
    cfg = tiny(tmp_path, env_id="Pendulum-v1", num_minibatches=4, total_timesteps=64)
    trainer = PPO(cfg)
    trainer.learn()
    tensors, meta = load_checkpoint(tmp_path / "run" / CHECKPOINT)
    np.testing.assert_array_equal(tensors["obs_norm/mean"].numpy(), trainer.obs_norm.rms.mean)
    assert "rew_norm/var" in tensors and meta["config"]["normalize_obs"] is True
