"""The self-teacher pass of gear: the policy itself, with the reference answer in its context, scores the
tokens the student sampled. One batched no-grad forward over the sampled completions after the teacher's
prompts, in chunks, with each distinct teacher prompt (one per group) run once into a KV cache that its rows
share (:meth:`~reflectrl.llm.policy.Policy.shared_prompt_logp`; the log-probs align token by token); with
``kl`` a second no-grad forward of the student gives the full ``KL(pi || pi_T)`` per token."""

from __future__ import annotations

import math

import torch

from ..contract.fields import register_field
from ..tasks.base import teacher_prompt
from .batch import TokenBatch
from .grpo import GRPO, GRPOHook

TEACHER_LOGP = register_field("teacher_logp", "token", "method", "each response token's log-prob under the teacher context")
TEACHER_KL = register_field("teacher_kl", "token", "method", "KL(teacher || policy) at each response token")


class TeacherPass(GRPOHook):
    """Puts ``teacher_logp`` (and ``teacher_kl``) into ``batch.extras`` for gear."""

    needs = ("old_logp", "entropy")
    provides = (TEACHER_LOGP, TEACHER_KL)

    def __init__(self, kl: bool = False, chunk_rows: int | None = None):
        self.kl, self.chunk_rows = kl, chunk_rows
        self._cache: dict[str, list[int]] = {}
        self.seconds = 0.0

    def prompts(self, trainer: GRPO, batch: TokenBatch) -> list[list[int]]:
        """Token ids of each row's teacher prompt: the task's prompt with the reference answer in context."""
        pol, task = trainer.policy, trainer.task
        out = []
        for p in batch.problems:
            if p.id not in self._cache:
                text = teacher_prompt(getattr(task, "task", task), p, chat=pol.chat is not None)
                self._cache[p.id] = pol.encode_prompt(text)
            out.append(self._cache[p.id])
        return out

    @torch.no_grad()
    def after_prepare(self, trainer: GRPO, batch: TokenBatch) -> None:
        import time

        t0 = time.perf_counter()
        pol, cfg = trainer.policy, trainer.cfg
        prompts = self.prompts(trainer, batch)
        step = self.chunk_rows or max(1, math.ceil(batch.rows / cfg.grad_accum))
        logp, kl = [], []
        was = pol.training
        pol.eval()
        for s in range(0, batch.rows, step):
            rows = range(s, min(s + step, batch.rows))
            t_logp, t_all = pol.shared_prompt_logp(prompts[s:rows.stop], batch.response_ids[s:rows.stop],
                                                   batch.response_attention[s:rows.stop], cfg.temperature, self.kl)
            logp.append(t_logp.cpu())
            if self.kl:
                s_out = pol.forward_batch(batch.select(rows, trim=False), temperature=cfg.temperature, with_logprobs=True)
                p_s = s_out.logprobs.exp()
                kl.append((p_s * (s_out.logprobs - t_all)).sum(-1).cpu() * batch.response_attention[rows])
        pol.train(was)
        mask = batch.completion_mask.float()
        batch.extras[TEACHER_LOGP] = torch.cat(logp)[:, :batch.steps] * mask
        if self.kl:
            batch.extras[TEACHER_KL] = torch.cat(kl)[:, :batch.steps] * mask
        self.seconds = time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {"time/teacher_pass": self.seconds}
