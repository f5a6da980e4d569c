"""What every part of the sandbox shares: its errors, the backend record, and the timing constants."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import ReflectRLError

BACKENDS = ("bwrap", "unshare", "none")

STARTUP_S = 20.0  # time allowed for the sandbox itself to come up (not counted in timeout_s)
GRACE_S = 1.0  # time allowed to exit after the final report
CHANNEL_CAP = 1 << 20  # bytes of result records read at most
FSIZE = 32 << 20  # largest file the code may write (RLIMIT_FSIZE)
UNSHARE_NOISE = b"unshare: sigprocmask unblock failed: Invalid argument\n"  # printed when we kill its child


class SandboxError(ReflectRLError, RuntimeError):
    """The sandbox itself could not run (not a verdict about the code)."""


class SandboxWarning(RuntimeWarning):
    """Some protections are not in force on this machine."""


@dataclass(frozen=True)
class Backend:
    """A working way to launch the runner, with the protections it was verified to give."""

    name: str
    drop_uid: bool
    protections: dict = field(default_factory=dict, compare=False)


def is_root() -> bool:
    """Whether we may switch the child to a dedicated uid."""
    return hasattr(os, "geteuid") and os.geteuid() == 0
