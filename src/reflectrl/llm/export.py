"""A run's policy as a model folder: ``RUN/model`` at the end of a run, and ``reflectrl llm export``.

A LoRA run exports the adapter alone (a few MB beside a base model of hundreds), naming its base model
(:mod:`reflectrl.llm.folders`); every command that takes a model folder loads it as the base with the adapter merged
in. ``reflectrl llm export RUN --merge`` writes the merged model as a plain Hugging Face directory, for tools that
know nothing of adapters; a full fine-tuning run exports its whole model either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..runlog import staged_folder
from .policy import Policy


def export_policy(policy: Policy, out_dir: str | Path, merge: bool = False, base_name: str | None = None) -> Path:
    """:meth:`Policy.save_pretrained` into a temporary sibling of ``out_dir``, moved into its place once complete:
    an interrupted export leaves the previous one (or nothing), never a mix of the two."""
    with staged_folder(out_dir) as tmp:
        policy.save_pretrained(tmp, merge, base_name)
    return Path(out_dir)


def folder_size(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def export_run(run_dir: str | Path, out: str | Path | None = None, merge: bool = False,
               model: str | None = None, force: bool = False) -> dict[str, Any]:
    """Export the latest checkpoint of an LLM run: a LoRA run's adapter (default ``RUN/model``) or, with
    ``merge``, the merged full model (default ``RUN/merged``); a full fine-tuning run's whole model (default
    ``RUN/model``). ``model``: the run's base model where it has moved. The default folder is replaced; another
    ``out`` that holds files only with ``force``. Returns what was written: ``out``, ``format`` (adapter, merged or
    full), ``bytes`` and ``base_model``."""
    from ..runlog import claim_output_dir, folder_kind
    from .config import is_llm_run_dir
    from .evaluate import load_for_eval
    from .folders import no_export_reason

    run = Path(run_dir)
    if not run.is_dir():
        raise ConfigError(f"run directory {run} does not exist")
    if not is_llm_run_dir(run):
        if folder_kind(run) == "llm run":
            raise ConfigError(no_export_reason(run))
        raise ConfigError(f"{run} is not an LLM run directory (a folder of `reflectrl llm train` with config.json and "
                          "a checkpoint)")
    policy, cfg = load_for_eval(run, model=model)
    lora = hasattr(policy.model, "merge_and_unload")
    default = run / ("merged" if merge and lora else "model")
    dst = Path(out) if out is not None else default
    if dst.resolve() != default.resolve():
        if policy.base_folder and dst.resolve() == Path(policy.base_folder).resolve():
            raise ConfigError(f"--out {dst} is the run's base model; choose another folder")
        claim_output_dir(dst, "--out", force)
    export_policy(policy, dst, merge=merge, base_name=cfg.get("model_name") or None)  # None: the name it loaded by
    kind = "adapter" if lora and not merge else ("merged" if lora else "full")
    return {"out": str(dst), "format": kind, "bytes": folder_size(dst), "base_model": policy.base_folder}


__all__ = ["export_policy", "export_run"]
