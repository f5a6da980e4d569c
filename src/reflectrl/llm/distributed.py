"""Data-parallel training of the GRPO trainer across processes (``torchrun``), without a wrapper module.

``torchrun --nproc-per-node N -m reflectrl llm train ...`` starts N copies of the trainer. Each reads
torchrun's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT`` here
(:func:`from_env`) and joins one process group: gloo when the policy is on the CPU, nccl on CUDA (the
process then uses ``cuda:LOCAL_RANK``). Every process draws the same problems, rolls out its share of the
groups (:func:`shard`) with its own generator (:func:`rank_seed`), and takes part in each optimizer step:
the loss normalizers (token or row counts) are summed over the processes, so each process's loss is its
share of the global batch's, and the gradients are summed (:meth:`Dist.sum_grads_`) before clipping and
the step. The parameters therefore stay equal on every process, as under DistributedDataParallel (which
is what this does, by hand: the policy's forward is called directly, so no wrapper is needed; the
reduction runs after the backward pass instead of overlapping with it). Rank 0 writes the run directory.

One process (no ``WORLD_SIZE``, or 1) gets :data:`SINGLE`, whose methods do nothing: that path is
the trainer as it was.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError

BUCKET_ELEMS = 1 << 24  # gradients are summed in flat buckets of at most this many elements (64 MiB in float32)
TIMEOUT = timedelta(hours=1)  # rank 0 alone evaluates and writes checkpoints; the others wait this long at most

# how the record of one update is combined over the processes (the rest: mean weighted by each one's rows)
SUM_KEYS = frozenset({"rollout/generated_tokens", "rollout/reward_cache_hits", "groups/kept_rows",
                      "charts/tokens_per_s"})
MEAN_LOSS_KEYS = frozenset({"losses/grad_norm", "losses/optimizer_steps", "charts/learning_rate"})


@dataclass
class Dist:
    """This process's place in a distributed run (``world == 1``: a single process; every collective is then
    skipped)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str = ""
    owns: bool = False  # this module started the process group (and ends it in close)

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _device(self) -> torch.device:
        """Where tensors of a collective live (nccl: this process's GPU; gloo: the CPU)."""
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------ collectives
    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """The sum over the processes of each value (float64)."""
        if not self.active:
            return [float(v) for v in values]
        import torch.distributed as dist

        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._device())
        dist.all_reduce(t)
        return t.cpu().tolist()

    def any(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag as true on some process (the same answer everywhere)."""
        if not self.active:
            return tuple(bool(f) for f in flags)
        return tuple(v > 0 for v in self.sum_floats([float(bool(f)) for f in flags]))

    def broadcast_(self, tensors: Sequence[Tensor]) -> None:
        """Overwrite ``tensors`` with rank 0's (the initial weights)."""
        if not self.active:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for t in tensors:
                buf = t.detach().to(self._device())
                dist.broadcast(buf, 0)
                if buf is not t:
                    t.copy_(buf)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process (a picklable value)."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, 0)
        return box[0]

    def sum_grads_(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over the processes. A parameter no process computed a
        gradient for keeps ``grad = None`` (so the optimizer skips it everywhere, as in one process); one that
        some process left out counts as zero there."""
        if not self.active:
            return
        import torch.distributed as dist

        params = list(params)
        had = torch.tensor([float(p.grad is not None) for p in params], dtype=torch.float32, device=self._device())
        dist.all_reduce(had)
        live = [p for p, h in zip(params, had.tolist()) if h > 0]
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for bucket in _buckets(live):
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            dist.all_reduce(flat)
            off = 0
            for p in bucket:
                n = p.grad.numel()
                p.grad.copy_(flat[off:off + n].view_as(p.grad))
                off += n

    def combine_record(self, rec: dict[str, Any], rows: int) -> dict[str, Any]:
        """The record of one update over every process: counts summed (tokens, cache hits, kept rows, and the
        loss statistics, which each process has already weighted by its share of the global batch), times and
        the longest completion the maximum, everything else the mean weighted by the processes' rows."""
        if not self.active:
            return rec
        import torch.distributed as dist

        recs: list[Any] = [None] * self.world
        dist.all_gather_object(recs, (rec, rows))
        return combine_records(recs)

    def close(self) -> None:
        if self.owns:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.owns = False


SINGLE = Dist()


def combine_records(recs: Sequence[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """:meth:`Dist.combine_record` on the gathered ``(record, rows)`` of every process (rank 0 first)."""
    keys: list[str] = []
    for r, _ in recs:
        keys += [k for k in r if k not in keys]
    out: dict[str, Any] = {}
    for k in keys:
        have = [(r[k], n) for r, n in recs if k in r]
        nums = [(float(v), n) for v, n in have if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(nums) != len(have):  # not a number somewhere: rank 0's (or the first process's) value
            out[k] = have[0][0]
            continue
        vals = [v for v, _ in nums]
        if k in SUM_KEYS or (k.startswith("losses/") and k not in MEAN_LOSS_KEYS):
            v: float = sum(vals)
        elif k.startswith("time/") or k == "completion/max_length":
            v = max(vals)
        else:
            w = sum(n for _, n in nums)
            v = sum(x * n for x, n in nums) / w if w > 0 else sum(vals) / len(vals)
        out[k] = int(v) if all(isinstance(x, int) for x, _ in have) and float(v).is_integer() else v
    return out


def _buckets(params: list[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Consecutive parameters of one dtype and device, at most :data:`BUCKET_ELEMS` elements a bucket."""
    out: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        if not out or size + p.numel() > BUCKET_ELEMS or (out[-1][0].dtype, out[-1][0].device) != (p.dtype, p.device):
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.numel()
    return out


def from_env(device: str) -> tuple[Dist, str]:
    """This process's :class:`Dist` from torchrun's environment variables, and the device its policy goes on
    (``cuda:LOCAL_RANK`` when ``device`` is a CUDA device and several processes run). Joins the default
    process group (``env://``: ``MASTER_ADDR`` / ``MASTER_PORT``), or uses one the caller has set up."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
        local = int(os.environ.get("LOCAL_RANK", rank))
        if world == 1:
            return SINGLE, device
        cuda_dev = _cuda_device(device, local)
        return Dist(rank, world, local, str(dist.get_backend()), owns=False), cuda_dev or device
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return SINGLE, device
    rank, local = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if not dist.is_available():
        raise ConfigError("WORLD_SIZE > 1 (torchrun) but this torch build has no torch.distributed")
    cuda_dev = _cuda_device(device, local)
    backend = "nccl" if cuda_dev else "gloo"
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(var):
            raise ConfigError(f"WORLD_SIZE={world} but {var} is not set: start the processes with torchrun")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=TIMEOUT)
    return Dist(rank, world, local, backend, owns=True), cuda_dev or device


def _cuda_device(device: str, local_rank: int) -> str | None:
    """``cuda:LOCAL_RANK`` (made current) for a CUDA ``device``; None for the CPU."""
    if not str(device).startswith("cuda"):
        return None
    if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
        raise ConfigError(f"process {local_rank} of this node needs cuda:{local_rank}, but "
                          f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA devices are visible")
    torch.cuda.set_device(local_rank)
    return f"cuda:{local_rank}"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def shard(n: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, stop)`` of process ``rank``'s share of ``n`` items (contiguous; sizes differ by at most 1)."""
    return n * rank // world, n * (rank + 1) // world


def rank_seed(seed: int, rank: int, update: int) -> int:
    """The seed of process ``rank``'s generator in update ``update`` (a hash: independent streams)."""
    digest = hashlib.sha256(f"reflectrl/{seed}/{rank}/{update}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


__all__ = ["Dist", "SINGLE", "combine_records", "from_env", "rank_seed", "shard"]
