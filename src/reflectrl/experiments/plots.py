"""Curves over training from run directories: one subplot per (metric, env), one line per method.

Each run's logged values are interpolated linearly on a common step grid (NaN outside the steps it logged);
a method's line is the mean over its seeds and its band Student's t 95% interval of that mean.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..errors import ReflectRLError
from ..eval.stats import interpolate_curve, mean_t_band
from .rundata import EPISODIC_RETURN, RunData, discover_runs, group_runs, load_run

GRID_POINTS = 200


def method_curve(runs: Sequence[RunData], metric: str, grid: np.ndarray) -> np.ndarray:
    """``[seeds, grid]``: each run's ``metric`` on ``grid`` (NaN where the run logged nothing around)."""
    return np.stack([interpolate_curve(*r.series(metric), grid) for r in runs]) if runs else np.zeros((0, len(grid)))


def _grid(runs: Iterable[RunData], metric: str, num_points: int) -> np.ndarray | None:
    """Evenly spaced steps from the first to the last step at which any of ``runs`` logged ``metric``."""
    steps = [s for r in runs for s in r.series(metric)[0]]
    if not steps:
        return None
    lo, hi = float(min(steps)), float(max(steps))
    return np.linspace(lo, hi, num_points) if hi > lo else np.array([lo])


def _label(metric: str) -> str:
    return "episodic return" if metric == EPISODIC_RETURN else metric


def plot_runs(runs: Sequence[RunData], metrics: str | Sequence[str], out: str | Path,
              num_points: int = GRID_POINTS, confidence: float = 0.95) -> Path:
    """Draw ``metrics`` (rows) for every env (columns) of ``runs`` into the image file ``out``."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    groups = group_runs(runs)
    if not any(len(r.series(m)[0]) for r in runs for m in metrics):
        available = sorted({k for r in runs for rec in r.records for k in rec if k != "global_step"})
        raise ReflectRLError(f"none of the {len(runs)} runs logged {', '.join(metrics)}; logged metrics: "
                             f"{', '.join(available) or 'none'}")
    method_order = list(dict.fromkeys(m for env in groups.values() for m in env))
    colors = {m: f"C{i % 10}" for i, m in enumerate(method_order)}
    envs = list(groups)
    fig = Figure(figsize=(5.0 * len(envs), 3.6 * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), len(envs), squeeze=False)
    for i, metric in enumerate(metrics):
        for j, env in enumerate(envs):
            ax = axes[i][j]
            grid = _grid((r for rs in groups[env].values() for r in rs), metric, num_points)
            if grid is None:
                ax.text(0.5, 0.5, f"no {metric} logged", ha="center", va="center", transform=ax.transAxes)
            else:
                for method, rs in groups[env].items():
                    ys = method_curve(rs, metric, grid)
                    if not np.isfinite(ys).any():
                        continue
                    mean, low, high = mean_t_band(ys, confidence)
                    n = len(rs)
                    ax.plot(grid, mean, color=colors[method], label=f"{method} (n={n})", lw=1.6)
                    ax.fill_between(grid, low, high, color=colors[method], alpha=0.2, lw=0)
                ax.legend(fontsize=8)
            ax.set_title(env if len(metrics) == 1 else f"{env}: {metric}", fontsize=10)
            ax.set_xlabel("environment steps")
            ax.set_ylabel(_label(metric))
            ax.grid(alpha=0.3)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def plot_metric_over_time(run_dirs: Iterable[str | Path], metric: str | Sequence[str], out: str | Path,
                          num_points: int = GRID_POINTS) -> Path:
    """Plot one or more logged metrics (e.g. ``reflection/L_cal``, ``reflection/b_cal_mean``) over training.

    ``run_dirs`` are run directories or folders holding them; runs are grouped by env and method (the
    label ``reflectrl compare`` gave them, else config.json's ``algo``); the result is written to ``out``."""
    runs = [load_run(d) for d in discover_runs(run_dirs)]
    return plot_runs(runs, metric, out, num_points)
