"""Reading finished or partial run directories: labels, logged curves, evaluation, wall time.

A run directory holds ``config.json`` (with ``algo`` and ``env_id``), ``metrics.jsonl`` (one record per
update, ``global_step`` first), and, when ``reflectrl compare`` ran it, ``run.json`` (the method label, the
train arguments and the wall time of each attempt) and ``eval.json`` (``reflectrl eval --json``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ReflectRLError
from ..runlog import current_names

EPISODIC_RETURN = "charts/episodic_return"


def read_json(path: Path) -> dict[str, Any] | None:
    """The object in ``path``, or None when the file is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (metrics under their current names); a torn last line (a run killed
    mid-write) is skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(current_names(rec))
    return out


@dataclass
class RunData:
    """One run directory, read once."""

    run_dir: Path
    method: str
    algo: str
    env_id: str
    seed: int | None
    total_timesteps: int | None
    records: list[dict[str, Any]] = field(default_factory=list)
    eval: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def series(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """``(global_step, value)`` of every record that logged ``metric`` as a number."""
        pts = [(r["global_step"], r[metric]) for r in self.records
               if isinstance(r.get(metric), (int, float)) and not isinstance(r.get(metric), bool)
               and isinstance(r.get("global_step"), (int, float))]
        if not pts:
            return np.zeros(0), np.zeros(0)
        a = np.asarray(pts, float)
        return a[:, 0], a[:, 1]

    @property
    def final_return(self) -> float | None:
        """The mean return of the evaluation episodes (``eval.json``), None before evaluation."""
        return None if not self.eval or self.eval.get("mean") is None else float(self.eval["mean"])

    @property
    def last_step(self) -> int:
        steps = [r["global_step"] for r in self.records if isinstance(r.get("global_step"), (int, float))]
        return int(max(steps)) if steps else 0

    @property
    def train_wall_s(self) -> float | None:
        """Wall time of the training processes over every recorded attempt (train and resumes)."""
        return self._attempt_sum("wall_s")

    @property
    def learn_s(self) -> float | None:
        """Seconds inside the training loop (the trainer's own ``wall_s``) over every recorded attempt."""
        return self._attempt_sum("learn_s")

    @property
    def train_attempts(self) -> list[dict]:
        """The ``reflectrl train`` attempts recorded in ``run.json`` (train and resumes; evaluations left out)."""
        return [a for a in self.info.get("attempts", []) if a.get("kind") in ("train", "resume")]

    @property
    def killed_attempts(self) -> int:
        """Training attempts that started but never recorded an end (their process was killed), so
        ``train_wall_s`` and ``learn_s`` leave their time out."""
        return sum(1 for a in self.train_attempts if a.get("status") is None)

    def _attempt_sum(self, key: str) -> float | None:
        vals = [a[key] for a in self.train_attempts if key in a]
        return float(sum(vals)) if vals else None


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; raises ReflectRLError when it has no readable ``config.json``."""
    run_dir = Path(run_dir)
    cfg = read_json(run_dir / "config.json")
    if cfg is None:
        raise ReflectRLError(f"{run_dir} is not a reflectrl run directory (no readable config.json)")
    info = read_json(run_dir / "run.json") or {}
    algo = str(cfg.get("algo", "ppo"))
    return RunData(run_dir=run_dir, method=run_label(run_dir, info, algo), algo=algo,
                   env_id=str(cfg.get("env_id", "?")), seed=cfg.get("seed"),
                   total_timesteps=info.get("total_timesteps", cfg.get("total_timesteps")),
                   records=read_records(run_dir / "metrics.jsonl"), eval=read_json(run_dir / "eval.json"), info=info)


def run_label(run_dir: Path, info: dict[str, Any], algo: str) -> str:
    """The method label of a run. In a ``reflectrl compare`` layout (``.../{label}/seed_{s}`` with a
    ``run.json``) it is the folder's name, so a run linked or copied in from a comparison that named it
    otherwise takes the label of the folder it sits in; elsewhere ``run.json``'s label, or the algo."""
    if info and re.fullmatch(r"seed_\d+", run_dir.name):
        return run_dir.parent.name
    return str(info.get("method", algo))


def _config_dirs(root: Path) -> list[Path]:
    """Folders under ``root`` holding ``config.json``, following symbolic links (each real folder once)."""
    found, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames.clear()
            continue
        seen.add(real)
        if "config.json" in filenames:
            found.append(Path(dirpath))
    return sorted(found)


def discover_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories named by ``paths``: each path is a run directory (it holds ``config.json``) or a folder
    searched recursively for them (a ``reflectrl compare`` output, a ``runs/`` folder)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ReflectRLError(f"{p} does not exist")
        if (p / "config.json").is_file():
            found.append(p)
        else:
            found.extend(_config_dirs(p))
    unique = list(dict.fromkeys(found))
    if not unique:
        raise ReflectRLError(f"no run directories (folders with config.json) under {', '.join(map(str, paths))}")
    return unique


def group_runs(runs: Iterable[RunData]) -> dict[str, dict[str, list[RunData]]]:
    """``{env_id: {method: [runs sorted by seed]}}``, envs and methods in order of first appearance."""
    out: dict[str, dict[str, list[RunData]]] = {}
    for r in runs:
        out.setdefault(r.env_id, {}).setdefault(r.method, []).append(r)
    for methods in out.values():
        for rs in methods.values():
            rs.sort(key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, str(r.run_dir)))
    return out
