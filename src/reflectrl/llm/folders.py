"""What a model folder holds: a full Hugging Face model, or a LoRA adapter that names its base model.

A LoRA run exports its policy (``RUN/model``) as the adapter alone: peft's ``adapter_config.json`` and
``adapter_model.safetensors``, the tokenizer, the heads (``reflectrl_heads.safetensors``) and :data:`ADAPTER_INFO`,
which names the base model by the folder it resolved to (absolute) and the name it was given (a named model or a
GGUF file, converted again where that folder has gone). :func:`reflectrl.llm.policy.load_policy` loads either kind;
:mod:`reflectrl.llm.export` writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ReflectRLError

ADAPTER_INFO = "reflectrl_adapter.json"
"""Written beside a LoRA adapter: ``{"base_model": FOLDER, "base_name": NAME or null}``."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = (ADAPTER_CONFIG, "adapter_model.safetensors", "adapter_model.bin", ADAPTER_INFO)
FULL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
              "pytorch_model.bin")
"""The files of each kind of folder that writing the other kind removes (left behind, they would make it ambiguous)."""


def is_adapter_dir(path: str | Path) -> bool:
    """True for a folder holding a LoRA adapter and no full model (no ``config.json``)."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def is_model_dir(path: str | Path) -> bool:
    """True for a Hugging Face model directory or a LoRA adapter folder."""
    p = Path(path)
    return (p / "config.json").is_file() or is_adapter_dir(p)


def adapter_info(folder: str | Path) -> dict[str, Any]:
    """:data:`ADAPTER_INFO` of an adapter folder; for an adapter written elsewhere, its ``adapter_config.json``'s
    base model and no name."""
    p = Path(folder)
    try:
        info = json.loads((p / ADAPTER_INFO).read_text())
        if isinstance(info, dict) and info.get("base_model"):
            return info
    except (OSError, ValueError):
        pass
    try:
        base = json.loads((p / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    if not base:
        raise ReflectRLError(f"{p} holds a LoRA adapter that names no base model (no {ADAPTER_INFO}, and no "
                             f"base_model_name_or_path in its {ADAPTER_CONFIG})")
    return {"base_model": str(base), "base_name": None}


def no_export_reason(run: Path) -> str:
    """Why an LLM run folder has no model to load: no checkpoint yet (and how far the run got), or a checkpoint that
    was never exported (and the command that exports it)."""
    from ..trainer import CHECKPOINT

    if (run / CHECKPOINT).is_file():
        return f"{run} has a checkpoint but no exported model: write it with `reflectrl llm export {run}`"
    try:
        done = sum(1 for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip())
    except OSError:
        done = 0
    when = ("it stopped before its first update" if done == 0 else
            f"it stopped after {done} update{'s' if done > 1 else ''}, before its first checkpoint")
    return f"{run} has no checkpoint yet: {when} (nothing trained to load; start the run again)"


__all__ = ["ADAPTER_INFO", "adapter_info", "is_adapter_dir", "is_model_dir", "no_export_reason"]
