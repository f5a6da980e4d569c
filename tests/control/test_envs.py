import gymnasium as gym
import numpy as np
import pytest

from reflectrl.control.envs import (
    EpisodeTracker,
    LeanSyncVectorEnv,
    RunningMeanStd,
    check_env_id,
    episode_seed,
    make_vector_env,
    replay,
    reset_all,
    reset_done,
)
from reflectrl.errors import ConfigError


def test_unknown_env_id_suggests_close_names():
    with pytest.raises(ConfigError, match="LunarLander-v3"):
        check_env_id("LunarLander-v9")


def test_episode_seed_is_a_pure_function():
    assert episode_seed(1, 0, 0) == episode_seed(1, 0, 0)
    assert len({episode_seed(1, i, e) for i in range(4) for e in range(4)}) == 16


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_lean_vector_env_matches_gymnasium_sync_vector_env(env_id):
    lean = make_vector_env(env_id, 3)
    assert isinstance(lean, LeanSyncVectorEnv)
    ref = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(3)],
                                   autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    o1, _ = lean.reset(seed=[1, 2, 3])
    o2, _ = ref.reset(seed=[1, 2, 3])
    np.testing.assert_array_equal(o1, o2)
    rng = np.random.default_rng(0)
    for _ in range(60):
        a = np.stack([lean.single_action_space.sample() for _ in range(3)])
        r1, r2 = lean.step(a), ref.step(a)
        for x, y in zip(r1[:4], r2[:4]):
            np.testing.assert_array_equal(x, y)
        done = r1[2] | r1[3]
        if done.any():
            seeds = [int(s) for s in rng.integers(1e6, size=3)]
            n1, _ = lean.reset(seed=seeds, options={"reset_mask": done})
            n2, _ = ref.reset(seed=seeds, options={"reset_mask": done})
            np.testing.assert_array_equal(n1, n2)


def test_replay_rebuilds_env_state_exactly():
    envs = make_vector_env("LunarLander-v3", 2)
    tr = EpisodeTracker(seed=3, num_envs=2)
    obs = reset_all(envs, tr)
    rng = np.random.default_rng(0)
    for _ in range(150):
        a = rng.integers(0, 4, size=2)
        obs, r, term, trunc, _ = envs.step(a)
        tr.record(a, r)
        done = term | trunc
        if done.any():
            tr.finish(done)
            obs = reset_done(envs, tr, obs, done)
    envs2 = make_vector_env("LunarLander-v3", 2)
    tr2 = EpisodeTracker(seed=3, num_envs=2)
    tr2.load(tr.state())
    np.testing.assert_array_equal(replay(envs2, tr2), obs)
    a = np.array([1, 2])
    np.testing.assert_array_equal(envs.step(a)[0], envs2.step(a)[0])


def test_tracker_trims_actions_of_finished_episodes():
    tr = EpisodeTracker(seed=0, num_envs=2)
    for _ in range(5):
        tr.record(np.array([1, 2]), np.array([1.0, 1.0]))
    rets, lens = tr.finish(np.array([True, False]))
    assert rets == [5.0] and lens == [5]
    assert len(tr.episode_actions(0)) == 0 and len(tr.episode_actions(1)) == 5
    tr.finish(np.array([False, True]))
    assert tr.steps == []


def test_running_mean_std_matches_numpy():
    rms = RunningMeanStd((3,), epsilon=0.0)
    data = np.random.default_rng(0).normal(size=(100, 3)) * 3 + 1
    for chunk in np.split(data, 10):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-10)


def test_lean_env_falls_back_when_gymnasium_lacks_its_internals(monkeypatch):
    """A Gymnasium whose SyncVectorEnv lacks the internals the lean step writes gets the plain one."""
    from reflectrl.control import envs as envs_mod

    assert isinstance(envs_mod.make_vector_env("CartPole-v1", 2), envs_mod.LeanSyncVectorEnv)
    monkeypatch.setattr(envs_mod, "LEAN_ATTRS", (*envs_mod.LEAN_ATTRS, "_an_internal_gymnasium_2_renamed"))
    plain = envs_mod.make_vector_env("CartPole-v1", 2)
    assert not isinstance(plain, envs_mod.LeanSyncVectorEnv)
