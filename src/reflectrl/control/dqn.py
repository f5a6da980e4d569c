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

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..checkpoint import (extend_budget, load_checkpoint, pack_hooks, pack_optimizer, pack_state_dict,
                          save_checkpoint, unpack_hooks, unpack_optimizer, unpack_state_dict)
from ..errors import CheckpointError, ConfigError
from ..progress import TrainProgress
from ..runlog import open_run, truncate_metrics
from .envs import EpisodeTracker, make_vector_env, replay, reset_all, reset_done
from .ppo import CHECKPOINT, load_run_config

EVAL_EPSILON = 0.05  # epsilon of `reflectrl eval --stochastic` for Q policies (CleanRL's evaluation epsilon)


@dataclass
class DQNConfig:
    """DQN with a target network, a replay buffer and epsilon-greedy exploration (CleanRL dqn.py defaults)."""

    env_id: str = "CartPole-v1"
    """Gymnasium environment id (discrete actions)."""
    exp_name: str = "dqn"
    """Name of the experiment (part of the default run directory)."""
    seed: int = 1
    """Seed of the network init, exploration, replay sampling and every episode's reset."""
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
    threads: int = 1
    """torch CPU threads."""
    save_interval: int = 10
    """Checkpoint every this many records (and always at the end); 0 saves only at the end."""
    run_dir: Optional[str] = None
    """Run directory (default runs/{env_id}__{exp_name}__{seed}__{unix time})."""
    tensorboard: bool = True
    """Write TensorBoard events to RUN_DIR/tb."""
    track: bool = False
    """Also log to Weights & Biases."""
    wandb_project_name: str = "reflectrl"
    """W&B project."""
    progress: bool = True
    """Show a progress bar."""

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
            (self.threads >= 1, "--threads must be at least 1"),
            (self.save_interval >= 0, "--save-interval must be non-negative"),
            (self.total_timesteps >= self.num_envs, "--total-timesteps is smaller than one vector step"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)


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


class ReplayBuffer:
    """A ring of transitions as preallocated tensors (observation, next observation, action,
    reward, and whether the next state is terminal for bootstrapping)."""

    def __init__(self, capacity: int, obs_dim: int):
        self.obs = torch.zeros(capacity, obs_dim)
        self.next_obs = torch.zeros(capacity, obs_dim)
        self.actions = torch.zeros(capacity, dtype=torch.long)
        self.rewards = torch.zeros(capacity)
        self.terminal = torch.zeros(capacity, dtype=torch.bool)
        self.ptr = self.size = 0

    def add(self, obs: Tensor, next_obs: Tensor, actions: Tensor, rewards: Tensor, terminal: Tensor) -> Tensor:
        """Store one vector step; returns the slots written."""
        cap = self.obs.shape[0]
        slots = (self.ptr + torch.arange(obs.shape[0])) % cap
        self.obs[slots], self.next_obs[slots], self.actions[slots] = obs, next_obs, actions
        self.rewards[slots], self.terminal[slots] = rewards, terminal
        self.ptr = int((self.ptr + obs.shape[0]) % cap)
        self.size = min(cap, self.size + obs.shape[0])
        return slots

    def sample(self, n: int, generator: torch.Generator) -> Tensor:
        """Slots drawn uniformly with replacement."""
        return torch.randint(self.size, (n,), generator=generator)

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminal")


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


class DQN:
    """The DQN trainer. ``DQN(DQNConfig(env_id="CartPole-v1")).learn()``.

    Hooks (optional methods): ``after_step(trainer, slots, obs, rewards, done)`` after each stored
    vector step, ``td_extra(trainer, idx) -> Tensor | None`` added to the TD targets of sampled
    slots, ``metrics()``, ``state()`` / ``load_state()``."""

    algo_name = "dqn"

    def __init__(self, config: DQNConfig, hooks: list[Any] | None = None):
        from gymnasium import spaces

        config.validate()
        self.cfg = cfg = config
        self.hooks = list(hooks or [])
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
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.learning_rate)
        self.buffer = ReplayBuffer(cfg.buffer_size, self.obs_dim)
        self.tracker = EpisodeTracker(cfg.seed, cfg.num_envs)
        self.raw_obs = reset_all(self.envs, self.tracker)
        self.vstep = 0  # vector steps taken
        self.records = 0
        self.recent_returns: deque[float] = deque(maxlen=100)
        self._acc = self._fresh_acc()
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else Path(
            "runs") / f"{cfg.env_id}__{cfg.exp_name}__{cfg.seed}__{int(time.time())}"

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
        slots = self.buffer.add(obs, next_obs, actions, rewards, torch.from_numpy(terminal))
        for h in self.hooks:
            if hasattr(h, "after_step"):
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
        idx = b.sample(cfg.batch_size, self.gen)
        with torch.no_grad():
            target_max = self.q_target(b.next_obs[idx]).max(-1).values
            td_target = b.rewards[idx] + cfg.gamma * target_max * (~b.terminal[idx]).float()
            for h in self.hooks:
                extra = h.td_extra(self, idx) if hasattr(h, "td_extra") else None
                if extra is not None:
                    td_target = td_target + extra
        q = self.q(b.obs[idx]).gather(1, b.actions[idx, None]).squeeze(1)
        loss = F.mse_loss(td_target, q)
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
        self.records += 1
        acc, self._acc = self._acc, self._fresh_acc()
        rec: dict[str, Any] = {"update": self.records, "global_step": self.global_step, "charts/epsilon": self.epsilon(),
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
            if hasattr(h, "metrics"):
                rec.update(h.metrics())
        return rec

    def learn(self) -> dict[str, Any]:
        """Train until ``total_timesteps``; logs, checkpoints, returns a summary."""
        cfg = self.cfg
        logger = open_run(self.run_dir, {"algo": self.algo_name}, cfg)
        start_step, t_start, t_last = self.global_step, time.perf_counter(), time.perf_counter()
        step_last = self.global_step
        try:
            with TrainProgress(self.num_vsteps * cfg.num_envs, cfg.progress, cfg.env_id) as bar:
                while self.vstep < self.num_vsteps:
                    self.step()
                    if self.vstep % self.log_every and self.vstep != self.num_vsteps:
                        continue
                    rec = self.record()
                    now = time.perf_counter()
                    rec["charts/SPS"] = (self.global_step - step_last) / max(now - t_last, 1e-9)
                    rec["time/interval"] = now - t_last
                    t_last, step_last = now, self.global_step
                    logger.log(rec)
                    if self.vstep == self.num_vsteps or (cfg.save_interval and self.records % cfg.save_interval == 0):
                        self.save(self.run_dir / CHECKPOINT)
                    recent = float(np.mean(self.recent_returns)) if self.recent_returns else None
                    bar.update(self.global_step, rec["charts/SPS"], recent)
        finally:
            logger.close()
        elapsed = time.perf_counter() - t_start
        return {"run_dir": str(self.run_dir), "global_step": self.global_step, "updates": self.records,
                "sps": (self.global_step - start_step) / max(elapsed, 1e-9), "wall_s": elapsed,
                "recent_return": float(np.mean(self.recent_returns)) if self.recent_returns else None}

    # ----------------------------------------------------------------------------- checkpoints
    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Everything a resume needs (taken at a record boundary), as tensors and JSON metadata."""
        tensors = {**pack_state_dict("q", self.q.state_dict()), **pack_state_dict("q_target", self.q_target.state_dict())}
        opt_t, opt_meta = pack_optimizer("optim", self.optimizer)
        tensors.update(opt_t)
        tensors.update({f"replay/{f}": getattr(self.buffer, f) for f in ReplayBuffer.FIELDS})
        tensors["rng/torch_gen"] = self.gen.get_state()
        tensors["rng/torch_global"] = torch.get_rng_state()
        tr = self.tracker.state()
        tensors["env/actions"] = torch.from_numpy(np.ascontiguousarray(tr.pop("actions")))
        tensors["env/raw_obs"] = torch.from_numpy(np.ascontiguousarray(self.raw_obs))
        meta = {"format": 1, "algo": self.algo_name, "vstep": self.vstep, "records": self.records,
                "global_step": self.global_step, "optim": opt_meta, "tracker": tr,
                "replay": {"ptr": self.buffer.ptr, "size": self.buffer.size},
                "recent_returns": list(self.recent_returns), "config": dataclasses.asdict(self.cfg)}
        pack_hooks(self.hooks, tensors, meta)
        return tensors, meta

    def save(self, path: Path) -> None:
        """Write the checkpoint atomically."""
        save_checkpoint(path, *self.state())

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        """Restore from :meth:`state` output and rebuild the envs by replay."""
        try:
            self.q.load_state_dict(unpack_state_dict("q", tensors))
            self.q_target.load_state_dict(unpack_state_dict("q_target", tensors))
            self.optimizer.load_state_dict(unpack_optimizer("optim", tensors, meta["optim"]))
            for f in ReplayBuffer.FIELDS:
                setattr(self.buffer, f, tensors[f"replay/{f}"].clone())
            self.buffer.ptr, self.buffer.size = int(meta["replay"]["ptr"]), int(meta["replay"]["size"])
            self.gen.set_state(tensors["rng/torch_gen"])
            torch.set_rng_state(tensors["rng/torch_global"])
            self.tracker.load({**meta["tracker"], "actions": tensors["env/actions"].numpy()})
            self.vstep, self.records = int(meta["vstep"]), int(meta["records"])
            self.recent_returns.extend(meta["recent_returns"])
            unpack_hooks(self.hooks, tensors, meta)
        except (KeyError, RuntimeError, ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint does not match this configuration or is damaged ({exc})") from None
        self.raw_obs = replay(self.envs, self.tracker)
        if not np.array_equal(self.raw_obs, tensors["env/raw_obs"].numpy()):
            import warnings

            warnings.warn(f"{self.cfg.env_id} did not replay to the same state: it is not deterministic given "
                          "seed and actions, so the resumed run will differ from an uninterrupted one")

    @classmethod
    def resume(cls, run_dir: str | Path, total_timesteps: int | None = None, config_cls: type = DQNConfig,
               make_hooks: Any = None, **overrides: Any) -> "DQN":
        """Rebuild a trainer from a run directory's ``config.json`` and latest checkpoint."""
        run_dir = Path(run_dir)
        cfg = load_run_config(run_dir, config_cls)
        tensors, meta = load_checkpoint(run_dir / CHECKPOINT)
        extend_budget(cfg, total_timesteps)
        cfg = dataclasses.replace(cfg, run_dir=str(run_dir), **overrides)
        trainer = cls(cfg, hooks=make_hooks(cfg) if make_hooks else None)
        trainer.load_state(tensors, meta)
        truncate_metrics(run_dir / "metrics.jsonl", trainer.records)
        return trainer


def load_q_policy(run_dir: str | Path, tensors: dict[str, Tensor]) -> tuple[QPolicy, None, DQNConfig]:
    """``(policy, None, config)`` of a DQN run directory, for evaluation."""
    import gymnasium as gym
    import warnings

    cfg = load_run_config(Path(run_dir), DQNConfig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(cfg.env_id)
    obs_dim, n = int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    env.close()
    net = q_network(obs_dim, n, tuple(cfg.hidden_sizes))
    net.load_state_dict(unpack_state_dict("q", tensors))
    net.eval()
    return QPolicy(net, n), None, cfg
