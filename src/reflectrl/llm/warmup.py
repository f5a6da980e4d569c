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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, ReflectRLError
from ..progress import TrainProgress
from ..runlog import strict
from ..tasks.base import Problem, get_task, parse_options
from .batch import RowResult, Segment, build_batch
from .policy import load_policy


@dataclass
class WarmupConfig:
    """Supervised fine-tuning on demonstrations before RL."""

    model: str = ""
    """Hugging Face model directory to start from (e.g. from `reflectrl llm init-tiny`), a named model or a GGUF
    file (docs/llm.md)."""
    task: str = "arith"
    """Registered task whose train split provides the demonstrations."""
    task_options: tuple[str, ...] = ()
    """Task options as KEY=VALUE (as ``--set`` gives them)."""
    out: str = ""
    """Directory the warmed-up model is written to (Hugging Face format); one that holds files is refused."""
    force: bool = False
    """Replace what ``out`` holds (a model written before, its warmup.json)."""
    steps: int = 500
    """Optimizer steps."""
    batch_size: int = 32
    """Demonstrations per step."""
    learning_rate: float | None = None
    """AdamW learning rate; default from the model's size: 3e-3 for a tiny model (under 10M parameters), 1e-5 for a
    pretrained one (a tiny model's rate wrecks it: a warning says so when one is given)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_problems: int | None = None
    """Use only the first this many train problems as demonstrations (all by default)."""
    stop_at_accuracy: float | None = None
    """Stop once greedy accuracy on ``eval_problems`` train problems reaches this."""
    eval_every: int = 50
    """Steps between those checks."""
    eval_problems: int = 128
    """Train problems in each check."""
    max_new_tokens: int | None = None
    """Token limit of the greedy check's completions (default: the task's, else 32)."""
    self_report: str = "off"
    """End each demonstration with a self-report turn: off, reflect, confidence, or both (one of them per
    episode), so that any method or evaluation can ask the model for one (docs/llm.md); or inline: the final
    answer itself ends with ``<confidence>q</confidence>`` (rlcr ``--self-report inline``); or all (reflect,
    confidence or inline per episode)."""
    self_report_negatives: float = 0.3
    """With self_report: share of the demonstrations that show a wrong answer (context only, not trained on)
    followed by "unsolved" or a low confidence."""
    multi_turn_share: float = 0.5
    """Share of a multi-turn task's demonstrations that play several turns (query, result, answer)."""
    teacher_share: float = 0.0
    """Share of the demonstrations given after the task's teacher prompt (the reference answer in context), so the
    model learns to use a reference and can serve as gear's self-teacher."""
    step_confidence: bool = False
    """A multi-turn task's demonstrations (rag) state a confidence on every turn: middling before anything is read,
    high once a search returned what the next move needs, low after one that missed (every such demonstration
    plays its turns; ``multi_turn_share`` does not apply). So per-step confidences are in the model's vocabulary
    before RL, and carry what it has read."""
    detour_share: float = 0.2
    """With step_confidence: share of the demonstrations with a search that misses at one hop (another relation, or
    the subject misspelled; context only, not trained on), followed by a low confidence and the right search."""
    seed: int = 0
    """Seed of the demonstration order."""
    threads: int = 1
    """torch threads of the warm-up (torch.set_num_threads)."""
    device: str = "cpu"
    """torch device of the model (cpu, cuda, cuda:1, ...)."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16."""
    chat: str = "auto"
    """Demonstrations as conversations in the model's chat template (auto: when it has one; off: raw prompts)."""
    progress: bool = True
    """A progress bar on stderr (log lines with the time left where stderr is not a terminal)."""

    def validate(self) -> None:
        if not self.model or not self.out:
            raise ConfigError("warmup needs --model PATH and --out DIR")
        if self.steps < 1 or self.batch_size < 1 or (self.learning_rate is not None and self.learning_rate <= 0):
            raise ConfigError("--steps and --batch-size must be >= 1 and --learning-rate > 0")
        if self.stop_at_accuracy is not None and not 0 < self.stop_at_accuracy <= 1:
            raise ConfigError(f"--stop-at-accuracy must be in (0, 1], got {self.stop_at_accuracy}")
        if self.eval_every < 1 or self.eval_problems < 1:
            raise ConfigError("--eval-every and --eval-problems must be >= 1")
        if self.self_report not in SELF_REPORTS:
            raise ConfigError(f"--self-report must be one of {', '.join(SELF_REPORTS)}, got {self.self_report!r}")
        shares = (0 <= self.self_report_negatives < 1, 0 <= self.multi_turn_share <= 1, 0 <= self.teacher_share < 1,
                  0 <= self.detour_share <= 1)
        if not all(shares):
            raise ConfigError("--self-report-negatives and --teacher-share must be in [0, 1), --multi-turn-share and "
                              "--detour-share in [0, 1]")


SELF_REPORTS = ("off", "reflect", "confidence", "both", "inline", "all")
MIXES = {"both": ("reflect", "confidence"), "all": ("reflect", "confidence", "inline")}
REPORTS = {"reflect": ("solved", "unsolved"),
           "confidence": (("0.6", "0.7", "0.8", "0.9"), ("0.1", "0.2", "0.3", "0.4"))}
CHAT_REPORTS = {"reflect": ("yes", "no"), "confidence": REPORTS["confidence"]}  # answers to the chat questions
STEP_CONFIDENCES = {"start": ("0.4", "0.5"), "found": REPORTS["confidence"][0], "missed": ("0.1", "0.2", "0.3")}


def _tokens(tok: Any, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def demonstration_rows(policy: Any, task: Any, problems: list[Problem], self_report: str = "off",
                       negatives: float = 0.0, multi_turn_share: float = 0.0,
                       generator: torch.Generator | None = None, teacher_share: float = 0.0,
                       step_confidence: bool = False, detour_share: float = 0.0) -> list[RowResult]:
    """Each problem's demonstration as an episode whose agent turns are trained and whose environment
    replies are context only (masked out of the loss).

    ``multi_turn_share`` of the episodes of a task with ``demonstration_turns`` play those turns (run a
    query, read its result, answer); the others are the one-turn ``demonstration``. With ``self_report``
    (``reflect``, ``confidence``, or ``both`` / ``all``: one of them per episode) each episode ends with the question
    of :mod:`reflectrl.tasks.selfreport` and its answer: ``solved`` or a high confidence after the
    reference answer; and ``negatives`` of the episodes put a wrong answer (another problem's, checked to
    score 0) in the context, not in the loss, followed by ``unsolved`` or a low confidence, so that both
    reports are in the model's vocabulary before RL. ``inline`` asks nothing: the final answer turn itself ends
    with ``<confidence>q</confidence>`` (high after the reference answer, low after a wrong one).
    ``teacher_share`` of the episodes start from the task's teacher prompt (the reference answer in context), so
    that the policy can serve as its own teacher (gear). With ``step_confidence`` a task with
    ``stepwise_demonstration`` (rag) states a confidence on every turn (:data:`STEP_CONFIDENCES` per level), and
    ``detour_share`` of those episodes search in vain at one hop, by a wrong relation or a misspelled subject
    (that turn context only)."""
    from ..tasks.base import chat_prompt, teacher_prompt

    d = _Demos(policy, task, generator or torch.Generator().manual_seed(0))
    has_turns = callable(getattr(task, "demonstration_turns", None)) and getattr(task, "multi_turn", False)
    rows = []
    stepwise = step_confidence and callable(getattr(task, "stepwise_demonstration", None))
    for i, p in enumerate(problems):  # the random draws in this order: turns, report kind, negative, report, teacher
        if stepwise:
            turns = d.stepwise(p, detour_share)
        elif has_turns and d.rand() < multi_turn_share:
            turns = [(turn, reply, True) for turn, reply in task.demonstration_turns(p)]
        else:
            demo = task.demonstration(p)
            if demo.startswith(p.prompt):  # a task may return the whole text; train on the completion part
                demo = demo[len(p.prompt):]
            turns = [(demo, "", True)]
        kind = d.pick(MIXES[self_report]) if self_report in MIXES else self_report
        negative = False
        if kind != "off" and negatives > 0 and len(problems) > 1 and d.rand() < negatives:
            other = problems[(i + 1 + int(torch.randint(len(problems) - 1, (), generator=d.g))) % len(problems)]
            wrong = task.demonstration(other)
            if float(task.score(p, wrong)) <= 0.0:
                turns, negative = [(wrong, "", False)], True
        segs = d.segments(turns, kind, negative)
        use_teacher = teacher_share > 0 and not negative and d.rand() < teacher_share
        if d.chat is not None:
            ids = policy.encode_prompt(teacher_prompt(task, p, chat=True) if use_teacher else chat_prompt(task, p))
        else:
            ids = d.tok(teacher_prompt(task, p) if use_teacher else p.prompt, add_special_tokens=True)["input_ids"]
        rows.append(RowResult(ids, segs, None, 0.0, False, False, []))
    return rows


class _Demos:
    """What every demonstration of a warm-up shares: the tokenizer, the chat layout (a chat model: every turn a
    message of the template, :mod:`reflectrl.llm.chat`), the report words, and the one random stream."""

    def __init__(self, policy: Any, task: Any, g: torch.Generator):
        self.policy, self.task, self.g = policy, task, g
        self.tok = policy.tokenizer
        self.chat = getattr(policy, "chat", None)
        self.eos = [self.chat.end_of_turn] if self.chat is not None else policy.eos_ids[:1]
        self.words = CHAT_REPORTS if self.chat is not None else REPORTS

    def rand(self) -> float:
        return float(torch.rand((), generator=self.g))

    def pick(self, options: Sequence[Any]) -> Any:
        return options[int(torch.randint(len(options), (), generator=self.g))]

    def reply(self, text: str) -> list[int]:
        """An environment reply's tokens (a closed user turn of a chat model)."""
        return self.policy.encode_reply(text, closed=True) if self.chat is not None else _tokens(self.tok, text)

    def stepwise(self, p: Problem, detour_share: float) -> list[tuple[str, str, bool]]:
        """A stepwise demonstration stating a confidence on every turn, with a vain search at one hop in
        ``detour_share`` of them (any detour kind the task has)."""
        detour, hop = None, 0
        kinds = tuple(getattr(self.task, "detours", ()))
        if kinds and self.rand() < detour_share:  # a wrong search (any kind the task has) at one of the question's hops
            detour, hop = self.pick(kinds), int(torch.randint(len(p.meta["queries"]), (), generator=self.g))
        return self.task.stepwise_demonstration(p, lambda level: self.pick(STEP_CONFIDENCES[level]), detour, hop)

    def segments(self, turns: list[tuple[str, str, bool]], kind: str, negative: bool) -> list[Segment]:
        """The episode's segments: each agent turn (trained unless it is a wrong answer) and the environment's
        reply, then the self-report ``kind`` (the question and its answer, or the answer's inline confidence)."""
        from ..tasks.selfreport import question

        tok, chat, eos = self.tok, self.chat, self.eos
        segs = []
        for t, (turn, text, trained) in enumerate(turns):
            last = t == len(turns) - 1
            closes = (last or chat is not None) and not (last and kind == "inline")  # a chat model ends every turn
            ids = _tokens(tok, turn) + (eos if closes else [])
            segs.append(Segment(ids, "policy" if trained else "env", t))
            if not last and (text or chat is not None):
                segs.append(Segment(self.reply(text), "env", t))
        if kind == "inline":
            q = self.pick(REPORTS["confidence"][1 if negative else 0])
            segs.append(Segment(_tokens(tok, f"<confidence>{q}</confidence>") + eos, "policy", len(turns) - 1))
        elif kind != "off":
            pos, neg = self.words[kind]
            answer = (neg if negative else pos) if kind == "reflect" else self.pick(neg if negative else pos)
            segs.append(Segment(self.reply(question(kind)), "env", len(turns) - 1))
            segs.append(Segment(_tokens(tok, (" " if chat is not None else "") + answer) + eos, "policy", len(turns)))
        return segs


TINY_WARMUP_LR, PRETRAINED_WARMUP_LR = 3e-3, 1e-5


def warmup_learning_rate(model: str, given: float | None) -> float:
    """The warm-up's learning rate: ``given``, or one from the model's size (:data:`TINY_WARMUP_LR` under 10M
    parameters, :data:`PRETRAINED_WARMUP_LR` above). A given rate of 1e-3 or more on a pretrained model is warned
    about (3 steps at 3e-3 turn SmolLM2-135M's answers into punctuation)."""
    import warnings

    from .models import profile_of

    try:
        pretrained = profile_of(model, lora=False).pretrained_scale
    except (ConfigError, ReflectRLError):
        pretrained = False  # the load below reports the model
    if given is None:
        return PRETRAINED_WARMUP_LR if pretrained else TINY_WARMUP_LR
    if pretrained and given >= 1e-3:
        warnings.warn(f"--learning-rate {given:g} is a tiny model's rate: on a pretrained model it destroys what the "
                      f"model knows within a few steps; its default is {PRETRAINED_WARMUP_LR:g}", stacklevel=2)
    return given


def warmup(cfg: WarmupConfig) -> dict[str, Any]:
    """Run the warm-up; writes the model to ``cfg.out`` with ``warmup.json``; returns that summary."""
    from .evaluate import evaluate_policy

    cfg.validate()
    from ..runlog import claim_output_dir
    from .models import record_model

    cfg = dataclasses.replace(cfg, model=record_model(cfg.model)[0])  # warmup.json names the model from any folder
    cfg = dataclasses.replace(cfg, learning_rate=warmup_learning_rate(cfg.model, cfg.learning_rate))

    claim_output_dir(cfg.out, "--out", cfg.force, stale=("warmup.json",))
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    task = get_task(cfg.task, **parse_options(cfg.task_options))
    problems = list(task.problems("train"))[:cfg.max_problems]
    if not problems:
        raise ConfigError(f"task {cfg.task!r} has no train problems to demonstrate")
    policy = load_policy(cfg.model, dtype=cfg.dtype, device=cfg.device, chat=cfg.chat, savable=True)
    rows = demonstration_rows(policy, task, problems, cfg.self_report, cfg.self_report_negatives,
                              cfg.multi_turn_share, torch.Generator().manual_seed(cfg.seed + 1), cfg.teacher_share,
                              cfg.step_confidence, cfg.detour_share)
    from ..tasks.selfreport import default_new_tokens

    max_new = cfg.max_new_tokens or default_new_tokens(task, cfg.self_report)  # inline / all: room for the tag
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                            foreach=True)
    gen = torch.Generator().manual_seed(cfg.seed)
    order: list[int] = []
    losses: list[float] = []
    acc = None
    t0 = time.perf_counter()
    step = 0
    check = lambda: evaluate_policy(policy, task, "train", max_new_tokens=max_new, limit=cfg.eval_problems)["accuracy"]
    with TrainProgress(cfg.steps, cfg.progress, f"warmup {cfg.task}", value_label="loss") as bar:
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
            bar.update(step, step / max(time.perf_counter() - t0, 1e-9), losses[-1])
            if cfg.stop_at_accuracy is not None and step % cfg.eval_every == 0:
                acc = check()
                if acc >= cfg.stop_at_accuracy:
                    break
    policy.eval()
    out_dir = policy.save_pretrained(cfg.out)
    summary = {"out": str(out_dir), "steps": step, "final_loss": sum(losses[-10:]) / len(losses[-10:]),
               "train_accuracy": acc if acc is not None else check(), "wall_s": time.perf_counter() - t0,
               "config": dataclasses.asdict(cfg)}
    (Path(cfg.out) / "warmup.json").write_text(json.dumps(strict(summary), indent=2))
    return summary
