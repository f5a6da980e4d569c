"""Supervised warm-up: fine-tune a causal LM on a task's ``demonstration(problem)`` completions.

The loss is the mean negative log-likelihood of the demonstration tokens (and a closing eos) after
the problem's prompt, on the same :class:`~reflectrl.llm.batch.TokenBatch` layout the RL trainer
uses. ``stop_at_accuracy`` ends the warm-up once a greedy check on train problems reaches it, so
RL starts weak-but-nonzero, where group advantages have signal.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from ..errors import ConfigError
from ..progress import TrainProgress
from ..tasks.base import get_task
from .policy import load_policy
from .batch import RowResult, Segment, build_batch


@dataclass
class WarmupConfig:
    """Supervised fine-tuning on demonstrations before RL."""

    model: str = ""
    """Hugging Face model directory to start from (e.g. from `reflectrl llm init-tiny`)."""
    task: str = "arith"
    """Registered task whose train split provides the demonstrations."""
    out: str = ""
    """Directory the warmed-up model is written to (Hugging Face format)."""
    steps: int = 500
    """Optimizer steps."""
    batch_size: int = 32
    """Demonstrations per step."""
    learning_rate: float = 3e-3
    """AdamW learning rate (tiny models take large ones)."""
    weight_decay: float = 0.0
    max_problems: Optional[int] = None
    """Use only the first this many train problems as demonstrations (all by default)."""
    stop_at_accuracy: Optional[float] = None
    """Stop once greedy accuracy on ``eval_problems`` train problems reaches this."""
    eval_every: int = 50
    """Steps between those checks."""
    eval_problems: int = 128
    """Train problems in each check."""
    max_new_tokens: int = 32
    """Token limit of the greedy check's completions."""
    seed: int = 0
    """Seed of the demonstration order."""
    threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    progress: bool = True

    def validate(self) -> None:
        if not self.model or not self.out:
            raise ConfigError("warmup needs --model PATH and --out DIR")
        if self.steps < 1 or self.batch_size < 1 or self.learning_rate <= 0:
            raise ConfigError("steps and batch_size must be >= 1 and learning_rate > 0")
        if self.stop_at_accuracy is not None and not 0 < self.stop_at_accuracy <= 1:
            raise ConfigError(f"stop_at_accuracy must be in (0, 1], got {self.stop_at_accuracy}")
        if self.eval_every < 1 or self.eval_problems < 1:
            raise ConfigError("eval_every and eval_problems must be >= 1")


def demonstration_rows(policy, task, problems) -> list[RowResult]:
    """Prompt + demonstration (+ eos) of each problem as one-turn episodes (the demo is the policy turn)."""
    tok = policy.tokenizer
    eos = policy.eos_ids[:1]
    rows = []
    for p in problems:
        demo = task.demonstration(p)
        if demo.startswith(p.prompt):  # a task may return the whole text; train on the completion part
            demo = demo[len(p.prompt):]
        ids = tok(p.prompt, add_special_tokens=True)["input_ids"]
        comp = tok(demo, add_special_tokens=False)["input_ids"] + eos
        rows.append(RowResult(ids, [Segment(comp, "policy", 0)], None, 0.0, False, False, []))
    return rows


def warmup(cfg: WarmupConfig) -> dict[str, Any]:
    """Run the warm-up; writes the model to ``cfg.out`` with ``warmup.json``; returns that summary."""
    from .evaluate import evaluate_policy

    cfg.validate()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    task = get_task(cfg.task)
    problems = list(task.problems("train"))[:cfg.max_problems]
    if not problems:
        raise ConfigError(f"task {cfg.task!r} has no train problems to demonstrate")
    policy = load_policy(cfg.model, dtype=cfg.dtype, device=cfg.device)
    rows = demonstration_rows(policy, task, problems)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    order: list[int] = []
    losses: list[float] = []
    acc = None
    t0 = time.perf_counter()
    step = 0
    check = lambda: evaluate_policy(policy, task, "train", max_new_tokens=cfg.max_new_tokens,
                                    limit=cfg.eval_problems)["accuracy"]
    with TrainProgress(cfg.steps, cfg.progress, f"warmup {cfg.task}") as bar:
        for step in range(1, cfg.steps + 1):
            while len(order) < cfg.batch_size:
                order += torch.randperm(len(rows), generator=gen).tolist()
            pick, order = order[:cfg.batch_size], order[cfg.batch_size:]
            batch = build_batch([rows[i] for i in pick], range(len(pick)), [], policy.pad_id)
            policy.train()
            out = policy.forward_batch(batch)
            mask = batch.completion_mask.to(out.logp.device).float()
            loss = -(out.logp * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            bar.update(step, step / max(time.perf_counter() - t0, 1e-9), None)
            if cfg.stop_at_accuracy is not None and step % cfg.eval_every == 0:
                acc = check()
                if acc >= cfg.stop_at_accuracy:
                    break
    policy.eval()
    out_dir = policy.save_pretrained(cfg.out)
    summary = {"out": str(out_dir), "steps": step, "final_loss": sum(losses[-10:]) / len(losses[-10:]),
               "train_accuracy": acc if acc is not None else check(), "wall_s": time.perf_counter() - t0,
               "config": dataclasses.asdict(cfg)}
    (Path(cfg.out) / "warmup.json").write_text(json.dumps(summary, indent=2))
    return summary
