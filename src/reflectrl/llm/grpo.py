"""The GRPO-family trainer: group rollout -> core group advantages -> clipped policy loss on tokens.

Read top to bottom: :meth:`GRPO.iteration` (one update), :meth:`GRPO.prepare` (the no-grad pass),
:meth:`GRPO.advantages`, :meth:`GRPO.update`, :meth:`GRPO.learn`. The math lives in
:mod:`reflectrl.core` (``get_adv_est``, ``ppo_policy_loss``, ``agg_loss``, ``approx_kl``); this file
only moves token batches through it. Checkpoints restore the trainable weights, optimizer, RNG
streams and counters, so a resumed run is bitwise the run that never stopped (on CPU).

Methods plug in as *hooks*: objects with any of the methods below (all optional)::

    setup(trainer)                         attach heads / buffers (before the optimizer is built)
    needs -> set[str]                      {"old_logp", "ref_logp", "hidden", "entropy", "hidden_grad"}
    select_problems(trainer, n)            -> list[Problem] | None  (e.g. ExGRPO's replay buckets)
    after_rollout(trainer, batch)          -> TokenBatch | None     (reshape rewards, mix stored rows)
    after_advantages(trainer, batch)       edit batch.advantages / batch.weights (GEAR)
    policy_loss(trainer, mb, out, old_logp, adv, mask) -> (loss, stats)   replaces the clipped loss
    loss(trainer, mb, out)                 -> (extra loss, metrics)       added per micro-batch
    after_update(trainer, batch)           train a learned part after the policy step
    metrics() -> dict;  state() -> (tensors, meta);  load_state(tensors, meta)
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import (extend_budget, load_checkpoint, pack_hooks, pack_optimizer, save_checkpoint, unpack_hooks,
                          unpack_optimizer)
from ..core import agg_loss, approx_kl, get_adv_est, masked_mean, ppo_policy_loss
from ..errors import CheckpointError, ConfigError
from ..progress import TrainProgress
from ..runlog import open_run, truncate_metrics
from ..tasks.base import Problem, get_task
from .policy import load_policy
from .batch import TokenBatch
from .config import CHECKPOINT, SAMPLES, GRPOConfig, load_llm_config
from .engines import make_engine
from .rollout import Rollout

def _call(hooks: list[Any], name: str, *args: Any) -> list[Any]:
    return [getattr(h, name)(*args) for h in hooks if hasattr(h, name)]


class GRPO:
    """The GRPO trainer. ``GRPO(config_for_algo("grpo", task="arith", model=PATH)).learn()``."""

    def __init__(self, config: GRPOConfig, hooks: list[Any] | None = None):
        config.validate()
        self.task = get_task(config.task)
        if hasattr(self.task, "sandbox_batch"):
            self.task.sandbox_batch = config.sandbox_batch
        multi = bool(getattr(self.task, "multi_turn", False))
        turns = config.max_turns or (int(getattr(self.task, "max_turns", 6)) if multi else 1)
        budget = config.max_response_tokens or (config.max_new_tokens * turns * (2 if multi else 1))
        self.cfg = cfg = dataclasses.replace(config, max_turns=turns, max_response_tokens=budget,
                                             norm_len=config.norm_len or budget)
        self.hooks = list(hooks or [])
        self.needs: set[str] = set().union(*(set(getattr(h, "needs", ())) for h in self.hooks))
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.train_problems: list[Problem] = list(self.task.problems("train"))
        if not self.train_problems:
            raise ConfigError(f"task {cfg.task!r} has no train problems")
        self.policy = load_policy(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                  lora_dropout=cfg.lora_dropout, ref=cfg.kl_coef > 0 or "ref_logp" in self.needs,
                                  dtype=cfg.dtype, device=cfg.device)
        _call(self.hooks, "setup", self)
        self.optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=cfg.learning_rate,
                                           betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                           weight_decay=cfg.weight_decay)
        self.engine = make_engine(cfg.engine, self.policy, cfg.temperature, cfg.top_k)
        self.rollout = Rollout(self.policy, self.engine, self.task, cfg.max_new_tokens, turns, budget, cfg.gen_batch,
                               cfg.reward_workers, reward_cache=cfg.reward_cache,
                               batch_scoring=cfg.sandbox_batch > 1)
        self.adv_fn = get_adv_est(cfg.adv_estimator)
        # merging identical rows is exact for the built-in loss terms; a hook's own terms would not see the counts
        self._dedupe = cfg.dedupe and not any(hasattr(h, n) for h in self.hooks for n in ("policy_loss", "loss")) \
            and "hidden_grad" not in self.needs
        self.update_idx = 0
        self.global_step = 0  # completions sampled so far
        self.cursor = 0  # problems drawn so far
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else Path(
            "runs") / f"{cfg.task}__{cfg.algo}__{cfg.seed}__{int(time.time())}"

    # ----------------------------------------------------------------------------- data
    def next_problems(self, n: int) -> list[Problem]:
        """The next ``n`` train problems: a fresh seeded permutation each pass over the split."""
        N = len(self.train_problems)
        out = []
        for _ in range(n):
            epoch, pos = divmod(self.cursor, N)
            if getattr(self, "_perm_epoch", None) != epoch:
                g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
                self._perm, self._perm_epoch = torch.randperm(N, generator=g).tolist(), epoch
            out.append(self.train_problems[self._perm[pos]])
            self.cursor += 1
        return out

    # ----------------------------------------------------------------------------- learning
    @torch.no_grad()
    def prepare(self, batch: TokenBatch) -> None:
        """The no-grad pass before the update: old log-probs (if the batch is reused), reference
        log-probs (KL), and the features / entropies hooks asked for."""
        cfg = self.cfg
        want_old = cfg.ppo_epochs * cfg.minibatches > 1 or "old_logp" in self.needs
        want_ref = cfg.kl_coef > 0 or "ref_logp" in self.needs
        want_hidden, want_ent = "hidden" in self.needs, "entropy" in self.needs
        if not (want_old or want_ref or want_hidden or want_ent):
            return
        self.policy.eval()
        step = max(1, math.ceil(batch.rows / cfg.grad_accum))  # no graph is kept: larger chunks than the update
        old, ref, hid, ent = [], [], [], []
        C = batch.steps
        for s in range(0, batch.rows, step):
            mb = batch.select(range(s, min(s + step, batch.rows)), trim=False)
            if want_old or want_hidden or want_ent:
                out = self.policy.forward_batch(mb, with_entropy=want_ent, with_hidden=want_hidden,
                                                temperature=cfg.temperature)
                old.append(out.logp.cpu())
                hid.append(out.hidden.cpu() if want_hidden else None)
                ent.append(out.entropy.cpu() if want_ent else None)
            if want_ref:
                ref.append(self.policy.ref_logprobs(mb, cfg.temperature).cpu())
        batch.old_logp = torch.cat(old)[:, :C] if want_old else batch.old_logp
        batch.ref_logp = torch.cat(ref)[:, :C] if want_ref else batch.ref_logp
        batch.hidden = torch.cat(hid) if want_hidden else batch.hidden
        batch.entropy = torch.cat(ent) if want_ent else batch.entropy

    def advantages(self, batch: TokenBatch) -> None:
        """Group advantages from the registered estimator (verl signature), per token ``[R, C]``."""
        mask = batch.completion_mask.float()
        kw = {"values": batch.values} if batch.values is not None else {}
        batch.advantages, batch.returns = self.adv_fn(batch.token_rewards, mask, batch.index, self.cfg, **kw)

    def _normalizer(self, b: TokenBatch) -> float:
        """What ``agg_loss`` divides by for these rows, so micro-batch losses add up to the minibatch's."""
        if self.cfg.loss_agg_mode == "token-mean":
            return float(b.completion_mask.sum())
        return float((b.completion_mask.sum(1) > 0).sum())

    def distinct_rows(self, mb: TokenBatch) -> tuple[TokenBatch, torch.Tensor | None]:
        """Rows of one group with the same tokens, masks and advantages have the same loss and gradient:
        keep the first of each with its multiplicity (``None``: all rows are distinct)."""
        key = torch.cat([mb.index[:, None], torch.where(mb.prompt_mask, mb.prompt_ids, -1),
                         torch.where(mb.response_attention, mb.response_ids, -1), mb.completion_mask.long()], 1)
        _, inv, counts = torch.unique(key, dim=0, return_inverse=True, return_counts=True)
        if counts.numel() == mb.rows:
            return mb, None
        first = torch.full((counts.numel(),), mb.rows).scatter_reduce(0, inv, torch.arange(mb.rows), "amin")
        for t in (mb.advantages, mb.weights):
            if t is not None and not torch.equal(t, t[first][inv]):
                return mb, None
        order = first.argsort()
        return mb.select(first[order]), counts[order].float()

    def micro_loss(self, mb: TokenBatch, counts: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Policy loss (+ KL, entropy and hook terms) of one micro-batch, aggregated as configured; row r
        stands for ``counts[r]`` identical rows when given (:meth:`distinct_rows`)."""
        cfg = self.cfg
        out = self.policy.forward_batch(mb, with_entropy=True, with_hidden="hidden_grad" in self.needs,
                                        temperature=cfg.temperature, entropy_grad=cfg.entropy_coef > 0)
        dev = out.logp.device
        mask = mb.completion_mask.float().to(dev)
        old = mb.old_logp.to(dev) if mb.old_logp is not None else out.logp.detach()
        adv = (mb.advantages if mb.weights is None else mb.advantages * mb.weights).to(dev)
        c = torch.ones(mb.rows, device=dev) if counts is None else counts.to(dev)
        token_mean = cfg.loss_agg_mode == "token-mean"
        # multiplicities: token-mean weighs the mask; the per-row modes weigh the rows' terms and rescale
        m_loss = mask * c[:, None] if token_mean else mask
        row_w = torch.ones_like(c[:, None]) if token_mean else c[:, None]
        has = (mask.sum(1) > 0).float()
        scale = 1.0 if token_mean or counts is None else float(has.sum() / (has * c).sum())
        m_stat = mask * c[:, None]

        def agg(x: torch.Tensor) -> torch.Tensor:
            return agg_loss(x * row_w, m_loss, cfg.loss_agg_mode, cfg.norm_len) * scale

        custom = [h for h in self.hooks if hasattr(h, "policy_loss")]
        if custom:
            loss, st = custom[0].policy_loss(self, mb, out, old, adv, mask)
        else:
            loss, st = ppo_policy_loss(out.logp, old, adv * row_w, m_loss, cfg.clip_low, cfg.clip_high,
                                       cfg.loss_agg_mode, cfg.norm_len)
            loss = loss * scale
            if counts is not None and not token_mean:  # token-weighted diagnostics
                _, st = ppo_policy_loss(out.logp.detach(), old, adv, m_stat, cfg.clip_low, cfg.clip_high)
        stats = {"losses/policy_loss": loss.detach(), "losses/clipfrac": st["clipfrac"],
                 "losses/approx_kl": st["approx_kl"], "losses/entropy": masked_mean(out.entropy.detach(), m_stat)}
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * agg(out.entropy)
        if mb.ref_logp is not None:
            kl = approx_kl(out.logp, mb.ref_logp.to(dev), cfg.kl_estimator)
            stats["losses/kl"] = masked_mean(kl.detach(), m_stat)
            if cfg.kl_coef > 0:
                loss = loss + cfg.kl_coef * agg(kl)
        for extra, metrics in _call(self.hooks, "loss", self, mb, out):
            loss = loss + extra
            stats.update(metrics)
        return loss, stats

    def update(self, batch: TokenBatch) -> dict[str, float]:
        """``ppo_epochs`` passes of ``minibatches`` optimizer steps, each accumulated over ``grad_accum``
        micro-batches whose losses are weighted to equal the loss of the whole minibatch."""
        cfg = self.cfg
        if cfg.lr_schedule == "linear":
            self.optimizer.param_groups[0]["lr"] = (1.0 - (self.update_idx - 1) / cfg.updates) * cfg.learning_rate
        params = self.policy.trainable_parameters()
        self.policy.train()
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(batch.rows, generator=self.gen) if cfg.minibatches > 1 else torch.arange(batch.rows)
            for mb_rows in torch.tensor_split(order, cfg.minibatches):
                mb = batch.select(mb_rows)
                norm = self._normalizer(mb)
                if norm == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                acc: dict[str, float] = {}
                for micro_rows in torch.tensor_split(torch.arange(mb.rows), cfg.grad_accum):
                    micro = mb.select(micro_rows)
                    w = self._normalizer(micro) / norm
                    if w == 0:
                        continue
                    rows, counts = self.distinct_rows(micro) if self._dedupe else (micro, None)
                    loss, st = self.micro_loss(rows, counts)
                    (loss * w).backward()
                    for k, v in st.items():
                        acc[k] = acc.get(k, 0.0) + w * float(v)
                if cfg.max_grad_norm > 0:
                    gn = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                else:
                    gn = torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
                self.optimizer.step()
                acc["losses/grad_norm"] = float(gn)
                for k, v in acc.items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
        self.policy.eval()
        out = {k: v / max(steps, 1) for k, v in totals.items()}
        out["charts/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        out["losses/optimizer_steps"] = steps
        return out

    def iteration(self) -> tuple[dict[str, Any], TokenBatch]:
        """One rollout + advantages + update; returns this update's metrics and its batch."""
        cfg = self.cfg
        self.update_idx += 1
        t0 = time.perf_counter()
        chosen = [p for p in _call(self.hooks, "select_problems", self, cfg.prompts_per_update) if p is not None]
        problems = chosen[0] if chosen else self.next_problems(cfg.prompts_per_update)
        pending = self.rollout.start(problems, cfg.group_size, self.gen,
                                     index_offset=(self.update_idx - 1) * cfg.prompts_per_update)
        t_gen = time.perf_counter()
        # The no-grad pass needs only the tokens: run it while the last chunk's rewards are computed,
        # unless a hook may change the batch after the rollout (it sees the rewards first).
        early = not pending.finished and not any(hasattr(h, "after_rollout") for h in self.hooks)
        if early:
            self.prepare(pending.tokens())
        t_prep = time.perf_counter()
        batch, rstats = pending.finish()
        t_wait = time.perf_counter()
        self.global_step += batch.rows
        for new in _call(self.hooks, "after_rollout", self, batch):
            batch = new if new is not None else batch
        if not early:
            self.prepare(batch)
        t1 = time.perf_counter()
        self.advantages(batch)
        _call(self.hooks, "after_advantages", self, batch)
        rec = {"update": self.update_idx, "global_step": self.global_step, **self.reward_metrics(batch)}
        train = batch
        if cfg.filter_zero_std:
            keep = (~_zero_std_rows(batch)).nonzero().squeeze(1)
            train = batch.select(keep) if keep.numel() else None
            rec["groups/kept_rows"] = int(keep.numel())
        losses = self.update(train) if train is not None else {"losses/optimizer_steps": 0}
        _call(self.hooks, "after_update", self, batch)
        self.engine.sync(self.policy)
        t2 = time.perf_counter()
        rec.update(losses)
        rec.update(rstats.as_metrics())
        rec.update({"time/rollout": (t_gen - t0) + (t_wait - t_prep), "time/prepare": (t_prep - t_gen) + (t1 - t_wait),
                    "time/update": t2 - t1, "time/iteration": t2 - t0,
                    "time/reward_fraction": rstats.env_wait_s / max(t2 - t0, 1e-9),
                    "charts/tokens_per_s": rstats.generated_tokens / max(t2 - t0, 1e-9)})
        for m in _call(self.hooks, "metrics"):
            rec.update(m)
        return rec, batch

    @staticmethod
    def reward_metrics(batch: TokenBatch) -> dict[str, float]:
        """Reward mean/std, accuracy, zero-variance groups and completion lengths of a rollout batch."""
        lens = batch.completion_lengths.float()
        _, inv = torch.unique(batch.index, return_inverse=True)
        n_groups = int(inv.max()) + 1
        zero = _zero_std_rows(batch)
        zero_groups = torch.zeros(n_groups, dtype=torch.bool).index_fill_(0, inv[zero], True)
        return {"reward/mean": float(batch.scores.mean()), "reward/std": float(batch.scores.std()),
                "accuracy": float(batch.correct.float().mean()),
                "groups/zero_std_frac": float(zero_groups.float().mean()),
                "completion/mean_length": float(lens.mean()), "completion/max_length": float(lens.max()),
                "completion/truncated_frac": float(batch.truncated.float().mean()),
                "rollout/turns": float((batch.turn_ids.max(1).values + 1).float().mean())}

    def log_samples(self, batch: TokenBatch, path: Path) -> None:
        """Append the first completion of the first ``samples_per_log`` groups to samples.jsonl."""
        firsts = [i for i in range(batch.rows) if i == 0 or int(batch.index[i]) != int(batch.index[i - 1])]
        with open(path, "a") as fh:
            for i in firsts[:self.cfg.samples_per_log]:
                fh.write(json.dumps({"update": self.update_idx, "problem_id": batch.problems[i].id,
                                     "transcript": batch.transcripts[i], "score": float(batch.scores[i]),
                                     "correct": bool(batch.correct[i])}) + "\n")

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy on the first ``eval_problems`` held-out problems."""
        from .evaluate import evaluate_policy

        res = evaluate_policy(self.policy, self.task, "heldout", max_new_tokens=self.cfg.max_new_tokens,
                              max_turns=self.cfg.max_turns, limit=self.cfg.eval_problems, gen_batch=self.cfg.gen_batch,
                              max_response_tokens=self.cfg.max_response_tokens)
        return {"eval/accuracy": res["accuracy"], "eval/ci_low": res["ci"][0], "eval/ci_high": res["ci"][1]}

    def learn(self) -> dict[str, Any]:
        """Train until ``updates`` (or ``time_limit_s``); logs, checkpoints, returns a summary."""
        cfg = self.cfg
        logger = open_run(self.run_dir, {"kind": "llm"}, cfg)
        start_rows, t_start, cpu_start = self.global_step, time.perf_counter(), cpu_seconds()
        rec: dict[str, Any] = {}
        try:
            with TrainProgress(cfg.updates, cfg.progress, f"{cfg.algo} {cfg.task}") as bar:
                while self.update_idx < cfg.updates:
                    rec, batch = self.iteration()
                    elapsed = time.perf_counter() - t_start
                    rec["charts/samples_per_s"] = (self.global_step - start_rows) / max(elapsed, 1e-9)
                    out_of_time = (cfg.time_limit_s is not None and elapsed >= cfg.time_limit_s) or (
                        cfg.cpu_time_limit_s is not None and cpu_seconds() - cpu_start >= cfg.cpu_time_limit_s)
                    last = self.update_idx == cfg.updates or out_of_time
                    if cfg.eval_interval and (self.update_idx % cfg.eval_interval == 0 or last):
                        rec.update(self.evaluate())
                    logger.log(rec)
                    if cfg.sample_interval and (self.update_idx % cfg.sample_interval == 0 or self.update_idx == 1):
                        self.log_samples(batch, self.run_dir / SAMPLES)
                    if last or (cfg.save_interval and self.update_idx % cfg.save_interval == 0):
                        self.save(self.run_dir / CHECKPOINT)
                    bar.update(self.update_idx, rec["charts/samples_per_s"], rec["reward/mean"])
                    if out_of_time:
                        break
        finally:
            logger.close()
            self.rollout.close()
        if cfg.export_model:
            self.policy.save_pretrained(self.run_dir / "model")
        elapsed = time.perf_counter() - t_start
        return {"run_dir": str(self.run_dir), "updates": self.update_idx, "global_step": self.global_step,
                "wall_s": elapsed, "cpu_s": cpu_seconds() - cpu_start,
                "samples_per_s": (self.global_step - start_rows) / max(elapsed, 1e-9),
                "accuracy": rec.get("accuracy"), "eval_accuracy": rec.get("eval/accuracy")}

    # ----------------------------------------------------------------------------- checkpoints
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything a resume needs, split into tensors and JSON metadata."""
        tensors = {f"policy/{k}": v for k, v in self.policy.trainable_state().items()}
        opt_t, opt_meta = pack_optimizer("optim", self.optimizer)
        tensors.update(opt_t)
        tensors["rng/torch_gen"] = self.gen.get_state()
        tensors["rng/torch_global"] = torch.get_rng_state()
        meta = {"format": 1, "kind": "llm", "update": self.update_idx, "global_step": self.global_step,
                "cursor": self.cursor, "optim": opt_meta, "config": dataclasses.asdict(self.cfg)}
        pack_hooks(self.hooks, tensors, meta)
        return tensors, meta

    def save(self, path: Path) -> None:
        """Write the checkpoint atomically."""
        save_checkpoint(path, *self.state())

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Restore from :meth:`state` output."""
        try:
            self.policy.load_trainable_state({k[7:]: v for k, v in tensors.items() if k.startswith("policy/")})
            self.optimizer.load_state_dict(unpack_optimizer("optim", tensors, meta["optim"]))
            self.gen.set_state(tensors["rng/torch_gen"])
            torch.set_rng_state(tensors["rng/torch_global"])
            self.update_idx, self.global_step = int(meta["update"]), int(meta["global_step"])
            self.cursor = int(meta["cursor"])
            unpack_hooks(self.hooks, tensors, meta)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint does not match this configuration or is damaged ({exc})") from None
        self.engine.sync(self.policy)

    @classmethod
    def resume(cls, run_dir: str | Path, updates: int | None = None, make_hooks: Any = None,
               **overrides: Any) -> "GRPO":
        """Rebuild a trainer from ``RUN_DIR/config.json`` and its latest checkpoint (optionally for more updates)."""
        run_dir = Path(run_dir)
        cfg = load_llm_config(run_dir)
        tensors, meta = load_checkpoint(run_dir / CHECKPOINT)
        extend_budget(cfg, updates, field="updates", flag="--updates")
        cfg = dataclasses.replace(cfg, run_dir=str(run_dir), **overrides)
        trainer = cls(cfg, hooks=make_hooks(cfg) if make_hooks else None)
        trainer.load_state(tensors, meta)
        truncate_metrics(run_dir / "metrics.jsonl", trainer.update_idx)
        truncate_metrics(run_dir / SAMPLES, trainer.update_idx)
        return trainer


def step_batch(trainer: GRPO, batch: TokenBatch) -> Any:
    """The method-side view (:class:`reflectrl.methods.base.StepBatch`) of a token batch: states and
    features are the hidden states that predict each response token, rewards/advantages per token,
    each row one episode ending at its last policy token."""
    from ..methods.base import StepBatch

    mask = batch.completion_mask
    end = torch.zeros_like(mask)
    last = batch.last_completion_index()
    has = last >= 0
    end[has.nonzero().squeeze(1), last[has]] = True
    hidden = batch.hidden if batch.hidden is not None else torch.zeros(batch.rows, batch.steps, 0)
    zeros = torch.zeros(batch.rows, batch.steps)
    return StepBatch(states=hidden, features=hidden, rewards=batch.token_rewards,
                     values=batch.values if batch.values is not None else zeros,
                     advantages=batch.advantages, returns=batch.returns, episode_end=end,
                     terminated=end & ~batch.truncated[:, None], next_values=zeros, mask=mask.float(),
                     progress=(trainer.update_idx - 1) / max(trainer.cfg.updates, 1),
                     group_size=trainer.cfg.group_size)


class MethodHook:
    """Runs a method of :mod:`reflectrl.methods` (``fit`` / ``shape`` / ``metrics`` / ``state``) inside the
    GRPO trainer, on :func:`step_batch` of each batch, after the group advantages: a reward change
    re-runs the advantage estimator, an advantage change is added, weights multiply the advantages."""

    needs = ("hidden",)

    def __init__(self, method: Any):
        self.method = method

    def after_advantages(self, trainer: GRPO, batch: TokenBatch) -> None:
        m = self.method
        sb = step_batch(trainer, batch)
        if getattr(m, "fit_first", True):
            m.fit(sb)
        sh = m.shape(sb)
        if not getattr(m, "fit_first", True):
            m.fit(sb)
        mask = batch.completion_mask.float()
        if sh.reward_delta is not None:
            batch.token_rewards = batch.token_rewards + sh.reward_delta * mask
            trainer.advantages(batch)
        if sh.advantage_delta is not None:
            batch.advantages = batch.advantages + sh.advantage_delta * mask
        if sh.weights is not None:
            batch.weights = sh.weights if batch.weights is None else batch.weights * sh.weights

    def metrics(self) -> dict[str, float]:
        return self.method.metrics() if hasattr(self.method, "metrics") else {}

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self.method.state() if hasattr(self.method, "state") else ({}, {})

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        if hasattr(self.method, "load_state"):
            self.method.load_state(tensors, meta)


def cpu_seconds() -> float:
    """CPU time of this process (all threads) plus that of the child processes it has waited for."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def _zero_std_rows(batch: TokenBatch) -> torch.Tensor:
    """``[R]`` true for rows whose group's scores are all equal (their group advantage is 0)."""
    _, inv = torch.unique(batch.index, return_inverse=True)
    n = int(inv.max()) + 1
    lo = torch.full((n,), float("inf")).scatter_reduce(0, inv, batch.scores, "amin")
    hi = torch.full((n,), float("-inf")).scatter_reduce(0, inv, batch.scores, "amax")
    return (hi - lo)[inv] <= 1e-12
