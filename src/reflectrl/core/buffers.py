"""A FIFO ring of fixed-shape records in preallocated tensors: replay buffers and method memories."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class RingBuffer:
    """``capacity`` slots of named fields (``fields``: name -> (shape of one record, dtype)); the oldest
    records are overwritten first. :meth:`add` writes a batch of records and returns their slots."""

    def __init__(self, capacity: int, fields: dict[str, tuple[tuple[int, ...], torch.dtype]]):
        if capacity < 1:
            raise ValueError(f"a ring buffer needs capacity >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.names = tuple(fields)
        self.data: dict[str, Tensor] = {n: torch.zeros(self.capacity, *shape, dtype=dt) for n, (shape, dt) in fields.items()}
        self.ptr = self.size = 0

    def __getattr__(self, name: str) -> Tensor:
        data = self.__dict__.get("data")
        if data is not None and name in data:
            return data[name]
        raise AttributeError(name)

    def add(self, **records: Tensor) -> Tensor:
        """Append ``n`` records (each field ``[n, ...]``; only the last ``capacity`` are kept); return their slots."""
        n = next(iter(records.values())).shape[0]
        keep = min(n, self.capacity)
        slots = (self.ptr + torch.arange(keep)) % self.capacity
        for name in self.names:
            self.data[name][slots] = records[name][n - keep:].to(self.data[name].dtype)
        self.ptr = int((self.ptr + keep) % self.capacity)
        self.size = min(self.capacity, self.size + keep)
        return slots

    def view(self, name: str) -> Tensor:
        """The filled part of a field, ``[size, ...]`` (slot order, not insertion order)."""
        return self.data[name][:self.size]

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return dict(self.data), {"ptr": self.ptr, "size": self.size}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        for name in self.names:
            self.data[name] = tensors[name].clone()
        self.ptr, self.size = int(meta["ptr"]), int(meta["size"])
