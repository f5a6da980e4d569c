"""Batches: many jobs in one sandbox launch, each in its own freshly forked child (``runner/batch.py``).

The parent's side: the runner's control protocol, a runner with job slots fed call by call, and the
verdicts read from what each job's own pipes carried."""

from __future__ import annotations

import logging
import marshal
import math
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time

from .base import CHANNEL_CAP, GRACE_S, STARTUP_S, UNSHARE_NOISE, Backend
from .channel import Capped, Channel, Outcome
from .launch import clean_env, limits_for, mount_plan, wrapper_argv
from .procs import Sink, close_stream, drain, exited, kill, make_removable, read_some
from .runner import batch_source
from .uids import NoLease, UidLease
from .verdicts import Verdict, parse_tests, verdict

log = logging.getLogger(__name__)

BATCH_SIZE = 16  # default jobs per sandbox launch
BATCH_MAX = 128  # jobs per launch at most (three pipes per job are passed into the sandbox)
_BATCH_SETUP_S = 0.05  # allowance for the child's own set-up (rlimits, privilege drop) on top of timeout_s
_BATCH_SLACK_S = 2.0  # how far past a job's limit the parent waits for the runner's report before giving up
_BATCH_GAP_S = 10.0  # time allowed between two jobs (sweep, wipe, reading the next job)
BATCH_BROKEN: dict[str, str] = {}  # backend/variant -> why its batch runner cannot start here
_FDS_PER_MESSAGE = 240  # pipe ends per SCM_RIGHTS message (the kernel takes at most 253)
WARM_SLOTS = 64  # jobs one kept runner serves before a fresh one replaces it (SandboxPool, warm=True)


def warm_slots(workers: int) -> int:
    """Slots per kept runner: ``WARM_SLOTS``, fewer where the open-file limit is low (the parent holds
    three pipe ends per slot, for up to two runners per worker; a quarter of the limit is used)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    except (ImportError, OSError, ValueError):
        soft = 1024
    return max(2, min(WARM_SLOTS, soft // 4 // (6 * max(1, workers))))


class BatchJob:
    """What the parent collected about one job of a batch."""

    __slots__ = ("end", "nonce", "raw", "stderr", "stdout")

    def __init__(self, max_bytes: int):
        self.raw = Capped(CHANNEL_CAP)  # channel bytes, validated once the job's nonce is known
        self.stdout, self.stderr = Capped(max_bytes), Capped(max_bytes)
        self.nonce: bytes | None = None
        self.end: tuple[bool, int, float] | None = None  # (timed_out, returncode, duration_s) from the runner


class Control:
    """The runner's control lines: ready / start k nonce / end k timed_out rc duration / abort / finished."""

    def __init__(self, jobs: list[BatchJob]):
        self.jobs, self.buf = jobs, b""
        self.ready: str | None = None
        self.abort: str | None = None
        self.finished = False
        self.current: int | None = None  # index of the job started and not yet ended
        self.next = 0
        self.since = time.monotonic()  # time of the last event

    def feed(self, chunk: bytes) -> None:
        *lines, self.buf = (self.buf + chunk).split(b"\n")
        for line in lines:
            self._parse(line.decode("ascii", "replace").split(" "))
        self.buf = self.buf[-4096:]

    def _parse(self, parts: list[str]) -> None:
        self.since = time.monotonic()
        kind = parts[0]
        if kind == "ready" and self.ready is None:
            self.ready = " ".join(parts[1:]) or "-"
        elif kind == "start" and len(parts) == 3 and self.current is None and parts[1] == str(self.next) \
                and self.next < len(self.jobs) and len(parts[2]) == 32:
            self.current, self.next = self.next, self.next + 1
            self.jobs[self.current].nonce = parts[2].encode()
        elif kind == "end" and len(parts) == 5 and self.current is not None and parts[1] == str(self.current):
            try:
                self.jobs[self.current].end = (parts[2] == "1", int(parts[3]), float(parts[4]))
            except ValueError:
                self.abort = "bad end record"
            self.current = None
        elif kind == "abort":
            self.abort = " ".join(parts[1:]) or "?"
        elif kind == "finished":
            self.finished = True

    def deadline(self, timeout_s: float, start: float) -> float:
        """When the parent stops waiting for the runner's next event."""
        if self.ready is None:
            return start + STARTUP_S
        if self.current is not None:
            return self.since + timeout_s + _BATCH_SETUP_S + _BATCH_SLACK_S
        return self.since + _BATCH_GAP_S


def frame(obj) -> bytes:
    """A length-prefixed marshal frame of the runner's job stream."""
    data = marshal.dumps(obj)
    return b"%010d" % len(data) + data


def send_fds(sock_fd: int, fds: list[int]) -> None:
    """Hand the job pipes' write ends to the runner over its control socket (SCM_RIGHTS).

    Inherited through the namespace wrapper instead, they would also stay open in the wrapper's own
    process (``unshare`` keeps what it was given while it waits for the runner), so a job's pipes would
    never reach end-of-file and each call would wait out ``GRACE_S`` after its last job."""
    sock = socket.socket(fileno=sock_fd)
    try:
        for i in range(0, len(fds), _FDS_PER_MESSAGE):
            socket.send_fds(sock, [b"F"], fds[i:i + _FDS_PER_MESSAGE])
    finally:
        sock.detach()


def batch_key(backend: Backend) -> str:
    return f"{backend.name}/{backend.drop_uid}"


def batchable(backend: Backend) -> bool:
    """Batches need a PID namespace (to kill every leftover process between jobs) and a working runner."""
    return backend.name in ("bwrap", "unshare") and bool(backend.protections.get("pid_namespace")) \
        and batch_key(backend) not in BATCH_BROKEN


class BatchRunner:
    """One batch runner (one sandbox launch) with ``slots`` job slots, fed jobs call by call.

    The runner starts at construction and comes up in the background (so a replacement launched while
    the trainer generates is ready when the next chunk arrives). Each :meth:`run` sends its jobs into
    the next free slots and pumps the pipes until those jobs have ended; between calls the runner has
    swept its namespace and wiped the work dir and waits for the next job frame. One thread at a time."""

    def __init__(self, backend: Backend, slots: int, timeout_s: float, memory_mb: int, max_bytes: int,
                 max_processes: int):
        self.backend, self.slots, self.timeout_s = backend, slots, timeout_s
        self.key = (batch_key(backend), timeout_s, memory_mb, max_bytes, max_processes)
        self.used, self.broken = 0, False
        self.proc: subprocess.Popen | None = None
        self.sinks: dict[int, Sink] = {}
        self.job_fds: list[tuple[int, int, int]] = []
        self.live: set[int] = set()
        self.sel = selectors.DefaultSelector()
        self._lease = UidLease() if backend.drop_uid else NoLease()
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._closed = False
        self.states = [BatchJob(max_bytes) for _ in range(slots)]
        self.control = Control(self.states)
        self.diag = Capped(4096)
        uid = self._lease.__enter__()
        try:
            self._tmp = tempfile.TemporaryDirectory(prefix="reflectrl-sbx-")
            work = self.work = self._tmp.name
            mode = 0o700
            if uid is not None:
                os.chown(work, uid, uid)
                mode = 0o711  # the wrapper (root without capabilities) must be able to enter it
                os.chmod(work, mode)
            limits = limits_for(backend, timeout_s, memory_mb, max_processes)
            limits["MSGQUEUE"] = [0, 0]  # no POSIX message queue: they would outlive the job in the IPC namespace
            self._start(work, uid, mode, limits, timeout_s)
        except BaseException:
            self.close()
            raise

    def _start(self, work: str, uid: int | None, mode: int, limits: dict, timeout_s: float) -> None:
        passed: list[int] = []  # our copies of what the runner gets, closed once it has them
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            ctl, ctl_child = ours.detach(), theirs.detach()
            self.sinks[ctl] = self.control.feed
            passed.append(ctl_child)
            for st in self.states:
                reads = []
                for sink in (st.raw.feed, st.stdout.feed, st.stderr.feed):
                    r, w = os.pipe()
                    self.sinks[r] = sink
                    passed.append(w)
                    reads.append(r)
                self.job_fds.append(tuple(reads))
            conf = {"control": ctl_child, "slots": len(self.states), "workdir": work, "uid": uid, "mode": mode,
                    "timeout": timeout_s + _BATCH_SETUP_S,
                    "mounts": mount_plan(work) if self.backend.name == "unshare" else None,
                    "job": {"workdir": work, "uid": uid, "limits": limits, "mounts": None}}
            argv = wrapper_argv(self.backend, work, batch=True) + [sys.executable, "-I", "-B", "-c", batch_source()]
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         pass_fds=(ctl_child,), cwd=work, env=clean_env(work), start_new_session=True)
            send_fds(ctl, passed[1:])
        finally:
            for fd in passed:
                os.close(fd)
        self.sinks[self.proc.stdout.fileno()] = self.sinks[self.proc.stderr.fileno()] = self.diag.feed
        for fd in self.sinks:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.live = set(self.sinks)
        self.stdin = self.proc.stdin.fileno()
        os.set_blocking(self.stdin, False)
        self.pending = memoryview(frame(conf))
        self._write()  # the header: the runner sets itself up while the parent does other work
        self.launched = time.monotonic()

    @property
    def free(self) -> int:
        return 0 if self.broken or self._closed else self.slots - self.used

    def _write(self) -> None:
        """Write what the job pipe takes now; keep stdin open for later calls."""
        registered = self.stdin in self.sel.get_map()
        try:
            self.pending = self.pending[os.write(self.stdin, self.pending):]
        except BlockingIOError:
            pass
        except BrokenPipeError:
            self.pending = self.pending[:0]
            self.broken = True
        if self.pending and not registered:
            self.sel.register(self.stdin, selectors.EVENT_WRITE)
        elif not self.pending and registered:
            self.sel.unregister(self.stdin)

    def run(self, jobs: list[tuple[str, str]]) -> list[BatchJob | None]:
        """Run ``jobs`` in the next free slots; per job its collected state, or None if the runner
        could not vouch for it (it stopped, aborted or missed a deadline: rerun that job alone)."""
        if len(jobs) > self.free:
            raise ValueError(f"{len(jobs)} jobs for {self.free} free slots")
        idx = range(self.used, self.used + len(jobs))
        self.used += len(jobs)
        self.pending = memoryview(bytes(self.pending) + b"".join(frame({"code": c, "tests": t}) for c, t in jobs))
        self._write()
        ctl = self.control
        start = self.launched if ctl.ready is None else time.monotonic()
        ctl.since = time.monotonic()  # the runner has been idle since the last call: no gap counts against it
        wanted = {fd for i in idx for fd in self.job_fds[i]}
        finish_by = None
        while True:
            ended = all(self.states[i].end is not None for i in idx)
            if ended and not (wanted & self.live):
                break
            now = time.monotonic()
            if finish_by is None and (ended or ctl.finished or ctl.abort is not None or exited(self.proc)):
                finish_by = now + (GRACE_S if ended or ctl.finished or ctl.abort else 0.2)
            limit = min(ctl.deadline(self.timeout_s, start), finish_by or math.inf)
            if now >= limit:
                break
            for key, _ in self.sel.select(min(limit - now, 0.05)):
                if key.fd == self.stdin:
                    self._write()
                elif key.fd in self.live and not read_some(key.fd, self.sinks[key.fd]):
                    self.sel.unregister(key.fd)
                    self.live.discard(key.fd)
        if ctl.ready is None or ctl.abort is not None or not all(self.states[i].end is not None for i in idx) \
                or (self.used < self.slots and (ctl.finished or exited(self.proc))):
            self.broken = True
        return [self.states[i] if self.states[i].end is not None and self.states[i].nonce is not None else None
                for i in idx]

    def report_failure(self) -> None:
        """Log (once per runner) why it stopped vouching for jobs; remember a runner that cannot start."""
        ctl = self.control
        if ctl.ready is None:
            reason = ctl.abort or self.diag.text().replace(UNSHARE_NOISE.decode(), "")[-300:].strip() or "no report"
            if ctl.abort and ctl.abort.startswith("-1 "):
                BATCH_BROKEN[batch_key(self.backend)] = reason
            log.warning("sandbox batch runner (%s) did not start: %s; running these jobs one per sandbox",
                        self.backend.name, reason)
        elif ctl.abort:
            log.warning("sandbox batch (%s) stopped early: %s; the rest run one per sandbox",
                        self.backend.name, ctl.abort)

    def close(self) -> None:
        """Kill the runner (and with it its namespace), collect what is left, remove the work dir."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.proc is not None:
                kill(self.proc, wrapped=True)
                for fd in list(self.sinks):
                    drain(fd, self.sinks[fd])
                for fd in self.sinks:
                    if fd not in (self.proc.stdout.fileno(), self.proc.stderr.fileno()):
                        os.close(fd)
                for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                    close_stream(stream)
            else:
                for fd in self.sinks:
                    os.close(fd)
            self.sel.close()
            if self._tmp is not None:
                make_removable(self._tmp.name)
                self._tmp.cleanup()
        finally:
            self._lease.__exit__(None, None, None)


def verdicts_of(states: list[BatchJob | None], jobs: list[tuple[str, str]]) -> list[Verdict | None]:
    """Verdicts from what a batch collected; None where the sandbox, not the code, failed."""
    out: list[Verdict | None] = []
    for st, (_, tests) in zip(states, jobs):
        if st is None:
            out.append(None)
            continue
        chan = Channel(st.nonce.decode())
        chan.feed(bytes(st.raw.data))
        setup = chan.get("setup")
        if setup is None or not setup[0]:
            out.append(None)  # the sandbox, not the code, failed: the single run reports it properly
            continue
        assert_indices, n_statements = parse_tests(tests)
        timed_out, returncode, duration = st.end
        seen = Outcome(chan, st.stdout, st.stderr, returncode, timed_out and not chan.finished(), duration)
        out.append(verdict(seen, assert_indices, n_statements))
    return out


def execute_batch(backend: Backend, jobs: list[tuple[str, str]], timeout_s: float, memory_mb: int,
                  max_bytes: int, max_processes: int) -> list[Verdict | None]:
    """One sandbox launch for all `jobs`; None for a job the batch could not vouch for (rerun it alone)."""
    batch = BatchRunner(backend, len(jobs), timeout_s, memory_mb, max_bytes, max_processes)
    try:
        states = batch.run(jobs)
    finally:
        batch.close()
    if batch.broken:
        batch.report_failure()
    return verdicts_of(states, jobs)
