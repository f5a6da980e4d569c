"""Fixtures of the sandbox tests: each backend that works here, and each one that batches."""

from __future__ import annotations

import pytest

from reflectrl.sandbox import BACKENDS, backends, batch_supported

from .helpers import available


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend that works on this machine (others are skipped with the probe's reason)."""
    if not available(request.param):
        pytest.skip(f"backend {request.param} unavailable here: {backends.PROBE_ERRORS.get(request.param)}")
    return request.param


@pytest.fixture
def batch_backend(backend: str) -> str:
    """Each backend that batches on this machine (the others run one sandbox per job, tested elsewhere)."""
    if not batch_supported(backend):
        pytest.skip(f"backend {backend!r} runs one sandbox per job here (no PID namespace or runner failed)")
    return backend
