"""PPO hyperparameters (CleanRL's names and defaults) and named presets with tuned settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, TypeVar

from ..errors import ConfigError
from ..trainer import RunOptions, check_all

# CleanRL ppo.py (discrete) and ppo_continuous_action.py (continuous) defaults for the fields that differ.
DISCRETE_DEFAULTS = dict(learning_rate=2.5e-4, num_envs=4, num_steps=128, num_minibatches=4, update_epochs=4,
                         ent_coef=0.01, normalize_obs=False, normalize_reward=False)
CONTINUOUS_DEFAULTS = dict(learning_rate=3e-4, num_envs=1, num_steps=2048, num_minibatches=32, update_epochs=10,
                           ent_coef=0.0, normalize_obs=True, normalize_reward=True)


_Config = TypeVar("_Config", bound="PPOConfig")


@dataclass
class PPOConfig(RunOptions):
    """PPO with GAE and the clipped objective. Fields left at ``None`` take CleanRL's default for the
    env's action space (``ppo.py`` for discrete, ``ppo_continuous_action.py`` for continuous)."""

    env_id: str = "CartPole-v1"
    """Gymnasium environment id."""
    exp_name: str = "ppo"
    """Name of the experiment (part of the default run directory)."""
    total_timesteps: int = 500_000
    """Environment steps to train for (across all envs)."""
    learning_rate: float | None = None
    """Adam learning rate (default 2.5e-4 discrete, 3e-4 continuous)."""
    num_envs: int | None = None
    """Parallel environments in the SyncVectorEnv (default 4 discrete, 1 continuous)."""
    num_steps: int | None = None
    """Steps per env per rollout (default 128 discrete, 2048 continuous)."""
    anneal_lr: bool = True
    """Linearly anneal the learning rate to 0 over training."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    num_minibatches: int | None = None
    """Minibatches per epoch (default 4 discrete, 32 continuous)."""
    update_epochs: int | None = None
    """Epochs over each rollout (default 4 discrete, 10 continuous)."""
    norm_adv: bool = True
    """Normalize advantages within each minibatch."""
    clip_coef: float = 0.2
    """Lower (and, unless clip_coef_high is set, upper) clip range of the ratio."""
    clip_coef_high: float | None = None
    """Upper clip range (clip-higher); None means symmetric."""
    clip_vloss: bool = True
    """Use the clipped value loss."""
    ent_coef: float | None = None
    """Entropy bonus coefficient (default 0.01 discrete, 0.0 continuous)."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop the epochs of an update early once approx-KL exceeds this."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation."""
    ortho_init: bool = True
    """Orthogonal init (sqrt 2 hidden, 0.01 actor output, 1.0 critic output)."""
    log_std_init: float = 0.0
    """Initial log-std of the Gaussian policy (continuous actions)."""
    normalize_obs: bool | None = None
    """Running observation normalization (default off discrete, on continuous); saved with the model."""
    normalize_reward: bool | None = None
    """Scale rewards by the running std of the discounted return (default off discrete, on continuous)."""
    bootstrap_truncation: bool = True
    """Bootstrap from V(final observation) when an episode is truncated (CleanRL treats it as terminal)."""
    seed_group_size: int = 1
    """Envs 0..G-1, G..2G-1, ... share the reset seed of their n-th episodes (1: every env its own)."""
    env_workers: int = 0
    """Worker processes that step the envs beside the trainer, over shared memory: the envs split into this many + 1
    contiguous shards, the trainer stepping the first itself (0: every env in the trainer's process). The same run
    bit for bit; faster where the envs are a large share of the time and cores are free."""

    budget_field = "total_timesteps"

    def resolved(self: _Config, discrete: bool) -> _Config:
        """A copy with every ``None`` default filled in for the action-space kind, validated."""
        base = DISCRETE_DEFAULTS if discrete else CONTINUOUS_DEFAULTS
        fill = {k: v for k, v in base.items() if getattr(self, k) is None}
        cfg = dataclasses.replace(self, **fill)
        cfg.validate()
        return cfg

    @property
    def batch_size(self) -> int:
        return int(self.num_envs) * int(self.num_steps)

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // int(self.num_minibatches)

    @property
    def num_updates(self) -> int:
        return max(1, self.total_timesteps // self.batch_size)

    def budget_schedules(self) -> list[str]:
        """The enabled settings whose values follow ``total_timesteps`` (see :func:`reflectrl.trainer.extend_budget`)."""
        return ["--anneal-lr"] if self.anneal_lr else []

    def validate(self) -> None:
        """Raise ConfigError naming the first impossible hyperparameter."""
        checks = [
            (self.total_timesteps > 0, "--total-timesteps must be positive"),
            (self.learning_rate is None or self.learning_rate > 0, "--learning-rate must be positive"),
            (self.num_envs is None or self.num_envs >= 1, "--num-envs must be at least 1"),
            (self.num_steps is None or self.num_steps >= 1, "--num-steps must be at least 1"),
            (self.num_minibatches is None or self.num_minibatches >= 1, "--num-minibatches must be at least 1"),
            (self.update_epochs is None or self.update_epochs >= 1, "--update-epochs must be at least 1"),
            (0.0 <= self.gamma <= 1.0, "--gamma must be in [0, 1]"),
            (0.0 <= self.gae_lambda <= 1.0, "--gae-lambda must be in [0, 1]"),
            (self.clip_coef > 0, "--clip-coef must be positive"),
            (self.clip_coef_high is None or self.clip_coef_high > 0, "--clip-coef-high must be positive"),
            (self.ent_coef is None or self.ent_coef >= 0, "--ent-coef must be non-negative"),
            (self.vf_coef >= 0, "--vf-coef must be non-negative"),
            (self.max_grad_norm > 0, "--max-grad-norm must be positive"),
            (self.target_kl is None or self.target_kl > 0, "--target-kl must be positive"),
            (len(self.hidden_sizes) >= 1 and all(h >= 1 for h in self.hidden_sizes), "--hidden-sizes must be positive widths"),
            (self.seed_group_size >= 1, "--seed-group-size must be at least 1"),
            (self.env_workers >= 0, "--env-workers must be 0 (in process) or a number of worker processes"),
            (self.num_envs is None or self.env_workers < self.num_envs,
             f"--env-workers {self.env_workers} needs more than --num-envs {self.num_envs}: the trainer steps one shard "
             "of the envs and each worker another"),
        ]
        check_all(self.run_checks() + checks)
        if None not in (self.num_envs, self.num_steps, self.num_minibatches):
            if self.batch_size % self.num_minibatches:
                raise ConfigError(f"the batch (--num-envs {self.num_envs} x --num-steps {self.num_steps} = "
                                  f"{self.batch_size}) is not divisible by --num-minibatches {self.num_minibatches}")
            if self.num_envs % self.seed_group_size:
                raise ConfigError(f"--num-envs {self.num_envs} is not divisible by --seed-group-size {self.seed_group_size}")
            if self.total_timesteps < self.batch_size:
                raise ConfigError(f"--total-timesteps {self.total_timesteps} is smaller than one batch "
                                  f"({self.batch_size} = num_envs x num_steps)")


# Presets are named after their env id; explicit flags override their values.
# LunarLander-v3 and HalfCheetah-v5: RL Baselines3 Zoo's tuned PPO hyperparameters (hyperparams/ppo.yml,
# for LunarLander-v2 and HalfCheetah-v3), translated to CleanRL's names
# (n_steps -> num_steps, batch_size -> batch / num_minibatches, n_epochs -> update_epochs).
PRESETS: dict[str, dict] = {
    "LunarLander-v3": dict(
        env_id="LunarLander-v3", total_timesteps=1_000_000, num_envs=16, num_steps=1024, num_minibatches=256,
        update_epochs=4, gamma=0.999, gae_lambda=0.98, ent_coef=0.01, learning_rate=3e-4, anneal_lr=False,
        clip_vloss=False,
    ),
    "HalfCheetah-v5": dict(
        env_id="HalfCheetah-v5", total_timesteps=1_000_000, num_envs=1, num_steps=512, num_minibatches=8,
        update_epochs=20, gamma=0.98, gae_lambda=0.92, learning_rate=2.0633e-05, ent_coef=0.000401762,
        clip_coef=0.1, max_grad_norm=0.8, vf_coef=0.58096, anneal_lr=False, clip_vloss=False,
        normalize_obs=True, normalize_reward=True, hidden_sizes=(256, 256), activation="relu",
        ortho_init=False, log_std_init=-2.0,
    ),
    # sparse reward: -1 per step until the car reaches the flag (200-step limit); the zoo's
    # "normalize: true" is VecNormalize on observations and rewards; batch_size 64 of 16 x 16 steps
    "MountainCar-v0": dict(
        env_id="MountainCar-v0", total_timesteps=1_000_000, num_envs=16, num_steps=16, num_minibatches=4,
        update_epochs=4, gamma=0.99, gae_lambda=0.98, ent_coef=0.0, learning_rate=3e-4, anneal_lr=False,
        clip_vloss=False, normalize_obs=True, normalize_reward=True,
    ),
}


def preset_config(name: str) -> PPOConfig:
    """The PPOConfig of a named preset."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PPOConfig(**PRESETS[name])
