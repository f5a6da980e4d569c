"""Memory before work: the peak memory of a configured GRPO update, estimated from the model's shapes and the batch's
token bounds before the first rollout, against what the machine has free.

A process the kernel kills for memory loses the update it was in and says nothing; reflectrl prevents it instead.
:func:`plan_memory` estimates each phase of an update (generation with its KV cache, the no-grad pass, the training
forward and backward of the largest micro-batch with the optimizer's state) on top of what the process already
holds once the model is loaded. Where the peak does not fit:

- at the default split of a minibatch (no ``--micro-batch-tokens``, ``--grad-accum 1``), the trainer packs each
  minibatch into micro-batches of at most the tokens that fit (``--micro-batch-tokens N``: the loss is the whole
  minibatch's, equal within float rounding) and says so in one line;
- where the split was given, it refuses before any work, naming the ``--micro-batch-tokens`` that would fit.

The per-token costs are float32 activation and logit rows measured on SmolLM2-135M-Instruct (30 layers, width 576,
MLP width 1536, vocabulary 49152) by ``benchmarks/memory_estimate.py``, which also checks the estimate against the
measured peak of real updates; other models scale by their width, MLP width, layers and vocabulary.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30

DEFAULT_BUDGET = 12 * GIB
"""The memory a run's default split plans for at most: below what a 16 GiB machine has free, so that the default
micro-batches are the same on every machine with that much free (and so is the run)."""

HEADROOM = 0.85
"""The share of the free memory a run plans to use: the rest is left for the allocator's slack and the system."""

# float32 values kept per token and layer for the backward pass, as multiples of the width and the MLP width
# (measured: 14 x 576 + 7 x 1536 with LoRA adapters on every linear layer, 8 x 576 + 4.5 x 1536 without)
ACT_LORA = (14.0, 7.0)
ACT_FULL = (8.0, 4.5)
LOGIT_ROWS_TRAIN = 6.5  # vocabulary-sized float32 rows per response token in the training pass (logits, log-softmax,
# the entropy's, their gradients)
LOGIT_ROWS_NOGRAD = 3.5  # ... in a no-grad pass (logits, their scaled copy, log-softmax)
OPTIMIZER_COPIES = 4  # per trainable value: its gradient, AdamW's two moments, one temporary of the foreach step
MARGIN = 1.3
"""The estimate's safety factor on what an update adds: the allocator's slack between micro-batches of different
sizes is not modelled, and measured peaks of real updates came up to 25% above the unscaled estimate
(``benchmarks/memory_estimate.py``)."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of a model: layers, width, MLP width, vocabulary, KV width, bytes per value."""

    layers: int
    width: int
    inner: int
    vocab: int
    kv_width: int
    bytes: int = 4

    @classmethod
    def of(cls, config: Any, dtype_bytes: int = 4) -> ModelShape:
        get = lambda *names: next((int(getattr(config, n)) for n in names if getattr(config, n, None)), 0)  # noqa: E731
        width = get("hidden_size", "n_embd", "d_model")
        heads = get("num_attention_heads", "n_head") or 1
        kv_heads = get("num_key_value_heads") or heads
        head_dim = get("head_dim") or width // heads
        return cls(layers=get("num_hidden_layers", "n_layer", "num_layers"), width=width,
                   inner=get("intermediate_size", "n_inner") or 4 * width, vocab=get("vocab_size"),
                   kv_width=kv_heads * head_dim, bytes=dtype_bytes)

    def train_token(self, lora: bool) -> float:
        """Bytes the training pass keeps per token of a micro-batch (activations for the backward)."""
        a_w, a_i = ACT_LORA if lora else ACT_FULL
        return self.layers * (a_w * self.width + a_i * self.inner) * self.bytes

    def logit_row(self) -> float:
        return self.vocab * 4.0  # logits are taken in float32 whatever the model's dtype

    def kv_token(self) -> float:
        return self.layers * 2 * self.kv_width * self.bytes


@dataclass(frozen=True)
class UpdateShape:
    """The bounds of one update's batch: rows, the longest and shortest prompt, the longest response, rows generated
    together, and how a minibatch is split (``micro_tokens`` N > 0, else ``grad_accum`` equal row splits)."""

    rows: int
    prompt_max: int
    prompt_min: int
    response_max: int
    gen_batch: int
    minibatches: int
    grad_accum: int
    micro_tokens: int

    @property
    def width(self) -> int:
        return self.prompt_max + self.response_max

    @property
    def response_share(self) -> float:
        """The largest share of a row's tokens that can be response tokens (whose logits are kept)."""
        return self.response_max / max(1, self.prompt_min + self.response_max)

    def micro_tokens_max(self) -> int:
        """The most padded tokens one training micro-batch can hold."""
        if self.micro_tokens:
            return max(self.micro_tokens, self.width)  # a micro-batch holds at least one row
        per_step = math.ceil(self.rows / self.minibatches)
        return math.ceil(per_step / self.grad_accum) * self.width


@dataclass(frozen=True)
class MemoryPlan:
    """The estimated memory of each phase of an update above what the process holds now (``held``), in bytes. The
    peak adds the training pass to the larger of generation and the no-grad pass: what the allocator took for those
    is not all given back before the training pass runs."""

    held: float
    phases: dict[str, float]

    @property
    def peak(self) -> float:
        before = max(self.phases["generation"], self.phases["no-grad pass"])
        return self.held + MARGIN * (before + self.phases["training"])

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in self.phases.items())
        return f"{self.peak / GIB:.1f} GiB ({self.held / GIB:.1f} held; {parts}; x{MARGIN} margin)"


def plan_memory(model: ModelShape, shape: UpdateShape, trainable: int, lora: bool, held: float) -> MemoryPlan:
    """The estimated peak of one update of ``shape`` (see the module's docstring)."""
    gen_rows = min(shape.gen_batch, shape.rows)
    generation = gen_rows * (shape.width * model.kv_token() + 3 * model.logit_row())
    # the no-grad pass runs on the update's micro-batches, or on grad_accum chunks of the whole batch
    nograd_tokens = shape.micro_tokens_max() if shape.micro_tokens else \
        math.ceil(shape.rows / shape.grad_accum) * shape.width
    nograd = nograd_tokens * shape.response_share * LOGIT_ROWS_NOGRAD * model.logit_row()
    train = micro_bytes(model, shape.micro_tokens_max(), shape.response_share, lora) \
        + OPTIMIZER_COPIES * trainable * 4
    return MemoryPlan(held, {"generation": generation, "no-grad pass": nograd, "training": train})


def micro_bytes(model: ModelShape, tokens: int, response_share: float, lora: bool) -> float:
    """Bytes a training micro-batch of ``tokens`` padded tokens keeps for its backward pass."""
    return tokens * (model.train_token(lora) + response_share * LOGIT_ROWS_TRAIN * model.logit_row())


def fitting_micro_tokens(model: ModelShape, shape: UpdateShape, trainable: int, lora: bool, held: float,
                         budget: float) -> int:
    """The most tokens per micro-batch whose update fits ``budget`` bytes in all (0 when not even one row fits)."""
    lo, hi = 0, max(shape.width, shape.rows * shape.width)
    while lo < hi:  # the peak grows with the micro-batch's tokens: the largest that fits
        mid = (lo + hi + 1) // 2
        trial = plan_memory(model, _with_tokens(shape, mid), trainable, lora, held)
        if trial.peak <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo if lo >= shape.width else 0


def _with_tokens(shape: UpdateShape, tokens: int) -> UpdateShape:
    return UpdateShape(shape.rows, shape.prompt_max, shape.prompt_min, shape.response_max, shape.gen_batch,
                       shape.minibatches, 1, tokens)


def available_bytes() -> float | None:
    """Memory this process may still take: the system's available memory, less where a cgroup limit is tighter;
    None where neither can be read."""
    free: list[float] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append(float(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit_file, used_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                   "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            if limit != "max" and int(limit) < 1 << 60:
                free.append(float(int(limit) - int(Path(used_file).read_text().strip())))
            break
        except (OSError, ValueError):
            continue
    return min(free) if free else None


def resident_bytes() -> float:
    """This process's resident memory now (Linux), else its peak so far."""
    try:
        return float(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        scale = 1 if os.uname().sysname == "Darwin" else 1024
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def estimate_update(cfg: Any, policy: Any, prompt_lengths: list[int], held: float | None = None
                    ) -> tuple[MemoryPlan, ModelShape, UpdateShape, int] | None:
    """The plan of one update of ``cfg`` (a :class:`~reflectrl.llm.config.GRPOConfig`) with ``policy`` and the
    train prompts' lengths in tokens, with what it was computed from (the model's and the batch's shapes, the
    trainable values); None for a model whose config does not say its shapes. ``held`` defaults to this process's
    resident memory."""
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(cfg.dtype, 4)
    model = ModelShape.of(policy.config, dtype_bytes)
    if not (model.layers and model.width and model.vocab) or not prompt_lengths:
        return None
    shape = UpdateShape(cfg.rows, max(prompt_lengths), min(prompt_lengths), int(cfg.max_response_tokens),
                        cfg.gen_batch, cfg.minibatches, cfg.grad_accum, cfg.micro_batch_tokens)
    trainable = sum(p.numel() for p in policy.trainable_parameters())
    # the weights as they become resident: a model file is mapped, not read, until its first forward pass
    held = resident_bytes() + _weight_bytes(policy) if held is None else held
    return plan_memory(model, shape, trainable, cfg.lora_r > 0, held), model, shape, trainable


def _weight_bytes(policy: Any) -> float:
    model = getattr(policy, "model", None)
    if model is None or not hasattr(model, "parameters"):
        return 0.0
    return float(sum(p.numel() * p.element_size() for p in model.parameters()))


def fit_update(cfg: Any, policy: Any, prompt_lengths: list[int], free: float | None = None,
               held: float | None = None) -> tuple[Any, str | None]:
    """``cfg`` (a :class:`~reflectrl.llm.config.GRPOConfig`) with micro-batches that fit, and the line that says what
    was chosen (None: nothing changed); ConfigError, before any work, where the given split does not fit.
    ``free`` and ``held`` default to this machine's available memory and this process's resident memory (plus the
    model's weights, which a model file maps until they are first read)."""
    import dataclasses

    from ..errors import ConfigError

    free = available_bytes() if free is None else free
    found = estimate_update(cfg, policy, prompt_lengths, held)
    if found is None:
        return cfg, None  # a model whose config does not say its shapes: nothing to estimate
    plan, model, shape, trainable = found
    lora, held = cfg.lora_r > 0, plan.held
    machine = math.inf if free is None else held + HEADROOM * free
    default_split = cfg.micro_batch_tokens == 0 and cfg.grad_accum == 1
    budget = min(machine, float(DEFAULT_BUDGET)) if default_split else machine
    if plan.peak <= budget:
        return cfg, None
    fit = fitting_micro_tokens(model, shape, trainable, lora, held, budget)
    where = "the default split's budget" if default_split and budget < machine else "this machine's free memory"
    if fit == 0:
        raise ConfigError(f"an update is estimated to need {plan.describe()}, and not even one row of "
                          f"{shape.width} tokens fits {where} ({budget / GIB:.1f} GiB): give a smaller "
                          "--max-new-tokens or --max-response-tokens, or use a machine with more memory")
    if not default_split:
        raise ConfigError(f"an update is estimated to need {plan.describe()}, more than {where} "
                          f"({budget / GIB:.1f} GiB): give --micro-batch-tokens {fit} (and no --grad-accum), "
                          "which packs each minibatch into micro-batches that fit; the loss is the same")
    new = dataclasses.replace(cfg, micro_batch_tokens=fit)
    after = plan_memory(model, _with_tokens(shape, fit), trainable, lora, held)
    return new, (f"memory: one micro-batch per minibatch is estimated at {plan.peak / GIB:.1f} GiB, more than the "
                 f"{budget / GIB:.1f} GiB planned for; training in micro-batches of at most {fit} tokens "
                 f"(--micro-batch-tokens {fit}; the same loss within float rounding), estimated at "
                 f"{after.peak / GIB:.1f} GiB")
