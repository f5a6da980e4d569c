"""PPO's environments in worker processes (``--env-workers K``).

The ``num_envs`` environments are split into K + 1 contiguous shards, each a lean vector env
(:func:`~reflectrl.control.envs.make_vector_env`, autoreset disabled): the trainer's process steps the first
itself, and each of K worker processes one of the others. Actions go to the workers and observations, rewards and
episode ends come back through shared-memory arrays. A step is signalled through shared memory too, on x86-64: the
trainer bumps a worker's command counter, the worker (waiting on it, spinning briefly, then yielding, then napping)
steps its envs and writes the counter back as its acknowledgement: no system call and no process to wake while the
steps come fast, where a pipe's round trip costs about what stepping a few cheap envs does (x86-64 keeps stores in
order, so the arrays are written before the counter is seen; other machines use the pipe for every command).
Resets, replays and closing go through the pipes. All shards step at once, each on its own core. Every random
choice stays in the trainer's process (actions, reset seeds), and each environment sees the same calls in the same
order as in the synchronous vector env, so a run is bitwise the synchronous run, checkpoints and resume included (resume replays
each environment's current episode where it lives).

A worker that dies or raises ends the run with one error naming it; the last checkpoint on disk is kept.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import platform
import sys
import time
import traceback
from typing import Any

import gymnasium as gym
import numpy as np

from ..errors import ReflectRLError
from .envs import make_vector_env, step_each

_POLL_S = 1.0  # how often a waiting trainer checks that its workers are alive
SHARED_SIGNAL = platform.machine().lower() in {"x86_64", "amd64"}  # total store order: the step's handshake in memory
_LINE = 16  # int64 slots per worker in the control array (128 bytes: each worker's counters on their own cache line)
_STEP, _PIPE = 1, 2  # what a bumped command counter asks: a step, or the command waiting on the pipe
_SPIN, _YIELD = 2000, 2000  # a waiter's busy checks, then checks with sched_yield, before it naps between checks
_NAP_S = 1e-4


def _await(ctl: np.ndarray, i: int, old: int, alive: Any = None) -> int:
    """Wait until ``ctl[i]`` differs from ``old`` and return it: spin, then yield, then nap between checks (a worker
    idle through an update sleeps); ``alive`` (if given) is called about every :data:`_POLL_S` once napping."""
    n = 0
    last_check = None
    while True:
        v = int(ctl[i])
        if v != old:
            return v
        n += 1
        if n < _SPIN:
            continue
        if n < _SPIN + _YIELD:
            os.sched_yield()
            continue
        time.sleep(_NAP_S)
        if alive is not None:
            now = time.monotonic()
            if last_check is None:
                last_check = now
            elif now - last_check > _POLL_S:
                alive()
                last_check = now


def _views(bufs: dict[str, tuple[Any, str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    return {k: np.frombuffer(raw, dtype=dtype).reshape(shape) for k, (raw, dtype, shape) in bufs.items()}


def _serve(envs: Any, v: dict[str, np.ndarray], lo: int, hi: int, cmd: str, arg: Any) -> None:
    """One command on the envs ``lo .. hi - 1`` (a shard's vector env), through the shared arrays ``v``."""
    if cmd == "step":
        obs, rew, term, trunc, _ = envs.step(v["act"][lo:hi])
        v["obs"][lo:hi], v["rew"][lo:hi], v["term"][lo:hi], v["trunc"][lo:hi] = obs, rew, term, trunc
    elif cmd == "reset":
        seeds, mask = arg
        options = None if mask is None else {"reset_mask": np.asarray(mask, np.bool_)}
        obs, _ = envs.reset(seed=seeds, options=options)
        v["obs"][lo:hi] = obs
    elif cmd == "replay":  # each env's recorded actions since its reset, after a reset to its episode seed
        step_each(envs, arg, v["obs"][lo:hi])


def _worker(conn: Any, env_id: str, env_kwargs: dict[str, Any], lo: int, hi: int,
            bufs: dict[str, tuple[Any, str, tuple[int, ...]]], k: int, shared: bool) -> None:
    """Worker ``k``'s loop: own envs ``lo .. hi - 1`` and serve ``step``, ``reset``, ``replay`` and ``close``; with
    ``shared``, each command is announced by its counter in the control array, and a step is acknowledged there."""
    trainer = os.getppid()

    def orphaned() -> None:  # the trainer was killed: no pipe's end-of-file tells a worker waiting on memory
        if os.getppid() != trainer:
            raise EOFError

    seq = 0
    try:
        envs = make_vector_env(env_id, hi - lo, **env_kwargs)
        v = _views(bufs)
        ctl = v["ctl"]
        conn.send(("ok", None))
        while True:
            if shared:
                seq = _await(ctl, k * _LINE, seq, orphaned)
                if int(ctl[k * _LINE + 1]) == _STEP:
                    _serve(envs, v, lo, hi, "step", None)
                    ctl[k * _LINE + 8] = seq
                    continue
            cmd, arg = conn.recv()
            if cmd == "close":
                envs.close()
                conn.send(("ok", None))
                return
            _serve(envs, v, lo, hi, cmd, arg)
            conn.send(("ok", None))
    except (EOFError, KeyboardInterrupt):  # the trainer went away, or Ctrl-C reached the whole process group
        return
    except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it there
        conn.send(("error", traceback.format_exc(limit=4)))
        if shared:
            ctl[k * _LINE + 8] = -1  # a step's waiter reads the error from the pipe


class WorkerVectorEnv:
    """``num_envs`` copies of ``env_id`` in ``workers + 1`` contiguous shards: the first stepped by the trainer's
    process itself, the others each by a worker process, all at once. The interface is the lean vector env's that
    reflectrl's control trainers use: ``step``, ``reset(seed=, options={"reset_mask": ...})``, ``replay`` and
    ``close``, and ``num_envs`` and the single spaces."""

    def __init__(self, env_id: str, num_envs: int, workers: int, shared_signal: bool = SHARED_SIGNAL,
                 **env_kwargs: Any):
        if not 1 <= workers < num_envs:
            raise ReflectRLError(f"--env-workers must be between 1 and --num-envs - 1 ({num_envs - 1}), got {workers}")
        probe = make_vector_env(env_id, 1, **env_kwargs)
        self.single_observation_space = probe.single_observation_space
        self.single_action_space = probe.single_action_space
        probe.close()
        self.num_envs = num_envs
        obs_shape, obs_dtype = self.single_observation_space.shape, self.single_observation_space.dtype
        discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        act = ((num_envs,), np.dtype(np.int64)) if discrete else (
            (num_envs, *self.single_action_space.shape), np.dtype(np.float64))
        specs = {"obs": ((num_envs, *obs_shape), np.dtype(obs_dtype)), "act": act,
                 "rew": ((num_envs,), np.dtype(np.float64)), "term": ((num_envs,), np.dtype(np.bool_)),
                 "trunc": ((num_envs,), np.dtype(np.bool_)), "ctl": ((workers * _LINE,), np.dtype(np.int64))}
        ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        bufs = {k: (ctx.RawArray("b", max(int(np.prod(shape)) * dt.itemsize, 1)), dt.str, shape)
                for k, (shape, dt) in specs.items()}
        self._v = _views(bufs)
        self._ctl, self._seq, self.shared_signal = self._v["ctl"], 0, shared_signal
        bounds = np.linspace(0, num_envs, workers + 2).round().astype(int)
        spans = [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
        self.local, self.shards = spans[0], spans[1:]  # the trainer's own shard; the workers'
        self._local_envs = make_vector_env(env_id, self.local[1], **env_kwargs)
        self.conns, self.procs = [], []
        for k, (lo, hi) in enumerate(self.shards):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, env_id, env_kwargs, lo, hi, bufs, k, shared_signal), daemon=True,
                            name=f"reflectrl-env-worker-{k}")
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self._closed = False
        self._wait(range(workers))

    # ------------------------------------------------------------------ the protocol with the workers
    def _wait(self, which: Any) -> None:
        """Each named worker's acknowledgement; one error naming the first that died or raised."""
        for k in which:
            conn, proc = self.conns[k], self.procs[k]
            while not conn.poll(_POLL_S):
                if not proc.is_alive():
                    break
            try:
                status, detail = conn.recv()
            except (EOFError, OSError):
                status, detail = "died", None
            if status != "ok":
                self._fail(k, status, detail)

    def _fail(self, k: int, status: str, detail: Any) -> None:
        """Close every worker and raise one error naming worker ``k`` and what happened to it."""
        lo, hi = self.shards[k]
        self.procs[k].join(timeout=1.0)
        if status == "died":
            detail = f"exit code {self.procs[k].exitcode}"
        self.close()
        raise ReflectRLError(f"env worker {k} (envs {lo}-{hi - 1}) {'died' if status == 'died' else 'failed'}: "
                             f"{str(detail).strip().splitlines()[-1] if detail else status}")

    def _announce(self, k: int, code: int) -> None:
        """Bump worker ``k``'s command counter (its code written first)."""
        self._ctl[k * _LINE + 1] = code
        self._ctl[k * _LINE] = self._seq

    def _all(self, cmd: str, args: list[Any] | None = None) -> None:
        """``cmd`` on every shard (``args``: one per shard, the trainer's first; None skips a shard): the workers'
        sent first, the trainer's own run while they work, then their acknowledgements."""
        which = [k for k in range(len(self.shards)) if args is None or args[k + 1] is not None]
        self._seq += 1
        for k in which:
            try:
                self.conns[k].send((cmd, None if args is None else args[k + 1]))
            except OSError:  # a broken pipe: the worker is gone
                self._fail(k, "died", None)
            if self.shared_signal:
                self._announce(k, _PIPE)
        if args is None or args[0] is not None:
            _serve(self._local_envs, self._v, *self.local, cmd, None if args is None else args[0])
        self._wait(which)

    def _step_shared(self) -> None:
        """A step through the control array: every worker's counter bumped, the trainer's shard stepped, then each
        worker's acknowledgement awaited (an error or a death read from its pipe)."""
        self._seq += 1
        for k in range(len(self.shards)):
            self._announce(k, _STEP)
        _serve(self._local_envs, self._v, *self.local, "step", None)
        for k in range(len(self.shards)):
            i = k * _LINE + 8
            if int(self._ctl[i]) == self._seq:
                continue
            proc = self.procs[k]

            def alive(k: int = k, proc: Any = proc) -> None:
                if not proc.is_alive():
                    self._fail(k, "died", None)

            ack = self._seq - 1
            while ack != self._seq:
                ack = _await(self._ctl, i, ack, alive)
                if ack < 0:
                    self._wait([k])  # reads the worker's error and raises it

    # ------------------------------------------------------------------ the vector env
    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        self._v["act"][...] = actions
        if self.shared_signal:
            self._step_shared()
        else:
            self._all("step")
        v = self._v
        return v["obs"].copy(), v["rew"].copy(), v["term"].copy(), v["trunc"].copy(), {}

    def reset(self, *, seed: list[int | None] | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict]:
        mask = None if options is None else options.get("reset_mask")
        args: list[Any] = []
        for lo, hi in [self.local, *self.shards]:
            m = None if mask is None else np.asarray(mask[lo:hi], np.bool_)
            seeds = None if seed is None else list(seed[lo:hi])
            args.append(None if m is not None and not m.any() else (seeds, None if m is None else m.tolist()))
        self._all("reset", args)
        return self._v["obs"].copy(), {}

    def replay(self, actions: list[list[Any]]) -> np.ndarray:
        """Step each env through its recorded actions (``actions[i]``: env i's since its last reset); the
        observations after them."""
        self._all("replay", [[actions[i] for i in range(lo, hi)] for lo, hi in [self.local, *self.shards]])
        return self._v["obs"].copy()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._local_envs.close()
        for k, (conn, proc) in enumerate(zip(self.conns, self.procs)):
            try:
                if proc.is_alive():
                    conn.send(("close", None))
                    if self.shared_signal:
                        self._seq += 1
                        self._announce(k, _PIPE)
                    if conn.poll(5.0):
                        conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                pass
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
            conn.close()

    def __del__(self) -> None:  # a trainer that was never closed (an error in a test) leaves no processes
        with contextlib.suppress(Exception):  # at interpreter shutdown
            self.close()
