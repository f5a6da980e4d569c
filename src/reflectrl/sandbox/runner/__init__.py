"""The programs that run inside the sandbox, kept as real modules so they are linted and testable.

They are never imported inside the sandbox: the launcher reads their source (``importlib.resources``)
and runs it as ``python -I -B -c SOURCE`` in an interpreter that has not imported reflectrl and uses
the standard library only. ``SINGLE`` runs one job (``job.py``); ``BATCH`` is ``job.py``'s source
followed by ``batch.py``'s and runs many jobs, each in its own forked child.
"""

from __future__ import annotations

from importlib.resources import files


def _source(name: str) -> str:
    """The text of one runner module of this package."""
    return files(__name__).joinpath(name).read_text(encoding="utf-8")


SINGLE = _source("job.py") + "\n\nmain()\n"
BATCH = _source("job.py") + "\n\n" + _source("batch.py") + "\n\nbatch_main()\n"


def single_source() -> str:
    """The single runner's source, as launched now (tests may replace ``SINGLE``)."""
    return SINGLE


def batch_source() -> str:
    """The batch runner's source, as launched now (tests may replace ``BATCH``)."""
    return BATCH


__all__ = ["BATCH", "SINGLE", "batch_source", "single_source"]
