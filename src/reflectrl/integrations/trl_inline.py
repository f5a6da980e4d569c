"""The inline self-report inside TRL's ``GRPOTrainer``: the answer, then the report's tag opened in the same assistant
message, completed by the model (the form reflectrl's own trainer uses on chat models; docs/llm.md, "Self-reports").

.. code-block:: python

    from reflectrl.integrations.trl import rlcr_reward, task_dataset
    from reflectrl.integrations.trl_inline import inline_rollout

    trainer = GRPOTrainer(model=MODEL, reward_funcs=[rlcr_reward("arith")],
                          train_dataset=task_dataset("arith", self_report="inline"),
                          rollout_func=inline_rollout("confidence"), args=GRPOConfig(...))

A small instruct model does not write the tag from the request alone (BENCHMARKS.md, "The inline form"), so
:func:`inline_rollout` is TRL's ``rollout_func`` (experimental in TRL): it samples each answer with the trainer's
model and generation settings, drops the end of turn the model sampled after it, appends the opened tag
(:data:`~reflectrl.tasks.selfreport.INLINE_OPENINGS`, context: ``env_mask`` 0, never trained) and samples at most
:data:`~reflectrl.tasks.selfreport.INLINE_REPORT_TOKENS` tokens of report. The answer's text and the report's go to
the reward functions as the columns ``inline_answer`` and ``inline_report``: the task's verifier reads the answer
alone, and the report is parsed as reflectrl's trainer parses it (a missing one is the format penalty).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from ..tasks.selfreport import INLINE_OPENINGS, INLINE_REPORT_TOKENS

RolloutFunc = Callable[[list[Any], Any], dict[str, Any]]


def inline_rollout(kind: str = "confidence", report_tokens: int = INLINE_REPORT_TOKENS) -> RolloutFunc:
    """A TRL ``rollout_func`` for the inline form of ``kind`` (``confidence``: rlcr's, ``reflect``: refgrpo's)."""
    if kind not in INLINE_OPENINGS:
        raise ConfigError(f"the inline report's kind must be one of {', '.join(INLINE_OPENINGS)}, got {kind!r}")
    if report_tokens < 1:
        raise ConfigError(f"report_tokens must be >= 1, got {report_tokens}")

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tok = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        config = trainer.generation_config
        prompt_ids = [prompt_tokens(tok, p) for p in prompts]
        ends = end_ids(tok, config)
        answers = [_strip_end(a, ends) for a in generate(model, tok, prompt_ids, config, config.max_new_tokens)]
        opening = tok(INLINE_OPENINGS[kind], add_special_tokens=False).input_ids
        reports = generate(model, tok, [p + a + opening for p, a in zip(prompt_ids, answers)], config, report_tokens)
        return {"prompt_ids": prompt_ids,
                "completion_ids": [a + opening + r for a, r in zip(answers, reports)],
                "logprobs": None,
                "env_mask": [[1] * len(a) + [0] * len(opening) + [1] * len(r) for a, r in zip(answers, reports)],
                "inline_answer": tok.batch_decode(answers, skip_special_tokens=True),
                "inline_report": tok.batch_decode(reports, skip_special_tokens=True),
                "inline_kind": [kind] * len(prompts)}

    return rollout


def prompt_tokens(tok: Any, prompt: Any) -> list[int]:
    """A dataset prompt's token ids: a conversation through the model's chat template (the assistant's turn opened),
    a string as it is."""
    if isinstance(prompt, list):
        ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in newer transformers
    return list(tok(prompt, add_special_tokens=False).input_ids)


def end_ids(tok: Any, config: Any) -> set[int]:
    """The ids that end a completion: the generation config's end-of-sequence ids and the tokenizer's."""
    ids = config.eos_token_id if config.eos_token_id is not None else tok.eos_token_id
    out = set(ids if isinstance(ids, (list, tuple)) else [ids]) if ids is not None else set()
    return out | ({tok.eos_token_id} if tok.eos_token_id is not None else set())


def _strip_end(ids: list[int], ends: set[int]) -> list[int]:
    """A completion without the end of turn it sampled (the report continues the same message)."""
    return ids[:-1] if ids and ids[-1] in ends else ids


@torch.no_grad()
def generate(model: Any, tok: Any, contexts: Sequence[list[int]], config: Any, max_new_tokens: int) -> list[list[int]]:
    """Sample at most ``max_new_tokens`` after each context with ``model.generate`` and the trainer's generation
    config (left-padded batch); each row's new tokens up to and including its first end-of-sequence id."""
    import copy

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(c) for c in contexts)
    ids = torch.tensor([[pad] * (width - len(c)) + list(c) for c in contexts])
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    cfg = copy.deepcopy(config)
    cfg.max_new_tokens = int(max_new_tokens)
    device = next(model.parameters()).device
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=cfg)
    ends = end_ids(tok, config)
    rows = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in ends), len(row))
        rows.append(row[:cut])
    return rows
