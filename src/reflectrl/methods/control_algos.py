"""The seed methods and DQN as ``reflectrl train --algo NAME`` entries of the control front end.

Each PPO-based method is a PPOConfig subclass (so every option is a CLI flag) plus one
:class:`MethodHook`, which runs the method on PPO's batch after GAE: it builds the
:class:`~reflectrl.methods.base.StepBatch` (features are tensors PPO already holds), calls
``fit`` and ``shape`` in the method's order and applies the shaping before the PPO update. A reward
change re-estimates GAE exactly, by linearity: ``A' = A + discounted_cumsum(delta, gamma * lambda)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

import numpy as np
import torch
from torch import Tensor

from ..control.algos import Algo, register_algo
from ..control.config import PPOConfig
from ..control.dqn import DQN, DQNConfig
from ..control.envs import make_vector_env
from ..control.ppo import PPO, Rollout
from ..errors import ConfigError
from .base import Shaping, StepBatch, discounted_cumsum
from .exgrpo_seed import ExGRPOSeed, ExGRPOSeedDQNHook, ExGRPOSeedOptions
from .gear_seed import GearSeed, GearSeedOptions
from .nets import control_features
from .refgrpo_seed import RefGRPOSeed, RefGRPOSeedOptions


def _check(checks: list[tuple[bool, str]]) -> None:
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)


@dataclass
class RefGRPOSeedConfig(RefGRPOSeedOptions, PPOConfig):
    """refgrpo-seed: PPO with a calibration bonus from a reflection predictor (METHODS.md §1). Fields left at
    ``None`` take CleanRL's default for the env's action space."""

    exp_name: str = "refgrpo-seed"
    """Name of the experiment (part of the default run directory)."""

    def validate(self) -> None:
        PPOConfig.validate(self)
        _check(self.validate_refgrpo())


@dataclass
class GearSeedConfig(GearSeedOptions, PPOConfig):
    """gear-seed: PPO with advantages reweighted by a value head distilled from group winners (METHODS.md §3).
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
    """exgrpo-seed: PPO with a trajectory-level reflection term from a reflection memory (METHODS.md §5).
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
    trajectory (METHODS.md §5; CleanRL dqn.py defaults otherwise)."""

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


# ----------------------------------------------------------------------------- the PPO adapter
def apply_shaping(b: Rollout, sh: Shaping, discount: float) -> None:
    """Apply a method's shaping to PPO's rollout: a reward change moves the GAE advantages by
    ``discounted_cumsum(delta, gamma * lambda)`` (exactly GAE on the shaped rewards) and the
    returns with them; an advantage change leaves the returns (the critic's targets) alone."""
    if sh.reward_delta is not None:
        b.rewards = b.rewards + sh.reward_delta
        b.advantages = b.advantages + discounted_cumsum(sh.reward_delta, b.episode_end, discount)
        b.returns = b.advantages + b.values
    if sh.advantage_delta is not None:
        b.advantages = b.advantages + sh.advantage_delta
    if sh.weights is not None:
        b.weights = sh.weights if b.weights is None else b.weights * sh.weights


Features = Callable[[PPO, Rollout], tuple[Tensor, Tensor]]


class MethodHook:
    """PPO hook that runs one method class on each batch after GAE (see the module docstring)."""

    def __init__(self, method: Any, features: Features):
        self.method, self.features = method, features
        self.seconds = 0.0
        if hasattr(method, "minibatch_loss"):  # an extra loss term on each PPO minibatch
            self.minibatch_loss = lambda trainer, idx, logp, old_logp: method.minibatch_loss(idx, logp, old_logp)

    def after_advantages(self, trainer: PPO, b: Rollout) -> None:
        t0 = time.perf_counter()
        cfg = trainer.cfg
        states, feats = self.features(trainer, b)
        sb = StepBatch(states=states, features=feats, rewards=b.rewards, values=b.values, advantages=b.advantages,
                       returns=b.returns, episode_end=b.episode_end, terminated=b.terminated,
                       next_values=b.next_values, progress=(trainer.update_idx - 1) / cfg.num_updates,
                       group_size=cfg.seed_group_size)
        m = self.method
        if m.fit_first:
            m.fit(sb)
            shaping = m.shape(sb)
        else:
            shaping = m.shape(sb)
            m.fit(sb)
        apply_shaping(b, shaping, cfg.gamma * cfg.gae_lambda)
        self.seconds = time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {**self.method.metrics(), "time/method": self.seconds}

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return self.method.state()

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.method.load_state(tensors, meta)


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
    discrete = isinstance(act, spaces.Discrete)
    return Spaces(int(np.prod(obs.shape)), int(act.n) if discrete else None,
                  int(act.n) if discrete else int(np.prod(act.shape)), discrete)


def method_seed(seed: int, salt: int) -> int:
    """A method's own seed, derived from the run seed (so it never shares the trainer's streams)."""
    return int(np.random.SeedSequence([seed, 7919, salt]).generate_state(1)[0])


def _actor_hidden(trainer: PPO, b: Rollout) -> Tensor:
    with torch.no_grad():
        flat = b.obs.reshape(-1, b.obs.shape[-1])
        h = trainer.model.net.trunk(flat)[0]
    return h.reshape(*b.obs.shape[:2], -1)


def refgrpo_hooks(cfg: RefGRPOSeedConfig) -> list[Any]:
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

    method = RefGRPOSeed(in_dim, rc, rc.learning_rate, method_seed(rc.seed, 1))
    return [MethodHook(method, features)]


def gear_hooks(cfg: GearSeedConfig) -> list[Any]:
    sp = probe(cfg.env_id)
    rc = cfg.resolved(sp.discrete)
    method = GearSeed(sp.obs_dim, rc.num_envs, rc.seed_group_size, rc.gamma, rc, method_seed(rc.seed, 2))
    return [MethodHook(method, lambda trainer, b: (b.obs, b.obs))]


def exgrpo_hooks(cfg: ExGRPOSeedConfig) -> list[Any]:
    sp = probe(cfg.env_id)
    rc = cfg.resolved(sp.discrete)
    method = ExGRPOSeed(sp.obs_dim, rc.num_envs, rc, method_seed(rc.seed, 3))
    return [MethodHook(method, lambda trainer, b: (b.obs, b.obs))]


def exgrpo_dqn_hooks(cfg: ExGRPOSeedDQNConfig) -> list[Any]:
    sp = probe(cfg.env_id)
    return [ExGRPOSeedDQNHook(sp.obs_dim, cfg.num_envs, cfg.buffer_size, cfg, method_seed(cfg.seed, 4))]


def _named(trainer: Any, name: str) -> Any:
    trainer.algo_name = name
    return trainer


def _register_ppo_method(name: str, config_cls: type, make_hooks: Callable[[Any], list[Any]], description: str) -> None:
    register_algo(Algo(
        name, config_cls,
        lambda cfg: _named(PPO(cfg, hooks=make_hooks(cfg)), name),
        lambda run_dir, total=None, **kw: _named(PPO.resume(run_dir, total, config_cls=config_cls,
                                                            make_hooks=make_hooks, **kw), name),
        description))


_register_ppo_method("refgrpo-seed", RefGRPOSeedConfig, refgrpo_hooks,
                     "PPO + calibration bonus from a reflection predictor (seed 000)")
_register_ppo_method("gear-seed", GearSeedConfig, gear_hooks,
                     "PPO + advantages reweighted by a value head distilled from group winners (seed 001)")
_register_ppo_method("exgrpo-seed", ExGRPOSeedConfig, exgrpo_hooks,
                     "PPO + trajectory reflection term from a prioritized reflection memory (seed 003)")
register_algo(Algo("dqn", DQNConfig, lambda cfg: DQN(cfg),
                   lambda run_dir, total=None, **kw: DQN.resume(run_dir, total, **kw),
                   "DQN with replay, target network and epsilon-greedy (CleanRL dqn.py defaults)"))
register_algo(Algo(
    "exgrpo-seed-dqn", ExGRPOSeedDQNConfig,
    lambda cfg: _named(DQN(cfg, hooks=exgrpo_dqn_hooks(cfg)), "exgrpo-seed-dqn"),
    lambda run_dir, total=None, **kw: _named(DQN.resume(run_dir, total, config_cls=ExGRPOSeedDQNConfig,
                                                        make_hooks=exgrpo_dqn_hooks, **kw), "exgrpo-seed-dqn"),
    "DQN + eta * Q_refl(s, a) in the TD target from a reflection memory (seed 003)"))
