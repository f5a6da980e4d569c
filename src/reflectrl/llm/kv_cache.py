"""A KV cache that appends in place: what the sampler and the shared-prompt passes decode with.

transformers' ``DynamicCache`` grows each layer's keys and values by ``torch.cat`` at every decoding step, which
copies the whole cache ``[rows, kv_heads, width, head_dim]`` per layer and step: a copy as long as the transcript, at
every step. :func:`new_cache` builds the same ``DynamicCache`` with each plain
layer replaced by a :class:`GrowingLayer`, whose keys and values are views of a buffer with room at its end: a step
writes its column into the room, and the buffer is copied only when it is full (its room doubles then) or rows are
dropped. The views hold the same numbers as the concatenated tensors, so attention over them gives the same logits
bit for bit (``tests/llm/test_kv_cache.py``). :func:`reserve` makes room for a call's token budget up front, so a
sampling call copies the prompt's cache once at most.

Columns already written are never written again (a step writes only past the view's end, and dropping rows makes a
new buffer), so a view taken of a layer's keys and values stays as it was: what
:class:`~reflectrl.llm.kv_reuse.KeptContexts` keeps between calls.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

try:
    from transformers.cache_utils import DynamicLayer

    _LAYERS = True
except ImportError:  # transformers before cache layers (4.56): the plain cache
    DynamicLayer = object
    _LAYERS = False
_TAKES_CONFIG = "config" in inspect.signature(DynamicCache.__init__).parameters


class GrowingLayer(DynamicLayer):  # type: ignore[valid-type, misc]
    """A ``DynamicLayer`` whose ``keys`` and ``values`` are views ``buffer[:, :, :n]`` of buffers with room to
    grow; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._kb: Tensor | None = None  # the buffers [rows, kv_heads, capacity, head_dim]
        self._vb: Tensor | None = None
        self._n = 0

    def _views(self) -> None:
        assert self._kb is not None and self._vb is not None
        self.keys, self.values = self._kb[:, :, :self._n], self._vb[:, :, :self._n]

    def adopt(self, keys: Tensor, values: Tensor) -> None:
        """Take ``keys`` and ``values`` as the cache's contents (no room yet: the next append makes it)."""
        self.device, self.is_initialized = keys.device, True
        self._kb, self._vb, self._n = keys, values, keys.shape[-2]
        self._views()

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more columns without another copy."""
        if self._kb is not None and self._n + extra > self._kb.shape[-2]:
            self._regrow(self._n + extra)

    def _regrow(self, capacity: int) -> None:
        assert self._kb is not None and self._vb is not None
        kb = self._kb.new_empty(*self._kb.shape[:2], capacity, self._kb.shape[-1])
        vb = self._vb.new_empty(*self._vb.shape[:2], capacity, self._vb.shape[-1])
        kb[:, :, :self._n] = self._kb[:, :, :self._n]
        vb[:, :, :self._n] = self._vb[:, :, :self._n]
        self._kb, self._vb = kb, vb

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        if self._kb is None:
            self.adopt(key_states.contiguous(), value_states.contiguous())
            return self.keys, self.values
        n, add = self._n, key_states.shape[-2]
        if n + add > self._kb.shape[-2]:
            self._regrow(max(n + add, 2 * self._kb.shape[-2]))
        self._kb[:, :, n:n + add] = key_states
        self._vb[:, :, n:n + add] = value_states
        self._n = n + add
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        if self._kb is not None and self._vb is not None:
            self._kb, self._vb = self._kb[indices], self._vb[indices]
            self._views()

    def _rebuffer(self) -> None:
        """After an operation of the base class that replaced ``keys`` and ``values``: they are the buffers."""
        if self.is_initialized and self.keys is not None and self.keys.numel():
            self.adopt(self.keys, self.values)
        else:
            self._kb = self._vb = None
            self._n = 0

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._rebuffer()

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._rebuffer()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._rebuffer()

    def reset(self) -> None:
        super().reset()
        self._kb = self._vb = None
        self._n = 0


def new_cache(config: Any, past: list[tuple[Tensor, Tensor]] | None = None, append: bool = True) -> Any:
    """A ``DynamicCache`` for a model of ``config`` (holding ``past``, per layer keys and values, when given) whose
    plain layers append in place (:class:`GrowingLayer`; not ``append``: transformers' own)."""
    if past is not None:
        cache = DynamicCache(ddp_cache_data=past, config=config)
    else:
        cache = DynamicCache(config=config) if _TAKES_CONFIG else DynamicCache()
    layers = getattr(cache, "layers", None)
    if layers is None or not _LAYERS or not append:
        return cache
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            grown = GrowingLayer()
            if layer.is_initialized and layer.keys is not None and layer.keys.numel():
                grown.adopt(layer.keys, layer.values)
            layers[i] = grown
    return cache


def reserve(cache: Any, extra: int) -> None:
    """Room in each growing layer of ``cache`` for ``extra`` more columns (a sampling call's token budget)."""
    for layer in getattr(cache, "layers", ()):
        if isinstance(layer, GrowingLayer):
            layer.reserve(extra)
