"""The GRPO-family run options (:class:`GRPOConfig`) and reading an LLM run directory's ``config.json``.

The defaults each ``reflectrl llm train --algo`` applies on top of these are registered with the
algorithm (:mod:`reflectrl.algos`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..core import LOSS_AGG_MODES, adv_est_requires, list_registered
from ..errors import CheckpointError, ConfigError
from ..trainer import CHECKPOINT, RunOptions, check_all, load_config, read_config_json, run_kind

SAMPLES = "samples.jsonl"


@dataclass
class GRPOConfig(RunOptions):
    """GRPO-family RL on a verifiable task; --algo picks a variant's defaults, explicit flags override them."""

    task: str = "arith"
    """Registered task name (arith, codegen, text2sql, ...)."""
    model: str = ""
    """Hugging Face model directory, a named model (``smollm2-135m-instruct``) or a GGUF file (converted once into
    the cache: ``reflectrl llm get-model``), or a hub id where a hub is reachable. A run records the folder it
    resolved to, absolute, in config.json."""
    model_name: str = ""
    """Recorded by the trainer: the name ``--model`` was given as when it named a model or a GGUF file (``model`` then
    holds the folder it was converted into); a resumed run whose folder has gone is converted again from it."""
    chat: Literal["auto", "on", "off"] = "auto"
    """Episodes as conversations in the model's chat template (auto: when its tokenizer has one; off: raw prompts,
    as the tiny models get them)."""
    algo: str = "grpo"
    """The algo whose defaults were applied; recorded in config.json (set by --algo)."""
    task_options: tuple[str, ...] = ()
    """Task options as KEY=VALUE (what ``--set KEY=VALUE`` gives; see ``reflectrl tasks show TASK``)."""
    self_report: Literal["off", "reflect", "confidence", "inline", "inline-reflect"] = "off"
    """After each episode the environment asks for a reflection (solved / unsolved) or a confidence in [0, 1];
    those tokens are trained with the episode (refgrpo sets reflect, rlcr confidence). inline: nothing is asked;
    the answer itself ends with its report (``<confidence>q</confidence>``), as RLCR trains it."""
    updates: int = 100
    """Rollout + optimizer-update iterations to train for."""
    prompts_per_update: int = 16
    """Problems per rollout batch."""
    group_size: int = 8
    """Samples per problem (G); group advantages compare them."""
    max_new_tokens: int | None = None
    """Token limit of one completion (one turn); default: the task's (``reflectrl tasks show TASK``), else 32."""
    max_turns: int | None = None
    """Turns per episode (default 1 for single-turn tasks, the task's ``max_turns`` or 6 for multi-turn)."""
    max_response_tokens: int | None = None
    """Token budget of a whole response, completions plus feedback (default max_new_tokens x turns x 2 multi-turn)."""
    temperature: float = 1.0
    """Sampling temperature (log-probs in the loss use the same one)."""
    top_k: int = 0
    """Sample from the top-k tokens only (0: the whole vocabulary)."""
    learning_rate: float = 1e-6
    """AdamW learning rate. The CLI's default follows the model (docs/llm.md): 2e-4 for a tiny model, 1e-4 with
    LoRA, 1e-6 for full fine-tuning of a pretrained model."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """Constant, or linear decay to 0 over ``updates``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW's beta1: the decay of its running mean of gradients."""
    adam_beta2: float = 0.99
    """AdamW's beta2: the decay of its running mean of squared gradients."""
    adam_eps: float = 1e-8
    """AdamW's epsilon, added to the root of the squared-gradient mean."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (0 disables it)."""
    adv_estimator: str = "grpo"
    """Registered advantage estimator (core registry): grpo (mean/std), drgrpo (mean only), ..."""
    loss_agg_mode: str = "seq-mean-token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm."""
    norm_len: int | None = None
    """Divisor of seq-mean-token-sum-norm (default: max_response_tokens)."""
    clip_low: float = 0.2
    """Lower clip range of the ratio (and the upper one unless clip_high is set)."""
    clip_high: float | None = None
    """Upper clip range (clip-higher, e.g. 0.28); None is symmetric."""
    clip_c: float | None = None
    """Dual-clip bound (> 1) on the loss of negative-advantage tokens; None: no dual clip."""
    log_ratio_clamp: float | None = None
    """Clamp the log-ratio to +-this before the exponential (verl uses 20); None: no clamp."""
    policy_loss: str = "vanilla"
    """Registered policy loss (core.register_policy_loss): vanilla is the clipped loss above."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen reference (0: no reference is kept)."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """Per-token KL estimator."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient."""
    report_entropy_coef: float = 0.0
    """Entropy bonus on the tokens of the self-report turn alone (the turn --self-report reflect|confidence asks
    for), added to --entropy-coef there: keeps a trained report from collapsing to one constant answer."""
    collapse_alarm_updates: int = 5
    """The collapse alarm (a run with self-reports): it rings when the batch's stated reports have been constant for
    this many consecutive updates (metric selfreport/collapse, one warning)."""
    collapse_alarm_spread: float = 0.02
    """The collapse alarm: stated confidences count as constant when their standard deviation is below this."""
    gamma: float = 1.0
    """Discount of --adv-estimator gae over tokens."""
    lam: float = 1.0
    """GAE lambda of --adv-estimator gae."""
    whiten: bool = True
    """Whiten the GAE advantages over the batch (as verl does)."""
    vf_coef: float = 0.5
    """Weight of the value loss of the critic head (--adv-estimator gae)."""
    value_clip: float | None = 0.2
    """Clip range of the critic's value loss around its old values (None: unclipped)."""
    filter_zero_std: bool = False
    """Leave groups whose rewards are all equal out of the update (DAPO's dynamic-sampling filter)."""
    max_gen_batches: int = 1
    """With --filter-zero-std: sample up to this many batches of prompts_per_update new problems per update
    until prompts_per_update groups with unequal rewards are kept (DAPO's dynamic sampling; the surplus is
    dropped); 0: no limit. 1 samples once and trains on what is kept."""
    ppo_epochs: int = 1
    """Passes over each rollout batch (mu); > 1 computes old log-probs in a separate pass."""
    minibatches: int = 1
    """Optimizer steps per pass (rows split into this many minibatches)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradient accumulation; the loss equals the unsplit one)."""
    micro_batch_tokens: int = 0
    """0: each minibatch is split into --grad-accum micro-batches of equal row counts. N > 0: its rows, sorted by
    length, are packed into micro-batches of at most N padded tokens each (at least one row each), so that rows of
    like length share a micro-batch and little padding is computed (under --attention shared-prompt a prompt's rows
    stay together, and a micro-batch costs its distinct prompts' tokens plus its responses'); the loss is the whole
    minibatch's either way (equal within float rounding). Replaces --grad-accum."""
    dedupe: bool = True
    """Run the training forward once per distinct row of a group (identical samples: same loss and
    gradient), weighting it by its multiplicity; exact, and faster when the policy is peaked."""
    lora_r: int = 0
    """LoRA rank (0 trains every weight)."""
    lora_alpha: int = 16
    """LoRA's alpha: the adapter's update is scaled by alpha / rank."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA adapter's input (0: none)."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16."""
    device: str = "cpu"
    """torch device of the policy (cpu, cuda, cuda:1, ...)."""
    engine: str = "torch"
    """Generation engine: torch (KV-cache sampling loop), hf (model.generate) or vllm (vLLM installed and a GPU);
    others register."""
    engine_options: tuple[str, ...] = ()
    """Keyword arguments of the engine as KEY=VALUE. torch: reuse_cache (keep each row's keys and values between
    turns; on by default on multi-turn tasks and, with a chat model, for an asked self-report turn), append_cache
    (append the KV cache in place), lean_step (the lean one-token step on Llama-architecture models; the same logits
    bit for bit), prune_frac (drop finished rows when they are this share of the batch); vllm:
    gpu_memory_utilization=0.5, enforce_eager=true, ... (docs/llm.md)."""
    tis_cap: float | None = 2.0
    """Truncated importance sampling when the engine returns its log-probs (vllm): each token's policy-loss term
    is multiplied by min(exp(logp_trainer - logp_engine), tis_cap); None turns it off (the gap is still logged)."""
    old_logp: Literal["auto", "recompute", "engine"] = "auto"
    """The old log-probs of the policy loss's ratio (when the batch is used for more than one optimizer step):
    recompute: a no-grad pass of the trainer's model over the batch before the update; engine: the log-probs the
    generation engine drew each token with (the torch engine computes them beside the draw, vllm returns them), so
    that pass is not run: the same tokens, log-probs equal within float rounding on the torch engine, and no
    importance correction (the engine's log-probs are the behaviour policy's). Takes --top-k 0. auto: engine for a
    chat model on the torch engine at --top-k 0, else recompute (config.json records which). Where the batch serves
    one optimizer step (one minibatch, one epoch) neither runs a pass or asks the torch engine for its log-probs:
    the old log-probs are the update's own, detached."""
    gen_batch: int = 128
    """Rows generated together (larger is faster per token); rewards of one chunk are computed while the
    next generates."""
    reward_workers: int = 4
    """Threads that run env steps / reward functions (0: inline)."""
    sandbox_batch: int = 16
    """Jobs per sandbox launch for tasks that run code in the sandbox (codegen, humaneval): the rollout scores
    each generated chunk with one call and the task runs its tests in batches of this size, each job still in
    its own forked process (docs/sandbox.md); 1: one sandbox launch per completion, one env step each."""
    reward_cache: int = 100_000
    """Remember the scores of this many (problem, completion) pairs of a single-turn task, so a completion
    sampled again is not verified again (0: only duplicates within one rollout share a score)."""
    eval_interval: int = 0
    """Greedy held-out accuracy every this many updates (0: never)."""
    eval_problems: int = 200
    """Held-out problems in that evaluation."""
    attention: Literal["auto", "padded", "causal", "shared-prompt"] = "auto"
    """The training forward's layout (and the old-log-prob, reference and teacher passes): padded (left-padded prompts
    under an attention mask), causal (each row's tokens moved to its start, right-padded, under the plain causal kernel) or
    shared-prompt (each distinct prompt of a micro-batch run once, forward and backward, and the responses on its
    keys and values): the same log-probs up to float32 rounding (docs/llm.md, "The trainer"). auto: shared-prompt for
    a chat model, else padded (config.json records which)."""
    eval_split: Literal["heldout", "validation"] = "heldout"
    """The split of that evaluation: validation when its numbers choose anything (a recipe, a coefficient, when to
    stop), so that heldout problems give final numbers only."""
    sample_interval: int = 10
    """Write sample completions to samples.jsonl every this many updates (0: never)."""
    samples_per_log: int = 4
    """Completions written each time."""
    export_model: bool = True
    """Write the final policy into RUN_DIR/model: a LoRA run's adapter alone (``reflectrl llm export RUN_DIR --merge``
    writes it merged), else the full Hugging Face model directory."""

    budget_field = "updates"

    @property
    def rows(self) -> int:
        return self.prompts_per_update * self.group_size

    def engine_kwargs(self) -> dict[str, Any]:
        """``engine_options`` as keyword arguments of the engine (parsed as the task's options are)."""
        from ..tasks.base import parse_options

        return parse_options(self.engine_options, "--engine-options")

    def task_kwargs(self) -> dict[str, Any]:
        """``task_options`` as keyword arguments of the task (values parsed as in ``reflectrl tasks --set``)."""
        from ..tasks.base import parse_options

        return parse_options(self.task_options)

    def resolved(self, task: Any, chat: bool = False) -> GRPOConfig:
        """A copy with the turn and token budgets filled in from the task: turns default to 1 for a
        single-turn task and to the task's ``max_turns`` (else 6) for a multi-turn one; a completion's
        budget to the task's ``max_new_tokens`` (with a chat model its ``chat_max_new_tokens``; else 32), plus room
        for the tag with ``self_report`` inline; the whole response's to :func:`response_budget`."""
        from ..tasks.selfreport import default_new_tokens

        multi = bool(getattr(task, "multi_turn", False))
        turns = self.max_turns or (int(getattr(task, "max_turns", 6)) if multi else 1)
        per_turn = self.max_new_tokens or default_new_tokens(task, self.self_report, chat=chat)
        budget = self.max_response_tokens or task_response_budget(task, per_turn, turns, chat)
        return dataclasses.replace(self, max_turns=turns, max_new_tokens=per_turn, max_response_tokens=budget,
                                   norm_len=self.norm_len or budget, **self.fast_paths(chat))

    def fast_paths(self, chat: bool) -> dict[str, str]:
        """``attention`` and ``old_logp`` where they are auto: the fast paths for a chat model (the shared-prompt
        layout; the sampler's log-probs on the torch engine at --top-k 0), which compute the numbers of the plain ones
        within float32 rounding; the plain ones (padded, recompute) otherwise, so that the tiny models' runs
        reproduce bit for bit (docs/llm.md, "Defaults")."""
        out = {}
        if self.attention == "auto":
            out["attention"] = "shared-prompt" if chat else "padded"
        if self.old_logp == "auto":
            out["old_logp"] = "engine" if chat and self.engine == "torch" and self.top_k == 0 else "recompute"
        return out

    def budget_schedules(self) -> list[str]:
        """The enabled settings whose values follow ``updates`` (see :func:`reflectrl.trainer.extend_budget`);
        a method hook's progress-based schedule (``StepBatch.progress``) follows it too."""
        return ["--lr-schedule linear"] if self.lr_schedule == "linear" else []

    def validate(self) -> None:
        """Raise ConfigError for an impossible or inconsistent setting."""
        checks = self.run_checks() + [
            (self.model != "", "--model is required: a Hugging Face model directory "
                               "(make one with `reflectrl llm init-tiny DIR`)"),
            (self.updates >= 1, f"--updates must be >= 1, got {self.updates}"),
            (self.prompts_per_update >= 1, f"--prompts-per-update must be >= 1, got {self.prompts_per_update}"),
            (self.group_size >= 2,
             f"--group-size must be >= 2 (group advantages compare samples), got {self.group_size}"),
            (self.max_new_tokens is None or self.max_new_tokens >= 1,
             f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.max_turns is None or self.max_turns >= 1, f"--max-turns must be >= 1, got {self.max_turns}"),
            (self.temperature > 0, "--temperature must be > 0 for training (0 makes every sample of a group "
                                   f"identical), got {self.temperature}"),
            (self.top_k >= 0, f"--top-k must be >= 0, got {self.top_k}"),
            (self.learning_rate > 0, f"--learning-rate must be > 0, got {self.learning_rate}"),
            (0 < self.clip_low < 1, f"--clip-low must be in (0, 1), got {self.clip_low}"),
            (self.clip_high is None or self.clip_high > 0, f"--clip-high must be > 0, got {self.clip_high}"),
            (self.clip_c is None or self.clip_c > 1, f"--clip-c must be > 1 (dual-clip), got {self.clip_c}"),
            (self.log_ratio_clamp is None or self.log_ratio_clamp > 0, "--log-ratio-clamp must be > 0"),
            (0 <= self.gamma <= 1 and 0 <= self.lam <= 1, "--gamma and --lam must be in [0, 1]"),
            (self.vf_coef >= 0 and (self.value_clip is None or self.value_clip > 0),
             "--vf-coef must be >= 0 and --value-clip > 0"),
            (self.kl_coef >= 0 and self.entropy_coef >= 0 and self.report_entropy_coef >= 0,
             "--kl-coef, --entropy-coef and --report-entropy-coef must be >= 0"),
            (self.collapse_alarm_updates >= 1 and self.collapse_alarm_spread >= 0,
             "--collapse-alarm-updates must be >= 1 and --collapse-alarm-spread >= 0"),
            (self.report_entropy_coef == 0 or self.self_report in ("reflect", "confidence"),
             "--report-entropy-coef needs a self-report turn: --self-report reflect or confidence"),
            (self.loss_agg_mode in LOSS_AGG_MODES,
             f"unknown --loss-agg-mode {self.loss_agg_mode!r}; choose one of {', '.join(LOSS_AGG_MODES)}"),
            (self.ppo_epochs >= 1 and self.minibatches >= 1 and self.grad_accum >= 1,
             "--ppo-epochs, --minibatches and --grad-accum must be >= 1"),
            (self.micro_batch_tokens >= 0, f"--micro-batch-tokens must be >= 0 (0: off), got {self.micro_batch_tokens}"),
            (self.micro_batch_tokens == 0 or self.grad_accum == 1,
             "--micro-batch-tokens replaces --grad-accum's equal split of a minibatch: give one of them"),
            (self.minibatches * self.grad_accum <= self.rows,
             f"--minibatches x --grad-accum ({self.minibatches} x {self.grad_accum}) exceeds the rows of a batch "
             f"(--prompts-per-update x --group-size = {self.rows})"),
            (self.max_grad_norm >= 0, "--max-grad-norm must be >= 0"),
            (self.gen_batch >= 1 and self.reward_workers >= 0 and self.reward_cache >= 0,
             "--gen-batch must be >= 1, --reward-workers and --reward-cache >= 0"),
            (self.norm_len is None or self.norm_len >= 1, "--norm-len must be >= 1"),
            (self.sandbox_batch >= 1, f"--sandbox-batch must be >= 1, got {self.sandbox_batch}"),
            (self.lora_r >= 0, f"--lora-r must be >= 0, got {self.lora_r}"),
            (self.eval_interval >= 0, f"--eval-interval must be >= 0 (0: never), got {self.eval_interval}"),
            (self.eval_problems >= 1, f"--eval-problems must be >= 1, got {self.eval_problems}"),
            (self.sample_interval >= 0, f"--sample-interval must be >= 0 (0: never), got {self.sample_interval}"),
            (self.samples_per_log >= 1, f"--samples-per-log must be >= 1, got {self.samples_per_log}"),
            (self.lora_alpha > 0 and 0 <= self.lora_dropout < 1,
             f"--lora-alpha must be > 0 and --lora-dropout in [0, 1), got {self.lora_alpha} and {self.lora_dropout}"),
            (self.max_gen_batches >= 0, f"--max-gen-batches must be >= 0 (0: no limit), got {self.max_gen_batches}"),
            (self.max_gen_batches == 1 or self.filter_zero_std,
             "--max-gen-batches refills the groups --filter-zero-std leaves out: give --filter-zero-std too"),
            (self.old_logp != "engine" or self.top_k == 0,
             "--old-logp engine takes --top-k 0 (the trainer's log-probs are over the whole vocabulary)"),
            (self.tis_cap is None or self.tis_cap >= 1,
             f"--tis-cap must be >= 1 (the cap of the importance weight), or None to turn it off; got {self.tis_cap}"),
        ]
        check_all(checks)
        self.engine_kwargs()
        registered = list_registered()
        if self.adv_estimator not in registered["adv_estimators"]:
            raise ConfigError(f"unknown --adv-estimator {self.adv_estimator!r}; registered: "
                              f"{', '.join(registered['adv_estimators'])}")
        unknown = adv_est_requires(self.adv_estimator) - PROVIDED
        if unknown:
            raise ConfigError(f"--adv-estimator {self.adv_estimator!r} needs {', '.join(sorted(unknown))}, which the "
                              f"LLM trainer does not provide (it provides {', '.join(sorted(PROVIDED))})")
        if self.policy_loss not in registered["policy_losses"]:
            raise ConfigError(f"unknown --policy-loss {self.policy_loss!r}; registered: "
                              f"{', '.join(registered['policy_losses'])}")


CHAT_REPLY_TOKENS = 64
"""Room per environment reply in a chat model's response budget: the template's turn markers, the reply and the
opening of the next answer (a self-report question with its prefill is about 30 tokens of SmolLM2's tokenizer)."""


def response_budget(per_turn: int, turns: int, multi: bool, chat: bool = False) -> int:
    """The default token budget of a whole response: completion budget x turns, x 2 for a multi-turn task's feedback,
    plus :data:`CHAT_REPLY_TOKENS` per reply with a chat model."""
    return per_turn * turns * (2 if multi else 1) + (CHAT_REPLY_TOKENS * (turns - 1) if chat and multi else 0)


def task_response_budget(task: Any, per_turn: int, turns: int, chat: bool = False) -> int:
    """:func:`response_budget` of ``task``; where a chat model completes an inline report in its answer's message
    (the task's ``inline_room``), the inner task's budget (a turn fewer) plus that room."""
    multi = bool(getattr(task, "multi_turn", False))
    room = getattr(task, "inline_room", None)
    if chat and room is not None:
        inner = getattr(task, "task", task)
        return response_budget(per_turn, turns - 1, bool(getattr(inner, "multi_turn", False)), chat) + int(room)
    return response_budget(per_turn, turns, multi, chat)


PROVIDED = frozenset({"values"})  # estimator inputs the trainer computes: values from a critic head


def load_llm_config(run_dir: str | Path) -> GRPOConfig:
    """Read ``RUN_DIR/config.json`` of an LLM run into a GRPOConfig."""
    if run_kind(read_config_json(run_dir)) != "llm":
        raise CheckpointError(f"{run_dir} is a control run directory: evaluate it with `reflectrl eval {run_dir}`")
    return load_config(run_dir, GRPOConfig)


def is_llm_run_dir(path: str | Path) -> bool:
    """True for a directory written by :meth:`GRPO.learn` (config.json of kind llm + a checkpoint)."""
    p = Path(path)
    try:
        return (p / CHECKPOINT).is_file() and json.loads((p / "config.json").read_text()).get("kind") == "llm"
    except (OSError, json.JSONDecodeError):
        return False
