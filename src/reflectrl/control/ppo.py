"""PPO for Gymnasium: rollout -> ``[rows=envs, steps]`` batch -> core GAE -> clipped PPO update.

Read top to bottom: :meth:`PPO.rollout`, :meth:`PPO.advantages`, :meth:`PPO.update`, :meth:`PPO.learn`.
Checkpoints restore model, optimizer, normalizers, RNG streams, counters and the envs' exact state,
so a resumed run is bitwise the run that never stopped (on CPU).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint import (extend_budget, load_checkpoint, pack_hooks, pack_optimizer, save_checkpoint, unpack_hooks,
                          unpack_optimizer)
from ..core import explained_variance, gae, ppo_policy_loss, value_loss
from ..errors import CheckpointError, ConfigError
from ..progress import TrainProgress
from ..runlog import open_run, truncate_metrics
from .config import PPOConfig
from .envs import EpisodeTracker, ObsNormalizer, RewardNormalizer, make_vector_env, replay, reset_all, reset_done
from .networks import build_actor_critic

CHECKPOINT = "checkpoint.safetensors"


@dataclass
class Rollout:
    """One rollout in the core's ``[rows=envs, steps]`` layout (obs/actions carry trailing dims)."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    next_values: torch.Tensor
    terminated: torch.Tensor
    episode_end: torch.Tensor
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    weights: torch.Tensor | None = None  # optional per-step advantage weights set by a method


class PPO:
    """The PPO trainer. ``PPO(PPOConfig(env_id="LunarLander-v3")).learn()``."""

    algo_name = "ppo"

    def __init__(self, config: PPOConfig, hooks: list[Any] | None = None):
        probe = make_vector_env(config.env_id, 1)
        from gymnasium import spaces

        self.discrete = isinstance(probe.single_action_space, spaces.Discrete)
        probe.close()
        self.cfg = cfg = config.resolved(self.discrete)
        self.hooks = list(hooks or [])
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.envs = make_vector_env(cfg.env_id, cfg.num_envs)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.model = build_actor_critic(obs_space, act_space, cfg.hidden_sizes, cfg.activation, cfg.ortho_init,
                                        cfg.log_std_init)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        self.obs_norm = ObsNormalizer(obs_space.shape) if cfg.normalize_obs else None
        self.rew_norm = RewardNormalizer(cfg.num_envs, cfg.gamma) if cfg.normalize_reward else None
        self.act_low = None if self.discrete else np.asarray(act_space.low, np.float64)
        self.act_high = None if self.discrete else np.asarray(act_space.high, np.float64)
        self.tracker = EpisodeTracker(cfg.seed, cfg.num_envs, cfg.seed_group_size)
        self.obs_dim = int(np.prod(obs_space.shape))
        self.act_shape = () if self.discrete else tuple(act_space.shape)
        self.update_idx = 0
        self.global_step = 0
        self.raw_obs = reset_all(self.envs, self.tracker)
        self.obs = self._norm_obs(self.raw_obs, update=True)
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else Path(
            "runs") / f"{cfg.env_id}__{cfg.exp_name}__{cfg.seed}__{int(time.time())}"

    # ----------------------------------------------------------------------------- rollout
    def _norm_obs(self, raw: np.ndarray, update: bool) -> torch.Tensor:
        x = self.obs_norm(raw, update) if self.obs_norm is not None else raw
        return torch.as_tensor(np.asarray(x, np.float32).reshape(len(raw), -1))

    def _env_action(self, action: torch.Tensor) -> np.ndarray:
        a = action.numpy()
        return a if self.discrete else np.clip(a, self.act_low, self.act_high)

    def rollout(self) -> tuple[Rollout, dict[str, float]]:
        """Collect ``num_steps`` vector steps with the current policy."""
        cfg, T, N = self.cfg, self.cfg.num_steps, self.cfg.num_envs
        obs_l, act_l, logp_l, val_l = [], [], [], []
        rew_b, final_v = torch.zeros((T, N)), torch.zeros((T, N))
        term_b, trunc_b = (torch.zeros((T, N), dtype=torch.bool) for _ in range(2))
        t_env = t_inf = 0.0
        ep_returns: list[float] = []
        ep_lengths: list[int] = []
        noise = None
        if self.discrete:  # one draw for the whole rollout: the same stream as one draw per step
            with torch.inference_mode():
                noise = self.model.sample_noise((T, N, self.envs.single_action_space.n), self.gen)
        for t in range(T):
            t0 = time.perf_counter()
            with torch.inference_mode():
                action, logp, value = self.model.act(self.obs, self.gen, None if noise is None else noise[t])
            obs_l.append(self.obs), act_l.append(action), logp_l.append(logp), val_l.append(value)
            env_action = self._env_action(action)
            t1 = time.perf_counter()
            raw, reward, term, trunc, _ = self.envs.step(env_action)
            self.tracker.record(env_action, reward)
            done = term | trunc
            learn_r = self.rew_norm(reward, done) if self.rew_norm is not None else reward
            rew_b[t] = torch.from_numpy(np.asarray(learn_r, np.float32))
            term_b[t], trunc_b[t] = torch.from_numpy(term), torch.from_numpy(trunc)
            if done.any():
                if cfg.bootstrap_truncation and trunc.any():
                    with torch.no_grad():
                        fv = self.model.value(self._norm_obs(raw[trunc], update=False))
                    final_v[t, torch.from_numpy(trunc)] = fv
                rets, lens = self.tracker.finish(done)
                ep_returns += rets
                ep_lengths += lens
                raw = reset_done(self.envs, self.tracker, raw, done)
            self.raw_obs = raw
            self.obs = self._norm_obs(raw, update=True)
            t_env += time.perf_counter() - t1
            t_inf += t1 - t0
        with torch.no_grad():
            bootstrap = self.model.value(self.obs)
        obs_b, act_b, logp_b, val_b = (torch.stack(x) for x in (obs_l, act_l, logp_l, val_l))
        self.global_step += T * N
        self.recent_returns.extend(ep_returns)
        nxt = torch.cat([val_b[1:], bootstrap[None]], 0)
        if cfg.bootstrap_truncation:
            nxt = torch.where(trunc_b, final_v, nxt)
            terminated = term_b
        else:
            terminated = term_b | trunc_b  # CleanRL's treatment: truncation counts as termination
        tr = lambda x: x.transpose(0, 1).contiguous()  # [steps, envs] -> [rows, steps]
        batch = Rollout(tr(obs_b), tr(act_b), tr(logp_b), tr(val_b), tr(rew_b), tr(nxt), tr(terminated),
                        tr(term_b | trunc_b))
        stats = {"time/env": t_env, "time/inference": t_inf}
        if ep_returns:
            stats["charts/episodic_return"] = float(np.mean(ep_returns))
            stats["charts/episodic_length"] = float(np.mean(ep_lengths))
            stats["charts/episodes"] = len(ep_returns)
        return batch, stats

    # ----------------------------------------------------------------------------- learning
    def advantages(self, b: Rollout) -> None:
        """GAE on the (possibly shaped) rewards; fills ``b.advantages`` and ``b.returns``."""
        b.advantages, b.returns = gae(b.rewards, b.values, b.next_values, b.terminated, b.episode_end,
                                      self.cfg.gamma, self.cfg.gae_lambda)

    def update(self, b: Rollout) -> dict[str, float]:
        """``update_epochs`` passes of minibatch PPO over the flattened rollout."""
        cfg = self.cfg
        B, M = cfg.batch_size, cfg.minibatch_size
        obs, act = b.obs.reshape(B, -1), b.actions.reshape(B, *self.act_shape)
        old_logp, old_v, ret = b.logp.reshape(B), b.values.reshape(B), b.returns.reshape(B)
        adv = b.advantages.reshape(B)
        if b.weights is not None:
            adv = adv * b.weights.reshape(B)
        if cfg.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = (1.0 - (self.update_idx - 1) / cfg.num_updates) * cfg.learning_rate
        acc = torch.zeros(6)
        n = 0
        extra = [h.minibatch_loss for h in self.hooks if hasattr(h, "minibatch_loss")]
        for _ in range(cfg.update_epochs):
            perm = torch.randperm(B, generator=self.gen)
            for start in range(0, B, M):
                idx = perm[start:start + M]
                logp, ent, v = self.model.evaluate(obs[idx], act[idx])
                mb_adv = adv[idx]
                if cfg.norm_adv:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg, st = ppo_policy_loss(logp, old_logp[idx], mb_adv, None, cfg.clip_coef, cfg.clip_coef_high)
                vl = value_loss(v, old_v[idx], ret[idx], None, cfg.clip_coef if cfg.clip_vloss else None)
                entropy = ent.mean()
                loss = pg - cfg.ent_coef * entropy + cfg.vf_coef * vl
                for term in extra:  # a method's own loss on this minibatch (hook.minibatch_loss)
                    loss = loss + term(self, idx, logp, old_logp[idx])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                acc += torch.stack([pg.detach(), vl.detach(), entropy.detach(), st["old_approx_kl"],
                                    st["approx_kl"], st["clipfrac"]])
                n += 1
            if cfg.target_kl is not None and float(st["approx_kl"]) > cfg.target_kl:
                break
        pg, vl, ent, okl, kl, cf = (acc / n).tolist()
        return {"charts/learning_rate": self.optimizer.param_groups[0]["lr"], "losses/policy_loss": pg,
                "losses/value_loss": vl, "losses/entropy": ent, "losses/old_approx_kl": okl,
                "losses/approx_kl": kl, "losses/clipfrac": cf,
                "losses/explained_variance": explained_variance(old_v, ret)}

    def iteration(self) -> dict[str, Any]:
        """One rollout + advantage estimate + update; returns this update's metrics."""
        self.update_idx += 1
        t0 = time.perf_counter()
        batch, stats = self.rollout()
        t1 = time.perf_counter()
        for h in self.hooks:
            if hasattr(h, "before_advantages"):
                h.before_advantages(self, batch)
        self.advantages(batch)
        for h in self.hooks:
            if hasattr(h, "after_advantages"):
                h.after_advantages(self, batch)
        losses = self.update(batch)
        t2 = time.perf_counter()
        rec = {"update": self.update_idx, "global_step": self.global_step, **stats, **losses,
               "time/update": t2 - t1, "time/iteration": t2 - t0}
        for h in self.hooks:
            if hasattr(h, "metrics"):
                rec.update(h.metrics())
        return rec

    def learn(self) -> dict[str, Any]:
        """Train until ``total_timesteps``; logs, checkpoints, returns a summary."""
        cfg = self.cfg
        logger = open_run(self.run_dir, {"algo": self.algo_name}, cfg)
        start_step, t_start = self.global_step, time.perf_counter()
        try:
            with TrainProgress(cfg.num_updates * cfg.batch_size, cfg.progress, cfg.env_id) as bar:
                while self.update_idx < cfg.num_updates:
                    rec = self.iteration()
                    elapsed = time.perf_counter() - t_start
                    rec["charts/SPS"] = (self.global_step - start_step) / max(elapsed, 1e-9)
                    logger.log(rec)
                    last = self.update_idx == cfg.num_updates
                    if last or (cfg.save_interval and self.update_idx % cfg.save_interval == 0):
                        self.save(self.run_dir / CHECKPOINT)
                    recent = float(np.mean(self.recent_returns)) if self.recent_returns else None
                    bar.update(self.global_step, rec["charts/SPS"], recent)
        finally:
            logger.close()
        elapsed = time.perf_counter() - t_start
        return {"run_dir": str(self.run_dir), "global_step": self.global_step, "updates": self.update_idx,
                "sps": (self.global_step - start_step) / max(elapsed, 1e-9), "wall_s": elapsed,
                "recent_return": float(np.mean(self.recent_returns)) if self.recent_returns else None}

    # ----------------------------------------------------------------------------- checkpoints
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything a resume needs, split into tensors and JSON metadata."""
        tensors = {f"model/{k}": v for k, v in self.model.state_dict().items()}
        opt_t, opt_meta = pack_optimizer("optim", self.optimizer)
        tensors.update(opt_t)
        tensors["rng/torch_gen"] = self.gen.get_state()
        tensors["rng/torch_global"] = torch.get_rng_state()
        tr = self.tracker.state()
        tensors["env/actions"] = torch.from_numpy(np.ascontiguousarray(tr.pop("actions")))
        tensors["env/raw_obs"] = torch.from_numpy(np.ascontiguousarray(self.raw_obs))
        for name, norm in (("obs_norm", self.obs_norm and self.obs_norm.rms), ("rew_norm", self.rew_norm and self.rew_norm.rms)):
            if norm:
                for k, v in norm.state().items():
                    tensors[f"{name}/{k}"] = torch.from_numpy(v)
        if self.rew_norm is not None:
            tensors["rew_norm/returns"] = torch.from_numpy(self.rew_norm.returns.copy())
        meta = {"format": 1, "update": self.update_idx, "global_step": self.global_step, "optim": opt_meta,
                "tracker": tr, "recent_returns": list(self.recent_returns), "config": dataclasses.asdict(self.cfg)}
        pack_hooks(self.hooks, tensors, meta)
        return tensors, meta

    def save(self, path: Path) -> None:
        """Write the checkpoint atomically."""
        save_checkpoint(path, *self.state())

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Restore from :meth:`state` output and rebuild the envs by replay."""
        try:
            self.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model/")})
            self.optimizer.load_state_dict(unpack_optimizer("optim", tensors, meta["optim"]))
            self.gen.set_state(tensors["rng/torch_gen"])
            torch.set_rng_state(tensors["rng/torch_global"])
            for name, norm in (("obs_norm", self.obs_norm), ("rew_norm", self.rew_norm)):
                if norm is not None:
                    norm.rms.load({k: tensors[f"{name}/{k}"].numpy() for k in ("mean", "var", "count")})
            if self.rew_norm is not None:
                self.rew_norm.returns = tensors["rew_norm/returns"].numpy().copy()
            self.tracker.load({**meta["tracker"], "actions": tensors["env/actions"].numpy()})
            self.update_idx, self.global_step = int(meta["update"]), int(meta["global_step"])
            self.recent_returns.extend(meta["recent_returns"])
            unpack_hooks(self.hooks, tensors, meta)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint does not match this configuration or is damaged ({exc})") from None
        self.raw_obs = replay(self.envs, self.tracker)
        if not np.array_equal(self.raw_obs, tensors["env/raw_obs"].numpy()):
            import warnings

            warnings.warn(f"{self.cfg.env_id} did not replay to the same state: it is not deterministic given "
                          "seed and actions, so the resumed run will differ from an uninterrupted one")
        self.obs = self._norm_obs(self.raw_obs, update=False)

    @classmethod
    def resume(cls, run_dir: str | Path, total_timesteps: int | None = None, config_cls: type = PPOConfig,
               make_hooks: Any = None, **overrides: Any) -> "PPO":
        """Rebuild a trainer from a run directory's ``config.json`` and latest checkpoint.

        ``config_cls`` and ``make_hooks(cfg) -> hooks`` rebuild a method that runs on top of PPO."""
        run_dir = Path(run_dir)
        cfg = load_run_config(run_dir, config_cls)
        tensors, meta = load_checkpoint(run_dir / CHECKPOINT)
        extend_budget(cfg, total_timesteps)
        cfg = dataclasses.replace(cfg, run_dir=str(run_dir), **overrides)
        trainer = cls(cfg, hooks=make_hooks(cfg) if make_hooks else None)
        trainer.load_state(tensors, meta)
        truncate_metrics(run_dir / "metrics.jsonl", trainer.update_idx)
        return trainer


def run_algo(run_dir: Path) -> str:
    """The ``algo`` a run directory was trained with (``ppo`` for runs that predate the field)."""
    path = Path(run_dir) / "config.json"
    try:
        return json.loads(path.read_text()).get("algo", "ppo")
    except FileNotFoundError:
        if not Path(run_dir).is_dir():
            raise CheckpointError(f"run directory {run_dir} does not exist") from None
        raise CheckpointError(f"{run_dir} is not a reflectrl run directory (no config.json)") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is corrupt ({exc})") from None


def load_run_config(run_dir: Path, config_cls: type = PPOConfig) -> PPOConfig:
    """Read ``RUN_DIR/config.json`` into ``config_cls`` (a PPOConfig or a subclass)."""
    path = Path(run_dir) / "config.json"
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"run directory {run_dir} does not exist")
    if not path.is_file():
        raise CheckpointError(f"{run_dir} is not a reflectrl run directory (no config.json)")
    try:
        raw = json.loads(path.read_text())
        fields = {f.name: f for f in dataclasses.fields(config_cls)}
        raw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in fields}
        return config_cls(**raw)
    except (json.JSONDecodeError, TypeError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc})") from None
