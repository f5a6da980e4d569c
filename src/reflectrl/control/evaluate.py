"""Deterministic-policy evaluation of a run directory's latest checkpoint."""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from ..checkpoint import load_checkpoint
from ..errors import CheckpointError
from ..trainer import CHECKPOINT, load_config, read_config_json, run_kind
from .config import PPOConfig
from .envs import ObsNormalizer, check_env_id, episode_seed
from .networks import build_actor_critic

EVAL_SEED = 10_007  # episode seeds of evaluation never coincide with training's (seeded by the run seed)


def load_policy(run_dir: str | Path):
    """``(model, obs_normalizer_or_None, config)`` from a run directory, ready for inference."""
    if run_kind(read_config_json(run_dir)) != "control":
        raise CheckpointError(f"{run_dir} is an LLM run directory: evaluate it with `reflectrl llm eval {run_dir}`")
    cfg = load_config(Path(run_dir), PPOConfig)
    tensors, _ = load_checkpoint(Path(run_dir) / CHECKPOINT)
    check_env_id(cfg.env_id)
    if any(k.startswith("q/") for k in tensors):  # a value-based run (dqn, exgrpo-seed-dqn)
        from .dqn import load_q_policy

        return load_q_policy(run_dir, tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(cfg.env_id)
    model = build_actor_critic(env.observation_space, env.action_space, tuple(cfg.hidden_sizes), cfg.activation,
                               cfg.ortho_init, cfg.log_std_init)
    env.close()
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model/")})
    model.eval()
    norm = None
    if cfg.normalize_obs:
        norm = ObsNormalizer(tuple(tensors["obs_norm/mean"].shape))
        norm.rms.load({k: tensors[f"obs_norm/{k}"].numpy() for k in ("mean", "var", "count")})
    return model, norm, cfg


def evaluate(run_dir: str | Path, episodes: int = 20, seed: int = EVAL_SEED, deterministic: bool = True) -> list[float]:
    """Undiscounted returns of ``episodes`` episodes (fixed reset seeds), all envs stepped in one batch."""
    model, norm, cfg = load_policy(run_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        envs = [gym.make(cfg.env_id) for _ in range(episodes)]
    obs = np.stack([e.reset(seed=episode_seed(seed, i, 0))[0] for i, e in enumerate(envs)])
    active = np.ones(episodes, bool)
    returns = np.zeros(episodes)
    space = envs[0].action_space
    gen = torch.Generator().manual_seed(seed)
    while active.any():
        idx = np.flatnonzero(active)
        x = obs[idx] if norm is None else norm(obs[idx], update=False)
        with torch.inference_mode():
            t = torch.as_tensor(np.asarray(x, np.float32))
            act = model.deterministic(t) if deterministic else model.act(t, gen)[0]
        act = act.numpy()
        if isinstance(space, gym.spaces.Box):
            act = np.clip(act, space.low, space.high)
        for j, i in enumerate(idx):
            o, r, term, trunc, _ = envs[i].step(act[j].item() if act.ndim == 1 else act[j])
            returns[i] += r
            obs[i] = o
            if term or trunc:
                active[i] = False
    for e in envs:
        e.close()
    return returns.tolist()
