"""What ``reflectrl train`` and ``reflectrl llm train`` share: continuing a run with ``--resume`` under the
same rules on both front ends, and building a new run's trainer into a free run directory."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .errors import ConfigError


def resume_from_cli(run_dir: str, rest: list[str], kind: str, algo: str | None, preset: str | None = None) -> Any:
    """The trainer of ``--resume RUN_DIR [--BUDGET N] [...]``. The run continues as it was configured: a
    different ``--algo`` or a ``--preset`` is refused; the budget may grow (never shrink below what is
    done); the progress bar, time limits and (LLM) the base model's path may change."""
    from .algos import resume, run_algo

    budget_flag = "--total-timesteps" if kind == "control" else "--updates"
    resume_cmd = "reflectrl train" if kind == "control" else "reflectrl llm train"
    ap = argparse.ArgumentParser(prog=f"{resume_cmd} --resume RUN_DIR",
                                 description="Continue a run from its latest checkpoint, as it was configured.")
    ap.add_argument(budget_flag, type=int, default=None, dest="budget",
                    help="train to this budget in total (it stays in config.json for later resumes)")
    ap.add_argument("--time-limit-s", type=float, default=None, help="stop after this much wall time")
    ap.add_argument("--cpu-time-limit-s", type=float, default=None, help="stop after this much CPU time")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    if kind == "llm":
        ap.add_argument("--model", default=None, help="the base model's directory, if it has moved")
    try:
        extra = ap.parse_args(rest)
    except SystemExit as exc:
        if exc.code == 0:
            raise
        raise ConfigError(f"--resume continues a run as it was configured; {budget_flag}, --time-limit-s, "
                          "--cpu-time-limit-s and --no-progress" + (" and --model" if kind == "llm" else "")
                          + " are the flags it takes") from None
    run = run_algo(run_dir)
    if run.kind != kind:
        other = "reflectrl train" if run.kind == "control" else "reflectrl llm train"
        raise ConfigError(f"{run_dir} is a {run.kind} run: continue it with `{other} --resume {run_dir}`")
    if algo is not None and algo != run.name:
        raise ConfigError(f"{run_dir} is a run of --algo {run.name}; --resume continues it as such (drop --algo {algo})")
    if preset is not None:
        raise ConfigError("--resume continues a run with its own settings; --preset cannot be combined with it")
    overrides: dict[str, Any] = {"progress": False} if extra.no_progress else {}
    for key in ("time_limit_s", "cpu_time_limit_s", "model"):
        if getattr(extra, key, None) is not None:
            overrides[key] = getattr(extra, key)
    return resume(run_dir, extra.budget, **overrides)


def print_json(obj: Any) -> None:
    """One JSON line on stdout (a closed pipe is not an error)."""
    import sys

    try:
        print(json.dumps(obj), flush=True)
    except BrokenPipeError:
        sys.stdout = None  # type: ignore[assignment]


def run_command(fn: Any, argv: list[str]) -> int:
    """Run a CLI command: a user's error is one ``error: ...`` line and exit status 2; a run stopped by a
    signal says where its checkpoint is and exits 128 + the signal (143 for SIGTERM, 130 for SIGINT);
    an interrupt elsewhere exits 130 with no hint to resume; a closed stdout pipe is not an error."""
    import os
    import sys

    from .errors import ReflectRLError
    from .trainer import TrainingStopped

    try:
        return fn(argv)
    except TrainingStopped as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    except ReflectRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
