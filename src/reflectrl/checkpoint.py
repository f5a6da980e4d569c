"""Atomic single-file checkpoints: tensors in safetensors, everything else as JSON metadata.

A checkpoint is one ``.safetensors`` file written to a temporary name, flushed to disk and renamed
over the previous one, so a process killed mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import CheckpointError

_META_KEY = "reflectrl"


def save_checkpoint(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write ``tensors`` and JSON-serializable ``meta`` to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    flat = {k: v.detach().contiguous().clone() if v.requires_grad else v.contiguous() for k, v in tensors.items()}
    save_file(flat, str(tmp), metadata={_META_KEY: json.dumps(meta)})
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint written by :func:`save_checkpoint`; raise CheckpointError if unusable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: the run has not saved one yet, or the path is wrong")
    try:
        tensors = load_file(str(path))
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as fh:
            raw = (fh.metadata() or {}).get(_META_KEY)
        if raw is None:
            raise ValueError("metadata missing")
        meta = json.loads(raw)
    except (SafetensorError, ValueError, OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt or incomplete ({exc}); "
                              "restore it from a backup or start a new run") from None
    return tensors, meta


def pack_state_dict(prefix: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Prefix the keys of a module state dict for storage in one flat file."""
    return {f"{prefix}/{k}": v for k, v in state.items()}


def unpack_state_dict(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`pack_state_dict`."""
    p = prefix + "/"
    return {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}


def pack_optimizer(prefix: str, opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer state dict into tensors and JSON metadata."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{prefix}/{pid}/{k}"] = v
            else:
                scalars[f"{pid}/{k}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def unpack_optimizer(prefix: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Rebuild an optimizer state dict from :func:`pack_optimizer` output."""
    state: dict[int, dict[str, Any]] = {}
    p = prefix + "/"
    for key, v in tensors.items():
        if key.startswith(p):
            pid, name = key[len(p):].split("/", 1)
            state.setdefault(int(pid), {})[name] = v
    for key, v in meta["scalars"].items():
        pid, name = key.split("/", 1)
        state.setdefault(int(pid), {})[name] = v
    return {"state": state, "param_groups": meta["param_groups"]}


def _hook_key(h: Any) -> str:
    return f"hook/{getattr(h, 'name', None) or type(h).__name__}"


def pack_hooks(hooks: Any, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Add the state of every hook or method that has one: tensors under ``hook/NAME/``, metadata under
    ``meta["hook/NAME"]`` (``NAME``: its ``name`` attribute, else its class name)."""
    for h in hooks:
        if hasattr(h, "state"):
            ht, hm = h.state()
            tensors.update({f"{_hook_key(h)}/{k}": v for k, v in ht.items()})
            meta[_hook_key(h)] = hm


def unpack_hooks(hooks: Any, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Inverse of :func:`pack_hooks` (a missing entry raises KeyError)."""
    for h in hooks:
        if hasattr(h, "load_state"):
            h.load_state(unpack_state_dict(_hook_key(h), tensors), meta[_hook_key(h)])
