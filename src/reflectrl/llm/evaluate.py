"""Held-out evaluation of an LLM policy: greedy accuracy with a Wilson interval, or pass@k from samples.

``pass@k`` uses the unbiased estimator of Chen et al. 2021 (HumanEval): with ``n >= k`` samples of
which ``c`` are correct, ``pass@k = 1 - C(n - c, k) / C(n, k)``; its interval is a percentile
bootstrap over problems.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, ReflectRLError
from ..tasks.base import SPLITS, Problem, Task, get_task
from .config import task_response_budget
from .engines import make_engine
from .eval_progress import EvalMeter
from .models import base_model_of
from .policy import Policy, load_policy
from .rollout import Rollout, logged_episode


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (well behaved at 0 and 1 and for small n)."""
    if n == 0:
        return float("nan"), float("nan")
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + confidence / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (requires ``n >= k``)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate_policy(policy: Policy, task: Task, split: str = "heldout", samples: int = 0, n: int | None = None,
                    temperature: float = 1.0, max_new_tokens: int = 64, max_turns: int | None = None,
                    max_response_tokens: int | None = None, limit: int | None = None, gen_batch: int = 128,
                    seed: int = 0, confidence: float = 0.95, engine: str = "torch",
                    self_report: str | None = None, per_problem: bool = False,
                    transcripts: bool = False, progress: bool = False, meter: EvalMeter | None = None
                    ) -> dict[str, Any]:
    """Accuracy of ``policy`` on ``task``'s ``split``: greedy when ``samples == 0``; otherwise ``n``
    (default ``samples``) sampled completions per problem give pass@1 (as ``accuracy``) and pass@``samples``.

    ``self_report`` (``reflect``, ``confidence`` or ``both``) asks after each episode for a reflection and / or
    a confidence (:mod:`reflectrl.tasks.selfreport`, whatever the model was trained with) and adds their
    calibration (:func:`reflectrl.eval.calibration.self_report_metrics`) and the per-rollout reports
    (``reports``: correct, reflection, confidence; null where missing). ``inline`` asks nothing and reads the
    confidence the final answer itself states (``<confidence>q</confidence>``: rlcr's inline form). ``per_problem``
    adds ``per_problem``: each problem's share of right completions, in the split's order (greedy: 0 or 1).
    ``transcripts`` adds ``episodes``: per rollout, in the split's order, its problem id, ``correct``, the
    environment's per-step ``infos`` and the ``transcript`` (``(kind, text)`` turns). ``progress``: a bar with the
    time left on stderr (log lines where stderr is not a terminal), and a line suggesting ``--limit`` when the
    evaluation is projected to be long (:class:`~reflectrl.llm.eval_progress.EvalMeter`; ``meter``: the one of a
    larger evaluation this is a pass of)."""
    title = f"eval {getattr(task, 'name', '')} {split}" + (f" ({self_report})" if self_report not in (None, "off") else "")
    if self_report == "both":
        with EvalMeter(len(_eval_problems(task, split, samples, n, limit)), 2, progress, title) as both:
            out = evaluate_policy(policy, task, split, samples, n, temperature, max_new_tokens, max_turns,
                                  max_response_tokens, limit, gen_batch, seed, confidence, engine, "reflect",
                                  per_problem, transcripts, progress, meter=both)
            conf = evaluate_policy(policy, task, split, samples, n, temperature, max_new_tokens, max_turns,
                                   max_response_tokens, limit, gen_batch, seed, confidence, engine, "confidence",
                                   transcripts=transcripts, progress=progress, meter=both)
        return _merge_reports(out, conf, transcripts)
    task, max_turns, max_response_tokens = _with_report_turn(task, self_report, max_turns, max_response_tokens,
                                                             policy.chat is not None)
    problems = _eval_problems(task, split, samples, n, limit)
    multi = bool(getattr(task, "multi_turn", False))
    turns = max_turns or (int(getattr(task, "max_turns", 6)) if multi else 1)
    greedy = samples == 0
    per = 1 if greedy else (n or samples)
    own = meter is None
    meter = meter if meter is not None else EvalMeter(len(problems), 1, progress, title)
    ro = Rollout(policy, meter.engine(make_engine(engine, policy, temperature)), task, max_new_tokens, turns,
                 max_response_tokens or task_response_budget(task, max_new_tokens, turns, policy.chat is not None),
                 gen_batch, reward_workers=4)
    with meter if own else contextlib.nullcontext():
        r = _roll_out(policy, ro, problems, per, greedy, torch.Generator().manual_seed(seed), gen_batch, transcripts,
                      meter)
    if self_report not in (None, "off"):
        # every episode's last info names the report asked for, so that a missing one reads as missing (reflectrl
        # calibration), not as a row without a report: a raw-prompt model's inline report is its answer's own tag,
        # and an episode that spent its token budget on the answer ended before the report's turn
        kind = "confidence" if self_report in ("inline", "confidence") else "reflect"
        for ep in r.kept:
            if ep["infos"] and "self_report" not in ep["infos"][-1]:
                ep["infos"] = [*ep["infos"][:-1], {**ep["infos"][-1], "self_report": kind}]
    out: dict[str, Any] = {"task": getattr(task, "name", None), "split": split, "n": len(problems),
                           "ci_level": confidence, "mean_score": float(r.scores.mean())}
    if self_report not in (None, "off"):
        out.update(_report_metrics(self_report, r.correct, r.finals, confidence))
    out.update(_episode_metrics(r.episodes, tuple(getattr(task, "tool_kinds", ()))))
    if per_problem:
        out["per_problem"] = r.correct.mean(1).tolist()
    if transcripts:
        out["episodes"] = r.kept
    return {**out, **_accuracy(r.correct, greedy, per, samples, temperature, confidence)}


def _merge_reports(out: dict[str, Any], conf: dict[str, Any], transcripts: bool) -> dict[str, Any]:
    """The reflection pass's result with the confidence pass's reports and metrics added (``self_report`` both)."""
    out["reports"]["confidence"] = conf["reports"]["confidence"]
    if transcripts:  # the episodes of both passes: each one's last info names the report it was asked for
        out["episodes"] = out["episodes"] + conf.pop("episodes")
    out.update({k: v for k, v in conf.items() if k not in out})
    out["self_report"] = "both"
    return out


def _with_report_turn(task: Task, self_report: str | None, max_turns: int | None, max_response_tokens: int | None,
                      chat: bool = False) -> tuple[Task, int | None, int | None]:
    """``task`` with the self-report question asked after each episode (and a turn more to answer it), when asked;
    in an inline form, with a chat model, the report completed in the answer's own message (a turn more too)."""
    if self_report not in (None, "off", "reflect", "confidence", "inline", "inline-reflect"):
        raise ConfigError(f"--self-report must be reflect, confidence, both, inline or inline-reflect, got "
                          f"{self_report!r}")
    if self_report in (None, "off") or (self_report in ("inline", "inline-reflect") and not chat):
        return task, max_turns, max_response_tokens
    from ..tasks.selfreport import with_self_report

    base_multi = bool(getattr(task, "multi_turn", False))
    base_turns = max_turns or (int(getattr(task, "max_turns", 6)) if base_multi else 1)
    # room for the question and the report: the multi-turn default budget
    return with_self_report(task, self_report, chat=chat), base_turns + 1, None


def _eval_problems(task: Task, split: str, samples: int, n: int | None, limit: int | None) -> list[Problem]:
    """The problems of ``split`` (the first ``limit``), after the settings are checked."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if samples < 0 or (n is not None and n < max(samples, 1)):
        raise ConfigError("--samples must be >= 0 and --n at least --samples")
    problems = list(task.problems(split))
    if limit is not None:
        problems = problems[:limit]
    if not problems:
        raise ConfigError(f"task {getattr(task, 'name', task)!r} has no {split} problems")
    return problems


@dataclass
class _Rollouts:
    """An evaluation's rollouts: correctness and scores ``[problems, per]``, each episode's last info, each
    episode's infos with its outcome, and (with transcripts) the kept episodes."""

    correct: np.ndarray
    scores: np.ndarray
    finals: list[dict[str, Any]] = field(default_factory=list)
    episodes: list[tuple[list[dict[str, Any]], bool]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)


def _roll_out(policy: Policy, ro: Rollout, problems: list[Problem], per: int, greedy: bool, gen: torch.Generator,
              gen_batch: int, transcripts: bool, meter: EvalMeter) -> _Rollouts:
    """``per`` episodes of every problem, in chunks, with the policy in eval mode, each chunk told to ``meter``."""
    was_training = policy.training
    policy.eval()
    r = _Rollouts(np.zeros((len(problems), per), dtype=bool), np.zeros((len(problems), per)))
    try:
        step = max(1, gen_batch // per) * 4
        for s in range(0, len(problems), step):
            chunk = problems[s:s + step]
            meter.chunk(len(chunk), len(chunk) * per, ro.max_turns)
            batch, _ = ro.run(chunk, per, gen, greedy=greedy)
            r.correct[s:s + len(chunk)] = batch.correct.numpy().reshape(len(chunk), per)
            r.scores[s:s + len(chunk)] = batch.scores.numpy().reshape(len(chunk), per)
            r.finals += [(rows[-1] if rows else {}) for rows in batch.infos]
            r.episodes += [(rows, bool(c)) for rows, c in zip(batch.infos, batch.correct.tolist())]
            if transcripts:
                chat = policy.chat is not None
                r.kept += [{"problem": p.id, "correct": bool(c), "infos": rows,
                            **logged_episode(policy.tokenizer, chat, rec, tr)}
                           for p, rows, tr, c, rec in zip(batch.problems, batch.infos, batch.transcripts,
                                                          batch.correct.tolist(), batch.to_records())]
            meter.done(float(r.correct[:s + len(chunk)].mean()))
    finally:
        ro.close()
        policy.train(was_training)
    return r


def _accuracy(correct: np.ndarray, greedy: bool, per: int, samples: int, temperature: float, confidence: float
              ) -> dict[str, Any]:
    """Greedy accuracy with its Wilson interval, or sampled pass@1 and pass@``samples`` with bootstrap intervals."""
    if greedy:
        k = int(correct.sum())
        return {"mode": "greedy", "accuracy": k / len(correct), "ci": list(wilson_interval(k, len(correct), confidence))}
    from ..eval.stats import bootstrap_ci

    c = correct.sum(1)
    p1 = c / per
    pk = np.array([pass_at_k(per, int(ci), samples) for ci in c])
    return {"mode": "sampled", "samples_per_problem": per, "temperature": temperature, "accuracy": float(p1.mean()),
            "ci": list(bootstrap_ci(p1, np.mean, confidence)), f"pass@{samples}": float(pk.mean()),
            f"pass@{samples}_ci": list(bootstrap_ci(pk, np.mean, confidence))}


def _episode_metrics(episodes: list[tuple[list[dict[str, Any]], bool]], tool_kinds: tuple[str, ...]) -> dict[str, Any]:
    """Tool calls per episode (queries, searches), the ECE and AUROC of confidences stated along the episodes
    (every turn's, against its episode's outcome) and the premature-answer rate (a task that says how many
    searches a question needs), where the task logs them."""
    from ..eval.calibration import auroc, ece
    from ..tasks.selfreport import turn_confidences

    out: dict[str, Any] = {}
    kinds = [sum(1 for i in rows if i.get("kind") in tool_kinds) for rows, _ in episodes]
    if any(kinds):
        out["tool_calls"] = float(np.mean(kinds))
    steps = [(q, float(ok)) for rows, ok in episodes for q in turn_confidences(rows) if q is not None]
    if steps:
        v = ece([q for q, _ in steps], [y for _, y in steps])
        out["step_ece"] = v if math.isfinite(v) else None
        a = auroc([q for q, _ in steps], [y for _, y in steps])  # NaN when every episode has one outcome
        out["step_auroc"] = a if math.isfinite(a) else None
        out["step_reports"] = len(steps) / len(episodes)
    prem = [bool(rows[-1]["premature"]) for rows, _ in episodes if rows and "premature" in rows[-1]]
    if prem:
        out["premature_rate"] = float(np.mean(prem))
    return out


def _report_metrics(kind: str, correct: np.ndarray, finals: list[dict[str, Any]], level: float = 0.95
                    ) -> dict[str, Any]:
    """The calibration of one kind of self-report, and the per-rollout reports behind it; ``correct`` is
    ``[problems, samples]``. A confidence adds its AUROC's DeLong interval and its ECE's bootstrap interval over
    problems (:func:`reflectrl.eval.uncertainty.confidence_intervals`, at ``level``; several samples of a problem
    count as one problem) and the selective accuracies (:func:`reflectrl.eval.calibration.selective_accuracies`)."""
    from ..eval.calibration import selective_accuracies, self_report_metrics
    from ..eval.uncertainty import confidence_intervals

    groups = np.repeat(np.arange(correct.shape[0]), correct.shape[1]) if correct.ndim == 2 and correct.shape[1] > 1 \
        else None
    correct = correct.reshape(-1)
    reflect = kind in ("reflect", "inline-reflect")
    key = "reflection" if reflect else "confidence"  # inline: the answer's stated confidence
    values = [f.get(key) for f in finals]
    arr = np.array([np.nan if v is None else float(v) for v in values])
    m = self_report_metrics(correct.astype(float), arr if reflect else None, None if reflect else arr)
    m.pop("accuracy", None)
    if not reflect:
        m.update({**selective_accuracies(arr, correct), **confidence_intervals(arr, correct, groups, level)})
    # the accuracy of the episodes whose reflection parsed (the ones the reflection rates describe): not the accuracy
    if "task_accuracy" in m:
        m["reported_accuracy"] = m.pop("task_accuracy")
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}
    return {**clean, "self_report": kind,
            "reports": {"correct": correct.astype(int).tolist(), key: [None if v is None else float(v) for v in values]}}


def run_base_model(run_dir: Path, recorded: str) -> str:
    """The base model of a run: the recorded path, or (a relative path recorded by an older run, evaluated from
    another folder) that path beside or inside the run folder, where it exists."""
    p = Path(recorded).expanduser()
    if p.is_absolute() or p.exists():
        return recorded
    for base in (run_dir.parent, run_dir):
        if (base / p / "config.json").is_file():
            return str((base / p).resolve())
    return recorded


def load_for_eval(path: str | Path, device: str = "cpu", chat: str | None = None,
                  model: str | None = None) -> tuple[Policy, dict[str, Any]]:
    """A policy from a model directory, or from a GRPO run directory's latest checkpoint (its base
    model plus the trained weights); returns it with the run's config (empty for a model directory). ``chat``:
    ``auto``, ``on`` or ``off`` (default: the run's, else auto); ``model``: the run's base model where it has moved
    (default: the path in its config.json)."""
    from ..trainer import CHECKPOINT, read_config_json, run_kind
    from .config import is_llm_run_dir
    from .folders import is_model_dir

    p = Path(path)
    if (p / "config.json").is_file() and (p / CHECKPOINT).is_file() and run_kind(read_config_json(p)) == "control":
        raise ReflectRLError(f"{p} is a control run directory: evaluate it with `reflectrl eval {p}`")
    if is_llm_run_dir(p):
        return _load_run(p, device, chat, model)
    if model is not None:
        raise ConfigError(f"--model gives a run's moved base model; {p} is not an LLM run directory (evaluate a "
                          "model folder by passing it as the first argument)")
    if p.is_dir() and not (p / "model.safetensors").exists() and is_model_dir(p / "model"):
        p = p / "model"  # a run directory without a checkpoint but with its exported model
    if p.is_dir() and not is_model_dir(p):
        raise ReflectRLError(f"{p} is neither a model directory nor an LLM run directory (no config.json)")
    return load_policy(str(path) if not p.exists() else str(p), device=device, chat=chat or "auto"), {}


def _load_run(p: Path, device: str, chat: str | None, model: str | None) -> tuple[Policy, dict[str, Any]]:
    """An LLM run's base model with the trained weights and heads of its latest checkpoint, and its config."""
    import dataclasses

    from ..checkpoint import load_checkpoint
    from ..trainer import CHECKPOINT
    from .config import load_llm_config

    cfg = load_llm_config(p)
    tensors, _ = load_checkpoint(p / CHECKPOINT)
    base = model or base_model_of(run_base_model(p, cfg.model), cfg.model_name)
    try:
        policy = load_policy(base, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, dtype=cfg.dtype, device=device,
                             chat=chat or cfg.chat)
    except ReflectRLError as exc:
        if model is not None:
            raise
        raise ReflectRLError(f"the base model of run {p} cannot be loaded ({exc}); give its place with "
                             f"`reflectrl llm eval {p} --model PATH`") from None
    state = {k[7:]: v for k, v in tensors.items() if k.startswith("policy/")}
    for key in state:
        if key.startswith("heads."):
            name = key.split(".")[1]
            if name not in policy.heads and key.endswith(".weight"):
                policy.add_head(name, state[key].shape[0])
    policy.load_trainable_state(state)
    return policy, dataclasses.asdict(cfg)


def warmup_task(folder: Path) -> dict[str, Any]:
    """``{"task", "task_options"}`` of a warm-up folder's ``warmup.json``; empty for any other folder."""
    import json

    try:
        cfg = json.loads((folder / "warmup.json").read_text())["config"]
        return {"task": cfg["task"], "task_options": list(cfg.get("task_options", []))}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def evaluate(model_or_run: str | Path, task: str | None = None, split: str = "heldout", samples: int = 0,
             task_options: tuple[str, ...] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Load and evaluate; the task, its options and the token limits default to the run's when given a run
    directory (a run trained with a self-report turn counts that turn in its ``max_turns``), else the task's."""
    from ..tasks.base import parse_options

    policy, run_cfg = load_for_eval(model_or_run, kwargs.pop("device", "cpu"), kwargs.pop("chat", None),
                                    kwargs.pop("model", None))
    if not run_cfg:  # a warm-up folder records the task it was trained on
        run_cfg = warmup_task(Path(model_or_run))
    task_name = task or run_cfg.get("task")
    if not task_name:
        raise ConfigError("--task is required when evaluating a model directory")
    same_task = task_name == run_cfg.get("task")
    if task_options is None:
        task_options = tuple(run_cfg.get("task_options", ())) if same_task else ()
    t = get_task(task_name, **parse_options(task_options))
    for key in ("max_new_tokens", "max_turns", "max_response_tokens"):
        if kwargs.get(key) is None and same_task and run_cfg.get(key) is not None:
            kwargs[key] = run_cfg[key]
    asked = run_cfg.get("self_report", "off") not in ("off", "inline", "inline-reflect") or (
        run_cfg.get("self_report") in ("inline", "inline-reflect") and policy.chat is not None)
    if same_task and asked and kwargs.get("max_turns"):
        kwargs["max_turns"] -= 1  # the run's count includes its self-report turn; the task's own turns
        kwargs.pop("max_response_tokens", None)
    if kwargs.get("max_new_tokens") is None:
        from ..tasks.selfreport import default_new_tokens

        kwargs["max_new_tokens"] = default_new_tokens(t, kwargs.get("self_report"), fallback=64,
                                                      chat=policy.chat is not None)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return evaluate_policy(policy, t, split, samples, **kwargs)
