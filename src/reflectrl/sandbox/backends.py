"""Backends: what the OS offers (bubblewrap, then ``unshare``, then plain rlimits), probed once per process
and cached, the protections each one was verified to give, and the choice among them."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import warnings

from .base import BACKENDS, Backend, SandboxError, SandboxWarning, is_root
from .launch import execute

_PROBE_CODE = "import fractions, decimal\nvalue = 1\n"
_PROBE_TESTS = "assert value == 1\n"

PROBED: dict[str, Backend | None] = {}
PROBE_ERRORS: dict[str, str] = {}
WARNED: set[str] = set()
_LOCK = threading.RLock()


def protections_of(name: str, drop_uid: bool, notes: str) -> dict[str, bool]:
    """The protections a backend gives, given the runner's setup notes from the probe."""
    ns = name in ("bwrap", "unshare")
    failed_limits = note_values(notes, "limits_failed")
    userns = ns and not is_root()  # non-root: processes are counted inside a fresh user namespace
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
        "fs_readonly_outside_workdir": ns and not note_values(notes, "ro_failed"),
        "tmp_and_home_hidden": ns,
        "dedicated_uid": drop_uid,
        "parent_protected": ns or drop_uid,
    }


def note_values(notes: str, key: str) -> list[str]:
    """Values of `key=a,b` in the runner's `;`-separated setup notes."""
    for part in notes.split(";"):
        if part.startswith(key + "="):
            return part[len(key) + 1 :].split(",")
    return []


def candidates(name: str) -> list[tuple[str, bool]]:
    """(backend, drop_uid) variants to try for a backend name, strongest first."""
    variants = [True, False] if is_root() else [False]  # a dedicated uid needs root and a mapped uid range
    if name == "bwrap" and not shutil.which("bwrap"):
        return []
    if name == "unshare" and not (shutil.which("unshare") and sys.platform.startswith("linux")):
        return []
    return [(name, drop_uid) for drop_uid in variants]


def probe(name: str) -> Backend | None:
    """Try a backend once with a trivial job; the first variant whose runner reports success wins."""
    with _LOCK:
        if name not in PROBED:
            PROBED[name] = None
            for backend, drop_uid in candidates(name):
                trial = Backend(backend, drop_uid)
                try:
                    verdict, notes = execute(trial, _PROBE_CODE, _PROBE_TESTS, 10.0, 256, 4096, 64)
                except (SandboxError, OSError) as exc:
                    PROBE_ERRORS[name] = str(exc)
                    continue
                if verdict.status == "passed":
                    PROBED[name] = Backend(backend, drop_uid, protections_of(backend, drop_uid, notes))
                    break
                hint = " (is the Python installation readable by other users?)" if drop_uid else ""
                PROBE_ERRORS[name] = f"trial run ended with status {verdict.status!r}{hint} {verdict.stderr[-300:]}"
            if PROBED[name] is None and name not in PROBE_ERRORS:
                PROBE_ERRORS[name] = "not installed or not supported on this OS"
        return PROBED[name]


def select(backend: str | None) -> Backend:
    """The requested backend (or the strongest available one), warning once about missing protections."""
    backend = backend or os.environ.get("REFLECTRL_SANDBOX_BACKEND") or "auto"
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; expected auto or one of {BACKENDS}")
    for name in BACKENDS if backend == "auto" else (backend,):
        chosen = probe(name)
        if chosen is not None:
            with _LOCK:
                _warn_once(chosen)
            return chosen
    raise SandboxError(f"sandbox backend {backend!r} is unavailable: {PROBE_ERRORS.get(backend, '')}")


def _warn_once(backend: Backend) -> None:
    """One clear warning per backend listing which protections hold and which do not."""
    missing = [k for k, v in backend.protections.items() if not v]
    key = f"{backend.name}/{backend.drop_uid}"
    if not set(missing) - {"dedicated_uid"} or key in WARNED:  # a dedicated uid only matters without namespaces
        return
    WARNED.add(key)
    held = [k for k, v in backend.protections.items() if v]
    hint = "" if backend.name == "bwrap" else " Install bubblewrap (apt-get install bubblewrap) for full isolation."
    rank = BACKENDS.index(backend.name)
    why = "".join(f" [{n}: {e.strip()}]" for n, e in PROBE_ERRORS.items() if BACKENDS.index(n) <= rank)
    warnings.warn(
        f"reflectrl sandbox uses backend {backend.name!r}; NOT in force: {', '.join(missing)}; "
        f"in force: {', '.join(held)}.{why}{hint}",
        SandboxWarning,
        stacklevel=4,
    )


def sandbox_backend(backend: str | None = None) -> str:
    """Name of the backend that `run_tests` would use ('bwrap', 'unshare' or 'none')."""
    return select(backend).name


def sandbox_capabilities(backend: str | None = None) -> dict[str, bool]:
    """The protections in force for untrusted code (probed once, then cached)."""
    return dict(select(backend).protections)


