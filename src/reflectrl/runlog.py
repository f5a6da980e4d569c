"""Run directories: ``config.json``, ``metrics.jsonl`` (one object per update), TensorBoard, W&B."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigError, ReflectRLError


def strict(obj: Any) -> Any:
    """``obj`` with every NaN and infinite float, in nested dicts, lists and tuples too, replaced by None: what
    ``json.dumps`` then writes is strict JSON (a missing value is ``null``, never the bare ``NaN`` most readers
    reject)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


@contextlib.contextmanager
def staged_folder(dst: str | Path) -> Iterator[Path]:
    """A temporary sibling of ``dst`` to write into, moved into ``dst``'s place (replacing what was there) when the
    block ends without an error: an interrupted write leaves the previous folder (or nothing), never a mix."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        yield tmp
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class RunLogger:
    """Writes one JSON object per update to ``metrics.jsonl`` and the same scalars to TensorBoard (one
    event per update holding all its scalars: what ``add_scalar`` per scalar writes, in one record)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], tensorboard: bool = True, track: bool = False,
                 wandb_project: str = "reflectrl", run_name: str | None = None, purge_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._fh = open(self.metrics_path, "a", buffering=1)  # noqa: SIM115 (open for the logger's life; close())
        self._tb = None
        if tensorboard:
            from tensorboard.compat.proto.summary_pb2 import Summary
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge_step)
            self._summary, self._value = Summary, Summary.Value
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
            value = self._value
            scalars = [value(tag=k, simple_value=float(v)) for k, v in rec.items()
                       if k != "global_step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
            if scalars:  # SummaryWriter.add_scalar's summaries (simple_value), all of this step in one event
                self._tb._get_file_writer().add_summary(self._summary(value=scalars), step)
        if self._wandb is not None:
            self._wandb.log(rec, step=step)

    def close(self) -> None:
        """Flush and close every sink."""
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _dir_problem(p: Path, create: bool) -> str | None:
    """Why the directory ``p`` cannot be written (None when it can): it or a parent is a file, or it cannot
    be made or written (``/proc``, ``/sys``, a read-only disk, no permission). Directories made for the
    check are removed again unless ``create``."""
    import os

    for parent in (p, *p.parents):
        if parent.exists() and not parent.is_dir():
            return "is a file, not a directory" if parent == p else f"is under {parent}, which is a file"
    made = [d for d in (p, *p.parents) if not d.exists()]
    probe = p / f".reflectrl-write-check-{os.getpid()}"
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    finally:
        if not create:
            for d in made:  # deepest first
                try:
                    d.rmdir()
                except OSError:
                    break
    return None


def ensure_writable_dir(path: str | Path, what: str, create: bool = True) -> Path:
    """Check that ``path`` is a directory this process can write (making it), or raise ConfigError in one
    line naming ``what`` (a flag such as ``--run-dir``). Without ``create`` the directories made for the
    check are removed again, so a command that fails later leaves nothing behind."""
    p = Path(path)
    problem = _dir_problem(p, create)
    if problem:
        raise ConfigError(f"{what} {p} {problem}; choose another path")
    return p


def ensure_writable_file(path: str | Path, what: str) -> Path:
    """Check that the file ``path`` can be written (its directory exists or can be made; it is not made
    here), or raise ConfigError naming ``what``."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a directory; give a file name")
    problem = _dir_problem(p.parent, create=False)
    if problem:
        raise ConfigError(f"{what} {p}: its directory {p.parent} {problem}; choose another path")
    return p


def folder_kind(path: str | Path) -> str | None:
    """What a folder holds, as far as reflectrl writes folders: ``"model"`` (a Hugging Face model folder, or a LoRA
    adapter folder: a LoRA run's exported model), ``"llm run"`` or ``"control run"`` (a run directory),
    ``"comparison"`` (``compare`` / ``llm compare`` output), or None (missing, empty, or anything else)."""
    p = Path(path)
    if not p.is_dir():
        return None
    cfg = p / "config.json"
    if cfg.is_file():
        try:
            data = json.loads(cfg.read_text())
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict):
            if data.get("kind") in ("llm", "control"):
                return f"{data['kind']} run"
            if "model_type" in data or "architectures" in data:
                return "model"
            if "env_id" in data:  # a control run from before the kind field
                return "control run"
    if (p / "adapter_config.json").is_file():
        return "model"
    if (p / "runs").is_dir() and ((p / "report.md").is_file() or (p / "models").is_dir()):
        return "comparison"
    return None


def guard_folder(path: str | Path, writes: str, what: str) -> None:
    """ConfigError in one line when ``path`` holds something of another kind than ``writes`` (see
    :func:`folder_kind`): no command writes a run into a model folder, a model into a run, and so on, with or
    without ``--force``."""
    kind = folder_kind(path)
    if kind is not None and kind != writes:
        raise ConfigError(f"{what} {path} holds {_a(kind)}; reflectrl will not write {_a(writes)} into it "
                          "(--force does not change that): choose another folder")


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def claim_output_dir(path: str | Path, what: str, force: bool, stale: tuple[str, ...] = ()) -> Path:
    """A directory to write a model into: ConfigError if it holds a run or a comparison (whatever ``force``
    says), if it already holds files (unless ``force``; then the ``stale`` files of what was there, which the
    new contents would not replace, are removed), or if it cannot be written."""
    guard_folder(path, "model", what)
    p = ensure_writable_dir(path, what, create=False)
    if p.is_dir() and any(p.iterdir()):
        if not force:
            raise ConfigError(f"{what} {p} is not empty; choose a new directory, or add --force to replace "
                              "what it holds")
        for name in stale:
            (p / name).unlink(missing_ok=True)
    return p


_WRITTEN: dict[str, tuple[str, tuple]] = {}  # config.json path -> (text this process wrote, its stat then)


def _stat_key(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


def write_config(run_dir: Path, header: dict[str, Any], cfg: Any) -> None:
    """Write ``RUN_DIR/config.json`` (``header`` + the config dataclass) atomically. When this process
    wrote the same text there last and the file is still that one (inode, size, mtime), it is left as
    it is: a checkpoint's save rewrites it only when the config changed."""
    import dataclasses
    import os

    path = Path(run_dir) / "config.json"
    text = json.dumps({**dataclasses.asdict(cfg), **header}, indent=2)
    key = str(path.absolute())
    last = _WRITTEN.get(key)
    if last is not None and last[0] == text and last[1] == _stat_key(path):
        return
    tmp = path.with_name(f".config.json.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    stat = _stat_key(path)
    if stat is not None:
        _WRITTEN[key] = (text, stat)


def open_run(run_dir: Path, header: dict[str, Any], cfg: Any, fresh: bool = True, extra_logs: tuple[str, ...] = (),
             purge_step: int | None = None) -> RunLogger:
    """Create ``run_dir``, write ``config.json`` and open the run's logger with the config's TensorBoard /
    W&B settings. A fresh run first removes what a run that never checkpointed left there (its
    metrics, ``extra_logs`` and TensorBoard events); a resumed run rewrites ``config.json`` (its budget
    may have grown) and TensorBoard drops the events past ``purge_step`` that the interrupted run wrote
    after its last checkpoint."""
    import dataclasses
    import shutil

    run_dir = ensure_writable_dir(run_dir, "run directory")
    try:
        if fresh:
            for name in ("metrics.jsonl", *extra_logs):
                (run_dir / name).unlink(missing_ok=True)
            shutil.rmtree(run_dir / "tb", ignore_errors=True)
        write_config(run_dir, header, cfg)
    except OSError as exc:
        raise ReflectRLError(f"cannot write the run directory {run_dir}: {exc.strerror or exc}") from None
    return RunLogger(run_dir, dataclasses.asdict(cfg), cfg.tensorboard, cfg.track, cfg.wandb_project_name,
                     run_dir.name, purge_step)


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


_SEED_METRICS = {
    ("refgrpo", "refgrpo-seed"): "L_cal_pre L_cal_train L_cal_unseen L_cal_heldout b_cal_mean b_cal_std bonus_clip_frac "
                                 "clip_c beta bonus_to_reward",
    ("gear", "gear-seed"): "omega_mean omega_std omega_min omega_max omega_clip_frac tau vd_loss winners groups_completed "
                           "winner_steps pending_groups rank_pairs rank_loss",
    ("exgrpo", "exgrpo-seed"): "refl_mean refl_std refl_kept_frac coef refl_loss priority_max priority_min priority_entropy "
                               "buffer_size lm_graded lm_malformed_frac lm_too_long_frac lm_agreement",
}
RENAMED_METRICS: dict[str, str] = {f"{old}/{k}": f"{new}/{k}" for (old, new), keys in _SEED_METRICS.items()
                                   for k in keys.split()}
"""Metric names of the seed methods before each method logged under its own name (refgrpo-seed's calibration
fit, gear-seed's omega, exgrpo-seed's reflection memory were logged under ``refgrpo/``, ``gear/``, ``exgrpo/``, which
the paper methods of those names use too): a run written before reads under today's names."""


def current_names(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` with any metric of :data:`RENAMED_METRICS` under its current name."""
    if not any(k in RENAMED_METRICS for k in rec):
        return rec
    return {RENAMED_METRICS.get(k, k): v for k, v in rec.items()}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file (metrics under their current names: :data:`RENAMED_METRICS`)."""
    return [current_names(json.loads(l)) for l in Path(path).read_text().splitlines() if l.strip()]


PROCESS_FIELDS = ("rollout/reward_cache_hits",)
"""Metrics that describe the process rather than the run: the reward cache lives in memory and is not part of a
checkpoint, so a resumed run scores again the completions an uninterrupted one would have found in its cache (the
rewards are the same; the count of hits is not)."""


def is_process_field(key: str) -> bool:
    """Timing fields (``time/*``, throughputs ``*per_s``, ``charts/SPS``) and :data:`PROCESS_FIELDS`: what two runs
    of the same configuration may differ in while their behaviour is the same."""
    return key.startswith("time/") or "per_s" in key or key == "charts/SPS" or key in PROCESS_FIELDS


def behaviour(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` without their process fields (:func:`is_process_field`): what resume and same-seed equality
    compare."""
    return [{k: v for k, v in r.items() if not is_process_field(k)} for r in records]
