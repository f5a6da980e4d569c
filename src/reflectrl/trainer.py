"""The trainer skeleton every algorithm shares: the learn loop, checkpoint cadence, state and resume,
stopping on a signal or a time limit, and run-directory loading.

A trainer (PPO, DQN, GRPO) subclasses :class:`Trainer` and keeps only what differs: one
:meth:`Trainer.iteration` (an update and its metrics record), how far along it is
(:attr:`Trainer.position` of :attr:`Trainer.total`), and the parts of its state beyond what every
trainer has (modules, optimizers, random streams, counters, method hooks). The loop here logs one
record per iteration, checkpoints every ``save_interval`` records and at the end, and stops
cleanly at the next safe point on SIGTERM or SIGINT (a checkpoint is written first, so nothing since
the signal is lost) or when a wall / CPU time limit is reached.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_checkpoint, pack_hooks, pack_optimizer, save_checkpoint, unpack_hooks, unpack_optimizer
from .errors import CheckpointError, ConfigError, ReflectRLError
from .progress import Budget, TrainProgress
from .runlog import guard_folder, open_run, truncate_metrics, write_config

CHECKPOINT = "checkpoint.safetensors"
SEED_MAX = 2**63 - 1


@dataclass
class RunOptions:
    """Options every trainer has: seed, run directory, checkpoints, time limits and logging."""

    seed: int = 1
    """Seed of every random stream of the run (initialization, sampling, ordering, resets)."""
    run_dir: str | None = None
    """Where metrics, TensorBoard events and checkpoints go (default runs/<name>__<algo>__<seed>__<unix time>)."""
    save_interval: int = 10
    """Checkpoint every this many updates (and always at the end); 0 saves only at the end."""
    time_limit_s: float | None = None
    """Stop (with a checkpoint) once this much wall time has passed."""
    cpu_time_limit_s: float | None = None
    """Stop (with a checkpoint) once this much CPU time has been used by the trainer (all threads) and the
    processes it ran (sandboxed tests): a compute budget that does not depend on what else the machine runs."""
    on_nonfinite: str = "stop"
    """A NaN or inf in an observation, advantage or loss: stop the run (the last good checkpoint is kept) or
    skip (leave out the optimizer steps it would poison and go on)."""
    threads: int = 1
    """torch CPU threads."""
    progress: bool = True
    """Show progress on stderr: a bar on a terminal, else a log line every 5% and at least every minute, with the
    time left."""
    tensorboard: bool = True
    """Write TensorBoard events to RUN_DIR/tb."""
    track: bool = False
    """Also log to Weights & Biases."""
    wandb_project_name: str = "reflectrl"
    """W&B project."""

    def run_checks(self) -> list[tuple[bool, str]]:
        """The checks of the shared options (a trainer's ``validate`` adds its own)."""
        return [
            (isinstance(self.seed, int) and 0 <= self.seed <= SEED_MAX,
             f"--seed must be an integer in [0, 2^63 - 1], got {self.seed}"),
            (self.save_interval >= 0, "--save-interval must be non-negative"),
            (self.threads >= 1, "--threads must be at least 1"),
            (self.time_limit_s is None or self.time_limit_s > 0, "--time-limit-s must be positive"),
            (self.cpu_time_limit_s is None or self.cpu_time_limit_s > 0, "--cpu-time-limit-s must be positive"),
            (self.on_nonfinite in ("stop", "skip"), f"--on-nonfinite must be stop or skip, got {self.on_nonfinite!r}"),
        ]


def check_all(checks: list[tuple[bool, str]]) -> None:
    """Raise ConfigError with the message of the first failed check."""
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)


class TrainingStopped(ReflectRLError):
    """Training stopped on a signal after writing a checkpoint; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int, run_dir: Path, update: int, resume_cmd: str):
        self.signum, self.run_dir, self.update = signum, run_dir, update
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} after update {update}; the checkpoint in {run_dir} holds it: "
                         f"continue with `{resume_cmd} {run_dir}`")


class NonFiniteError(ReflectRLError):
    """A NaN or inf reached a tensor the update depends on."""


SECOND_INTERRUPT_EXITS = False
"""Set by the command line (:func:`reflectrl.cli.util.run_command`): a second SIGINT ends the process at once with one
line and status 130, instead of raising KeyboardInterrupt wherever the main thread is (which could leave a lock
held and hang, or print a traceback from interpreter shutdown)."""


class StopRequests:
    """Turns SIGTERM and SIGINT into a request to stop at the next safe point (the main thread only;
    elsewhere the signals keep their handlers). A second SIGINT interrupts at once: in a command-line process it
    ends the process with the line ``at_once()`` gives (the last checkpoint stays as it was written, atomically,
    and resumes), and keeps doing so until the process has exited; in a library call it raises KeyboardInterrupt."""

    def __init__(self, at_once: Callable[[], str] | None = None) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        self.at_once = at_once

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _exit_now(self, signum: int, frame: Any = None) -> None:
        import os
        import sys

        try:
            line = self.at_once() if self.at_once is not None else "interrupted"
            sys.stderr.write(f"{signal.Signals(signum).name} again: stopped at once; {line}\n")
            sys.stderr.flush()
        finally:
            os._exit(128 + signum)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            if SECOND_INTERRUPT_EXITS:
                self._exit_now(signum)
            raise KeyboardInterrupt
        self.signum = signum
        import sys

        print(f"{signal.Signals(signum).name}: stopping after this update with a checkpoint"
              + (" (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""), file=sys.stderr, flush=True)

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            # a command-line process that is stopping keeps ending at once on another Ctrl-C while it shuts down
            late = SECOND_INTERRUPT_EXITS and self.requested and s == signal.SIGINT
            signal.signal(s, self._exit_now if late else h)


def ignore_late_interrupts() -> None:
    """Called by a command-line process as it returns its exit status: if a SIGINT stop was requested, a further
    Ctrl-C while the interpreter shuts down changes nothing (the status stays 130). Python's shutdown resets its
    own signal handlers to the default, under which a late SIGINT would kill the process (status -2, not 130);
    an ignored signal stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGINT)
    if getattr(handler, "__func__", None) is StopRequests._exit_now:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Leave what exists when a run starts out of the cyclic garbage collector's scans until it ends.

    A run's process holds a few hundred thousand long-lived objects (torch, transformers, the model's modules), and
    each full collection walks all of them again, every few updates of a short GRPO step, for nothing, as they
    outlive the run (``benchmarks/llm_throughput.py`` reports the collector's share of a step). ``gc.freeze`` moves them to the
    permanent generation, which collections skip; ``gc.unfreeze`` at the end gives them back, so anything frozen
    that has become garbage meanwhile is collected as usual later. No computation changes: only when the collector
    runs, and over what.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def cpu_seconds() -> float:
    """CPU time of this process (all threads) plus that of the child processes it has waited for."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


class Clock:
    """Wall and CPU time since a run (or its resumption) started."""

    def __init__(self) -> None:
        self.t0, self.cpu0 = time.perf_counter(), cpu_seconds()

    @property
    def wall(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def cpu(self) -> float:
        return cpu_seconds() - self.cpu0

    def out_of_time(self, cfg: RunOptions) -> bool:
        return (cfg.time_limit_s is not None and self.wall >= cfg.time_limit_s) or (
            cfg.cpu_time_limit_s is not None and self.cpu >= cfg.cpu_time_limit_s)


def budgets(cfg: RunOptions, clock: Clock) -> list[Budget]:
    """The time limits of a run, as the progress bar shows them (what is used of each, read from ``clock``)."""
    out = []
    if cfg.cpu_time_limit_s is not None:
        out.append(Budget("CPU", cfg.cpu_time_limit_s, lambda: clock.cpu))
    if cfg.time_limit_s is not None:
        out.append(Budget("wall", cfg.time_limit_s, lambda: clock.wall))
    return out


class Trainer:
    """The shared skeleton (see the module docstring). Subclasses set ``kind``, ``budget_field``,
    ``resume_cmd``, build ``cfg``, ``hooks``, ``gen``, ``optimizer``, ``run_dir`` and implement
    :meth:`iteration`, :attr:`position`, :attr:`total`, :attr:`finished`, :meth:`state_extra` and
    :meth:`load_extra`."""

    kind = "control"
    algo_name = ""
    budget_field = "total_timesteps"
    budget_flag = "--total-timesteps"
    resume_cmd = "reflectrl train --resume"
    extra_logs: tuple[str, ...] = ()  # files beside metrics.jsonl with one record per update (samples.jsonl)
    cfg: Any
    hooks: list[Any]
    gen: torch.Generator
    optimizer: torch.optim.Optimizer
    run_dir: Path
    update_idx: int = 0

    # ------------------------------------------------------------------ what a trainer provides
    def iteration(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def position(self) -> int:
        """Progress in the unit of :attr:`total` (env steps, updates)."""
        raise NotImplementedError

    @property
    def total(self) -> int:
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        raise NotImplementedError

    @property
    def log_step(self) -> int:
        """The x-axis value of the latest record (``global_step``; TensorBoard's step)."""
        return int(getattr(self, "global_step", self.position))

    def describe(self) -> str:
        """The progress bar's label."""
        return self.algo_name

    def add_rates(self, rec: dict[str, Any], clock: Clock, start: int) -> None:
        """Add throughput fields to a record (``position`` was ``start`` when the clock started)."""

    def bar_values(self, rec: dict[str, Any]) -> tuple[float, float | None]:
        """(rate, value) the progress bar shows for the latest record."""
        return 0.0, None

    def bar_labels(self) -> tuple[str, str]:
        return "steps/s", "return"

    def after_iteration(self, rec: dict[str, Any], last: bool) -> None:
        """Work between an iteration and its logging (evaluation, sample logs)."""

    def finalize(self) -> None:
        """Work after the last iteration (exporting a model)."""

    def close(self) -> None:
        """Release resources (env workers, thread pools)."""

    def summary(self, clock: Clock, start: int) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "updates": self.update_idx, "wall_s": clock.wall}

    def state_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Add the trainer's own state (models, envs, buffers, counters)."""
        raise NotImplementedError

    def load_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        raise NotImplementedError

    def after_load(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Work after the state is restored (rebuild envs, sync an engine)."""

    @property
    def is_main(self) -> bool:
        """True in the process that writes the run directory: always, except in the processes of a distributed
        run other than rank 0 (which train but write no logs, checkpoints or progress)."""
        return True

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """The flags as every process of a distributed run sees them (true where any process's is), so they all
        stop together; one process: as given."""
        return flags

    # ------------------------------------------------------------------ the loop
    def header(self) -> dict[str, Any]:
        return {"kind": self.kind, "algo": self.algo_name}

    def learn(self) -> dict[str, Any]:
        """Train until the budget (or a time limit, or a stop signal); log, checkpoint, return a summary."""
        cfg = self.cfg
        fresh = self.update_idx == 0
        if fresh:
            guard_folder(self.run_dir, f"{self.kind} run", "run directory")
        if fresh and (self.run_dir / CHECKPOINT).exists():
            raise ConfigError(f"run directory {self.run_dir} already holds a run; continue it with "
                              f"`{self.resume_cmd} {self.run_dir}` or choose another --run-dir")
        logger = open_run(self.run_dir, self.header(), cfg, fresh=fresh, extra_logs=self.extra_logs,
                          purge_step=None if fresh else self.log_step + 1) if self.is_main else _NoLog()
        clock, start = Clock(), self.position
        try:
            bar_args = (self.total, cfg.progress and self.is_main, self.describe(), *self.bar_labels())
            with (frozen_heap(), StopRequests(self._interrupted_line) as stop,
                  TrainProgress(*bar_args, start=start, budgets=budgets(cfg, clock)) as bar):
                while not self.finished:
                    self.current_update = self.update_idx + 1  # what finite() names (DQN counts at the end)
                    rec = self.iteration()
                    self.add_rates(rec, clock, start)
                    out_of_time, stopping = self.agree(clock.out_of_time(cfg), stop.requested)
                    last = self.finished or out_of_time or stopping
                    self.after_iteration(rec, last)
                    logger.log(rec)
                    if self.is_main and (last or (cfg.save_interval and self.update_idx % cfg.save_interval == 0)):
                        self.save()
                    bar.update(self.position, *self.bar_values(rec))
                    if stopping:
                        raise TrainingStopped(stop.signum or signal.SIGTERM, self.run_dir, self.update_idx,
                                              self.resume_cmd)
                    if out_of_time:
                        break
        finally:
            logger.close()
            self.close()
        self.finalize()
        return self.summary(clock, start)

    # ------------------------------------------------------------------ non-finite values
    def finite(self, name: str, x: torch.Tensor, where: str = "") -> bool:
        """True when ``x`` holds no NaN or inf. Otherwise raise :class:`NonFiniteError` naming the update,
        the tensor and the step (``on_nonfinite="stop"``), or return False so the caller skips what
        depends on it (``"skip"``, counted in ``health/skipped``)."""
        if bool(torch.isfinite(x).all()):
            return True
        if self.cfg.on_nonfinite == "skip":
            self.skipped = getattr(self, "skipped", 0) + 1
            return False
        saved, update = getattr(self, "saved_update", None), getattr(self, "current_update", self.update_idx)
        kept = (f"its last checkpoint, of update {saved}, in {self.run_dir} is kept" if saved is not None else
                f"it wrote no checkpoint before, so {self.run_dir} holds none")
        raise NonFiniteError(f"non-finite values (NaN or inf) in {name} at update {update}"
                             f"{', ' + where if where else ''}: the run stops and {kept} "
                             "(--on-nonfinite skip leaves such steps out instead)")

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything a resume needs, as tensors and JSON metadata."""
        tensors: dict[str, torch.Tensor] = {}
        opt_t, opt_meta = pack_optimizer("optim", self.optimizer)
        tensors.update(opt_t)
        tensors["rng/torch_gen"] = self.gen.get_state()
        tensors["rng/torch_global"] = torch.get_rng_state()
        meta: dict[str, Any] = {"format": 1, "kind": self.kind, "algo": self.algo_name, "update": self.update_idx,
                                "optim": opt_meta, "config": dataclasses.asdict(self.cfg)}
        self.state_extra(tensors, meta)
        pack_hooks(self.stateful(), tensors, meta)
        return tensors, meta

    def stateful(self) -> list[Any]:
        """The methods and hooks whose state goes into the checkpoint (each once)."""
        out: list[Any] = []
        for h in [*getattr(self, "methods", []), *self.hooks]:
            if not any(h is o for o in out):
                out.append(h)
        return out

    def _interrupted_line(self) -> str:
        """What a run stopped at once holds: its last checkpoint and how to continue, or that it has none."""
        saved = getattr(self, "saved_update", None)
        if saved is None or not (self.run_dir / CHECKPOINT).is_file():
            return f"{self.run_dir} holds no checkpoint yet: start the run again"
        return (f"the checkpoint of update {saved} in {self.run_dir} holds the run (later records are dropped on "
                f"resume): continue with `{self.resume_cmd} {self.run_dir}`")

    def save(self, path: Path | None = None) -> None:
        """Write the checkpoint atomically, and ``config.json`` beside it (so it always describes it)."""
        path = Path(path) if path is not None else self.run_dir / CHECKPOINT
        save_checkpoint(path, *self.state())
        if path.parent == self.run_dir:
            write_config(self.run_dir, self.header(), self.cfg)
            self.saved_update = self.update_idx

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Restore from :meth:`state` output."""
        try:
            self.optimizer.load_state_dict(unpack_optimizer("optim", tensors, meta["optim"]))
            self.gen.set_state(tensors["rng/torch_gen"])
            torch.set_rng_state(tensors["rng/torch_global"])
            self.update_idx = int(meta["update"])
            self.load_extra(tensors, meta)
            unpack_hooks(self.stateful(), tensors, meta)
        except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise CheckpointError(f"checkpoint does not match this configuration or is damaged ({exc})") from None
        self.after_load(tensors, meta)

    def load_run(self, run_dir: Path, loaded: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None) -> None:
        """Restore the latest checkpoint of ``run_dir`` (or ``loaded``, that checkpoint read already) and
        drop log records written after it."""
        tensors, meta = loaded if loaded is not None else load_checkpoint(run_dir / CHECKPOINT)
        self.load_state(tensors, meta)
        self.saved_update = self.update_idx
        for name in ("metrics.jsonl", *self.extra_logs) if self.is_main else ():
            truncate_metrics(run_dir / name, self.update_idx)


class _NoLog:
    """The logger of a distributed run's processes other than rank 0 (they write nothing)."""

    def log(self, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------- run directories
def read_config_json(run_dir: str | Path) -> dict[str, Any]:
    """``RUN_DIR/config.json`` as a dict, or CheckpointError saying why it cannot be read."""
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {run_dir} does not exist")
    if not path.is_file():
        raise CheckpointError(f"{run_dir} is not a reflectrl run directory (no config.json)")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} is corrupt (not a JSON object)")
    return raw


def run_kind(raw: dict[str, Any]) -> str:
    """``control`` or ``llm`` (runs that predate the field are control runs)."""
    return str(raw.get("kind", "control"))


def load_config(run_dir: str | Path, config_cls: type) -> Any:
    """Read ``RUN_DIR/config.json`` into ``config_cls`` (unknown keys are ignored, lists become tuples
    where the field is a tuple)."""
    raw = read_config_json(run_dir)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    try:
        kw = {k: (tuple(v) if isinstance(v, list) and "tuple" in str(fields[k].type) else v)
              for k, v in raw.items() if k in fields}
        return config_cls(**kw)
    except TypeError as exc:
        raise CheckpointError(f"{Path(run_dir) / 'config.json'} is corrupt ({exc})") from None


def extend_budget(cfg: Any, new: int | None, done: int, field: str, flag: str) -> None:
    """Set a resumed run's budget ``cfg.<field>`` to ``new``. A budget below what is done is refused; a run
    extended to a larger budget equals a fresh one of that budget only when no schedule follows the
    budget, so this warns naming those settings (``cfg.budget_schedules()``)."""
    import warnings

    old = getattr(cfg, field)
    if new is None or new == old:
        return
    if new < done:
        raise ConfigError(f"{flag} {new} is below what the run has done already ({done}); give a larger budget "
                          "or evaluate the run as it is")
    moved = cfg.budget_schedules()
    if moved:
        warnings.warn(f"changing {flag} from {old} to {new} moves the schedule of {', '.join(moved)}, which "
                      f"follow the budget: the steps already taken used the old schedule, so this run will "
                      f"differ from a fresh run of {new}", stacklevel=2)
    setattr(cfg, field, new)


def default_run_dir(name: str, algo: str, seed: int) -> Path:
    """``runs/<name>__<algo>__<seed>__<unix time>`` (path separators in the parts are replaced)."""
    clean = lambda s: str(s).replace("/", "-").replace("\\", "-").replace("..", "-") or "-"
    return Path("runs") / f"{clean(name)}__{clean(algo)}__{seed}__{int(time.time())}"
