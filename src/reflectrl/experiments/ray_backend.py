"""``reflectrl compare --backend ray``: each run is a Ray task calling the same ``run_one`` as the local pool.

``ray.init()`` connects to ``RAY_ADDRESS`` or to the cluster a ``ray start`` on this machine created; without
either it starts a local Ray instance with ``num_cpus=workers`` (``RAY_ADDRESS=local`` forces that). Every
node needs reflectrl installed; without a disk shared by all nodes at the same path, each task ships the run's
small files (config, metrics, evaluation, log) back and the driver writes them into its own ``--out``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

from ..errors import ReflectRLError
from .runner import RunSpec, failed_result, run_one


def init_ray(workers: int) -> None:
    """Connect to the configured cluster, or start a local instance with ``workers`` CPUs."""
    try:
        import ray
    except ImportError:
        raise ReflectRLError("--backend ray needs Ray: pip install 'reflectrl[ray]'") from None
    if ray.is_initialized():
        return
    try:
        try:
            ray.init(num_cpus=workers, include_dashboard=False, logging_level=logging.WARNING)
        except ValueError as exc:  # an existing cluster was found: its CPUs are its own
            if "existing cluster" not in str(exc):
                raise
            ray.init(logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ReflectRLError(f"cannot reach the Ray cluster ({exc}); start one with `ray start --head`, or unset "
                             "RAY_ADDRESS to use a local Ray instance") from None


def run_ray(specs: Sequence[RunSpec], workers: int, on_result: Callable[[dict], None]) -> None:
    """One Ray task (1 CPU) per run; results are handed to ``on_result`` as they finish."""
    import ray

    init_ray(workers)
    retries = max((s.retries for s in specs), default=0)
    task = ray.remote(num_cpus=1, max_retries=retries)(run_one)
    pending = {task.remote(dataclasses.replace(s, ship_files=True)): s for s in specs}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayError as exc:  # the worker died (out of memory, node lost)
                result = failed_result(spec, f"Ray task failed: {str(exc).splitlines()[0]}")
            on_result(result)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref)  # raises KeyboardInterrupt in the task; run_one interrupts its process
        raise
    finally:
        ray.shutdown()
