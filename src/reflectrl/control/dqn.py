"""DQN for discrete-action Gymnasium envs: replay buffer, target network, epsilon-greedy, TD(0).

CleanRL ``dqn.py``'s hyperparameters and order of operations: one loop over vector steps; act
epsilon-greedily (epsilon decays linearly over ``exploration_fraction`` of training), store the
transition, and after ``learning_starts`` train every ``train_frequency`` steps and update the
target network every ``target_network_frequency`` steps (frequencies count vector steps, which
are env steps at the default single env). Truncated episodes bootstrap from their final
observation; terminated ones do not. Run directories, metrics and checkpoints follow PPO's:
a record per ``log_interval`` env steps, and a resume is bitwise the run that never stopped (CPU).
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..checkpoint import pack_state_dict, unpack_state_dict
from ..contract.hooks import Hook
from ..core import RingBuffer
from ..errors import ConfigError
from ..trainer import Clock, RunOptions, check_all, default_run_dir, load_config
from .base import EnvTrainer
from .envs import EpisodeTracker, make_vector_env, replay, reset_all, reset_done

EVAL_EPSILON = 0.05  # epsilon of `reflectrl eval --stochastic` for Q policies (CleanRL's evaluation epsilon)


@dataclass
class DQNConfig(RunOptions):
    """DQN with a target network, a replay buffer and epsilon-greedy exploration (CleanRL dqn.py defaults)."""

    env_id: str = "CartPole-v1"
    """Gymnasium environment id (discrete actions)."""
    exp_name: str = "dqn"
    """Name of the experiment (part of the default run directory)."""
    total_timesteps: int = 500_000
    """Environment steps to train for (across all envs)."""
    learning_rate: float = 2.5e-4
    """Adam learning rate."""
    num_envs: int = 1
    """Parallel environments."""
    buffer_size: int = 10_000
    """Replay buffer capacity (transitions)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 1.0
    """Target network update rate (1: hard copy)."""
    target_network_frequency: int = 500
    """Update the target network every this many vector steps."""
    batch_size: int = 128
    """Transitions sampled from the replay buffer per training step."""
    start_e: float = 1.0
    """Initial exploration epsilon."""
    end_e: float = 0.05
    """Final exploration epsilon."""
    exploration_fraction: float = 0.5
    """Fraction of total_timesteps over which epsilon decays from start_e to end_e."""
    learning_starts: int = 10_000
    """Env steps before training starts."""
    train_frequency: int = 10
    """Train every this many vector steps."""
    hidden_sizes: tuple[int, ...] = (120, 84)
    """Hidden layer widths of the Q-network (ReLU)."""
    bootstrap_truncation: bool = True
    """Bootstrap from the final observation when an episode is truncated (only termination stops it)."""
    log_interval: int = 1000
    """Write one metrics record every this many env steps."""

    budget_field = "total_timesteps"

    def budget_schedules(self) -> list[str]:
        """The enabled settings whose values follow ``total_timesteps`` (epsilon decays over a fraction of it)."""
        return ["--exploration-fraction"] if self.start_e != self.end_e else []

    def validate(self) -> None:
        """Raise ConfigError naming the first impossible hyperparameter."""
        checks = [
            (self.total_timesteps > 0, "--total-timesteps must be positive"),
            (self.learning_rate > 0, "--learning-rate must be positive"),
            (self.num_envs >= 1, "--num-envs must be at least 1"),
            (self.buffer_size >= self.num_envs, "--buffer-size must hold at least one vector step"),
            (0.0 <= self.gamma <= 1.0, "--gamma must be in [0, 1]"),
            (0.0 < self.tau <= 1.0, "--tau must be in (0, 1]"),
            (self.target_network_frequency >= 1, "--target-network-frequency must be at least 1"),
            (self.batch_size >= 1, "--batch-size must be at least 1"),
            (0.0 <= self.end_e <= 1.0 and 0.0 <= self.start_e <= 1.0, "--start-e and --end-e must be in [0, 1]"),
            (0.0 < self.exploration_fraction <= 1.0, "--exploration-fraction must be in (0, 1]"),
            (self.learning_starts >= 0, "--learning-starts must be non-negative"),
            (self.train_frequency >= 1, "--train-frequency must be at least 1"),
            (len(self.hidden_sizes) >= 1 and all(h >= 1 for h in self.hidden_sizes), "--hidden-sizes must be positive widths"),
            (self.log_interval >= 1, "--log-interval must be at least 1"),
            (self.total_timesteps >= self.num_envs, "--total-timesteps is smaller than one vector step"),
        ]
        check_all(self.run_checks() + checks)


def q_network(obs_dim: int, num_actions: int, hidden: tuple[int, ...]) -> nn.Sequential:
    """``[obs -> 120 ReLU -> 84 ReLU -> actions]`` (PyTorch's default Linear init, as CleanRL)."""
    sizes = [obs_dim, *hidden, num_actions]
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def linear_schedule(start: float, end: float, duration: float, t: int) -> float:
    """CleanRL's epsilon: linear from ``start`` to ``end`` over ``duration`` steps, then ``end``."""
    slope = (end - start) / duration
    return max(slope * t + start, end)


REPLAY_FIELDS = ("obs", "next_obs", "actions", "rewards", "terminal")


def replay_buffer(capacity: int, obs_dim: int) -> RingBuffer:
    """The ring of transitions: observation, next observation, action, reward, and whether the next
    state is terminal for bootstrapping."""
    return RingBuffer(capacity, {"obs": ((obs_dim,), torch.float32), "next_obs": ((obs_dim,), torch.float32),
                                 "actions": ((), torch.long), "rewards": ((), torch.float32),
                                 "terminal": ((), torch.bool)})


class QPolicy:
    """A Q-network as a policy, with the interface evaluation uses (``deterministic`` and ``act``)."""

    def __init__(self, net: nn.Module, num_actions: int, epsilon: float = EVAL_EPSILON):
        self.net, self.num_actions, self.epsilon = net, num_actions, epsilon

    def deterministic(self, obs: Tensor) -> Tensor:
        return self.net(obs).argmax(-1)

    def act(self, obs: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor]:
        """Epsilon-greedy with the evaluation epsilon."""
        greedy = self.deterministic(obs)
        explore = torch.rand(obs.shape[0], generator=generator) < self.epsilon
        rand = torch.randint(self.num_actions, (obs.shape[0],), generator=generator)
        return (torch.where(explore, rand, greedy),)


class DQNHook(Hook["DQN"]):
    """DQN's events of the one hook protocol (:class:`reflectrl.contract.hooks.Hook`: ``setup``, ``metrics``,
    the checkpointed state); what a method may add to DQN (exgrpo-seed-dqn): override any of these."""

    def after_step(self, trainer: DQN, slots: Tensor, obs: Tensor, rewards: Tensor, done: Tensor) -> None:
        """After each stored vector step (``obs``: the states the actions were taken in)."""

    def td_extra(self, trainer: DQN, idx: Tensor) -> Tensor | None:
        """A term added to the TD targets of the sampled replay slots ``idx`` (None: nothing)."""
        return None


class DQN(EnvTrainer):
    """The DQN trainer. ``DQN(DQNConfig(env_id="CartPole-v1")).learn()``; ``hooks`` are
    :class:`DQNHook` s (their ``state()`` / ``load_state()``, if any, go into the checkpoint)."""

    algo_name = "dqn"

    def __init__(self, config: DQNConfig, hooks: Sequence[DQNHook] | None = None):
        from gymnasium import spaces

        config.validate()
        self.cfg = cfg = config
        self.hooks: list[DQNHook] = list(hooks or [])
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.envs = make_vector_env(cfg.env_id, cfg.num_envs)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        if not isinstance(act_space, spaces.Discrete):
            self.envs.close()
            raise ConfigError(f"DQN needs a discrete action space; {cfg.env_id} has {act_space}")
        if not isinstance(obs_space, spaces.Box) or len(obs_space.shape) != 1:
            self.envs.close()
            raise ConfigError(f"reflectrl's Q-network needs a flat Box observation space, got {obs_space}")
        self.obs_dim, self.num_actions = int(obs_space.shape[0]), int(act_space.n)
        self.q = q_network(self.obs_dim, self.num_actions, tuple(cfg.hidden_sizes))
        self.q_target = q_network(self.obs_dim, self.num_actions, tuple(cfg.hidden_sizes))
        self.q_target.load_state_dict(self.q.state_dict())
        for h in self.hooks:
            h.setup(self)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.learning_rate)
        self.buffer = replay_buffer(cfg.buffer_size, self.obs_dim)
        self.tracker = EpisodeTracker(cfg.seed, cfg.num_envs)
        self.raw_obs = reset_all(self.envs, self.tracker)
        self.vstep = 0  # vector steps taken
        self.update_idx = 0  # records written
        self.recent_returns: deque[float] = deque(maxlen=100)
        self._acc = self._fresh_acc()
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg.env_id, cfg.exp_name, cfg.seed)
        if cfg.total_timesteps <= cfg.learning_starts:
            warnings.warn(f"--total-timesteps {cfg.total_timesteps} is not above --learning-starts "
                          f"{cfg.learning_starts}: DQN only fills its replay buffer and never trains", stacklevel=2)

    @staticmethod
    def _fresh_acc() -> dict[str, Any]:
        return {"td": 0.0, "q": 0.0, "n": 0, "returns": [], "lengths": []}

    @property
    def global_step(self) -> int:
        return self.vstep * self.cfg.num_envs

    @property
    def progress(self) -> float:
        return min(1.0, self.global_step / self.cfg.total_timesteps)

    @property
    def num_vsteps(self) -> int:
        return self.cfg.total_timesteps // self.cfg.num_envs

    @property
    def log_every(self) -> int:
        return max(1, self.cfg.log_interval // self.cfg.num_envs)

    # ----------------------------------------------------------------------------- acting
    def epsilon(self) -> float:
        cfg = self.cfg
        return linear_schedule(cfg.start_e, cfg.end_e, cfg.exploration_fraction * cfg.total_timesteps, self.global_step)

    def step(self) -> None:
        """One vector step: act, store, maybe train and update the target."""
        cfg, n = self.cfg, self.cfg.num_envs
        obs = torch.from_numpy(np.asarray(self.raw_obs, np.float32).reshape(n, -1))
        explore = torch.rand(n, generator=self.gen) < self.epsilon()
        actions = torch.randint(self.num_actions, (n,), generator=self.gen)
        if not bool(explore.all()):
            with torch.inference_mode():
                actions = torch.where(explore, actions, self.q(obs).argmax(-1))
        env_actions = actions.numpy()
        raw, reward, term, trunc, _ = self.envs.step(env_actions)
        self.tracker.record(env_actions, reward)
        done = term | trunc
        terminal = term if cfg.bootstrap_truncation else done
        rewards = torch.from_numpy(np.asarray(reward, np.float32))
        next_obs = torch.from_numpy(np.asarray(raw, np.float32).reshape(n, -1))
        slots = self.buffer.add(obs=obs, next_obs=next_obs, actions=actions, rewards=rewards,
                                terminal=torch.from_numpy(terminal))
        for h in self.hooks:
            h.after_step(self, slots, obs, rewards, torch.from_numpy(done))
        if done.any():
            rets, lens = self.tracker.finish(done)
            self._acc["returns"] += rets
            self._acc["lengths"] += lens
            self.recent_returns.extend(rets)
            raw = reset_done(self.envs, self.tracker, raw, done)
        self.raw_obs = raw
        i, before = self.vstep, self.global_step
        self.vstep += 1
        if before > cfg.learning_starts:
            if i % cfg.train_frequency == 0:
                self.train_step()
            if i % cfg.target_network_frequency == 0:
                self.update_target()

    # ----------------------------------------------------------------------------- learning
    def train_step(self) -> None:
        """One TD(0) regression step on a uniformly sampled minibatch."""
        b, cfg = self.buffer, self.cfg
        idx = torch.randint(b.size, (cfg.batch_size,), generator=self.gen)
        with torch.no_grad():
            target_max = self.q_target(b.next_obs[idx]).max(-1).values
            td_target = b.rewards[idx] + cfg.gamma * target_max * (~b.terminal[idx]).float()
            for h in self.hooks:
                extra = h.td_extra(self, idx)
                if extra is not None:
                    td_target = td_target + extra
        q = self.q(b.obs[idx]).gather(1, b.actions[idx, None]).squeeze(1)
        loss = F.mse_loss(td_target, q)
        if not self.finite("the TD loss", loss.detach(), f"env step {self.global_step}"):
            return
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._acc["td"] += float(loss.detach())
        self._acc["q"] += float(q.detach().mean())
        self._acc["n"] += 1

    def update_target(self) -> None:
        """target <- tau * q + (1 - tau) * target."""
        with torch.no_grad():
            for pt, p in zip(self.q_target.parameters(), self.q.parameters()):
                pt.copy_(self.cfg.tau * p + (1.0 - self.cfg.tau) * pt)

    def record(self) -> dict[str, Any]:
        """The metrics of the steps since the last record."""
        self.update_idx += 1
        acc, self._acc = self._acc, self._fresh_acc()
        rec: dict[str, Any] = {"update": self.update_idx, "global_step": self.global_step, "charts/epsilon": self.epsilon(),
                               "replay/size": self.buffer.size}
        if acc["returns"]:
            rec["charts/episodic_return"] = float(np.mean(acc["returns"]))
            rec["charts/episodic_length"] = float(np.mean(acc["lengths"]))
            rec["charts/episodes"] = len(acc["returns"])
        if acc["n"]:
            rec["losses/td_loss"] = acc["td"] / acc["n"]
            rec["losses/q_values"] = acc["q"] / acc["n"]
            rec["losses/train_steps"] = acc["n"]
        for h in self.hooks:
            rec.update(h.metrics())
        if getattr(self, "skipped", 0):
            rec["health/skipped"] = self.skipped
        return rec

    # ----------------------------------------------------------------------------- the skeleton's loop
    def iteration(self) -> dict[str, Any]:
        """Vector steps up to the next record boundary (``log_interval`` env steps), then that record."""
        self.step()
        while self.vstep % self.log_every and self.vstep != self.num_vsteps:
            self.step()
        return self.record()

    @property
    def position(self) -> int:
        return self.global_step

    @property
    def total(self) -> int:
        return self.num_vsteps * self.cfg.num_envs

    @property
    def finished(self) -> bool:
        return self.vstep >= self.num_vsteps

    def describe(self) -> str:
        return self.cfg.env_id

    def add_rates(self, rec: dict[str, Any], clock: Clock, start: int) -> None:
        """SPS of the interval since the previous record."""
        last_t, last_step = getattr(self, "_interval", (None, None))
        if last_t is None or last_t < clock.t0:
            last_t, last_step = clock.t0, start
        now = time.perf_counter()
        rec["charts/SPS"] = (self.global_step - last_step) / max(now - last_t, 1e-9)
        rec["time/interval"] = now - last_t
        self._interval = (now, self.global_step)

    # ----------------------------------------------------------------------------- checkpoints
    def state_extra(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        tensors.update({**pack_state_dict("q", self.q.state_dict()), **pack_state_dict("q_target", self.q_target.state_dict())})
        tensors.update({f"replay/{f}": getattr(self.buffer, f) for f in REPLAY_FIELDS})
        tr = self.tracker.state()
        tensors["env/actions"] = torch.from_numpy(np.ascontiguousarray(tr.pop("actions")))
        tensors["env/raw_obs"] = torch.from_numpy(np.ascontiguousarray(self.raw_obs))
        meta.update({"vstep": self.vstep, "global_step": self.global_step, "tracker": tr,
                     "replay": {"ptr": self.buffer.ptr, "size": self.buffer.size},
                     "recent_returns": list(self.recent_returns)})

    def load_extra(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.q.load_state_dict(unpack_state_dict("q", tensors))
        self.q_target.load_state_dict(unpack_state_dict("q_target", tensors))
        self.buffer.load_state({f: tensors[f"replay/{f}"] for f in REPLAY_FIELDS}, meta["replay"])
        self.tracker.load({**meta["tracker"], "actions": tensors["env/actions"].numpy()})
        self.vstep = int(meta["vstep"])
        self.recent_returns.extend(meta["recent_returns"])

    def after_load(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.raw_obs = replay(self.envs, self.tracker)
        if not np.array_equal(self.raw_obs, tensors["env/raw_obs"].numpy()):
            warnings.warn(f"{self.cfg.env_id} did not replay to the same state: it is not deterministic given "
                          "seed and actions, so the resumed run will differ from an uninterrupted one", stacklevel=2)


def load_q_policy(run_dir: str | Path, tensors: dict[str, Tensor]) -> tuple[QPolicy, None, DQNConfig]:
    """``(policy, None, config)`` of a DQN run directory, for evaluation."""
    import warnings

    import gymnasium as gym

    cfg = load_config(Path(run_dir), DQNConfig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(cfg.env_id)
    obs_dim, n = int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    env.close()
    net = q_network(obs_dim, n, tuple(cfg.hidden_sizes))
    net.load_state_dict(unpack_state_dict("q", tensors))
    net.eval()
    return QPolicy(net, n), None, cfg
