"""What the commands of both front ends share: continuing a run with ``--resume`` under the same rules on
both, the checks of seeds and devices, and running a command so that a user's error is one line (no
traceback), a warning is one line, and a signal or a closed pipe ends it cleanly."""

from __future__ import annotations

import argparse
import contextlib
import json
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ConfigError
from ..runlog import strict

SEED_MAX = 2**63 - 1  # reflectrl.trainer.SEED_MAX (not imported: keeps the CLI's start light)


class QuietParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise ConfigError (one ``error: ...`` line) instead of printing the
    usage and exiting."""

    def error(self, message: str) -> Any:
        raise ConfigError(f"{self.prog}: {message}")


def check_seed(seed: Any, flag: str = "--seed") -> int:
    """``seed`` if it is an integer in [0, 2^63 - 1] (what every random stream accepts), else ConfigError."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"{flag} must be an integer in [0, 2^63 - 1], got {seed}")
    return seed


def check_device(device: str, flag: str = "--device") -> str:
    """``device`` if torch can use it here, else ConfigError saying why (an unknown name, or CUDA / MPS that
    this torch build or machine does not have)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"{flag} {device!r} is not a torch device; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{flag} {device}: this torch cannot use CUDA here (torch.cuda.is_available() is "
                              f"False; torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                              "use --device cpu or a CUDA build of torch on a machine with a GPU")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{flag} {device}: there are {torch.cuda.device_count()} CUDA devices "
                              "(torch.cuda.device_count())")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{flag} {device}: torch.backends.mps.is_available() is False on this machine")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{flag} {device}: only cpu, cuda and mps devices are supported")
    return device


def foreign_flags(rest: Sequence[str], kind: str, algo: str) -> None:
    """ConfigError in one line for a flag that ``--algo algo`` does not take but another algo of front end ``kind``
    does (a method's option given to the wrong method), naming the algos that take it."""
    import dataclasses

    from ..algos import algo_table

    table = algo_table(kind)
    fields = lambda a: {f.name for f in dataclasses.fields(table[a].config_cls)}  # noqa: E731
    own = fields(algo)
    for tok in rest:
        if not tok.startswith("--") or tok == "--":
            continue
        name = tok[2:].split("=", 1)[0].replace("-", "_")
        candidates = {name, name[3:] if name.startswith("no_") else name}
        if candidates & own:
            continue
        takers = sorted(a for a in table if candidates & fields(a))
        if takers:
            flag = tok.split("=", 1)[0]
            raise ConfigError(f"{flag} is a flag of --algo {', '.join(takers)}, not of --algo {algo}")


def config_from_flags(default: Any, rest: list[str], prog: str, kind: str, probe_run_dir: bool = True) -> Any:
    """The config of a new run: ``default`` (an algo's config, with any preset or implied defaults) updated by the
    flags ``rest``; a ``--run-dir`` it names is refused in one line when it holds something of another kind or
    cannot be written (``probe_run_dir`` False: another process checks it)."""
    import tyro

    from ..runlog import ensure_writable_dir, guard_folder

    cfg = tyro.cli(type(default), args=rest, default=default, prog=prog)
    if cfg.run_dir and probe_run_dir:
        guard_folder(cfg.run_dir, f"{kind} run", "--run-dir")
        ensure_writable_dir(cfg.run_dir, "--run-dir", create=False)
    return cfg


def merge_task_options(*given: tuple[str, Sequence[str]]) -> tuple[str, ...]:
    """One list of task options from the flags that give them (``--set``, ``--task-options``, ``--task-option``:
    aliases), in order, each KEY once; ConfigError naming both flags when one KEY gets two values."""
    from ..tasks.base import parse_options

    seen: dict[str, tuple[str, Any]] = {}
    out: list[str] = []
    for flag, items in given:
        for item in items:
            ((key, val),) = parse_options([item]).items()
            if key in seen:
                if seen[key][1] != val:
                    raise ConfigError(f"task option {key} is given twice with different values: {seen[key][0]} "
                                      f"{key}={seen[key][1]!r} and {flag} {item}; give it once (--set KEY=VALUE)")
                continue
            seen[key] = (flag, val)
            out.append(item)
    return tuple(out)


def resume_from_cli(run_dir: str, rest: list[str], kind: str, algo: str | None, preset: str | None = None) -> Any:
    """The trainer of ``--resume RUN_DIR [--BUDGET N] [...]``. The run continues as it was configured: a
    different ``--algo`` or a ``--preset`` is refused; the budget may grow (never shrink below what is
    done); the progress bar, time limits and (LLM) the base model's path may change."""
    from ..algos import resume, run_algo

    budget_flag = "--total-timesteps" if kind == "control" else "--updates"
    resume_cmd = "reflectrl train" if kind == "control" else "reflectrl llm train"
    ap = QuietParser(prog=f"{resume_cmd} --resume RUN_DIR",
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
    except ConfigError:
        raise ConfigError(f"--resume continues a run as it was configured; {budget_flag}, --time-limit-s, "
                          "--cpu-time-limit-s and --no-progress" + (" and --model" if kind == "llm" else "")
                          + f" are the flags it takes (got {' '.join(rest)})") from None
    run = run_algo(run_dir)
    if run.kind != kind:
        other = "reflectrl train" if run.kind == "control" else "reflectrl llm train"
        raise ConfigError(f"{run_dir} is a {run.kind} run: continue it with `{other} --resume {run_dir}`")
    if algo is not None and algo != run.name:
        raise ConfigError(f"{run_dir} is a run of --algo {run.name}; --resume continues it as such "
                          f"(drop --algo {algo})")
    if preset is not None:
        raise ConfigError("--resume continues a run with its own settings; --preset cannot be combined with it")
    if kind == "llm":
        from pathlib import Path

        from ..trainer import read_config_json

        raw = read_config_json(run_dir)
        check_device(str(raw.get("device", "cpu")), "the run's device")
        from ..llm.models import base_model_of

        model = base_model_of(str(raw.get("model") or ""), str(raw.get("model_name") or ""))
        if extra.model is None and model and not Path(model).exists() and model == raw.get("model"):
            raise ConfigError(f"the base model of {run_dir}, {model}, does not exist (moved?): give its new place "
                              f"with `{resume_cmd} --resume {run_dir} --model PATH`")
    overrides: dict[str, Any] = {"progress": False} if extra.no_progress else {}
    for key in ("time_limit_s", "cpu_time_limit_s", "model"):
        if getattr(extra, key, None) is not None:
            overrides[key] = getattr(extra, key)
    return resume(run_dir, extra.budget, **overrides)


def print_json(obj: Any) -> None:
    """One line of strict JSON on stdout (NaN and inf become null; a closed pipe is not an error)."""
    import sys

    try:
        print(json.dumps(strict(obj)), flush=True)
    except BrokenPipeError:
        sys.stdout = None  # type: ignore[assignment]


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                  line: Any = None) -> None:
    """One ``warning: ...`` line on stderr (no source line, no file name)."""
    import sys

    text = str(message).replace("\n", " ")
    if not issubclass(category, UserWarning):
        text = f"{category.__name__}: {text}"
    with contextlib.suppress(OSError, ValueError):
        print(f"warning: {text}", file=file or sys.stderr, flush=True)


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Within the block, a warning prints as one ``warning: ...`` line (the previous display is restored)."""
    old = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        yield
    finally:
        warnings.showwarning = old


def run_command(fn: Any, argv: list[str]) -> int:
    """Run a CLI command: a user's error is one ``error: ...`` line and exit status 2; a run stopped by a
    signal says where its checkpoint is and exits 128 + the signal (143 for SIGTERM, 130 for SIGINT);
    an interrupt elsewhere exits 130 with no hint to resume; a closed stdout pipe is not an error."""
    import os
    import sys

    from .. import trainer
    from ..errors import ReflectRLError
    from ..trainer import TrainingStopped

    trainer.SECOND_INTERRUPT_EXITS = True  # a double Ctrl-C ends the process in one line, never a hang
    try:
        with one_line_warnings():
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
