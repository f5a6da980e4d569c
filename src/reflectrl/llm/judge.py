"""The language-model reflector of exgrpo-seed (seed 003: "a large language model or a dedicated reflection
network analyses the trajectories"): a local causal LM reads each completed episode and grades it; its answer,
parsed to [-1, 1], is the episode's reflection ``r_refl``.

The grader is the policy itself (its current weights, no gradient) or another model (``--reflector-model PATH``,
frozen). Its prompt is the episode exactly as the agent saw it (the task's prompt, the agent's turns and the
environment's replies) followed by the self-report question of :mod:`reflectrl.tasks.selfreport`
(``--reflector-report reflect``: "solved or unsolved?", graded +1 / -1; ``confidence``: a probability q,
graded 2q - 1). It answers greedily (no random stream is drawn), in batches of ``gen_batch`` rows, every
``--refl-every`` updates; a missing or malformed answer grades NaN (no term) and is counted, and so is an episode
whose prompt and answer budget would pass the grader's position limit (it is not graded). ``exgrpo-seed/lm_agreement`` is
the share of the validly graded episodes whose grade agrees with their outcome (a grade above 0 on a right
episode, at or below 0 on a wrong one). The grades go to
``batch.extras["row/lm_reflection"]``, which the method reads as ``StepBatch.info["lm_reflection"]``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..contract.fields import register_field
from ..tasks.selfreport import QUESTIONS, parse_report
from ..tasks.selfreport import question as ask_question
from .batch import TokenBatch
from .engines import TorchSampler
from .grpo import GRPO, GRPOHook
from .policy import Policy, load_policy
from .rollout import decode_batch

INFO_KEY = "lm_reflection"
"""The grades' name in ``StepBatch.info``."""
LM_REFLECTION = register_field(INFO_KEY, "row", "method", "a language-model reflector's grade of each episode")


def grade(kind: str, text: Any) -> float:
    """A grader's answer as a reflection in [-1, 1]: ``reflect``: solved +1, unsolved -1; ``confidence``: 2q - 1;
    NaN when the answer is missing or malformed."""
    report = parse_report(kind, text)
    if report is None:
        return math.nan
    return 2.0 * float(report) - 1.0


def agreement(grades: torch.Tensor, correct: torch.Tensor) -> float:
    """The share of the episodes with a grade (``grades [R]``, NaN: none) whose grade agrees with their outcome
    (``correct [R]``): above 0 on a right episode, at or below 0 on a wrong one; NaN when none is graded."""
    valid = ~grades.isnan()
    if not bool(valid.any()):
        return math.nan
    return float(((grades[valid] > 0) == correct[valid].bool()).float().mean())


class LMReflectorPass(GRPOHook):
    """Grades every episode of a batch with a causal LM every ``every`` updates (see the module docstring)."""

    provides = (LM_REFLECTION,)

    def __init__(self, kind: str = "reflect", model: str = "", max_new_tokens: int = 16, every: int = 1):
        self.kind, self.model_path, self.max_new_tokens, self.every = kind, model, int(max_new_tokens), int(every)
        self.judge: Policy | None = None  # None: the policy itself
        self.seconds, self.graded, self.malformed, self.too_long = 0.0, 0, 0, 0
        self.agreement = math.nan  # share of the graded episodes whose grade's sign is their outcome
        self.last_texts: list[str] = []

    def setup(self, trainer: GRPO) -> None:
        if self.model_path:
            self.judge = load_policy(self.model_path, device=str(trainer.policy.device))
            self.judge.model.eval().requires_grad_(False)

    def prompts(self, trainer: GRPO, batch: TokenBatch) -> list[list[int]]:
        """Each row's grading prompt in the grader's tokens: the episode as the agent saw it, then the question."""
        pol = trainer.policy
        contexts = [batch.prompt_ids[r][batch.prompt_mask[r]].tolist() + batch.response_ids[r][
            batch.response_attention[r]].tolist() for r in range(batch.rows)]
        question = QUESTIONS[self.kind]
        if self.judge is None:  # the policy's own reply encoding: with a chat model the question is a user turn
            ask = ask_question(self.kind)
            eot = pol.chat.end_of_turn if pol.chat is not None else None
            return [c + pol.encode_reply(ask, closed=bool(c) and c[-1] == eot) for c in contexts]
        texts = pol.tokenizer.batch_decode(contexts, skip_special_tokens=True)
        tok = self.judge.tokenizer
        return [tok(t + question, add_special_tokens=True)["input_ids"] for t in texts]

    @torch.no_grad()
    def after_prepare(self, trainer: GRPO, batch: TokenBatch) -> None:
        self.graded = self.malformed = self.too_long = 0
        self.agreement = math.nan
        if trainer.update_idx % self.every != 0 or batch.rows == 0:
            return
        t0 = time.perf_counter()
        judge = self.judge or trainer.policy
        prompts = self.prompts(trainer, batch)
        limit = getattr(judge.config, "max_position_embeddings", None) or getattr(judge.config, "n_positions", None)
        fits = [limit is None or len(p) + self.max_new_tokens <= int(limit) for p in prompts]
        todo = [p for p, ok in zip(prompts, fits) if ok]
        sampler = TorchSampler(judge)
        step = max(1, trainer.cfg.gen_batch)
        was = judge.training
        judge.eval()
        texts: list[str] = []
        unused = torch.Generator()  # greedy decoding draws nothing
        eos = set(judge.eos_ids)
        for s in range(0, len(todo), step):
            ids = sampler.generate(todo[s:s + step], self.max_new_tokens, unused, greedy=True)
            texts += decode_batch(judge.tokenizer, [[t for t in row if t not in eos] for row in ids])
        judge.train(was)
        answers = iter(texts)
        self.last_texts = [next(answers) if ok else "" for ok in fits]  # an episode too long to grade: no answer
        scores = torch.tensor([grade(self.kind, t) if ok else math.nan for t, ok in zip(self.last_texts, fits)],
                              dtype=torch.float32)
        batch.extras[LM_REFLECTION] = scores
        self.graded, self.malformed, self.too_long = len(prompts), int(scores.isnan().sum()), fits.count(False)
        self.agreement = agreement(scores, batch.correct)
        self.seconds = time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        if not self.graded:
            return {}
        return {"time/reflector_lm": self.seconds, "exgrpo-seed/lm_graded": float(self.graded),
                "exgrpo-seed/lm_malformed_frac": self.malformed / self.graded,
                "exgrpo-seed/lm_too_long_frac": self.too_long / self.graded,
                **({} if math.isnan(self.agreement) else {"exgrpo-seed/lm_agreement": self.agreement})}
