"""The batch runner: runs inside one sandbox (PID namespace required), never inside reflectrl's own process.

Sent as the source of ``job.py`` followed by this module's (see ``reflectrl.sandbox.runner``) and run as
``python -I -B -c SOURCE``. It reads a header frame, then one frame per job *just before running it*; for
each job it kills every other process in the namespace, wipes the work dir and SysV IPC, draws the job's
nonce, announces it on its private control pipe, forks the job's child (which keeps only its own three
pipes and runs ``run_job`` exactly as the single runner does), enforces the wall-time limit, kills what the
job left, closes the job's pipes and reports the exit. It never runs untrusted code and never reads what a
job writes.
"""

import os
import sys

if __package__:  # imported as a module (tests, linters); in the sandbox job.py's source above defines these
    from .job import exc_name, isolate_fs, libc, run_job


def read_exact(n: int) -> bytes:
    """n bytes from stdin (the parent's job pipe); b'' at EOF."""
    chunks, left = [], n
    while left:
        chunk = os.read(0, min(left, 1 << 16))
        if not chunk:
            return b""
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame() -> dict:
    """One length-prefixed marshal frame."""
    import marshal
    head = read_exact(10)
    if len(head) != 10:
        raise EOFError("job stream ended")
    return marshal.loads(read_exact(int(head)))


def receive_fds(sock_fd: int, count: int) -> list:
    """The `count` job pipe ends the parent sends over the control socket (SCM_RIGHTS), in order.

    They come this way, not inherited through the wrapper, so that only this runner (and a job's child)
    ever holds a job's pipe ends: when the runner closes them after the job, the parent sees end-of-file."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, sock_fd)
    fds = []
    try:
        while len(fds) < count:
            data, ancillary, flags, _ = sock.recvmsg(1, _socket.CMSG_SPACE(4 * 253))  # SCM_MAX_FD per message
            if not data:
                raise EOFError("control socket closed before the job pipes arrived")
            if flags & _socket.MSG_CTRUNC:
                raise OSError("job pipes cut off in transit")
            for level, kind, blob in ancillary:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(blob[i:i + 4], sys.byteorder, signed=True)
                            for i in range(0, len(blob) - len(blob) % 4, 4)]
    finally:
        sock.detach()
    if len(fds) != count:
        raise OSError(f"expected {count} job pipe ends, got {len(fds)}")
    return fds


def ancestors() -> set:
    """This process and its ancestors inside the PID namespace (never signalled)."""
    keep, pid = {os.getpid()}, os.getppid()
    while pid > 0 and pid not in keep:
        keep.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return keep


def live_others(keep: set) -> list:
    """Pids in this namespace, other than `keep`, that are not zombies."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in keep:
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                out.append(int(entry))
    return out


def reap() -> None:
    """Collect exited children (as namespace init, orphans are ours too)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(keep: set, time: object) -> bool:
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


def ipc_ids() -> list:
    """(kind, id) of every SysV shared-memory segment, message queue and semaphore set of this IPC namespace."""
    found = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open("/proc/sysvipc/" + kind) as fh:
                found += [(kind, int(line.split()[1])) for line in fh.read().splitlines()[1:] if line.strip()]
        except (OSError, ValueError, IndexError):
            continue
    return found


def clear_ipc(lib: object, uid: int | None) -> bool:
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


def wipe(work: str, uid: int | None, mode: int) -> None:
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


def wait_child(pid: int, deadline: float, time: object) -> int | None:
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


def in_child(job: dict, null: int, out: int, err: int, chan: int, max_fd: int) -> None:
    """In a job's forked child: its own process group, stdin from /dev/null, stdout, stderr and the job's channel on
    fds 1, 2 and 3, every other fd closed, then the job; the child never returns."""
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


def reap_job(pid: int, deadline: float, time) -> tuple[bool, int]:
    """Wait for a job's child until ``deadline`` (then kill its process group); whether it timed out, and its exit
    code."""
    status = wait_child(pid, deadline, time)
    timed_out = status is None
    if timed_out:
        try:
            os.killpg(pid, 9)
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
    return timed_out, os.waitstatus_to_exitcode(status)


def next_job(keep: set, lib, uid: int | None, work: str, mode: int, time) -> dict:
    """The next job, read once the last one's processes and IPC objects are gone and its workdir is wiped."""
    if not (sweep(keep, time) and clear_ipc(lib, uid)):
        raise RuntimeError("processes or IPC objects survived the sweep")
    wipe(work, uid, mode)
    return read_frame()


def batch_main() -> None:
    """Run the jobs of the batch one after another, each in a freshly forked child."""
    import _ast  # noqa: F401 - imported once, before any fork
    import builtins  # noqa: F401
    import marshal  # noqa: F401
    import resource  # noqa: F401
    import time

    ctypes, lib = libc()
    conf = read_frame()
    ctl = conf["control"]

    def say(text: str) -> None:
        os.write(ctl, (text + "\n").encode("ascii", "replace"))

    try:
        if os.getpid() > 8:  # kill(-1) below is only safe inside a fresh PID namespace
            raise RuntimeError(f"not in a fresh PID namespace (pid {os.getpid()})")
        pipes = receive_fds(ctl, 3 * conf["slots"])
        notes = isolate_fs(conf["mounts"]) if conf["mounts"] else ""
        if lib.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0: no ptrace, no /proc/PID/{mem,fd} for same-uid code
            raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE failed")
        os.chdir("/")
        keep = ancestors()
        work, uid, mode = conf["workdir"], conf["uid"], conf["mode"]
        null = os.open(os.devnull, os.O_RDWR)
        max_fd = os.sysconf("SC_OPEN_MAX")
    except BaseException as exc:  # noqa: BLE001 - reported, then the runner exits
        say("abort -1 " + (exc_name(exc) + ":" + str(exc)).replace("\n", " ")[:300])
        os._exit(0)
    say("ready " + (notes or "-"))
    for index in range(conf["slots"]):
        chan, out, err = pipes[3 * index:3 * index + 3]
        try:
            job = next_job(keep, lib, uid, work, mode, time)
        except BaseException as exc:  # noqa: BLE001 - reported, then the runner exits
            say(f"abort {index} " + (exc_name(exc) + ":" + str(exc)).replace("\n", " ")[:300])
            os._exit(0)
        job.update(conf["job"])
        job["nonce"] = nonce = os.urandom(16).hex()  # drawn now: no earlier child ever held it
        job["fd"] = 3
        say(f"start {index} {nonce}")
        del nonce
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            in_child(job, null, out, err, chan, max_fd)
        del job
        timed_out, code = reap_job(pid, started + conf["timeout"], time)
        duration = time.monotonic() - started
        clean = sweep(keep, time)
        for fd in (chan, out, err):
            os.close(fd)
        say(f"end {index} {timed_out:d} {code} {duration:.4f}")
        if not clean:
            say(f"abort {index + 1} processes survived the sweep")
            os._exit(0)
    sweep(keep, time)
    say("finished")
    os._exit(0)
