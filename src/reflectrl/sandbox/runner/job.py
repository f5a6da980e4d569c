"""The single-job runner: runs inside the sandbox, never inside reflectrl's own process.

Sent as source and run as ``python -I -B -c SOURCE`` (see ``reflectrl.sandbox.runner``), in an interpreter
that has not imported reflectrl; it uses the standard library only. It reads its job (marshal) from stdin,
applies the isolation steps it is asked for, then runs code and tests, reporting each result as
``<nonce> <kind> <index> <ok> <info>`` on a private pipe. After untrusted code starts, it only uses
references it bound beforehand (docs/sandbox.md lists the limits of that). The batch runner
(``batch.py``) is this module's source followed by its own.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
KEEP_FLAGS = 2 | 4 | 8 | 1024 | 2048  # nosuid nodev noexec noatime nodiratime (same bits in statvfs)


def read_job() -> dict:
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


_LIBC: list = []


def libc() -> tuple:
    """ctypes and the C library, loaded once per process (a batch runner's children inherit it)."""
    if not _LIBC:
        import ctypes
        _LIBC.append((ctypes, ctypes.CDLL(None, use_errno=True)))
    return _LIBC[0]


def mounter() -> Callable[..., None]:
    """mount(2), raising OSError on failure."""
    ctypes, lib = libc()

    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        if lib.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {dst}: {os.strerror(err)}")

    return mount


def mountpoints() -> list[str]:
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


def isolate_fs(plan: dict) -> str:
    """Hide tmp/home dirs, re-expose python and the work dir, make every other mount read-only."""
    mount, rw = mounter(), plan["rw"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = [(os.open(path, os.O_PATH), path) for path in plan["ro"] + [rw]]
    for path in plan["hide"]:
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k")
    for fd, path in keep:
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
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


def set_limits(limits: dict) -> str:
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


def caps(*fields: str) -> int:
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


def drop_privileges(uid: int | None) -> None:
    """Empty the capability bounding set, set no_new_privs, then switch to `uid` or drop caps."""
    if not sys.platform.startswith("linux"):
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        return
    ctypes, lib = libc()
    if caps("CapEff"):
        drop_bounding_set(ctypes, lib)
    if lib.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    elif caps("CapEff", "CapPrm"):
        clear_capabilities(ctypes, lib)
    if caps("CapEff", "CapPrm"):
        raise RuntimeError("capabilities are still held")


def drop_bounding_set(ctypes, lib) -> None:
    """Drop every capability from the bounding set and clear the ambient set."""
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        if lib.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP failed")
    lib.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL


def clear_capabilities(ctypes, lib) -> None:
    """Empty this process's effective, permitted and inheritable capabilities (capset, version 3)."""
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]  # noqa: RUF012 - read by ctypes
    data = (ctypes.c_uint32 * 6)()
    if lib.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def setup(job: dict) -> str:
    """All isolation steps, before any untrusted code runs; returns notes on what did not hold."""
    os.umask(0o022)
    notes = [isolate_fs(job["mounts"]) if job["mounts"] else ""]
    os.chdir(job["workdir"])
    notes.append(set_limits(job["limits"]))
    drop_privileges(job["uid"])
    return ";".join(n for n in notes if n) or "-"


def exc_name(exc: BaseException, _type=type, _str=str) -> str:
    """Sanitised class name of an exception, without running any of its (untrusted) methods."""
    try:
        name = _type.__dict__["__name__"].__get__(_type(exc))
        if _type(name) is not _str:
            return "?"
    except BaseException:  # noqa: BLE001 - untrusted code may raise anything
        return "?"
    allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_."
    return "".join([c for c in name[:64] if c in allowed]) or "?"


def make_reporter(nonce: str, fd: int, _write=os.write, _str=str) -> Callable[..., None]:
    """report(kind, index, ok, info): one nonce-tagged line on the private pipe."""
    prefix = nonce + " "

    def report(kind: str, index: int, ok: bool, info: str = "-") -> None:
        try:
            line = prefix + kind + " " + _str(index) + " " + ("1" if ok else "0") + " " + info + "\n"
            _write(fd, line.encode("utf-8", "replace"))
        except BaseException:  # noqa: BLE001, S110 - a report must never raise
            pass

    return report


def make_executor(ns: dict, reserve: list, _exec=exec, _base=BaseException, _mem=MemoryError, _isinstance=isinstance,
                  _name=exc_name, _trace=sys.settrace, _prof=sys.setprofile) -> Callable[[object], str | None]:
    """run(code_object) -> None if it completed, else the exception's class name."""

    def run(code: object) -> str | None:
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


def make_finisher(_sys=sys, _exit=os._exit, _base=BaseException, _getattr=getattr) -> Callable[[], None]:
    """finish(): flush what the code printed, then exit without running its atexit hooks."""

    def finish() -> None:
        for name in ("stdout", "stderr"):
            try:
                _getattr(_sys, name).flush()
            except _base:
                pass
        _exit(0)

    return finish


def main() -> None:
    """Read the job from stdin and run it in this process."""
    run_job(read_job())


def run_job(job: dict) -> None:
    """Compile the tests, isolate, then run the code and each test, reporting each; never returns."""
    import _ast  # not ast: same nodes, no import cost
    import builtins
    report = make_reporter(job["nonce"], job["fd"])
    tree = compile(job["tests"], "<tests>", "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
    units = [(i, compile(_ast.Module(body=[stmt], type_ignores=[]), f"<test {i}>", "exec",
                         dont_inherit=True, optimize=0)) for i, stmt in enumerate(tree.body)]
    n_units = len(units)
    try:
        solution, compile_err = compile(job["code"], "<solution>", "exec", dont_inherit=True, optimize=0), None
    except BaseException as exc:  # noqa: BLE001 - any compile failure is the code's error
        solution, compile_err = None, exc_name(exc)
    module = type(sys)("solution")
    ns = module.__dict__
    ns["__builtins__"] = builtins
    reserve = [bytearray(1 << 20)]
    run = make_executor(ns, reserve)
    finish = make_finisher()
    try:
        notes = setup(job)
    except BaseException as exc:  # noqa: BLE001 - reported, then the runner exits
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
