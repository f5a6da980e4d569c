"""Run untrusted, model-generated Python code against assert-style tests in an isolated child process.

The strongest isolation the OS offers is chosen at runtime (bubblewrap, then ``unshare``, then plain
rlimits); see ``docs/sandbox.md`` for the threat model and ``sandbox_capabilities()`` for what holds.
"""

from __future__ import annotations

import ast
import atexit
import json
import logging
import marshal
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from ..errors import ReflectRLError

__all__ = [
    "STATUSES",
    "SandboxError",
    "SandboxPool",
    "SandboxWarning",
    "Verdict",
    "batch_supported",
    "check_job",
    "run_tests",
    "run_tests_batch",
    "sandbox_backend",
    "sandbox_capabilities",
]

log = logging.getLogger(__name__)

STATUSES = ("passed", "failed", "error", "timeout", "memory", "killed")
BACKENDS = ("bwrap", "unshare", "none")

_STARTUP_S = 20.0  # time allowed for the sandbox itself to come up (not counted in timeout_s)
_GRACE_S = 1.0  # time allowed to exit after the final report
_CHANNEL_CAP = 1 << 20  # bytes of result records read at most
_FSIZE = 32 << 20  # largest file the code may write (RLIMIT_FSIZE)
_HIDDEN_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/root", "/home")
_PROBE_CODE = "import fractions, decimal\nvalue = 1\n"
_PROBE_TESTS = "assert value == 1\n"
_UNSHARE_NOISE = b"unshare: sigprocmask unblock failed: Invalid argument\n"  # printed when we kill its child


class SandboxError(ReflectRLError, RuntimeError):
    """The sandbox itself could not run (not a verdict about the code)."""


class SandboxWarning(RuntimeWarning):
    """Some protections are not in force on this machine."""


@dataclass
class Verdict:
    """Outcome of running code against tests; ``passed`` counts only results the parent validated."""

    status: str
    passed: int
    total: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain-dict form (JSON-serialisable)."""
        return asdict(self)

    def to_json(self) -> str:
        """One-line JSON form."""
        return json.dumps(self.to_dict())


# --------------------------------------------------------------------------------------------
# The runner: executed inside the sandbox as `python -I -B -c _RUNNER`. It reads its job (marshal)
# from stdin, applies the isolation steps it is asked for, then runs code and tests, reporting
# each result as "<nonce> <kind> <index> <ok> <info>" on a private pipe. After untrusted code
# starts, it only uses references it bound beforehand (see docs/sandbox.md for the limits).
# --------------------------------------------------------------------------------------------
_RUNNER_LIB = r'''
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
KEEP_FLAGS = 2 | 4 | 8 | 1024 | 2048  # nosuid nodev noexec noatime nodiratime (same bits in statvfs)


def read_job():
    """The whole job from stdin; stdin is then /dev/null, so the code cannot read what follows."""
    chunks = []
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    import marshal  # the parent is the same interpreter; json would cost ~15 ms of imports
    return marshal.loads(b"".join(chunks))


_LIBC = []


def libc():
    """ctypes and the C library, loaded once per process (a batch runner's children inherit it)."""
    if not _LIBC:
        import ctypes
        _LIBC.append((ctypes, ctypes.CDLL(None, use_errno=True)))
    return _LIBC[0]


def mounter():
    """mount(2), raising OSError on failure."""
    ctypes, lib = libc()
    def enc(text):
        return None if text is None else text.encode()

    def mount(src, dst, fstype, flags, data=None):
        if lib.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "mount %s: %s" % (dst, os.strerror(err)))
    return mount


def mountpoints():
    """Mount points of this mount namespace, unescaped, in order."""
    seen = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4]
            for code in ("\\040", "\\011", "\\012", "\\134"):
                point = point.replace(code, chr(int(code[1:], 8)))
            if point not in seen:
                seen.append(point)
    return seen


def isolate_fs(plan):
    """Hide tmp/home dirs, re-expose python and the work dir, make every other mount read-only."""
    mount, rw = mounter(), plan["rw"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = [(os.open(path, os.O_PATH), path) for path in plan["ro"] + [rw]]
    for path in plan["hide"]:
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k")
    for fd, path in keep:
        os.makedirs(path, exist_ok=True)
        mount("/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
        os.close(fd)
    points = [p for p in mountpoints() if p != rw and not p.startswith(rw + "/")]
    for point in points:
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue
        if not flags & MS_RDONLY:
            extra = (flags & KEEP_FLAGS) | (MS_RELATIME if flags & 4096 else 0)
            try:
                mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra)
            except OSError:
                pass
    still_rw = [p for p in points if os.path.exists(p) and not os.statvfs(p).f_flag & MS_RDONLY]
    return "ro_failed=" + ",".join(still_rw) if still_rw else ""


def set_limits(limits):
    """Apply (soft, hard) rlimits; names that could not be set are returned as a note."""
    import resource
    failed = []
    for name, (soft, hard) in limits.items():
        kind = getattr(resource, "RLIMIT_" + name, None)
        try:
            resource.setrlimit(kind, (soft, hard))
        except (ValueError, OSError, TypeError):
            failed.append(name)
    return "limits_failed=" + ",".join(failed) if failed else ""


def caps(*fields):
    """The OR of capability masks (CapEff, CapPrm, ...) of this process."""
    mask = 0
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.split(":", 1)[0] in fields:
                    mask |= int(line.split()[1], 16)
    except OSError:
        pass
    return mask


def drop_privileges(uid):
    """Empty the capability bounding set, set no_new_privs, then switch to `uid` or drop caps."""
    if not sys.platform.startswith("linux"):
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        return
    ctypes, lib = libc()
    if caps("CapEff"):
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            last = int(fh.read())
        for cap in range(last + 1):
            if lib.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP failed")
        lib.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    if lib.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    elif caps("CapEff", "CapPrm"):
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        data = (ctypes.c_uint32 * 6)()
        if lib.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
            raise OSError(ctypes.get_errno(), "capset failed")
    if caps("CapEff", "CapPrm"):
        raise RuntimeError("capabilities are still held")


def setup(job):
    """All isolation steps, before any untrusted code runs; returns notes on what did not hold."""
    os.umask(0o022)
    notes = [isolate_fs(job["mounts"]) if job["mounts"] else ""]
    os.chdir(job["workdir"])
    notes.append(set_limits(job["limits"]))
    drop_privileges(job["uid"])
    return ";".join(n for n in notes if n) or "-"


def exc_name(exc, _type=type, _str=str):
    """Sanitised class name of an exception, without running any of its (untrusted) methods."""
    try:
        name = _type.__dict__["__name__"].__get__(_type(exc))
        if _type(name) is not _str:
            return "?"
    except BaseException:
        return "?"
    allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_."
    return "".join([c for c in name[:64] if c in allowed]) or "?"


def make_reporter(nonce, fd, _write=os.write, _str=str):
    """report(kind, index, ok, info): one nonce-tagged line on the private pipe."""
    prefix = nonce + " "
    def report(kind, index, ok, info="-"):
        try:
            line = prefix + kind + " " + _str(index) + " " + ("1" if ok else "0") + " " + info + "\n"
            _write(fd, line.encode("utf-8", "replace"))
        except BaseException:
            pass
    return report


def make_executor(ns, reserve, _exec=exec, _base=BaseException, _mem=MemoryError,
                  _isinstance=isinstance, _name=exc_name, _trace=sys.settrace, _prof=sys.setprofile):
    """run(code_object) -> None if it completed, else the exception's class name."""
    def run(code):
        try:
            _exec(code, ns)
            err = None
        except _base as exc:
            if _isinstance(exc, _mem):
                reserve.clear()
            err = _name(exc)
        try:
            _trace(None)
            _prof(None)
        except _base:
            pass
        return err
    return run


def make_finisher(_sys=sys, _exit=os._exit, _base=BaseException, _getattr=getattr):
    """finish(): flush what the code printed, then exit without running its atexit hooks."""
    def finish():
        for name in ("stdout", "stderr"):
            try:
                _getattr(_sys, name).flush()
            except _base:
                pass
        _exit(0)
    return finish


def main():
    """Read the job from stdin and run it in this process."""
    run_job(read_job())


def run_job(job):
    """Compile the tests, isolate, then run the code and each test, reporting each; never returns."""
    import _ast  # not ast: same nodes, no import cost
    import builtins
    report = make_reporter(job["nonce"], job["fd"])
    tree = compile(job["tests"], "<tests>", "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
    units = [(i, compile(_ast.Module(body=[stmt], type_ignores=[]), "<test %d>" % i, "exec",
                         dont_inherit=True, optimize=0)) for i, stmt in enumerate(tree.body)]
    n_units = len(units)
    try:
        solution, compile_err = compile(job["code"], "<solution>", "exec", dont_inherit=True, optimize=0), None
    except BaseException as exc:
        solution, compile_err = None, exc_name(exc)
    module = type(sys)("solution")
    ns = module.__dict__
    ns["__builtins__"] = builtins
    reserve = [bytearray(1 << 20)]
    run = make_executor(ns, reserve)
    finish = make_finisher()
    try:
        notes = setup(job)
    except BaseException as exc:
        report("setup", 0, False, (exc_name(exc) + ":" + str(exc)).replace("\n", " ")[:400])
        os._exit(70)
    sys.modules["solution"] = sys.modules["__main__"] = module
    del job, tree
    report("setup", 0, True, notes)
    err = compile_err or run(solution)
    report("define", 0, err is None, err or "-")
    if err is None:
        for index, unit in units:
            err = run(unit)
            report("test", index, err is None, err or "-")
    report("done", n_units, True)
    finish()
'''
_RUNNER = _RUNNER_LIB + "\n\nmain()\n"

# --------------------------------------------------------------------------------------------
# The batch runner: `python -I -B -c _BATCH_RUNNER` inside one sandbox (PID namespace required).
# It reads a header frame, then one frame per job *just before running it*; for each job it kills
# every other process in the namespace, wipes the work dir and SysV IPC, draws the job's nonce,
# announces it on its private control pipe, forks the job's child (which keeps only its own three
# pipes and runs `run_job` exactly as the single runner does), enforces the wall-time limit, kills
# what the job left, closes the job's pipes and reports the exit. It never runs untrusted code and
# never reads what a job writes.
# --------------------------------------------------------------------------------------------
_BATCH_MAIN = r'''

def read_exact(n):
    """n bytes from stdin (the parent's job pipe); b'' at EOF."""
    chunks, left = [], n
    while left:
        chunk = os.read(0, min(left, 1 << 16))
        if not chunk:
            return b""
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame():
    """One length-prefixed marshal frame."""
    import marshal
    head = read_exact(10)
    if len(head) != 10:
        raise EOFError("job stream ended")
    return marshal.loads(read_exact(int(head)))


def ancestors():
    """This process and its ancestors inside the PID namespace (never signalled)."""
    keep, pid = {os.getpid()}, os.getppid()
    while pid > 0 and pid not in keep:
        keep.add(pid)
        try:
            with open("/proc/%d/stat" % pid) as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return keep


def live_others(keep):
    """Pids in this namespace, other than `keep`, that are not zombies."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in keep:
            try:
                with open("/proc/%s/stat" % entry) as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                out.append(int(entry))
    return out


def reap():
    """Collect exited children (as namespace init, orphans are ours too)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(keep, time):
    """SIGKILL every process of the namespace except us and our ancestors; True once none is left."""
    end = time.monotonic() + 3.0
    while True:
        try:
            os.kill(-1, 9)  # every process we may signal in this PID namespace, except us and its init
        except OSError:
            pass
        reap()
        alive = live_others(keep)
        if not alive:
            return True
        for pid in alive:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        if time.monotonic() > end:
            return False
        time.sleep(0.001)


def ipc_ids():
    """(kind, id) of every SysV shared-memory segment, message queue and semaphore set of this IPC namespace."""
    found = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open("/proc/sysvipc/" + kind) as fh:
                found += [(kind, int(line.split()[1])) for line in fh.read().splitlines()[1:] if line.strip()]
        except (OSError, ValueError, IndexError):
            continue
    return found


def clear_ipc(lib, uid):
    """Remove every SysV IPC object a job left (as its creator: IPC_RMID needs the owner); True if none is left."""
    found = ipc_ids()
    if not found:
        return True
    pid = os.fork() if uid is not None else 0
    if pid == 0:
        try:
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            for kind, ident in found:
                if kind == "shm":
                    lib.shmctl(ident, 0, None)  # IPC_RMID
                elif kind == "msg":
                    lib.msgctl(ident, 0, None)
                else:
                    lib.semctl(ident, 0, 0)
        finally:
            if uid is not None:
                os._exit(0)
    else:
        os.waitpid(pid, 0)
    return not ipc_ids()


def wipe(work, uid, mode):
    """Empty the work dir (never following links) and give it back its fresh owner and mode."""
    import shutil
    import stat
    os.chmod(work, 0o700)
    for name in os.listdir(work):
        path = work + "/" + name
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            os.chmod(path, 0o700)
            for root, dirs, _ in os.walk(path):
                for sub in dirs:
                    try:
                        os.chmod(root + "/" + sub, 0o700, follow_symlinks=False)
                    except OSError:
                        pass
            shutil.rmtree(path)
        else:
            os.unlink(path)
    if os.listdir(work):
        raise OSError("work dir not empty after wipe")
    if uid is not None:
        os.chown(work, uid, uid)
    os.chmod(work, mode)


def wait_child(pid, deadline, time):
    """The child's wait status, or None if it is still running at `deadline` (monotonic)."""
    import select
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.002))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def batch_main():
    """Run the jobs of the batch one after another, each in a freshly forked child."""
    import _ast, builtins, marshal, resource, time  # noqa: F401 - imported once, before any fork
    ctypes, lib = libc()
    conf = read_frame()
    ctl = conf["control"]

    def say(text):
        os.write(ctl, (text + "\n").encode("ascii", "replace"))

    try:
        if os.getpid() > 8:  # kill(-1) below is only safe inside a fresh PID namespace
            raise RuntimeError("not in a fresh PID namespace (pid %d)" % os.getpid())
        notes = isolate_fs(conf["mounts"]) if conf["mounts"] else ""
        if lib.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0: no ptrace, no /proc/PID/{mem,fd} for same-uid code
            raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE failed")
        os.chdir("/")
        keep = ancestors()
        work, uid, mode = conf["workdir"], conf["uid"], conf["mode"]
        null = os.open(os.devnull, os.O_RDWR)
        max_fd = os.sysconf("SC_OPEN_MAX")
    except BaseException as exc:
        say("abort -1 " + (exc_name(exc) + ":" + str(exc)).replace("\n", " ")[:300])
        os._exit(0)
    say("ready " + (notes or "-"))
    for index, (chan, out, err) in enumerate(conf["fds"]):
        try:
            if not (sweep(keep, time) and clear_ipc(lib, uid)):
                raise RuntimeError("processes or IPC objects survived the sweep")
            wipe(work, uid, mode)
            job = read_frame()
        except BaseException as exc:
            say("abort %d %s" % (index, (exc_name(exc) + ":" + str(exc)).replace("\n", " ")[:300]))
            os._exit(0)
        job.update(conf["job"])
        job["nonce"] = nonce = os.urandom(16).hex()  # drawn now: no earlier child ever held it
        job["fd"] = 3
        say("start %d %s" % (index, nonce))
        del nonce
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                os.dup2(null, 0)
                os.dup2(out, 1)
                os.dup2(err, 2)
                os.dup2(chan, 3)
                os.closerange(4, max_fd)  # other jobs' pipes, the control pipe, /dev/null
                run_job(job)
            finally:
                os._exit(71)
        del job
        status = wait_child(pid, started + conf["timeout"], time)
        timed_out = status is None
        if timed_out:
            try:
                os.killpg(pid, 9)
            except OSError:
                pass
            _, status = os.waitpid(pid, 0)
        duration = time.monotonic() - started
        code = os.waitstatus_to_exitcode(status)
        clean = sweep(keep, time)
        for fd in (chan, out, err):
            os.close(fd)
        say("end %d %d %d %.4f" % (index, timed_out, code, duration))
        if not clean:
            say("abort %d processes survived the sweep" % (index + 1))
            os._exit(0)
    sweep(keep, time)
    say("finished")
    os._exit(0)


batch_main()
'''
_BATCH_RUNNER = _RUNNER_LIB + _BATCH_MAIN


# --------------------------------------------------------------------------------------------
# Backends: what the OS offers, probed once per process and cached.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Backend:
    """A working way to launch the runner, with the protections it was verified to give."""

    name: str
    drop_uid: bool
    protections: dict = field(default_factory=dict, compare=False)


_PROBED: dict[str, _Backend | None] = {}
_PROBE_ERRORS: dict[str, str] = {}
_WARNED: set[str] = set()
_LOCK = threading.RLock()


def _is_root() -> bool:
    """Whether we may switch the child to a dedicated uid."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _protections(name: str, drop_uid: bool, notes: str) -> dict[str, bool]:
    """The protections a backend gives, given the runner's setup notes from the probe."""
    ns = name in ("bwrap", "unshare")
    failed_limits = _note(notes, "limits_failed")
    userns = ns and not _is_root()  # non-root: processes are counted inside a fresh user namespace
    return {
        "separate_process": True,
        "wall_timeout": True,
        "cpu_limit": "CPU" not in failed_limits,
        "memory_limit": "AS" not in failed_limits and sys.platform.startswith("linux"),
        "process_limit": "NPROC" not in failed_limits and (drop_uid or userns),
        "output_limit": True,
        "clean_env": True,
        "temp_workdir": True,
        "pid_namespace": ns,
        "kill_all_descendants": ns or drop_uid,
        "network_isolated": ns,
        "fs_readonly_outside_workdir": ns and not _note(notes, "ro_failed"),
        "tmp_and_home_hidden": ns,
        "dedicated_uid": drop_uid,
        "parent_protected": ns or drop_uid,
    }


def _note(notes: str, key: str) -> list[str]:
    """Values of `key=a,b` in the runner's `;`-separated setup notes."""
    for part in notes.split(";"):
        if part.startswith(key + "="):
            return part[len(key) + 1 :].split(",")
    return []


def _candidates(name: str) -> list[tuple[str, bool]]:
    """(backend, drop_uid) variants to try for a backend name, strongest first."""
    variants = [True, False] if _is_root() else [False]  # a dedicated uid needs root and a mapped uid range
    if name == "bwrap" and not shutil.which("bwrap"):
        return []
    if name == "unshare" and not (shutil.which("unshare") and sys.platform.startswith("linux")):
        return []
    return [(name, drop_uid) for drop_uid in variants]


def _probe(name: str) -> _Backend | None:
    """Try a backend once with a trivial job; the first variant whose runner reports success wins."""
    with _LOCK:
        if name not in _PROBED:
            _PROBED[name] = None
            for backend, drop_uid in _candidates(name):
                trial = _Backend(backend, drop_uid)
                try:
                    verdict, notes = _execute(trial, _PROBE_CODE, _PROBE_TESTS, 10.0, 256, 4096, 64)
                except (SandboxError, OSError) as exc:
                    _PROBE_ERRORS[name] = str(exc)
                    continue
                if verdict.status == "passed":
                    _PROBED[name] = _Backend(backend, drop_uid, _protections(backend, drop_uid, notes))
                    break
                hint = " (is the Python installation readable by other users?)" if drop_uid else ""
                _PROBE_ERRORS[name] = f"trial run ended with status {verdict.status!r}{hint} {verdict.stderr[-300:]}"
            if _PROBED[name] is None and name not in _PROBE_ERRORS:
                _PROBE_ERRORS[name] = "not installed or not supported on this OS"
        return _PROBED[name]


def _select(backend: str | None) -> _Backend:
    """The requested backend (or the strongest available one), warning once about missing protections."""
    backend = backend or os.environ.get("REFLECTRL_SANDBOX_BACKEND") or "auto"
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; expected auto or one of {BACKENDS}")
    for name in BACKENDS if backend == "auto" else (backend,):
        chosen = _probe(name)
        if chosen is not None:
            with _LOCK:
                _warn_once(chosen)
            return chosen
    raise SandboxError(f"sandbox backend {backend!r} is unavailable: {_PROBE_ERRORS.get(backend, '')}")


def _warn_once(backend: _Backend) -> None:
    """One clear warning per backend listing which protections hold and which do not."""
    missing = [k for k, v in backend.protections.items() if not v]
    key = f"{backend.name}/{backend.drop_uid}"
    if not set(missing) - {"dedicated_uid"} or key in _WARNED:  # a dedicated uid only matters without namespaces
        return
    _WARNED.add(key)
    held = [k for k, v in backend.protections.items() if v]
    hint = "" if backend.name == "bwrap" else " Install bubblewrap (apt-get install bubblewrap) for full isolation."
    rank = BACKENDS.index(backend.name)
    why = "".join(f" [{n}: {e.strip()}]" for n, e in _PROBE_ERRORS.items() if BACKENDS.index(n) <= rank)
    warnings.warn(
        f"reflectrl sandbox uses backend {backend.name!r}; NOT in force: {', '.join(missing)}; "
        f"in force: {', '.join(held)}.{why}{hint}",
        SandboxWarning,
        stacklevel=4,
    )


def sandbox_backend(backend: str | None = None) -> str:
    """Name of the backend that `run_tests` would use ('bwrap', 'unshare' or 'none')."""
    return _select(backend).name


def sandbox_capabilities(backend: str | None = None) -> dict[str, bool]:
    """The protections in force for untrusted code (probed once, then cached)."""
    return dict(_select(backend).protections)


# --------------------------------------------------------------------------------------------
# Launching one run.
# --------------------------------------------------------------------------------------------
def _python_dirs() -> list[str]:
    """Directories the interpreter needs, so they can be re-exposed under hidden dirs."""
    found = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    found |= {os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))}
    found |= {p for p in sys.path if p and os.path.isabs(p) and os.path.exists(p)}
    return sorted(os.path.realpath(p) for p in found)


def _mount_plan(work: str) -> dict:
    """Which dirs to hide behind empty read-only tmpfs, and what to bind back (read-only / rw)."""
    hide = [d for d in _HIDDEN_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    under = [p for p in _python_dirs() if any(p == h or p.startswith(h + "/") for h in hide)]
    ro = [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]
    return {"hide": hide, "ro": ro, "rw": work}


def _bwrap_argv(work: str, root: bool, drop_uid: bool, batch: bool = False) -> list[str]:
    """bubblewrap command line: read-only root, private /dev /proc, hidden tmp/home, rw work dir."""
    plan = _mount_plan(work)
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net"]
    argv += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--ro-bind", "/", "/"]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for hidden in [h for h in plan["hide"] if h != "/dev/shm"]:
        argv += ["--tmpfs", hidden]
    for path in plan["ro"]:
        for parent in _parents_below_hidden(path, plan["hide"]):
            argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", path, path]
    argv += [a for p in _parents_below_hidden(work, plan["hide"]) for a in ("--perms", "0755", "--dir", p)]
    argv += ["--bind", work, work]
    for hidden in [h for h in plan["hide"] if h != "/dev/shm"] + ["/dev"]:
        argv += ["--remount-ro", hidden]
    if root:  # bwrap run by root keeps every capability unless told otherwise
        caps = ("SETPCAP", "SETUID", "SETGID") if drop_uid else ("SETPCAP",)  # for the runner's privilege drop
        if batch:  # the batch runner kills what a job left and wipes its files (jobs drop all caps)
            caps += ("KILL", "DAC_OVERRIDE", "FOWNER", "CHOWN")
        argv += ["--cap-drop", "ALL"] + [a for c in caps for a in ("--cap-add", f"CAP_{c}")]
    return argv + ["--chdir", work, "--"]


def _parents_below_hidden(path: str, hidden: list[str]) -> list[str]:
    """Intermediate directories between a hidden dir and `path` (bwrap would create them 0700)."""
    top = next((h for h in hidden if path.startswith(h + "/")), None)
    if top is None:
        return []
    parts = path[len(top) + 1 :].split("/")[:-1]
    return [top + "/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _unshare_argv(root: bool) -> list[str]:
    """util-linux unshare: new pid/net/mount/ipc/uts namespaces; the runner does the mounts."""
    user = [] if root else ["--user", "--map-root-user"]
    namespaces = ["--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc", "--uts"]
    return ["unshare", *user, *namespaces, "--"]


def _clean_env(work: str) -> dict[str, str]:
    """The child's whole environment: nothing is inherited from the parent."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8"}


def _job(backend: _Backend, code: str, tests: str, work: str, uid: int | None, limits: dict) -> dict:
    """The JSON job the runner reads from stdin (the channel fd is filled in at launch)."""
    mounts = _mount_plan(work) if backend.name == "unshare" else None
    return {"code": code, "tests": tests, "nonce": secrets.token_hex(16), "fd": -1, "workdir": work,
            "uid": uid, "limits": limits, "mounts": mounts}


# --------------------------------------------------------------------------------------------
# Dedicated uids (root only): one per concurrent run, so RLIMIT_NPROC is exact and `kill -1`
# run as that uid reaches every process the code started, even outside a PID namespace.
# --------------------------------------------------------------------------------------------
_UID_SLOTS = 1024


def _uid_base() -> int:
    """Start of a uid range inside this (possibly nested) user namespace's uid map."""
    top = 2_000_000_000
    try:
        with open("/proc/self/uid_map") as fh:
            ends = [int(a) + int(c) for _, a, c in (line.split() for line in fh)]
        top = min(top, max(ends) - 2)
    except (OSError, ValueError):
        top = 65533
    return top - _UID_SLOTS


class _UidLease:
    """Exclusive use of one unused uid, across threads and processes (flock on a lock file)."""

    def __enter__(self) -> int:
        import fcntl

        lock_dir = os.path.join(tempfile.gettempdir(), "reflectrl-sandbox-uids")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        info = os.lstat(lock_dir)
        if not os.path.isdir(lock_dir) or os.path.islink(lock_dir) or info.st_uid != os.geteuid():
            raise SandboxError(f"{lock_dir} is not a directory owned by us; remove it")
        base = _uid_base()
        for slot in range(_UID_SLOTS):
            uid = base + slot
            fh = open(os.path.join(lock_dir, str(uid)), "a")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()
                continue
            if _uid_is_free(uid):
                self._fh, self.uid = fh, uid
                return uid
            fh.close()
        raise SandboxError("no free sandbox uid")

    def __exit__(self, *exc) -> None:
        _reap_uid(self.uid)
        self._fh.close()


def _uid_is_free(uid: int) -> bool:
    """No account and no process uses this uid."""
    import pwd

    try:
        pwd.getpwuid(uid)
        return False
    except KeyError:
        return not _pids_of_uid(uid)


def _pids_of_uid(uid: int) -> list[int]:
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


def _reap_uid(uid: int, timeout_s: float = 5.0) -> None:
    """Kill every process of `uid` with `kill -9 -1` run as that uid, until none is left."""
    deadline = time.monotonic() + timeout_s
    while _pids_of_uid(uid):
        if time.monotonic() > deadline:
            log.warning("sandbox uid %d still has processes after %.1fs", uid, timeout_s)
            return
        subprocess.run(["/bin/sh", "-c", "kill -9 -1"], user=uid, group=uid, extra_groups=[],
                       env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.005)


class _NoLease:
    """Stand-in for `_UidLease` when no uid switch is done."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


# --------------------------------------------------------------------------------------------
# Talking to the child: bounded capture of stdout/stderr, validated records from the channel.
# --------------------------------------------------------------------------------------------
class _Capped:
    """Keep the first `limit` bytes of a stream, count (and discard) the rest."""

    def __init__(self, limit: int):
        self.data, self.limit, self.dropped = bytearray(), limit, 0

    def feed(self, chunk: bytes) -> None:
        room = max(0, self.limit - len(self.data))
        self.data += chunk[:room]
        self.dropped += len(chunk) - min(room, len(chunk))

    def text(self) -> str:
        text = self.data.decode("utf-8", "replace")
        return text + f"\n...[{self.dropped} more bytes truncated]" if self.dropped else text


class _Channel:
    """Result records `<nonce> <kind> <index> <0|1> <info>`; lines without the nonce are ignored."""

    KINDS = {"setup", "define", "test", "done"}

    def __init__(self, nonce: str):
        self.nonce, self.buf, self.seen = nonce.encode(), b"", 0
        self.records: dict[tuple[str, int], tuple[bool, str]] = {}

    def feed(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.seen > _CHANNEL_CAP:
            return
        *lines, self.buf = (self.buf + chunk).split(b"\n")
        for line in lines:
            self._parse(line)

    def _parse(self, line: bytes) -> None:
        parts = line.split(b" ", 4)
        if len(parts) != 5 or not secrets.compare_digest(parts[0], self.nonce):
            return
        kind, index, ok = parts[1].decode("ascii", "replace"), parts[2], parts[3]
        if kind in self.KINDS and index.isdigit() and ok in (b"0", b"1"):
            self.records.setdefault((kind, int(index)), (ok == b"1", parts[4].decode("utf-8", "replace")))

    def get(self, kind: str, index: int = 0) -> tuple[bool, str] | None:
        """The first valid record of this kind and index."""
        return self.records.get((kind, index))

    def finished(self) -> bool:
        """Whether a (validated) final record arrived."""
        return any(kind == "done" for kind, _ in self.records)


@dataclass
class _Outcome:
    """Everything observed about one finished child."""

    channel: _Channel
    stdout: _Capped
    stderr: _Capped
    returncode: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the child has exited, without reaping it (so its pid/pgid cannot be reused yet)."""
    if not hasattr(os, "waitid"):
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _pump(proc: subprocess.Popen, chan_fd: int, payload: bytes, seen: _Outcome, timeout_s: float) -> bool:
    """Feed the job and read all pipes until exit, final report + grace, or deadline; True on timeout."""
    sel = selectors.DefaultSelector()
    sinks = {proc.stdout.fileno(): seen.stdout.feed, proc.stderr.fileno(): seen.stderr.feed,
             chan_fd: seen.channel.feed}
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
    pending, chan = memoryview(payload), seen.channel
    deadline, started, finish_by = time.monotonic() + _STARTUP_S, False, None
    while sinks:
        now = time.monotonic()
        if not started and chan.get("setup"):
            started, deadline = True, now + timeout_s
        if finish_by is None and (chan.finished() or _exited(proc)):
            finish_by = now + (_GRACE_S if chan.finished() else 0.2)
        limit = min(deadline, finish_by or deadline)
        if now >= limit:
            break
        for key, _ in sel.select(min(limit - now, 0.05)):
            if key.fd not in sinks:
                pending = _write_some(sel, proc.stdin, pending)
            elif not _read_some(key.fd, sinks[key.fd]):
                sel.unregister(key.fd)
                del sinks[key.fd]
    sel.close()
    if not started and chan.get("setup") is None and not _exited(proc):
        raise SandboxError(f"sandbox did not start within {_STARTUP_S:.0f}s")
    return started and not chan.finished() and time.monotonic() >= deadline


def _write_some(sel: selectors.BaseSelector, stdin, pending: memoryview) -> memoryview:
    """Write what the pipe takes; close stdin once the job is sent (or the child stopped reading)."""
    try:
        pending = pending[os.write(stdin.fileno(), pending) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        pending = pending[:0]
    if not pending:
        sel.unregister(stdin.fileno())
        _close(stdin)
    return pending


def _close(stream) -> None:
    """Close a pipe file object, ignoring a reader that went away."""
    try:
        stream.close()
    except OSError:
        pass


def _read_some(fd: int, sink) -> bool:
    """Read available bytes into `sink`; False at EOF (or when nothing is available right now)."""
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return True
    if chunk:
        sink(chunk)
    return bool(chunk)


def _drain(fd: int, sink) -> None:
    """Read whatever is left in a (non-blocking) pipe after the child was killed."""
    os.set_blocking(fd, False)
    try:
        while (chunk := os.read(fd, 1 << 16)):
            sink(chunk)
    except (BlockingIOError, OSError):
        pass


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (for a namespace wrapper: the namespace's init)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        return []


def _kill(proc: subprocess.Popen, wrapped: bool) -> None:
    """Kill the namespace init first (the kernel then kills everything in it), then the group; reap."""
    if wrapped and not _exited(proc):
        for child in _children(proc.pid):
            _signal(child)
        end = time.monotonic() + 1.0
        while not _exited(proc) and time.monotonic() < end:
            time.sleep(0.002)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _signal(pid: int) -> None:
    """SIGKILL one process, ignoring races with its exit."""
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _limits(backend: _Backend, timeout_s: float, memory_mb: int, max_processes: int) -> dict[str, list[int]]:
    """(soft, hard) rlimits the runner applies to itself before running the code."""
    cpu = math.ceil(timeout_s) + 1
    limits = {"AS": [memory_mb << 20] * 2, "CPU": [cpu, cpu + 1], "FSIZE": [_FSIZE] * 2, "CORE": [0, 0]}
    if backend.drop_uid or backend.name != "none":  # exact only for a dedicated uid / fresh user namespace
        limits["NPROC"] = [max_processes] * 2
    return limits


def _execute(backend: _Backend, code: str, tests: str, timeout_s: float, memory_mb: int, max_bytes: int,
             max_processes: int) -> tuple[Verdict, str]:
    """One sandboxed run; returns the verdict and the runner's setup notes."""
    assert_indices, n_statements = _parse_tests(tests)
    lease = _UidLease() if backend.drop_uid else _NoLease()
    with lease as uid, tempfile.TemporaryDirectory(prefix="reflectrl-sbx-") as work:
        if uid is not None:
            os.chown(work, uid, uid)
            os.chmod(work, 0o711)  # the wrapper (root without capabilities) must be able to enter it
        limits = _limits(backend, timeout_s, memory_mb, max_processes)
        seen = _launch(backend, _job(backend, code, tests, work, uid, limits), timeout_s, max_bytes)
        _make_removable(work)
    setup = seen.channel.get("setup")
    if setup is None or not setup[0]:
        detail = setup[1] if setup else seen.stderr.text()[-400:].strip()
        raise SandboxError(f"sandbox setup failed ({backend.name}): {detail or 'no report'}")
    return _verdict(seen, assert_indices, n_statements), setup[1]


def _wrapper_argv(backend: _Backend, work: str, batch: bool = False) -> list[str]:
    """Command prefix that puts the runner into namespaces (empty for the 'none' backend)."""
    if backend.name == "bwrap":
        return [shutil.which("bwrap") or "bwrap", *_bwrap_argv(work, _is_root(), backend.drop_uid, batch)[1:]]
    if backend.name == "unshare":
        return [shutil.which("unshare") or "unshare", *_unshare_argv(_is_root())[1:]]
    return []


def _launch(backend: _Backend, job: dict, timeout_s: float, max_bytes: int) -> _Outcome:
    """Start the runner in its own session, collect its output and reports, then kill everything."""
    chan_r, chan_w = os.pipe()
    job["fd"] = chan_w
    seen = _Outcome(_Channel(job["nonce"]), _Capped(max_bytes), _Capped(max_bytes))
    argv = _wrapper_argv(backend, job["workdir"]) + [sys.executable, "-I", "-B", "-c", _RUNNER]
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(chan_w,), cwd=job["workdir"], env=_clean_env(job["workdir"]),
                                start_new_session=True)
    except OSError:
        os.close(chan_r)
        raise
    finally:
        os.close(chan_w)
    try:
        seen.timed_out = _pump(proc, chan_r, marshal.dumps(job), seen, timeout_s)
    finally:
        _kill(proc, wrapped=backend.name != "none")
        for fd, sink in ((chan_r, seen.channel.feed), (proc.stdout.fileno(), seen.stdout.feed),
                         (proc.stderr.fileno(), seen.stderr.feed)):
            _drain(fd, sink)
        os.close(chan_r)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            _close(stream)
    seen.returncode, seen.duration_s = proc.returncode, time.monotonic() - start
    seen.stderr.data = seen.stderr.data.replace(_UNSHARE_NOISE, b"")
    return seen


def _make_removable(path: str) -> None:
    """Give the owner write+exec on every directory the code created, so cleanup cannot fail."""
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            try:
                os.chmod(os.path.join(root, name), 0o700, follow_symlinks=False)
            except OSError:
                pass


# --------------------------------------------------------------------------------------------
# Batches: many jobs in one sandbox launch, each in its own freshly forked child (see _BATCH_MAIN).
# --------------------------------------------------------------------------------------------
BATCH_SIZE = 16  # default jobs per sandbox launch
_BATCH_MAX = 128  # jobs per launch at most (three pipes per job are passed into the sandbox)
_BATCH_SETUP_S = 0.05  # allowance for the child's own set-up (rlimits, privilege drop) on top of timeout_s
_BATCH_SLACK_S = 2.0  # how far past a job's limit the parent waits for the runner's report before giving up
_BATCH_GAP_S = 10.0  # time allowed between two jobs (sweep, wipe, reading the next job)
_BATCH_BROKEN: dict[str, str] = {}  # backend/variant -> why its batch runner cannot start here
_WARM_SLOTS = 64  # jobs one kept runner serves before a fresh one replaces it (SandboxPool, warm=True)


def _warm_slots(workers: int) -> int:
    """Slots per kept runner: ``_WARM_SLOTS``, fewer where the open-file limit is low (the parent holds
    three pipe ends per slot, for up to two runners per worker; a quarter of the limit is used)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    except (ImportError, OSError, ValueError):
        soft = 1024
    return max(2, min(_WARM_SLOTS, soft // 4 // (6 * max(1, workers))))


class _BatchJob:
    """What the parent collected about one job of a batch."""

    __slots__ = ("raw", "stdout", "stderr", "nonce", "end")

    def __init__(self, max_bytes: int):
        self.raw = _Capped(_CHANNEL_CAP)  # channel bytes, validated once the job's nonce is known
        self.stdout, self.stderr = _Capped(max_bytes), _Capped(max_bytes)
        self.nonce: bytes | None = None
        self.end: tuple[bool, int, float] | None = None  # (timed_out, returncode, duration_s) from the runner


class _Control:
    """The runner's control lines: ready / start k nonce / end k timed_out rc duration / abort / finished."""

    def __init__(self, jobs: list[_BatchJob]):
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
            return start + _STARTUP_S
        if self.current is not None:
            return self.since + timeout_s + _BATCH_SETUP_S + _BATCH_SLACK_S
        return self.since + _BATCH_GAP_S


def _frame(obj) -> bytes:
    """A length-prefixed marshal frame of the runner's job stream."""
    data = marshal.dumps(obj)
    return b"%010d" % len(data) + data


def _batch_key(backend: _Backend) -> str:
    return f"{backend.name}/{backend.drop_uid}"


def _batchable(backend: _Backend) -> bool:
    """Batches need a PID namespace (to kill every leftover process between jobs) and a working runner."""
    return backend.name in ("bwrap", "unshare") and bool(backend.protections.get("pid_namespace")) \
        and _batch_key(backend) not in _BATCH_BROKEN


class _BatchRunner:
    """One batch runner (one sandbox launch) with ``slots`` job slots, fed jobs call by call.

    The runner starts at construction and comes up in the background (so a replacement launched while
    the trainer generates is ready when the next chunk arrives). Each :meth:`run` sends its jobs into
    the next free slots and pumps the pipes until those jobs have ended; between calls the runner has
    swept its namespace and wiped the work dir and waits for the next job frame. One thread at a time."""

    def __init__(self, backend: _Backend, slots: int, timeout_s: float, memory_mb: int, max_bytes: int,
                 max_processes: int):
        self.backend, self.slots, self.timeout_s = backend, slots, timeout_s
        self.key = (_batch_key(backend), timeout_s, memory_mb, max_bytes, max_processes)
        self.used, self.broken = 0, False
        self.proc: subprocess.Popen | None = None
        self.sinks: dict[int, Any] = {}
        self.job_fds: list[tuple[int, int, int]] = []
        self.live: set[int] = set()
        self.sel = selectors.DefaultSelector()
        self._lease = _UidLease() if backend.drop_uid else _NoLease()
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._closed = False
        self.states = [_BatchJob(max_bytes) for _ in range(slots)]
        self.control = _Control(self.states)
        self.diag = _Capped(4096)
        uid = self._lease.__enter__()
        try:
            self._tmp = tempfile.TemporaryDirectory(prefix="reflectrl-sbx-")
            work = self.work = self._tmp.name
            mode = 0o700
            if uid is not None:
                os.chown(work, uid, uid)
                mode = 0o711  # the wrapper (root without capabilities) must be able to enter it
                os.chmod(work, mode)
            limits = _limits(backend, timeout_s, memory_mb, max_processes)
            limits["MSGQUEUE"] = [0, 0]  # no POSIX message queue: they would outlive the job in the IPC namespace
            self._start(work, uid, mode, limits, timeout_s)
        except BaseException:
            self.close()
            raise

    def _start(self, work: str, uid: int | None, mode: int, limits: dict, timeout_s: float) -> None:
        passed: list[int] = []
        try:
            ctl_r, ctl_w = os.pipe()
            self.sinks[ctl_r] = self.control.feed
            self.ctl_fd = ctl_r
            passed.append(ctl_w)
            triples = []
            for st in self.states:
                reads, writes = [], []
                for sink in (st.raw.feed, st.stdout.feed, st.stderr.feed):
                    r, w = os.pipe()
                    self.sinks[r] = sink
                    passed.append(w)
                    reads.append(r)
                    writes.append(w)
                self.job_fds.append(tuple(reads))
                triples.append(writes)
            conf = {"control": ctl_w, "fds": triples, "workdir": work, "uid": uid, "mode": mode,
                    "timeout": timeout_s + _BATCH_SETUP_S,
                    "mounts": _mount_plan(work) if self.backend.name == "unshare" else None,
                    "job": {"workdir": work, "uid": uid, "limits": limits, "mounts": None}}
            argv = _wrapper_argv(self.backend, work, batch=True) + [sys.executable, "-I", "-B", "-c", _BATCH_RUNNER]
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         pass_fds=passed, cwd=work, env=_clean_env(work), start_new_session=True)
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
        self.pending = memoryview(_frame(conf))
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

    def run(self, jobs: list[tuple[str, str]]) -> list[_BatchJob | None]:
        """Run ``jobs`` in the next free slots; per job its collected state, or None if the runner
        could not vouch for it (it stopped, aborted or missed a deadline: rerun that job alone)."""
        if len(jobs) > self.free:
            raise ValueError(f"{len(jobs)} jobs for {self.free} free slots")
        idx = range(self.used, self.used + len(jobs))
        self.used += len(jobs)
        self.pending = memoryview(bytes(self.pending) + b"".join(_frame({"code": c, "tests": t}) for c, t in jobs))
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
            if finish_by is None and (ended or ctl.finished or ctl.abort is not None or _exited(self.proc)):
                finish_by = now + (_GRACE_S if ended or ctl.finished or ctl.abort else 0.2)
            limit = min(ctl.deadline(self.timeout_s, start), finish_by or math.inf)
            if now >= limit:
                break
            for key, _ in self.sel.select(min(limit - now, 0.05)):
                if key.fd == self.stdin:
                    self._write()
                elif key.fd in self.live and not _read_some(key.fd, self.sinks[key.fd]):
                    self.sel.unregister(key.fd)
                    self.live.discard(key.fd)
        if ctl.ready is None or ctl.abort is not None or not all(self.states[i].end is not None for i in idx) \
                or (self.used < self.slots and (ctl.finished or _exited(self.proc))):
            self.broken = True
        return [self.states[i] if self.states[i].end is not None and self.states[i].nonce is not None else None
                for i in idx]

    def report_failure(self) -> None:
        """Log (once per runner) why it stopped vouching for jobs; remember a runner that cannot start."""
        ctl = self.control
        if ctl.ready is None:
            reason = ctl.abort or self.diag.text().replace(_UNSHARE_NOISE.decode(), "")[-300:].strip() or "no report"
            if ctl.abort and ctl.abort.startswith("-1 "):
                _BATCH_BROKEN[_batch_key(self.backend)] = reason
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
                _kill(self.proc, wrapped=True)
                for fd in list(self.sinks):
                    _drain(fd, self.sinks[fd])
                for fd in self.sinks:
                    if fd not in (self.proc.stdout.fileno(), self.proc.stderr.fileno()):
                        os.close(fd)
                for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                    _close(stream)
            else:
                for fd in self.sinks:
                    os.close(fd)
            self.sel.close()
            if self._tmp is not None:
                _make_removable(self._tmp.name)
                self._tmp.cleanup()
        finally:
            self._lease.__exit__(None, None, None)


def _verdicts_of(states: list[_BatchJob | None], jobs: list[tuple[str, str]]) -> list[Verdict | None]:
    """Verdicts from what a batch collected; None where the sandbox, not the code, failed."""
    out: list[Verdict | None] = []
    for st, (_, tests) in zip(states, jobs):
        if st is None:
            out.append(None)
            continue
        chan = _Channel(st.nonce.decode())
        chan.feed(bytes(st.raw.data))
        setup = chan.get("setup")
        if setup is None or not setup[0]:
            out.append(None)  # the sandbox, not the code, failed: the single run reports it properly
            continue
        assert_indices, n_statements = _parse_tests(tests)
        timed_out, returncode, duration = st.end
        seen = _Outcome(chan, st.stdout, st.stderr, returncode, timed_out and not chan.finished(), duration)
        out.append(_verdict(seen, assert_indices, n_statements))
    return out


def _execute_batch(backend: _Backend, jobs: list[tuple[str, str]], timeout_s: float, memory_mb: int,
                   max_bytes: int, max_processes: int) -> list[Verdict | None]:
    """One sandbox launch for all `jobs`; None for a job the batch could not vouch for (rerun it alone)."""
    runner = _BatchRunner(backend, len(jobs), timeout_s, memory_mb, max_bytes, max_processes)
    try:
        states = runner.run(jobs)
    finally:
        runner.close()
    if runner.broken:
        runner.report_failure()
    return _verdicts_of(states, jobs)


# --------------------------------------------------------------------------------------------
# Verdicts.
# --------------------------------------------------------------------------------------------
# CPython 3.11 before 3.11.8 keeps the AST constructor's recursion depth in shared state, so `ast.parse`
# from two threads at once can fail with "AST constructor recursion depth mismatch" (SystemError;
# CPython issue gh-106905): the pool's batch threads parse under one lock.
_AST_LOCK = threading.Lock()


def _parse_tests(tests: str) -> tuple[list[int], int]:
    """Positions of the top-level `assert` statements in `tests` (each one is a test), and the statement count."""
    try:
        with _AST_LOCK:
            body = ast.parse(tests).body
    except SyntaxError as exc:
        raise ValueError(f"tests do not parse: {exc.msg} (line {exc.lineno})") from None
    indices = [i for i, stmt in enumerate(body) if isinstance(stmt, ast.Assert)]
    if not indices:
        raise ValueError("tests contain no top-level assert statement")
    return indices, len(body)


def _verdict(outcome: _Outcome, assert_indices: list[int], n_statements: int) -> Verdict:
    """Status and counts from the validated records only (never from stdout)."""
    chan = outcome.channel
    results = [chan.get("test", i) for i in assert_indices]
    passed = sum(1 for r in results if r and r[0])
    define = chan.get("define")
    excs = [r[1] for r in results + [define] if r and not r[0]]
    died = chan.get("done", n_statements) is None
    xcpu = outcome.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU)
    if "MemoryError" in excs or (died and b"MemoryError" in bytes(outcome.stderr.data)):
        status = "memory"
    elif outcome.timed_out or (died and xcpu):
        status = "timeout"
    elif define is not None and not define[0]:
        status = "error"
    elif died:
        status = "killed"
    else:
        status = "passed" if passed == len(assert_indices) else "failed"
    return Verdict(status, passed, len(assert_indices), outcome.stdout.text(), outcome.stderr.text(),
                   round(outcome.duration_s, 4))


def _check(code: str, tests: str, timeout_s: float, memory_mb: int, max_output_bytes: int, max_processes: int) -> None:
    """Reject bad arguments with a clear ValueError/TypeError."""
    if not isinstance(code, str) or not isinstance(tests, str):
        raise TypeError("code and tests must be str")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
    sizes = {"memory_mb": memory_mb, "max_output_bytes": max_output_bytes, "max_processes": max_processes}
    for name, value in sizes.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if "\x00" in tests:
        raise ValueError("tests contain a NUL byte")


def run_tests(code: str, tests: str, timeout_s: float = 5.0, memory_mb: int = 512, *, backend: str | None = None,
              max_output_bytes: int = 4096, max_processes: int = 64) -> Verdict:
    """Run `code`, then each top-level assert of `tests` in its namespace, in a sandboxed child process.

    `timeout_s` bounds the wall time of code + tests (interpreter start-up excluded); `backend` forces
    'bwrap', 'unshare' or 'none' (default: strongest available, or $REFLECTRL_SANDBOX_BACKEND).
    """
    _check(code, tests, timeout_s, memory_mb, max_output_bytes, max_processes)
    _parse_tests(tests)
    chosen = _select(backend)
    return _execute(chosen, code, tests, float(timeout_s), memory_mb, max_output_bytes, max_processes)[0]


def check_job(code: str, tests: str, timeout_s: float = 5.0, memory_mb: int = 512, *, max_output_bytes: int = 4096,
              max_processes: int = 64) -> None:
    """Raise the ValueError/TypeError that `run_tests` would raise for these arguments (nothing is run)."""
    _check(code, tests, timeout_s, memory_mb, max_output_bytes, max_processes)
    _parse_tests(tests)


def batch_supported(backend: str | None = None) -> bool:
    """Whether `run_tests_batch` really batches with this backend (else it runs one sandbox per job)."""
    return _batchable(_select(backend))


def run_tests_batch(jobs: Iterable[tuple[str, str]], timeout_s: float = 5.0, memory_mb: int = 512, *,
                    backend: str | None = None, max_output_bytes: int = 4096, max_processes: int = 64,
                    batch_size: int = BATCH_SIZE) -> list[Verdict]:
    """`run_tests` for many (code, tests) pairs, ``batch_size`` jobs per sandbox launch; input order kept.

    Each job still runs in its own freshly forked process with its own limits, work dir, nonce and result
    channel (see docs/sandbox.md, "Batch mode"). Jobs the batch cannot vouch for (the runner was killed or
    stopped) are rerun one per sandbox, so every verdict is the job's own. Backends without a PID namespace
    (``none``) always run one sandbox per job. Bad arguments raise like `run_tests`, naming the job.
    """
    jobs = list(jobs)
    _check_jobs(jobs, timeout_s, memory_mb, max_output_bytes, max_processes)
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    chosen = _select(backend)
    verdicts: list[Verdict | None] = [None] * len(jobs)
    size = min(batch_size, _BATCH_MAX)
    for start in range(0, len(jobs), size):
        chunk = jobs[start:start + size]
        if len(chunk) < 2 or not _batchable(chosen):
            continue
        try:
            verdicts[start:start + len(chunk)] = _execute_batch(chosen, chunk, float(timeout_s), memory_mb,
                                                                max_output_bytes, max_processes)
        except (SandboxError, OSError) as exc:
            log.warning("sandbox batch (%s) failed: %s; running its jobs one per sandbox", chosen.name, exc)
    return _rerun_alone(chosen, jobs, verdicts, float(timeout_s), memory_mb, max_output_bytes, max_processes)


def _check_jobs(jobs: list, timeout_s: float, memory_mb: int, max_output_bytes: int, max_processes: int) -> None:
    """`check_job` for each (code, tests) pair; the error names the job."""
    for i, job in enumerate(jobs):
        try:
            code, tests = job
            check_job(code, tests, timeout_s, memory_mb, max_output_bytes=max_output_bytes,
                      max_processes=max_processes)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"job {i}: {exc}") from None


def _rerun_alone(backend: _Backend, jobs: list[tuple[str, str]], verdicts: list[Verdict | None], timeout_s: float,
                 memory_mb: int, max_bytes: int, max_processes: int) -> list[Verdict]:
    """Fill each verdict a batch could not vouch for (None) with the job's own single-sandbox run."""
    for i, verdict in enumerate(verdicts):
        if verdict is None:
            code, tests = jobs[i]
            verdicts[i] = _execute(backend, code, tests, timeout_s, memory_mb, max_bytes, max_processes)[0]
    return verdicts  # type: ignore[return-value]


_POOLS: "weakref.WeakSet[SandboxPool]" = weakref.WeakSet()


@atexit.register
def _close_kept_runners() -> None:
    for pool in list(_POOLS):
        pool.close_runners()


class SandboxPool:
    """Parallel verdicts: a thread pool, each thread driving one sandboxed subprocess (or batch) at a time.

    With ``warm=True`` (default) batches go to batch runners the pool keeps between calls: a runner
    serves up to ``warm_slots`` jobs over successive calls, and when it is used up a replacement is
    launched at once, so it comes up while the caller does other work (see docs/sandbox.md, "Batch
    mode"). ``warm=False`` makes one sandbox launch per batch."""

    def __init__(self, max_workers: int | None = None, warm: bool = True, warm_slots: int | None = None,
                 **run_kwargs):
        self._kwargs = run_kwargs
        self.max_workers = max_workers or os.cpu_count() or 1
        self._executor = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="reflectrl-sandbox")
        self.warm = warm
        self.warm_slots = warm_slots or _warm_slots(self.max_workers)
        self._idle: list[_BatchRunner] = []
        self._idle_lock = threading.Lock()
        self._closed = False
        _POOLS.add(self)

    def submit(self, code: str, tests: str, **run_kwargs) -> Future:
        """Schedule one run; the Future resolves to a Verdict."""
        return self._executor.submit(run_tests, code, tests, **{**self._kwargs, **run_kwargs})

    def submit_batch(self, jobs: Sequence[tuple[str, str]], **run_kwargs) -> Future:
        """Schedule `run_tests_batch` on one worker; the Future resolves to a list of Verdicts."""
        kwargs = {**self._kwargs, **run_kwargs}
        if self.warm:
            return self._executor.submit(self._run_warm, list(jobs), kwargs)
        return self._executor.submit(run_tests_batch, list(jobs), **kwargs)

    def _run_warm(self, jobs: list[tuple[str, str]], kwargs: dict) -> list[Verdict]:
        """`run_tests_batch` on a kept runner (same checks, same verdicts, same fallback to one per job)."""
        kw = {"timeout_s": 5.0, "memory_mb": 512, "max_output_bytes": 4096, "max_processes": 64, **kwargs}
        backend_name, batch_size = kw.pop("backend", None), kw.pop("batch_size", BATCH_SIZE)
        chosen = _select(backend_name)
        if len(jobs) < 2 or len(jobs) > min(batch_size, self.warm_slots) or not _batchable(chosen) or self._closed:
            return run_tests_batch(jobs, backend=backend_name, batch_size=batch_size, **kw)
        _check_jobs(jobs, kw["timeout_s"], kw["memory_mb"], kw["max_output_bytes"], kw["max_processes"])
        timeout_s, memory_mb = float(kw["timeout_s"]), kw["memory_mb"]
        key = (_batch_key(chosen), timeout_s, memory_mb, kw["max_output_bytes"], kw["max_processes"])
        verdicts: list[Verdict | None] = [None] * len(jobs)
        try:
            runner = self._take(key, len(jobs)) or _BatchRunner(chosen, self.warm_slots, timeout_s, memory_mb,
                                                               kw["max_output_bytes"], kw["max_processes"])
        except (SandboxError, OSError) as exc:
            log.warning("sandbox batch (%s) failed: %s; running its jobs one per sandbox", chosen.name, exc)
            runner = None
        if runner is not None:
            try:
                verdicts = _verdicts_of(runner.run(jobs), jobs)
            except (SandboxError, OSError) as exc:
                log.warning("sandbox batch (%s) failed: %s; running its jobs one per sandbox", chosen.name, exc)
                runner.broken = True
            finally:
                self._give_back(runner, len(jobs))
        return _rerun_alone(chosen, jobs, verdicts, timeout_s, memory_mb, kw["max_output_bytes"], kw["max_processes"])

    def _take(self, key: tuple, n: int) -> _BatchRunner | None:
        """An idle runner for these limits with room for ``n`` jobs; one of them with too little room
        left is closed (calls this size would never use it)."""
        found, stale = None, []
        with self._idle_lock:
            for r in list(self._idle):
                if r.key == key and found is None and r.free >= n:
                    found = r
                    self._idle.remove(r)
                elif r.key == key and r.free < n:
                    stale.append(r)
                    self._idle.remove(r)
        for r in stale:
            r.close()
        return found

    def _give_back(self, runner: _BatchRunner, n: int) -> None:
        """Keep a runner with room for another call like this one; else close it and launch its successor."""
        if runner.broken:
            runner.report_failure()
        if runner.free >= n and not self._closed:
            with self._idle_lock:
                self._idle.append(runner)
            return
        runner.close()
        if runner.broken or self._closed:
            return
        try:
            fresh = _BatchRunner(runner.backend, self.warm_slots, *runner.key[1:])
        except (SandboxError, OSError):
            return  # the next call launches one (and reports what fails)
        with self._idle_lock:
            if not self._closed:
                self._idle.append(fresh)
                return
        fresh.close()

    def close_runners(self) -> None:
        """Close the kept batch runners (the pool stays usable; later batches launch new ones)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for r in idle:
            r.close()

    def map(self, items: Iterable[tuple[str, str]]) -> list[Verdict]:
        """Verdicts for (code, tests) pairs, in input order."""
        futures = [self.submit(code, tests) for code, tests in items]
        return [f.result() for f in futures]

    def map_batched(self, items: Iterable[tuple[str, str]], batch_size: int = BATCH_SIZE,
                    **run_kwargs) -> list[Verdict]:
        """Verdicts for (code, tests) pairs in batches of at most `batch_size` jobs per sandbox launch,
        spread over the workers (smaller batches when there are few jobs); input order kept."""
        items = list(items)
        if not items:
            return []
        size = max(1, min(batch_size, math.ceil(len(items) / self.max_workers)))
        futures = [self.submit_batch(items[i:i + size], batch_size=size, **run_kwargs)
                   for i in range(0, len(items), size)]
        return [v for f in futures for v in f.result()]

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work; optionally wait for running verdicts; close the kept batch runners."""
        self._closed = True
        self._executor.shutdown(wait=wait)
        self.close_runners()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
