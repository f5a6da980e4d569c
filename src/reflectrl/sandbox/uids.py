"""Dedicated uids (root only): one per concurrent run, so RLIMIT_NPROC is exact and ``kill -1`` run as that
uid reaches every process the code started, even outside a PID namespace."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time

from .base import SandboxError

log = logging.getLogger(__name__)

UID_SLOTS = 1024  # uids this process may lease at once


def uid_base() -> int:
    """Start of a uid range inside this (possibly nested) user namespace's uid map."""
    top = 2_000_000_000
    try:
        with open("/proc/self/uid_map") as fh:
            ends = [int(a) + int(c) for _, a, c in (line.split() for line in fh)]
        top = min(top, max(ends) - 2)
    except (OSError, ValueError):
        top = 65533
    return top - UID_SLOTS


class UidLease:
    """Exclusive use of one unused uid, across threads and processes (flock on a lock file)."""

    def __enter__(self) -> int:
        import fcntl

        lock_dir = os.path.join(tempfile.gettempdir(), "reflectrl-sandbox-uids")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        info = os.lstat(lock_dir)
        if not os.path.isdir(lock_dir) or os.path.islink(lock_dir) or info.st_uid != os.geteuid():
            raise SandboxError(f"{lock_dir} is not a directory owned by us; remove it")
        base = uid_base()
        for slot in range(UID_SLOTS):
            uid = base + slot
            fh = open(os.path.join(lock_dir, str(uid)), "a")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()
                continue
            if uid_is_free(uid):
                self._fh, self.uid = fh, uid
                return uid
            fh.close()
        raise SandboxError("no free sandbox uid")

    def __exit__(self, *exc) -> None:
        reap_uid(self.uid)
        self._fh.close()


def uid_is_free(uid: int) -> bool:
    """No account and no process uses this uid."""
    import pwd

    try:
        pwd.getpwuid(uid)
        return False
    except KeyError:
        return not pids_of_uid(uid)


def pids_of_uid(uid: int) -> list[int]:
    """Processes whose real uid is `uid` (from /proc/PID/status, which works for non-dumpable ones)."""
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as fh:
                    line = next(ln for ln in fh if ln.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if int(line.split()[1]) == uid:
                pids.append(int(entry))
    return pids


def reap_uid(uid: int, timeout_s: float = 5.0) -> None:
    """Kill every process of `uid` with `kill -9 -1` run as that uid, until none is left."""
    deadline = time.monotonic() + timeout_s
    while pids_of_uid(uid):
        if time.monotonic() > deadline:
            log.warning("sandbox uid %d still has processes after %.1fs", uid, timeout_s)
            return
        subprocess.run(["/bin/sh", "-c", "kill -9 -1"], user=uid, group=uid, extra_groups=[], env={},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        time.sleep(0.005)


class NoLease:
    """Stand-in for `UidLease` when no uid switch is done."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None
