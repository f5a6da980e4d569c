"""The GRPO-family trainer: group rollout -> core group advantages -> methods -> policy loss on tokens.

Read top to bottom: :meth:`GRPO.iteration` (one update), :meth:`GRPO.prepare` (the no-grad pass),
:meth:`GRPO.advantages`, :meth:`GRPO.apply_methods`, then the update in :mod:`reflectrl.llm.update`.
The math lives in :mod:`reflectrl.core` (estimators, policy losses, KL); the loop, checkpoints and
resume in :mod:`reflectrl.trainer`. Checkpoints restore the trainable weights, optimizer, RNG streams,
counters and every method's state, so a resumed run is bitwise the run that never stopped (on CPU).

Methods of :mod:`reflectrl.methods` plug in through the shared contract (:class:`MethodRunner` on
:func:`step_batch` of each batch). What else an LLM method needs of the trainer is a
:class:`GRPOHook` (choosing problems, mixing stored rows into a batch, a teacher pass).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..contract.base import MethodRunner, StepBatch, apply_shaping, last_turn_tokens
from ..contract.hooks import Hook, check_provided
from ..core import adv_est_requires, get_adv_est
from ..errors import ConfigError
from ..runlog import strict
from ..tasks.base import Problem, absolute_option_paths, chat_prompt, get_task
from ..tasks.selfreport import SelfReportTask, with_self_report
from ..trainer import Clock, Trainer, default_run_dir
from .batch import ENGINE_LOGP, REPLAYED, TokenBatch
from .collapse import CollapseAlarm
from .config import SAMPLES, GRPOConfig
from .distributed import from_env, rank_seed, shard
from .engines import check_engine, default_engine_options, engine_logprobs, make_engine
from .episodes import (
    _no_signal_rows,
    _zero_std_rows,
    episode_info,
    per_step_extras,
    reward_metrics,
    row_extras,
    trained_reward,
)
from .models import base_model_of, record_model, uses_chat
from .policy import load_policy
from .rollout import Rollout, RolloutStats, logged_episode
from .train_status import TrainStatus
from .update import REPORT_ENTROPY, ROW_ID, VALUE_HEAD, PolicyUpdate


class GRPOHook(Hook["GRPO"]):
    """The GRPO trainer's events of the one hook protocol (:class:`reflectrl.contract.hooks.Hook`: ``setup``,
    ``metrics``, ``needs``, ``provides``, the checkpointed state); override any of these."""

    def select_problems(self, trainer: GRPO, n: int) -> list[Problem] | None:
        """The problems of the next rollout (None: the trainer's own order)."""
        return None

    def after_rollout(self, trainer: GRPO, batch: TokenBatch) -> TokenBatch | None:
        """Change a finished rollout (mix stored rows in, reshape rewards); None keeps it."""
        return None

    def group_sizes(self, trainer: GRPO, problems: list[Problem]) -> list[int] | None:
        """Samples per problem of the next rollout (None: ``group_size`` each)."""
        return None

    def after_prepare(self, trainer: GRPO, batch: TokenBatch) -> None:
        """After the no-grad pass, before the advantages (a teacher pass: put per-token tensors into
        ``batch.extras[NAME]``, a field registered for methods, which read it as ``StepBatch.per_step[NAME]``)."""

    def after_update(self, trainer: GRPO, batch: TokenBatch) -> None:
        """After the policy step (store trajectories, train a learned part)."""

    changes_batch = False
    """True when ``after_rollout`` may change the batch (the no-grad pass then waits for it)."""


def _place(parts: list[tuple[torch.Tensor, torch.Tensor]], rows: int, width: int) -> torch.Tensor:
    """``[rows, width, ...]`` from per-chunk ``(row indices, values [n, w, ...])`` with ``w <= width``; 0 beyond each
    chunk's width (response-aligned outputs of chunks trimmed to their own widths)."""
    first = parts[0][1]
    out = first.new_zeros((rows, width, *first.shape[2:]))
    for idx, v in parts:
        out[idx, :v.shape[1]] = v[:, :width]
    return out


class GRPO(PolicyUpdate, Trainer):
    """The GRPO trainer. ``GRPO(config_for_algo("grpo", task="arith", model=PATH)).learn()``."""

    kind = "llm"
    algo_name = "grpo"
    budget_field = "updates"
    budget_flag = "--updates"
    resume_cmd = "reflectrl llm train --resume"
    extra_logs = (SAMPLES,)

    def __init__(self, config: GRPOConfig, hooks: Sequence[GRPOHook] | None = None,
                 methods: list[MethodRunner] | Callable[[GRPO], list[MethodRunner]] | None = None):
        """``methods``: the runners, or a function of the trainer that builds them once the policy is loaded
        (their heads read its hidden size)."""
        t_setup = time.perf_counter()
        self.cfg = cfg = self._configure(config)
        check_engine(cfg.engine)
        self.dist, device = from_env(cfg.device)  # torchrun: this process's rank and device (one process: as given)
        self._compose(list(hooks or []), methods)
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.train_problems: list[Problem] = list(self.task.problems("train"))
        if not self.train_problems:
            raise ConfigError(f"task {cfg.task!r} has no train problems")
        if cfg.eval_interval:
            self.task.problems(cfg.eval_split)  # a split the task lacks fails here, before any work
        self.problems_by_id = {p.id: p for p in self.train_problems}
        self._load_policy(device, methods)
        if self.dist.active:
            self._check_distributed()
        self._fit_memory()
        self.optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=cfg.learning_rate,
                                           betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                           weight_decay=cfg.weight_decay, foreach=True)
        self._build_rollout()
        # merging identical rows is exact for the built-in loss terms; a method's own terms would not see the counts
        self._dedupe = cfg.dedupe and not any(m.has_aux_loss for m in self.methods) and "hidden_grad" not in self.needs
        self._batch_shape = (0, 0)
        self._status = TrainStatus()  # what the progress bar shows beside the count of updates
        self.update_idx = 0
        self.global_step = 0  # completions sampled so far
        self.cursor = 0  # problems drawn so far
        self.last_batch: TokenBatch | None = None
        self.alarm = CollapseAlarm(cfg.collapse_alarm_updates, cfg.collapse_alarm_spread, cfg.self_report)
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg.task, cfg.algo, cfg.seed)
        if self.dist.active:
            self.run_dir = Path(self.dist.broadcast_object(str(self.run_dir)))  # rank 0's (a default one has a time)
        self._setup_s = time.perf_counter() - t_setup  # loading the model and task, before wall_s starts

    def _configure(self, config: GRPOConfig) -> GRPOConfig:
        """Validate ``config``, load its task (with the self-report turn asked for) and resolve the settings that
        follow the task and the model."""
        config.validate()
        self.algo_name = config.algo
        task = get_task(config.task, **config.task_kwargs())  # an unknown task or option fails before any model work
        # the model is recorded as an absolute folder (a named model's: the one it was converted into, with its name),
        # so the run resumes and evaluates from any folder
        folder, name = record_model(base_model_of(config.model, config.model_name))
        config = dataclasses.replace(config, model=folder, model_name=name or config.model_name,
                                     task_options=absolute_option_paths(config.task_options))
        # a chat model's budgets are its task's chat budgets (read from the model's files, before any weights load)
        chat = uses_chat(config.model, config.chat)
        self.task = with_self_report(task, config.self_report, chat=chat)
        if hasattr(self.task, "sandbox_batch"):
            self.task.sandbox_batch = config.sandbox_batch
        return config.resolved(self.task, chat=chat)

    def _compose(self, hooks: list[GRPOHook],
                 methods: list[MethodRunner] | Callable[[GRPO], list[MethodRunner]] | None) -> None:
        """Take the hooks and methods, and what they need of the no-grad pass; refuse what cannot go together."""
        cfg = self.cfg
        self.hooks = hooks
        self.methods: list[MethodRunner] = [] if callable(methods) else list(methods or [])
        self.needs: set[str] = set().union(*(set(h.needs) for h in self.hooks))
        if cfg.max_gen_batches != 1 and any(h.changes_batch for h in self.hooks):
            raise ConfigError(f"--max-gen-batches refills a batch, but --algo {cfg.algo} composes its own batches "
                              "(replayed rows); leave --max-gen-batches at 1")
        if callable(methods) or any(r.reads_states for r in self.methods):  # the hidden states are their states
            self.needs.add("hidden")
        self.critic = "values" in adv_est_requires(cfg.adv_estimator)
        if self.critic:
            self.needs.add("hidden")

    def _load_policy(self, device: str, methods: list[MethodRunner] | Callable[[GRPO], list[MethodRunner]] | None
                     ) -> None:
        """Load the policy (and its reference and critic head when needed), build the methods that read its size,
        set up the hooks, and check that every field a method reads is provided."""
        cfg = self.cfg
        self.policy = load_policy(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                  lora_dropout=cfg.lora_dropout, ref=cfg.kl_coef > 0 or "ref_logp" in self.needs,
                                  dtype=cfg.dtype, device=device, chat=cfg.chat, savable=True)
        self.policy.attention = cfg.attention
        if self.critic:
            self.policy.add_head(VALUE_HEAD)
        if callable(methods):
            self.methods = list(methods(self))
        for h in self.hooks:
            h.setup(self)
        check_provided(self.hooks, [(r.name, k) for r in self.methods for k in r.reads])

    def _fit_memory(self) -> None:
        """Estimate an update's peak memory before any work (:mod:`reflectrl.llm.memory`): at the default split,
        micro-batches that fit (said in one line); a given split that does not fit is refused."""
        from .memory import fit_update

        self.prompt_lengths = [len(self.policy.encode_prompt(chat_prompt(self.task, p) if self.policy.chat is not None
                                                             else p.prompt)) for p in self.train_problems[:256]]
        self.cfg, note = fit_update(self.cfg, self.policy, self.prompt_lengths)
        if note and self.is_main:
            print(note, file=sys.stderr, flush=True)

    def _build_rollout(self) -> None:
        """The generation engine and the rollout over the task's turns."""
        cfg = self.cfg
        inner = self.task.task if isinstance(self.task, SelfReportTask) else self.task
        # the task's own turns (an asked self-report turn aside); an inline report's turn continues the answer's own
        # message, which the kept cache spares prefilling again (a form with no earlier runs to reproduce)
        multi = bool(getattr(inner, "multi_turn", False)) or bool(getattr(self.task, "inline", False))
        implied = default_engine_options(cfg.engine, multi, self.policy.chat is not None and inner is not self.task)
        if unset := [f"{k}={str(v).lower()}" for k, v in implied.items() if k not in cfg.engine_kwargs()]:
            self.cfg = cfg = dataclasses.replace(cfg, engine_options=(*cfg.engine_options, *unset))  # as config.json says
        # the sampler's log-probs where they replace a no-grad pass (one optimizer step takes its own, detached)
        own = {"logprobs": True} if cfg.old_logp == "engine" and cfg.engine == "torch" and self._reuses_batch() else {}
        self.engine = make_engine(cfg.engine, self.policy, cfg.temperature, cfg.top_k, **{**own, **cfg.engine_kwargs()})
        if cfg.old_logp == "engine" and engine_logprobs(self.engine) is None and (own or cfg.engine != "torch"):
            raise ConfigError(f"--old-logp engine needs an engine that returns its log-probs (torch, vllm); "
                              f"--engine {cfg.engine} does not")
        self.rollout = Rollout(self.policy, self.engine, self.task, cfg.max_new_tokens, cfg.max_turns,
                               cfg.max_response_tokens, cfg.gen_batch, cfg.reward_workers, reward_cache=cfg.reward_cache,
                               batch_scoring=cfg.sandbox_batch > 1)
        self.adv_fn = get_adv_est(cfg.adv_estimator)

    def _reuses_batch(self) -> bool:
        """Whether the update needs old log-probs other than its own: the batch serves more than one optimizer step,
        or a method or hook reads them."""
        return self.cfg.ppo_epochs * self.cfg.minibatches > 1 or "old_logp" in self.needs

    def _check_distributed(self) -> None:
        """Under torchrun: refuse what would differ between the processes; give every process rank 0's weights."""
        if self.hooks or self.methods:
            raise ConfigError(f"--algo {self.cfg.algo} adds methods or hooks, whose state would differ between the "
                              f"{self.dist.world} torchrun processes: train grpo, drgrpo or dapo under torchrun, or "
                              "run this algo in one process")
        if self.cfg.prompts_per_update < self.dist.world:
            raise ConfigError(f"prompts_per_update ({self.cfg.prompts_per_update}) is below the number of torchrun "
                              f"processes ({self.dist.world}): each process needs a group of its own")
        self.dist.broadcast_(self.policy.trainable_parameters())

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
        log-probs (KL), the critic's values and the features / entropies methods and hooks asked for."""
        cfg = self.cfg
        want_old = self._reuses_batch() or ENGINE_LOGP in batch.extras
        if cfg.old_logp == "engine" and ENGINE_LOGP in batch.extras:  # the sampler's own: no pass for them
            if want_old:
                batch.old_logp = batch.extras[ENGINE_LOGP][:, :batch.steps].clone()
            want_old = False
        want_ref = cfg.kl_coef > 0 or "ref_logp" in self.needs
        want_hidden, want_ent = "hidden" in self.needs, "entropy" in self.needs
        if not (want_old or want_ref or want_hidden or want_ent):
            return
        self.policy.eval()
        parts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"old": [], "ref": [], "hid": [], "ent": []}
        for rows, mb in self._pass_chunks(batch):
            if want_old or want_hidden or want_ent:
                out = self.policy.forward_batch(mb, with_entropy=want_ent, with_hidden=want_hidden,
                                                temperature=cfg.temperature)
                parts["old"].append((rows, out.logp.cpu()))
                if want_hidden:
                    parts["hid"].append((rows, out.hidden.cpu()))
                if want_ent:
                    parts["ent"].append((rows, out.entropy.cpu()))
            if want_ref:
                parts["ref"].append((rows, self.policy.ref_logprobs(mb, cfg.temperature).cpu()))
        R, C = batch.rows, batch.steps
        batch.old_logp = _place(parts["old"], R, C) if want_old else batch.old_logp
        batch.ref_logp = _place(parts["ref"], R, C) if want_ref else batch.ref_logp
        batch.hidden = _place(parts["hid"], R, C) if want_hidden else batch.hidden
        batch.entropy = _place(parts["ent"], R, C) if want_ent else batch.entropy
        if self.critic:
            batch.values = self.policy.head(VALUE_HEAD, batch.hidden).float() * batch.completion_mask

    def _pass_chunks(self, batch: TokenBatch) -> list[tuple[torch.Tensor, TokenBatch]]:
        """The row chunks of the no-grad pass, each with its rows: ``grad_accum`` contiguous chunks at the batch's
        width (no graph is kept, so larger than the update's), or the update's length-packed micro-batches, each
        trimmed to its own width (``micro_batch_tokens``)."""
        if self.cfg.micro_batch_tokens:
            return [(rows, batch.select(rows)) for rows in self._micro_splits(batch)]
        step = max(1, math.ceil(batch.rows / self.cfg.grad_accum))
        return [(rows, batch.select(rows, trim=False)) for rows in torch.arange(batch.rows).split(step)]

    def advantages(self, batch: TokenBatch) -> None:
        """Advantages from the registered estimator (verl signature), per token ``[R, C]``."""
        mask = batch.completion_mask.float()
        kw = {"values": batch.values} if batch.values is not None else {}
        batch.advantages, batch.returns = self.adv_fn(batch.token_rewards, mask, batch.index, self.cfg, **kw)

    def apply_methods(self, batch: TokenBatch) -> None:
        """Run each method on :func:`step_batch` of this batch and apply its shaping (a reward change
        re-runs the estimator: it enters before group normalization)."""
        mask = batch.completion_mask.float()

        def reestimate(rewards: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            batch.token_rewards = rewards
            self.advantages(batch)
            return batch.advantages, batch.returns

        for runner in self.methods:
            sh = runner.run(step_batch(self, batch))
            out = apply_shaping(sh, batch.token_rewards, batch.advantages, batch.returns, batch.weights, mask, reestimate)
            batch.token_rewards, batch.advantages, batch.returns, batch.weights = (
                out.rewards, out.advantages, out.returns, out.weights)

    def iteration(self) -> dict[str, Any]:
        """One update, in named steps: draw the problems, roll them out (the no-grad pass beside the last rewards),
        shape the batch (advantages, then the methods), record it, choose the rows that train, update, and time
        it. Returns this update's metrics; the batch is kept as ``last_batch``."""
        self.update_idx += 1
        marks = {"start": time.perf_counter()}
        cpu0 = time.process_time()
        problems, group, offset, gen = self.draw_problems()
        batch, rstats, rounds, lean, gap = self.roll_out(problems, group, offset, gen, marks)
        self.advantages(batch)
        self.apply_methods(batch)
        rec = self.record(batch, gap)
        self.mark_report_turn(batch)
        train = self.rows_to_train(batch, rec, rounds, lean)
        marks["kept"] = time.perf_counter()
        if lean and train is not None:  # at the whole batch's width: the same numbers as a pass over all of it
            self.prepare(train)
            train = train.trimmed()
            rec.update(self.engine_correction(train))
        marks["kept_prepared"] = time.perf_counter()
        losses = self.update(train) if train is not None or self.dist.active else {"losses/optimizer_steps": 0}
        for h in self.hooks:
            h.after_update(self, batch)
        self.engine.sync(self.policy)
        marks["end"] = time.perf_counter()
        rec.update(losses)
        rec.update(rstats.as_metrics())
        rec.update(self.timings(marks, rstats))
        rec["time/cpu_iteration"] = time.process_time() - cpu0  # this process's CPU seconds (all its threads)
        for m in [*self.methods, *self.hooks]:
            rec.update(m.metrics())
        self.last_batch = batch
        return self.dist.combine_record(rec, batch.rows)

    def draw_problems(self) -> tuple[list[Problem], Any, int, torch.Generator]:
        """This update's problems (a hook's choice, or the trainer's order), their group size(s), the index of the
        first group and the generator; under torchrun this process's share, with its own generator."""
        cfg = self.cfg
        chosen = [p for h in self.hooks if (p := h.select_problems(self, cfg.prompts_per_update)) is not None]
        problems = chosen[0] if chosen else self.next_problems(cfg.prompts_per_update)
        sizes = [s for h in self.hooks if (s := h.group_sizes(self, problems)) is not None]
        group, offset, gen = sizes[0] if sizes else cfg.group_size, (self.update_idx - 1) * cfg.prompts_per_update, self.gen
        if self.dist.active:  # this process's groups of the global list, with its own generator
            lo, hi = shard(len(problems), self.dist.rank, self.dist.world)
            problems, group, offset = problems[lo:hi], group if isinstance(group, int) else list(group)[lo:hi], offset + lo
            gen = self.rank_gen = torch.Generator().manual_seed(rank_seed(cfg.seed, self.dist.rank, self.update_idx))
        return problems, group, offset, gen

    def roll_out(self, problems: list[Problem], group: Any, offset: int, gen: torch.Generator,
                 marks: dict[str, float]) -> tuple[TokenBatch, RolloutStats, int, bool, dict[str, float]]:
        """Generate and score the groups, with the no-grad pass (:meth:`prepare`) as early as it may run, and the
        hooks' turns. Returns the batch, its rollout stats, the generation rounds, whether the pass waits for the
        rows that train (``lean``) and the engine-correction metrics; ``marks`` gets the times of its phases."""
        cfg = self.cfg
        pending = self.rollout.start(problems, group, gen, index_offset=offset)
        marks["generated"] = time.perf_counter()
        # The no-grad pass needs only the tokens: run it while the last chunk's rewards are computed,
        # unless a hook may change the batch after the rollout (it sees the rewards first) or the batch
        # may be refilled.
        refill = cfg.max_gen_batches != 1
        early = not pending.finished and not any(h.changes_batch for h in self.hooks) and not refill
        # Dynamic sampling with nothing but the loss reading the batch: the no-grad pass runs on the rows that
        # train only (most of a refilled batch is left out), after the filter.
        lean = refill and not (self.methods or self.hooks or self.critic)
        if early:
            self.prepare(pending.tokens())
        marks["prepared"] = time.perf_counter()
        batch, rstats = pending.finish()
        rounds = 1
        if refill:
            batch, rstats, rounds = self.refill(batch, rstats, group, gen, offset)
        marks["rewarded"] = time.perf_counter()
        self.global_step += int(self.dist.sum_floats([batch.rows])[0])  # every process's rows
        for h in self.hooks:
            batch = h.after_rollout(self, batch) or batch
        if not (early or lean):
            self.prepare(batch)
        for h in self.hooks:
            h.after_prepare(self, batch)
        gap = {} if lean else self.engine_correction(batch)
        marks["shaping"] = time.perf_counter()
        return batch, rstats, rounds, lean, gap

    def record(self, batch: TokenBatch, gap: dict[str, float]) -> dict[str, Any]:
        """The update's record so far: counters, the fresh rows' reward and self-report metrics (replayed rows
        left out), the engine correction's and the collapse alarm's."""
        off = batch.extras.get(REPLAYED)
        fresh = batch if off is None or not bool(off.any()) else batch.select((off == 0).nonzero().squeeze(1), trim=False)
        kinds, info = tuple(getattr(self.task, "tool_kinds", ())), episode_info(fresh)
        return {"update": self.update_idx, "global_step": self.global_step,
                **reward_metrics(fresh, bool(self.methods), kinds, info), **gap,
                **self.alarm.observe(info, self.update_idx)}

    def mark_report_turn(self, batch: TokenBatch) -> None:
        """Row ids, and with ``--report-entropy-coef`` the self-report turn's entropy weights, for the update."""
        batch.extras[ROW_ID] = torch.arange(batch.rows)
        if self.cfg.report_entropy_coef > 0:
            asked = episode_info(batch).get("report_asked", torch.zeros(batch.rows))
            report = last_turn_tokens(batch.turn_ids, batch.completion_mask, asked)
            batch.extras[REPORT_ENTROPY] = report.float() * self.cfg.report_entropy_coef
        self._batch_shape = (batch.rows, batch.steps)

    def rows_to_train(self, batch: TokenBatch, rec: dict[str, Any], rounds: int, lean: bool) -> TokenBatch | None:
        """The rows the update trains on: all, or with ``--filter-zero-std`` the groups with a signal (after a refill
        the first ``prompts_per_update`` of them); None when none has one."""
        if not self.cfg.filter_zero_std:
            return batch
        # on what the advantages were computed from: the trained reward, methods' terms in
        keep = (~_no_signal_rows(batch)).nonzero().squeeze(1)
        if self.cfg.max_gen_batches != 1:  # the first prompts_per_update informative groups (each rank: its share)
            keep = keep[torch.isin(batch.index[keep], batch.index[keep].unique()[:self._kept_quota()])]
            rec["groups/gen_batches"] = rounds
        rec["groups/kept_rows"] = int(keep.numel())
        return batch.select(keep, trim=not lean) if keep.numel() else None

    @staticmethod
    def timings(marks: dict[str, float], rstats: RolloutStats) -> dict[str, float]:
        """``time/*`` of an update from its ``marks``: rollout (generating, then waiting for rewards), the no-grad
        passes, the update, the whole; the share of it spent waiting for rewards, and tokens per second."""
        lean = marks["kept_prepared"] - marks["kept"]
        whole = marks["end"] - marks["start"]
        return {"time/rollout": (marks["generated"] - marks["start"]) + (marks["rewarded"] - marks["prepared"]),
                "time/prepare": (marks["prepared"] - marks["generated"]) + (marks["shaping"] - marks["rewarded"]) + lean,
                "time/update": marks["end"] - marks["shaping"] - lean, "time/iteration": whole,
                "time/reward_fraction": rstats.env_wait_s / max(whole, 1e-9),
                "charts/tokens_per_s": rstats.generated_tokens / max(whole, 1e-9)}

    def _kept_quota(self) -> int:
        """Informative groups an update keeps on this process (its shard of prompts_per_update)."""
        if not self.dist.active:
            return self.cfg.prompts_per_update
        lo, hi = shard(self.cfg.prompts_per_update, self.dist.rank, self.dist.world)
        return hi - lo

    def refill(self, batch: TokenBatch, rstats: RolloutStats, group: int, gen: torch.Generator,
               offset: int) -> tuple[TokenBatch, RolloutStats, int]:
        """DAPO's dynamic sampling: roll out further batches of new problems until the update holds
        ``prompts_per_update`` groups whose rewards differ (counted over every process, so all of them
        draw the same problems), or ``max_gen_batches`` batches were sampled; returns the concatenated
        batch, the summed rollout statistics and the number of batches."""
        cfg, P = self.cfg, self.cfg.prompts_per_update

        def informative(b: TokenBatch) -> int:
            return int(b.index[~_zero_std_rows(b)].unique().numel())

        batches, kept, rounds = [batch], self.dist.sum_floats([informative(batch)])[0], 1
        while kept < P and (cfg.max_gen_batches == 0 or rounds < cfg.max_gen_batches):
            problems = self.next_problems(P)
            off = offset + rounds * P  # group ids stay distinct within the update
            if self.dist.active:
                lo, hi = shard(len(problems), self.dist.rank, self.dist.world)
                problems, off = problems[lo:hi], off + lo
            more, st = self.rollout.start(problems, group, gen, index_offset=off).finish()
            for k in ("generate_s", "prefill_s", "env_s", "env_wait_s", "generated_tokens", "cache_hits"):
                setattr(rstats, k, getattr(rstats, k) + getattr(st, k))
            rstats.new_steps |= st.new_steps
            batches.append(more)
            kept += self.dist.sum_floats([informative(more)])[0]
            rounds += 1
        return TokenBatch.cat(batches, self.policy.pad_id), rstats, rounds

    def log_samples(self, batch: TokenBatch, path: Path) -> None:
        """Append the first completion of the first ``samples_per_log`` groups to samples.jsonl."""
        firsts = [i for i in range(batch.rows) if i == 0 or int(batch.index[i]) != int(batch.index[i - 1])]
        firsts = firsts[:self.cfg.samples_per_log]
        with open(path, "a") as fh:
            for i, rec in zip(firsts, batch.to_records(firsts)):
                episode = logged_episode(self.policy.tokenizer, self.policy.chat is not None, rec, batch.transcripts[i])
                fh.write(json.dumps(strict({"update": self.update_idx, "problem_id": batch.problems[i].id,
                                            "score": float(batch.scores[i]), "reward": float(trained_reward(batch)[i]),
                                            "correct": bool(batch.correct[i]), **episode})) + "\n")

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy on the first ``eval_problems`` problems of ``eval_split``."""
        from .evaluate import evaluate_policy

        res = evaluate_policy(self.policy, self.task, self.cfg.eval_split, max_new_tokens=self.cfg.max_new_tokens,
                              max_turns=self.cfg.max_turns, limit=self.cfg.eval_problems, gen_batch=self.cfg.gen_batch,
                              max_response_tokens=self.cfg.max_response_tokens)
        return {"eval/accuracy": res["accuracy"], "eval/ci_low": res["ci"][0], "eval/ci_high": res["ci"][1]}

    # ----------------------------------------------------------------------------- the skeleton's loop
    @property
    def position(self) -> int:
        return self.update_idx

    @property
    def total(self) -> int:
        return self.cfg.updates

    @property
    def finished(self) -> bool:
        return self.update_idx >= self.cfg.updates

    def describe(self) -> str:
        return f"{self.cfg.algo} {self.cfg.task}"

    def bar_labels(self) -> tuple[str, str]:
        return "updates/s", ""  # the value names its parts (reflectrl.llm.train_status)

    def add_rates(self, rec: dict[str, Any], clock: Clock, start: int) -> None:
        self._rate = (self.update_idx - start) / max(clock.wall, 1e-9)
        rec["charts/samples_per_s"] = self._rate * self.cfg.rows

    def bar_values(self, rec: dict[str, Any]) -> tuple[float, str]:
        return self._rate, self._status.add(rec, self.update_idx)

    def after_iteration(self, rec: dict[str, Any], last: bool) -> None:
        cfg = self.cfg
        if cfg.eval_interval and (self.update_idx % cfg.eval_interval == 0 or last) and self.is_main:
            rec.update(self.evaluate())
        if cfg.sample_interval and (self.update_idx % cfg.sample_interval == 0 or self.update_idx == 1) and self.is_main:
            self.log_samples(self.last_batch, self.run_dir / SAMPLES)
        self._last_rec = rec

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        return self.dist.any(*flags)

    def close(self) -> None:
        self.rollout.close()
        self.dist.close()

    def finalize(self) -> None:
        """Export the policy into ``RUN/model``: a LoRA run's adapter (naming its base model), else the full model
        (:func:`~reflectrl.llm.export.export_policy`; ``reflectrl llm export RUN --merge`` merges an adapter)."""
        if self.cfg.export_model and self.is_main:
            from .export import export_policy

            export_policy(self.policy, self.run_dir / "model", base_name=self.cfg.model_name)

    def summary(self, clock: Clock, start: int) -> dict[str, Any]:
        rec = getattr(self, "_last_rec", {})
        return {"run_dir": str(self.run_dir), "updates": self.update_idx, "global_step": self.global_step,
                "wall_s": clock.wall, "cpu_s": clock.cpu, "setup_s": self._setup_s,
                "samples_per_s": (self.update_idx - start) * self.cfg.rows / max(clock.wall, 1e-9),
                "accuracy": rec.get("accuracy"), "eval_accuracy": rec.get("eval/accuracy")}

    # ----------------------------------------------------------------------------- checkpoints
    def state_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        tensors.update({f"policy/{k}": v for k, v in self.policy.trainable_state().items()})
        meta.update({"global_step": self.global_step, "cursor": self.cursor, "collapse_alarm": self.alarm.state()})

    def load_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.policy.load_trainable_state({k[7:]: v for k, v in tensors.items() if k.startswith("policy/")})
        self.global_step, self.cursor = int(meta["global_step"]), int(meta["cursor"])
        self.alarm.load_state(meta.get("collapse_alarm"))

    def after_load(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.engine.sync(self.policy)


def step_batch(trainer: GRPO, batch: TokenBatch) -> StepBatch:
    """The method-side view of a token batch: states and features are the hidden states that predict
    each response token, rewards/advantages per token, each row one episode ending at its last policy
    token; ``values`` are the critic's (``--adv-estimator gae``) or 0."""
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
                     group_size=trainer.cfg.group_size, turn_ids=batch.turn_ids,
                     info={**episode_info(batch), **row_extras(batch)}, per_step=per_step_extras(batch), whole_rows=True)


__all__ = ["GRPO", "GRPOHook", "step_batch"]
