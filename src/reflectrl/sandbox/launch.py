"""Launching one sandboxed run: the mount plan, the wrapper's command line, the job, and the parent's pump."""

from __future__ import annotations

import marshal
import math
import os
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from typing import IO

from .base import FSIZE, GRACE_S, STARTUP_S, UNSHARE_NOISE, Backend, SandboxError, is_root
from .channel import Capped, Channel, Outcome
from .procs import Sink, close_stream, drain, exited, kill, make_removable, read_some
from .runner import single_source
from .uids import NoLease, UidLease
from .verdicts import Verdict, parse_tests, verdict

_HIDDEN_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/root", "/home")


def python_dirs() -> list[str]:
    """Directories the interpreter needs, so they can be re-exposed under hidden dirs."""
    found = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    found |= {os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))}
    found |= {p for p in sys.path if p and os.path.isabs(p) and os.path.exists(p)}
    return sorted(os.path.realpath(p) for p in found)


def mount_plan(work: str) -> dict:
    """Which dirs to hide behind empty read-only tmpfs, and what to bind back (read-only / rw)."""
    hide = [d for d in _HIDDEN_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    under = [p for p in python_dirs() if any(p == h or p.startswith(h + "/") for h in hide)]
    ro = [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]
    return {"hide": hide, "ro": ro, "rw": work}


def bwrap_argv(work: str, root: bool, drop_uid: bool, batch: bool = False) -> list[str]:
    """bubblewrap command line: read-only root, private /dev /proc, hidden tmp/home, rw work dir."""
    plan = mount_plan(work)
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net"]
    argv += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--ro-bind", "/", "/"]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for hidden in [h for h in plan["hide"] if h != "/dev/shm"]:
        argv += ["--tmpfs", hidden]
    for path in plan["ro"]:
        for parent in parents_below_hidden(path, plan["hide"]):
            argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", path, path]
    argv += [a for p in parents_below_hidden(work, plan["hide"]) for a in ("--perms", "0755", "--dir", p)]
    argv += ["--bind", work, work]
    for hidden in [h for h in plan["hide"] if h != "/dev/shm"] + ["/dev"]:
        argv += ["--remount-ro", hidden]
    if root:  # bwrap run by root keeps every capability unless told otherwise
        caps = ("SETPCAP", "SETUID", "SETGID") if drop_uid else ("SETPCAP",)  # for the runner's privilege drop
        if batch:  # the batch runner kills what a job left and wipes its files (jobs drop all caps)
            caps += ("KILL", "DAC_OVERRIDE", "FOWNER", "CHOWN")
        argv += ["--cap-drop", "ALL"] + [a for c in caps for a in ("--cap-add", f"CAP_{c}")]
    return argv + ["--chdir", work, "--"]


def parents_below_hidden(path: str, hidden: list[str]) -> list[str]:
    """Intermediate directories between a hidden dir and `path` (bwrap would create them 0700)."""
    top = next((h for h in hidden if path.startswith(h + "/")), None)
    if top is None:
        return []
    parts = path[len(top) + 1 :].split("/")[:-1]
    return [top + "/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def unshare_argv(root: bool) -> list[str]:
    """util-linux unshare: new pid/net/mount/ipc/uts namespaces; the runner does the mounts."""
    user = [] if root else ["--user", "--map-root-user"]
    namespaces = ["--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc", "--uts"]
    return ["unshare", *user, *namespaces, "--"]


def wrapper_argv(backend: Backend, work: str, batch: bool = False) -> list[str]:
    """Command prefix that puts the runner into namespaces (empty for the 'none' backend)."""
    if backend.name == "bwrap":
        return [shutil.which("bwrap") or "bwrap", *bwrap_argv(work, is_root(), backend.drop_uid, batch)[1:]]
    if backend.name == "unshare":
        return [shutil.which("unshare") or "unshare", *unshare_argv(is_root())[1:]]
    return []


def clean_env(work: str) -> dict[str, str]:
    """The child's whole environment: nothing is inherited from the parent."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8"}


def make_job(backend: Backend, code: str, tests: str, work: str, uid: int | None, limits: dict) -> dict:
    """The JSON job the runner reads from stdin (the channel fd is filled in at launch)."""
    mounts = mount_plan(work) if backend.name == "unshare" else None
    return {"code": code, "tests": tests, "nonce": secrets.token_hex(16), "fd": -1, "workdir": work,
            "uid": uid, "limits": limits, "mounts": mounts}


def limits_for(backend: Backend, timeout_s: float, memory_mb: int, max_processes: int) -> dict[str, list[int]]:
    """(soft, hard) rlimits the runner applies to itself before running the code."""
    cpu = math.ceil(timeout_s) + 1
    limits = {"AS": [memory_mb << 20] * 2, "CPU": [cpu, cpu + 1], "FSIZE": [FSIZE] * 2, "CORE": [0, 0]}
    if backend.drop_uid or backend.name != "none":  # exact only for a dedicated uid / fresh user namespace
        limits["NPROC"] = [max_processes] * 2
    return limits


def pump(proc: subprocess.Popen, chan_fd: int, payload: bytes, seen: Outcome, timeout_s: float) -> bool:
    """Feed the job and read all pipes until exit, final report + grace, or deadline; True on timeout."""
    sel = selectors.DefaultSelector()
    sinks: dict[int, Sink] = {proc.stdout.fileno(): seen.stdout.feed, proc.stderr.fileno(): seen.stderr.feed,
             chan_fd: seen.channel.feed}
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
    pending, chan = memoryview(payload), seen.channel
    deadline, started, finish_by = time.monotonic() + STARTUP_S, False, None
    while sinks:
        now = time.monotonic()
        if not started and chan.get("setup"):
            started, deadline = True, now + timeout_s
        if finish_by is None and (chan.finished() or exited(proc)):
            finish_by = now + (GRACE_S if chan.finished() else 0.2)
        limit = min(deadline, finish_by or deadline)
        if now >= limit:
            break
        for key, _ in sel.select(min(limit - now, 0.05)):
            if key.fd not in sinks:
                pending = write_some(sel, proc.stdin, pending)
            elif not read_some(key.fd, sinks[key.fd]):
                sel.unregister(key.fd)
                del sinks[key.fd]
    sel.close()
    if not started and chan.get("setup") is None and not exited(proc):
        raise SandboxError(f"sandbox did not start within {STARTUP_S:.0f}s")
    return started and not chan.finished() and time.monotonic() >= deadline


def write_some(sel: selectors.BaseSelector, stdin: IO[bytes], pending: memoryview) -> memoryview:
    """Write what the pipe takes; close stdin once the job is sent (or the child stopped reading)."""
    try:
        pending = pending[os.write(stdin.fileno(), pending) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        pending = pending[:0]
    if not pending:
        sel.unregister(stdin.fileno())
        close_stream(stdin)
    return pending


def execute(backend: Backend, code: str, tests: str, timeout_s: float, memory_mb: int, max_bytes: int,
            max_processes: int) -> tuple[Verdict, str]:
    """One sandboxed run; returns the verdict and the runner's setup notes."""
    assert_indices, n_statements = parse_tests(tests)
    lease = UidLease() if backend.drop_uid else NoLease()
    with lease as uid, tempfile.TemporaryDirectory(prefix="reflectrl-sbx-") as work:
        if uid is not None:
            os.chown(work, uid, uid)
            os.chmod(work, 0o711)  # the wrapper (root without capabilities) must be able to enter it
        limits = limits_for(backend, timeout_s, memory_mb, max_processes)
        seen = launch(backend, make_job(backend, code, tests, work, uid, limits), timeout_s, max_bytes)
        make_removable(work)
    setup = seen.channel.get("setup")
    if setup is None or not setup[0]:
        detail = setup[1] if setup else seen.stderr.text()[-400:].strip()
        raise SandboxError(f"sandbox setup failed ({backend.name}): {detail or 'no report'}")
    return verdict(seen, assert_indices, n_statements), setup[1]


def launch(backend: Backend, job: dict, timeout_s: float, max_bytes: int) -> Outcome:
    """Start the runner in its own session, collect its output and reports, then kill everything."""
    chan_r, chan_w = os.pipe()
    job["fd"] = chan_w
    seen = Outcome(Channel(job["nonce"]), Capped(max_bytes), Capped(max_bytes))
    argv = wrapper_argv(backend, job["workdir"]) + [sys.executable, "-I", "-B", "-c", single_source()]
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(chan_w,), cwd=job["workdir"], env=clean_env(job["workdir"]),
                                start_new_session=True)
    except OSError:
        os.close(chan_r)
        raise
    finally:
        os.close(chan_w)
    try:
        seen.timed_out = pump(proc, chan_r, marshal.dumps(job), seen, timeout_s)
    finally:
        kill(proc, wrapped=backend.name != "none")
        for fd, sink in ((chan_r, seen.channel.feed), (proc.stdout.fileno(), seen.stdout.feed),
                         (proc.stderr.fileno(), seen.stderr.feed)):
            drain(fd, sink)
        os.close(chan_r)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            close_stream(stream)
    seen.returncode, seen.duration_s = proc.returncode, time.monotonic() - start
    seen.stderr.data = seen.stderr.data.replace(UNSHARE_NOISE, b"")
    return seen

