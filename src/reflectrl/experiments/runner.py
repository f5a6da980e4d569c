"""One run of a comparison: what it is (:class:`RunSpec`), what its directory holds (:func:`plan`), and
bringing it to evaluated (:func:`run_one`), each process through the ``reflectrl`` CLI. The local pool
(:func:`run_local`) and the Ray backend (:mod:`reflectrl.experiments.ray_backend`) both run
:func:`run_one`, for control and LLM runs alike.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runlog import strict
from .rundata import read_json

CHECKPOINT = "checkpoint.safetensors"  # reflectrl.trainer.CHECKPOINT (not imported: keeps this module light)
EVAL_FILE, RUN_FILE, LOG_FILE = "eval.json", "run.json", "train.log"


@dataclass(frozen=True)
class RunSpec:
    """One cell of the grid: everything ``run_one`` needs, picklable (it travels to Ray workers)."""

    env_id: str
    method: str
    algo: str
    seed: int
    budget: int
    run_dir: str
    train_args: tuple[str, ...] = ()
    eval_episodes: int = 20
    ship_files: bool = False  # return the run's small files in the result (Ray workers without a shared disk)
    kind: str = "control"
    """control: ``env_id`` is a Gymnasium id and ``budget`` env steps; llm: ``env_id`` is a task and ``budget`` updates."""
    eval_args: tuple[str, ...] = ()
    """Extra flags of the evaluation command (``reflectrl llm eval``: ``--self-report confidence``, ...)."""
    retries: int = 0
    """Attempts after a failed one before the run is reported failed."""

    @property
    def name(self) -> str:
        return f"{self.env_id}/{self.method}/seed_{self.seed}"

    @property
    def budget_key(self) -> str:
        return "total_timesteps" if self.kind == "control" else "updates"

    @property
    def budget_flag(self) -> str:
        return "--total-timesteps" if self.kind == "control" else "--updates"

    def train_command(self, action: str) -> list[str]:
        """The ``reflectrl`` arguments that train (``train``) or resume (``resume``) this run."""
        d = self.run_dir
        head = ["train"] if self.kind == "control" else ["llm", "train"]
        if action == "resume":
            return [*head, "--resume", d, self.budget_flag, str(self.budget), "--no-progress"]
        where = ["--env-id", self.env_id] if self.kind == "control" else ["--task", self.env_id]
        return [*head, "--algo", self.algo, *where, "--seed", str(self.seed), self.budget_flag, str(self.budget),
                "--run-dir", d, "--no-progress", *self.train_args]

    def eval_command(self) -> list[str]:
        if self.kind == "control":
            return ["eval", self.run_dir, "--episodes", str(self.eval_episodes), "--json", *self.eval_args]
        return ["llm", "eval", self.run_dir, "--json", *self.eval_args]


def plan(spec: RunSpec) -> tuple[str, str]:
    """``("skip" | "resume" | "train" | "conflict", why)`` from what the run directory holds."""
    d = Path(spec.run_dir)
    info, cfg = read_json(d / RUN_FILE), read_json(d / "config.json")
    if info is not None and (info.get("algo"), list(info.get("train_args", []))) != (spec.algo, list(spec.train_args)):
        return "conflict", (f"{d} holds a run of {info.get('algo')} with arguments "
                            f"{shlex.join(info.get('train_args', [])) or '(none)'}, not "
                            f"{spec.algo} {shlex.join(spec.train_args) or '(none)'}; use another --out or the same "
                            "arguments")
    if info is None and cfg is not None and cfg.get("algo", "ppo") != spec.algo:
        return "conflict", f"{d} holds a run of {cfg.get('algo', 'ppo')}, not {spec.algo}; use another --out"
    done = (info or {}).get(spec.budget_key, (cfg or {}).get(spec.budget_key))
    has_ckpt = (d / CHECKPOINT).is_file()
    unit = "steps" if spec.kind == "control" else "updates"
    if has_ckpt and done is not None and done > spec.budget:
        return "conflict", (f"{d} holds a run of {done} {unit}, more than {spec.budget_flag} {spec.budget}; "
                            "use another --out or that budget")
    if (d / EVAL_FILE).is_file() and done == spec.budget:
        return "skip", "finished"
    if has_ckpt:
        same = done == spec.budget
        return "resume", "checkpoint without evaluation" if same else f"extend to {spec.budget} {unit}"
    return "train", "new"


_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()


def _load_prctl():
    """libc's ``prctl`` on Linux (loaded here, once: the child after fork must not load libraries)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The child gets SIGTERM when the process that started it dies: no orphan keeps writing a run."""
    _PRCTL(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _run_cli(args: list[str], log: Path, capture: bool = False) -> tuple[int, str, float]:
    """Run ``python -m reflectrl.cli ARGS`` with stdout (unless captured) and stderr appended to ``log``;
    returns ``(status, captured stdout, wall seconds)``."""
    cmd = [sys.executable, "-m", "reflectrl.cli", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log, "a") as fh:
        fh.write(f"\n$ reflectrl {shlex.join(args)}\n")
        fh.flush()
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE if capture else fh, stderr=fh, text=True, env=env,
                             preexec_fn=_die_with_parent if _PRCTL is not None else None)
        with _LIVE_LOCK:
            _LIVE.add(p)
        try:
            out, _ = p.communicate()
        except BaseException:  # interrupted while waiting (Ray cancel, Ctrl-C): stop the child, keep its checkpoint
            p.send_signal(signal.SIGINT)
            p.wait()
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(p)
        if capture and out:
            fh.write(out)
    return p.returncode, out or "", time.perf_counter() - t0


def stop_children() -> None:
    """Interrupt every run process this process started (they exit keeping their last checkpoint)."""
    with _LIVE_LOCK:
        for p in list(_LIVE):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)


def _last_error(log: Path, offset: int) -> str:
    """The ``error: ...`` line (else the last line) a failed process wrote to ``log`` after ``offset``."""
    try:
        with open(log, errors="replace") as fh:
            fh.seek(offset)
            lines = [l.strip() for l in fh.read().splitlines() if l.strip() and not l.startswith("$ reflectrl")]
    except OSError:
        return "no output"
    errors = [l for l in lines if l.startswith("error:")]
    msg = (errors or lines or ["no output"])[-1]
    return msg[:300]


def _last_json(text: str) -> dict[str, Any] | None:
    """The JSON object on the last line of a command's stdout."""
    try:
        obj = json.loads(text.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(strict(obj), indent=2))
    tmp.replace(path)


def _clear(d: Path) -> None:
    """Remove what an attempt that never reached a checkpoint left (train.log is kept, appended to)."""
    import shutil

    for name in ("config.json", "metrics.jsonl", "metrics.tmp", EVAL_FILE, RUN_FILE):
        (d / name).unlink(missing_ok=True)
    shutil.rmtree(d / "tb", ignore_errors=True)


def make_result(spec: RunSpec, action: str, **extra: Any) -> dict[str, Any]:
    """What ``run_one`` returns for a run that finished: ``action`` is trained, resumed or skipped."""
    return {"name": spec.name, "run_dir": spec.run_dir, "log": str(Path(spec.run_dir) / LOG_FILE), "status": "ok",
            "action": action, "error": None, **extra}


def failed_result(spec: RunSpec, error: str) -> dict[str, Any]:
    """The result of a run that did not finish, with a one-line ``error``."""
    return {**make_result(spec, None), "status": "failed", "error": error}


def _attempt(spec: RunSpec, action: str, log: Path) -> dict[str, Any]:
    """Train or resume, then evaluate; records every process in ``run.json``. Returns the result."""
    d = Path(spec.run_dir)
    info = read_json(d / RUN_FILE) or {"attempts": []}
    info.update(method=spec.method, algo=spec.algo, env_id=spec.env_id, seed=spec.seed, kind=spec.kind,
                train_args=list(spec.train_args), **{spec.budget_key: spec.budget})
    _write_json(d / RUN_FILE, info)
    args = spec.train_command(action)
    offset = log.stat().st_size if log.exists() else 0
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    # recorded before it starts: if this process is killed, the entry stays with status null, so a
    # report knows the run's recorded time leaves an attempt out
    info["attempts"].append({"kind": action, "status": None, "at": started})
    _write_json(d / RUN_FILE, info)
    rc, out, wall = _run_cli(args, log, capture=True)
    attempt = {"kind": action, "wall_s": wall, "status": rc, "at": started}
    summary = _last_json(out)
    if summary and isinstance(summary.get("wall_s"), (int, float)):
        attempt["learn_s"] = summary["wall_s"]  # the training loop alone (no start-up, env creation, imports)
    info["attempts"][-1] = attempt
    _write_json(d / RUN_FILE, info)
    if rc != 0:
        return failed_result(spec, f"{'resume' if action == 'resume' else 'train'} exited with status {rc}: "
                                   f"{_last_error(log, offset)}")
    offset = log.stat().st_size
    rc, out, eval_wall = _run_cli(spec.eval_command(), log, capture=True)
    info["attempts"].append({"kind": "eval", "wall_s": eval_wall, "status": rc})
    _write_json(d / RUN_FILE, info)
    result = _last_json(out) if rc == 0 else None
    key = "mean" if spec.kind == "control" else "accuracy"
    if result is None or key not in result:
        return failed_result(spec, f"eval exited with status {rc}: {_last_error(log, offset)}")
    _write_json(d / EVAL_FILE, result)
    return make_result(spec, "resumed" if action == "resume" else "trained", wall_s=wall, eval_mean=result[key])


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Bring one run to evaluated: skip it when finished, resume it from its checkpoint, or train it.

    Never raises: a failure comes back as ``status="failed"`` with a one-line ``error`` and the ``log`` path."""
    d = Path(spec.run_dir)
    try:
        action, why = plan(spec)
        if action == "conflict":
            return failed_result(spec, why)
        if action == "skip":
            key = "mean" if spec.kind == "control" else "accuracy"
            res = make_result(spec, "skipped", eval_mean=(read_json(d / EVAL_FILE) or {}).get(key))
        else:
            for attempt in range(spec.retries + 1):
                d.mkdir(parents=True, exist_ok=True)
                if action == "train":
                    _clear(d)
                (d / EVAL_FILE).unlink(missing_ok=True)
                res = _attempt(spec, action, d / LOG_FILE)
                if res["status"] == "ok" or attempt == spec.retries:
                    break
                action, _ = plan(spec)  # resume from the failed attempt's last checkpoint, if it wrote one
                if action in ("skip", "conflict"):
                    break
            if attempt:
                res["retries"] = attempt
    except Exception as exc:  # noqa: BLE001  (disk full, permission denied, ...: report it, let the grid go on)
        return failed_result(spec, f"{type(exc).__name__}: {exc}")
    if spec.ship_files:
        res["files"] = {n: (d / n).read_text(errors="replace") for n in ("config.json", "metrics.jsonl", RUN_FILE,
                                                                          EVAL_FILE, LOG_FILE) if (d / n).is_file()}
    return res


def materialize(result: dict[str, Any]) -> None:
    """Write the files a remote worker shipped back when this machine's run directory lacks them (no shared
    disk). With a shared disk the files are already the same and nothing is written."""
    files = result.pop("files", None)
    if not files:
        return
    d = Path(result["run_dir"])
    if (d / RUN_FILE).is_file() and (d / RUN_FILE).read_text(errors="replace") == files.get(RUN_FILE):
        return
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        if name != EVAL_FILE:
            (d / name).write_text(text)
    if EVAL_FILE in files:  # last: its presence means "finished"
        (d / EVAL_FILE).write_text(files[EVAL_FILE])


def run_local(specs: Sequence[RunSpec], workers: int, on_result: Callable[[dict], None]) -> None:
    """Up to ``workers`` runs at a time on this machine, each in its own processes."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reflectrl-run")
    futures = [pool.submit(run_one, s) for s in specs]
    try:
        for f in as_completed(futures):
            on_result(f.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        stop_children()
        raise
    finally:
        pool.shutdown(wait=True)


