"""PPO for Gymnasium: rollout -> ``[rows=envs, steps]`` batch -> core GAE -> clipped PPO update.

Read top to bottom: :meth:`PPO.rollout`, :meth:`PPO.advantages`, :meth:`PPO.update`, :meth:`PPO.learn`.
Checkpoints restore model, optimizer, normalizers, RNG streams, counters and the envs' exact state,
so a resumed run is bitwise the run that never stopped (on CPU).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..contract.base import AuxInputs, MethodRunner, StepBatch, apply_shaping
from ..core import discounted_cumsum, explained_variance, gae, next_values_from, ppo_policy_loss, value_loss
from ..trainer import CHECKPOINT, Clock, default_run_dir
from .base import EnvTrainer
from .config import PPOConfig
from .env_workers import WorkerVectorEnv
from .envs import (
    EpisodeTracker,
    ObsNormalizer,
    RewardNormalizer,
    make_vector_env,
    replay,
    reset_all,
    reset_done,
)
from .networks import build_actor_critic
from .optim import EagerAdam

__all__ = ["CHECKPOINT", "PPO", "Rollout"]


@dataclass
class _Flat:
    """A rollout flattened to ``[rows * steps]`` for the minibatches: observations, actions, the log-probs and values
    they were taken with, the returns, and the (weighted) advantages."""

    obs: Tensor
    act: Tensor
    old_logp: Tensor
    old_v: Tensor
    ret: Tensor
    adv: Tensor


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
    weights: torch.Tensor | None = None  # per-step advantage weights set by a method


def clip_grad_norm(parameters: Any, max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)``: when the gradients are plain CPU tensors of
    one dtype, the same kernels in the same order without its per-call grouping and checks (a small MLP's
    update is bound by such overhead); otherwise torch's own."""
    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    g0 = grads[0]
    if g0.device.type != "cpu" or any(type(g) is not torch.Tensor or g.dtype != g0.dtype or g.device != g0.device
                                      for g in grads):
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    with torch.no_grad():
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        torch._foreach_mul_(grads, torch.clamp(float(max_norm) / (total + 1e-6), max=1.0))


class PPO(EnvTrainer):
    """The PPO trainer. ``PPO(PPOConfig(env_id="LunarLander-v3")).learn()``."""

    algo_name = "ppo"

    def __init__(self, config: PPOConfig, methods: list[MethodRunner] | None = None):
        probe = make_vector_env(config.env_id, 1)
        from gymnasium import spaces

        self.discrete = isinstance(probe.single_action_space, spaces.Discrete)
        probe.close()
        self.cfg = cfg = config.resolved(self.discrete)
        self.methods = list(methods or [])
        self.hooks = self.methods  # their state goes into the checkpoint
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.envs = (WorkerVectorEnv(cfg.env_id, cfg.num_envs, cfg.env_workers) if cfg.env_workers
                     else make_vector_env(cfg.env_id, cfg.num_envs))
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.model = build_actor_critic(obs_space, act_space, cfg.hidden_sizes, cfg.activation, cfg.ortho_init,
                                        cfg.log_std_init)
        self.optimizer = EagerAdam(self.model.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
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
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg.env_id, cfg.exp_name, cfg.seed)

    # ----------------------------------------------------------------------------- progress
    @property
    def position(self) -> int:
        return self.global_step

    @property
    def total(self) -> int:
        return self.cfg.num_updates * self.cfg.batch_size

    @property
    def finished(self) -> bool:
        return self.update_idx >= self.cfg.num_updates

    def describe(self) -> str:
        return self.cfg.env_id

    def add_rates(self, rec: dict[str, Any], clock: Clock, start: int) -> None:
        rec["charts/SPS"] = (self.global_step - start) / max(clock.wall, 1e-9)

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
        final_v = torch.zeros((T, N))
        # per-step rows go into numpy buffers (a numpy row write costs a fraction of a tensor's), as tensors after
        rew_np, term_np, trunc_np = np.zeros((T, N), np.float32), np.zeros((T, N), np.bool_), np.zeros((T, N), np.bool_)
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
            rew_np[t], term_np[t], trunc_np[t] = learn_r, term, trunc
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
        rew_b, term_b, trunc_b = torch.from_numpy(rew_np), torch.from_numpy(term_np), torch.from_numpy(trunc_np)
        self.global_step += T * N
        self.recent_returns.extend(ep_returns)
        tr = lambda x: x.transpose(0, 1).contiguous()  # [steps, envs] -> [rows, steps]
        values = tr(val_b)
        if cfg.bootstrap_truncation:
            nxt = next_values_from(values, bootstrap, tr(final_v), tr(trunc_b))
            terminated = term_b
        else:
            nxt = next_values_from(values, bootstrap)
            terminated = term_b | trunc_b  # CleanRL's treatment: truncation counts as termination
        batch = Rollout(tr(obs_b), tr(act_b), tr(logp_b), values, tr(rew_b), nxt, tr(terminated), tr(term_b | trunc_b))
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

    def apply_methods(self, b: Rollout) -> None:
        """Run each method on this batch (the shared :class:`~reflectrl.contract.base.MethodRunner`) and
        apply its shaping; a reward change moves the GAE advantages by ``discounted_cumsum(delta, gamma *
        lambda)``, exactly GAE on the shaped rewards."""
        cfg = self.cfg
        disc = cfg.gamma * cfg.gae_lambda
        for runner in self.methods:
            states, feats = runner.features(self, b)
            sb = StepBatch(states=states, features=feats, rewards=b.rewards, values=b.values, advantages=b.advantages,
                           returns=b.returns, episode_end=b.episode_end, terminated=b.terminated,
                           next_values=b.next_values, progress=(self.update_idx - 1) / cfg.num_updates,
                           group_size=cfg.seed_group_size)
            adv = b.advantages

            def linear_gae(rewards: torch.Tensor, delta: torch.Tensor, adv=adv) -> tuple[torch.Tensor, torch.Tensor]:
                new = adv + discounted_cumsum(delta, b.episode_end, disc)
                return new, new + b.values

            out = apply_shaping(runner.run(sb), b.rewards, b.advantages, b.returns, b.weights, None, linear_gae)
            b.rewards, b.advantages, b.returns, b.weights = out.rewards, out.advantages, out.returns, out.weights

    def update(self, b: Rollout) -> dict[str, float]:
        """``update_epochs`` passes of minibatch PPO over the flattened rollout."""
        cfg = self.cfg
        B, M = cfg.batch_size, cfg.minibatch_size
        R, T = b.rewards.shape
        adv = b.advantages.reshape(B)
        if b.weights is not None:
            adv = adv * b.weights.reshape(B)
        flat = _Flat(b.obs.reshape(B, -1), b.actions.reshape(B, *self.act_shape), b.logp.reshape(B),
                     b.values.reshape(B), b.returns.reshape(B), adv)
        if cfg.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = (1.0 - (self.update_idx - 1) / cfg.num_updates) * cfg.learning_rate
        usable = self.finite("the observations", flat.obs) and self.finite("the advantages", flat.adv)
        acc = torch.zeros(7)
        n = 0
        aux = [m for m in self.methods if m.has_aux_loss]
        for _ in range(cfg.update_epochs if usable else 0):
            perm = torch.randperm(B, generator=self.gen)
            for start in range(0, B, M):
                loss, row, st = self._minibatch_loss(flat, perm[start:start + M], (R, T), aux)
                if not self.finite("the loss", loss.detach(), f"epoch minibatch starting at {start}"):
                    continue
                self._step(loss)
                acc += row
                n += 1
            if n and cfg.target_kl is not None and float(st["approx_kl"]) > cfg.target_kl:
                break
        pg, vl, ent, okl, kl, cf, cb = (acc / max(n, 1)).tolist()
        out = {"charts/learning_rate": self.optimizer.param_groups[0]["lr"], "losses/policy_loss": pg,
               "losses/value_loss": vl, "losses/entropy": ent, "losses/old_approx_kl": okl,
               "losses/approx_kl": kl, "losses/clipfrac": cf, "losses/clip_binding_frac": cb,
               "losses/explained_variance": explained_variance(flat.old_v, flat.ret)}
        if getattr(self, "skipped", 0):
            out["health/skipped"] = self.skipped
        return out

    def _minibatch_loss(self, f: _Flat, idx: Tensor, shape: tuple[int, int], aux: list[MethodRunner]
                        ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The PPO loss of the flattened steps ``idx`` (clipped policy term, value loss, entropy bonus, each method's
        auxiliary loss), its logged terms stacked, and the policy term's stats."""
        cfg = self.cfg
        R, T = shape
        logp, ent, v = self.model.evaluate(f.obs[idx], f.act[idx])
        mb_adv = f.adv[idx]
        if cfg.norm_adv:
            mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
        pg, st = ppo_policy_loss(logp, f.old_logp[idx], mb_adv, None, cfg.clip_coef, cfg.clip_coef_high)
        vl = value_loss(v, f.old_v[idx], f.ret[idx], None, cfg.clip_coef if cfg.clip_vloss else None)
        entropy = ent.mean()
        loss = pg - cfg.ent_coef * entropy + cfg.vf_coef * vl
        for runner in aux:  # a method's own loss on this minibatch, in its batch's [rows, steps] terms
            extra = runner.aux_loss(AuxInputs(idx // T, idx % T, logp, f.old_logp[idx], (R, T)))
            if extra is not None:
                loss = loss + extra
        row = torch.stack([pg.detach(), vl.detach(), entropy.detach(), st["old_approx_kl"], st["approx_kl"],
                           st["clipfrac"], st["clip_binding_frac"]])
        return loss, row, st

    def _step(self, loss: Tensor) -> None:
        """Backpropagate, clip the gradients to ``max_grad_norm`` and step."""
        for group in self.optimizer.param_groups:  # zero_grad(set_to_none=True), without its wrappers
            for p in group["params"]:
                p.grad = None
        loss.backward()
        clip_grad_norm(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()

    def iteration(self) -> dict[str, Any]:
        """One rollout + advantage estimate + methods + update; returns this update's metrics."""
        self.update_idx += 1
        t0 = time.perf_counter()
        batch, stats = self.rollout()
        t1 = time.perf_counter()
        self.advantages(batch)
        self.apply_methods(batch)
        losses = self.update(batch)
        t2 = time.perf_counter()
        rec = {"update": self.update_idx, "global_step": self.global_step, **stats, **losses,
               "time/update": t2 - t1, "time/iteration": t2 - t0}
        for runner in self.methods:
            rec.update(runner.metrics())
        return rec

    # ----------------------------------------------------------------------------- checkpoints
    def state_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        tensors.update({f"model/{k}": v for k, v in self.model.state_dict().items()})
        tr = self.tracker.state()
        tensors["env/actions"] = torch.from_numpy(np.ascontiguousarray(tr.pop("actions")))
        tensors["env/raw_obs"] = torch.from_numpy(np.ascontiguousarray(self.raw_obs))
        for name, norm in (("obs_norm", self.obs_norm and self.obs_norm.rms), ("rew_norm", self.rew_norm and self.rew_norm.rms)):
            if norm:
                for k, v in norm.state().items():
                    tensors[f"{name}/{k}"] = torch.from_numpy(v)
        if self.rew_norm is not None:
            tensors["rew_norm/returns"] = torch.from_numpy(self.rew_norm.returns.copy())
        meta.update({"global_step": self.global_step, "tracker": tr, "recent_returns": list(self.recent_returns)})

    def load_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model/")})
        for name, norm in (("obs_norm", self.obs_norm), ("rew_norm", self.rew_norm)):
            if norm is not None:
                norm.rms.load({k: tensors[f"{name}/{k}"].numpy() for k in ("mean", "var", "count")})
        if self.rew_norm is not None:
            self.rew_norm.returns = tensors["rew_norm/returns"].numpy().copy()
        self.tracker.load({**meta["tracker"], "actions": tensors["env/actions"].numpy()})
        self.global_step = int(meta["global_step"])
        self.recent_returns.extend(meta["recent_returns"])

    def after_load(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Rebuild the envs by replaying each one's current episode."""
        self.raw_obs = replay(self.envs, self.tracker)
        if not np.array_equal(self.raw_obs, tensors["env/raw_obs"].numpy()):
            import warnings

            warnings.warn(f"{self.cfg.env_id} did not replay to the same state: it is not deterministic given "
                          "seed and actions, so the resumed run will differ from an uninterrupted one", stacklevel=2)
        self.obs = self._norm_obs(self.raw_obs, update=False)


