"""The seed methods on the control front end: one config dataclass per method (a PPOConfig or
DQNConfig subclass, so every option is a ``reflectrl train --algo NAME`` flag) and what each needs built
for a run: its :class:`~reflectrl.contract.base.MethodRunner` (PPO reads the features it names from its
own batch) or, for exgrpo-seed-dqn, its DQN hook. The composition root :mod:`reflectrl.algos`
registers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from ..contract.base import MethodRunner, method_seed
from ..contract.nets import control_features
from ..control.config import PPOConfig
from ..control.dqn import DQNConfig
from ..control.envs import make_vector_env
from ..errors import ConfigError
from ..methods.exgrpo_seed import ExGRPOSeed, ExGRPOSeedDQNHook, ExGRPOSeedOptions
from ..methods.gear_seed import GearSeed, GearSeedOptions
from ..methods.refgrpo_seed import RefGRPOSeed, RefGRPOSeedOptions

if TYPE_CHECKING:
    from ..control.ppo import PPO, Rollout


def _check(checks: list[tuple[bool, str]]) -> None:
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)


@dataclass
class RefGRPOSeedConfig(RefGRPOSeedOptions, PPOConfig):
    """refgrpo-seed: PPO with a calibration bonus from a reflection predictor (seed 000). Fields left at
    ``None`` take CleanRL's default for the env's action space."""

    exp_name: str = "refgrpo-seed"
    """Name of the experiment (part of the default run directory)."""

    def validate(self) -> None:
        PPOConfig.validate(self)
        _check(self.validate_refgrpo())


@dataclass
class GearSeedConfig(GearSeedOptions, PPOConfig):
    """gear-seed: PPO with advantages reweighted by a value head distilled from group winners (seed 001).
    Fields left at ``None`` take CleanRL's default for the env's action space."""

    exp_name: str = "gear-seed"
    """Name of the experiment (part of the default run directory)."""
    seed_group_size: int = 4
    """Group size G: envs 0..G-1, G..2G-1, ... share the reset seed of their n-th episodes (a group)."""

    def validate(self) -> None:
        PPOConfig.validate(self)
        _check([(self.seed_group_size >= 2, "gear-seed needs --seed-group-size of at least 2"), *self.validate_gear()])


@dataclass
class ExGRPOSeedConfig(ExGRPOSeedOptions, PPOConfig):
    """exgrpo-seed: PPO with a trajectory-level reflection term from a reflection memory (seed 003).
    Fields left at ``None`` take CleanRL's default for the env's action space."""

    exp_name: str = "exgrpo-seed"
    """Name of the experiment (part of the default run directory)."""

    def budget_schedules(self) -> list[str]:
        return PPOConfig.budget_schedules(self) + self.budget_exgrpo()

    def validate(self) -> None:
        PPOConfig.validate(self)
        _check(self.validate_exgrpo())


@dataclass
class ExGRPOSeedDQNConfig(ExGRPOSeedOptions, DQNConfig):
    """exgrpo-seed-dqn: DQN whose TD target adds eta * Q_refl(s, a), the reflection of the transition's
    trajectory (seed 003; CleanRL dqn.py defaults otherwise)."""

    exp_name: str = "exgrpo-seed-dqn"
    """Name of the experiment (part of the default run directory)."""
    refl_scale: Literal["return_std", "none"] = "none"
    """Multiply eta * Q_refl by the std of the memory's returns (return_std) or by 1 (none: the seed's 0.2 * reflection)."""
    refl_every: int = 1000
    """Train the reflector every this many env steps."""

    def budget_schedules(self) -> list[str]:
        return DQNConfig.budget_schedules(self) + self.budget_exgrpo()

    def validate(self) -> None:
        DQNConfig.validate(self)
        _check(self.validate_exgrpo())


@dataclass
class Spaces:
    """What a method's nets need to know of the env, read from one probe env."""

    obs_dim: int
    num_actions: int | None
    act_dim: int
    discrete: bool


def probe(env_id: str) -> Spaces:
    from gymnasium import spaces

    envs = make_vector_env(env_id, 1)
    obs, act = envs.single_observation_space, envs.single_action_space
    envs.close()
    if isinstance(act, spaces.Discrete):
        return Spaces(int(np.prod(obs.shape or ())), int(act.n), int(act.n), True)
    return Spaces(int(np.prod(obs.shape or ())), None, int(np.prod(act.shape or ())), False)


def observations(trainer: PPO, b: Rollout) -> tuple[Tensor, Tensor]:
    """The states and features of the methods that read observations only."""
    return b.obs, b.obs


def _actor_hidden(trainer: PPO, b: Rollout) -> Tensor:
    with torch.no_grad():
        flat = b.obs.reshape(-1, b.obs.shape[-1])
        h = trainer.model.actor_features(flat)
    return h.reshape(*b.obs.shape[:2], -1)


def refgrpo_methods(cfg: RefGRPOSeedConfig) -> list[MethodRunner]:
    sp = probe(cfg.env_id)
    rc = cfg.resolved(sp.discrete)
    kind = rc.reflection_input
    hidden_w = rc.hidden_sizes[-1]
    in_dim = {"obs_action": sp.obs_dim + sp.act_dim, "obs_action_hidden": sp.obs_dim + sp.act_dim + hidden_w,
              "trunk_head": hidden_w + sp.act_dim}[kind]

    def features(trainer: PPO, b: Rollout) -> tuple[Tensor, Tensor]:
        if kind == "obs_action":
            return b.obs, control_features(b.obs, b.actions, sp.num_actions)
        h = _actor_hidden(trainer, b)
        base = torch.cat([b.obs, h], -1) if kind == "obs_action_hidden" else h
        return b.obs, control_features(base, b.actions, sp.num_actions)

    method = RefGRPOSeed(in_dim, rc, float(rc.learning_rate or 0.0), method_seed(rc.seed, 1))
    return [MethodRunner(method, features)]


def gear_methods(cfg: GearSeedConfig) -> list[MethodRunner]:
    sp = probe(cfg.env_id)
    rc = cfg.resolved(sp.discrete)
    method = GearSeed(sp.obs_dim, int(rc.num_envs or 0), rc.seed_group_size, float(rc.gamma or 0.0), rc,
                      method_seed(rc.seed, 2))
    return [MethodRunner(method, observations)]


def exgrpo_methods(cfg: ExGRPOSeedConfig) -> list[MethodRunner]:
    sp = probe(cfg.env_id)
    rc = cfg.resolved(sp.discrete)
    method = ExGRPOSeed(sp.obs_dim, int(rc.num_envs or 0), rc, method_seed(rc.seed, 3))
    return [MethodRunner(method, observations)]


def exgrpo_dqn_hooks(cfg: ExGRPOSeedDQNConfig) -> list[ExGRPOSeedDQNHook]:
    sp = probe(cfg.env_id)
    return [ExGRPOSeedDQNHook(sp.obs_dim, cfg.num_envs, cfg.buffer_size, cfg, method_seed(cfg.seed, 4))]
