"""Processes and pipes on the parent's side: exit checks, non-blocking reads, killing a sandbox."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import IO

Sink = Callable[[bytes], None]


def exited(proc: subprocess.Popen) -> bool:
    """Whether the child has exited, without reaping it (so its pid/pgid cannot be reused yet)."""
    if not hasattr(os, "waitid"):
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def close_stream(stream: IO | None) -> None:
    """Close a pipe file object, ignoring a reader that went away."""
    try:
        if stream is not None:
            stream.close()
    except OSError:
        pass


def read_some(fd: int, sink: Sink) -> bool:
    """Read available bytes into `sink`; False at EOF (or when nothing is available right now)."""
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return True
    if chunk:
        sink(chunk)
    return bool(chunk)


def drain(fd: int, sink: Sink) -> None:
    """Read whatever is left in a (non-blocking) pipe after the child was killed."""
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 1 << 16):
            sink(chunk)
    except OSError:  # BlockingIOError included: nothing more for now
        pass


def children(pid: int) -> list[int]:
    """Direct children of `pid` (for a namespace wrapper: the namespace's init)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        return []


def kill(proc: subprocess.Popen, wrapped: bool) -> None:
    """Kill the namespace init first (the kernel then kills everything in it), then the group; reap."""
    if wrapped and not exited(proc):
        for child in children(proc.pid):
            signal_pid(child)
        end = time.monotonic() + 1.0
        while not exited(proc) and time.monotonic() < end:
            time.sleep(0.002)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def signal_pid(pid: int) -> None:
    """SIGKILL one process, ignoring races with its exit."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def make_removable(path: str) -> None:
    """Give the owner write+exec on every directory the code created, so cleanup cannot fail."""
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o700, follow_symlinks=False)
