"""Run directories: ``config.json``, ``metrics.jsonl`` (one object per update), TensorBoard, W&B."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import ReflectRLError


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class RunLogger:
    """Writes one JSON object per update to ``metrics.jsonl`` and the same scalars to TensorBoard."""

    def __init__(self, run_dir: Path, config: dict[str, Any], tensorboard: bool = True, track: bool = False,
                 wandb_project: str = "reflectrl", run_name: str | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._fh = open(self.metrics_path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"))
        self._wandb = None
        if track:
            try:
                import wandb
            except ImportError:
                raise ReflectRLError("--track needs Weights & Biases: pip install 'reflectrl[track]'") from None
            self._wandb = wandb.init(project=wandb_project, name=run_name, config=config, sync_tensorboard=False)

    def log(self, metrics: dict[str, Any]) -> None:
        """Append one record; ``global_step`` is the x-axis everywhere."""
        rec = {k: _clean(v) for k, v in metrics.items()}
        self._fh.write(json.dumps(rec) + "\n")
        step = rec.get("global_step", 0)
        if self._tb is not None:
            for k, v in rec.items():
                if k != "global_step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(rec, step=step)

    def close(self) -> None:
        """Flush and close every sink."""
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def open_run(run_dir: Path, header: dict[str, Any], cfg: Any) -> RunLogger:
    """Create ``run_dir``, write ``config.json`` (``header`` + the config dataclass) unless a resumed run
    wrote it already, and open the run's logger with the config's TensorBoard / W&B settings."""
    import dataclasses

    run_dir.mkdir(parents=True, exist_ok=True)
    fields = dataclasses.asdict(cfg)
    cfg_path = run_dir / "config.json"
    if not cfg_path.exists():
        cfg_path.write_text(json.dumps({**header, **fields}, indent=2))
    return RunLogger(run_dir, fields, cfg.tensorboard, cfg.track, cfg.wandb_project_name, run_dir.name)


def truncate_metrics(path: Path, max_update: int) -> None:
    """Drop records past ``max_update`` (written after the last checkpoint of an interrupted run)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break
        if rec.get("update", 0) <= max_update:
            keep.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(l + "\n" for l in keep))
    tmp.replace(path)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file."""
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
