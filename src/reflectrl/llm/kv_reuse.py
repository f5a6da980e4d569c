"""Keeping each row's KV cache from one generation call to the next (``--engine-options reuse_cache=true``).

A multi-turn episode calls the engine once per turn with its whole transcript so far, which used to be prefilled
again every turn. :class:`KeptContexts` keeps, when a call ends, the keys and values of every row's context and of
the tokens it generated (all but the last, which was sampled and never fed), under the context the call was given.
The next call finds, for each new context, a kept one that is its prefix (looked up at each length a kept context
has), reuses the kept keys and values as far as the new context agrees with the kept tokens, and
runs the model on the rest only: the environment's reply and the opening of the next turn. What is kept is
dropped when it is used and whenever the policy's weights change (:meth:`clear`, at the engine's ``sync``).

The reused keys and values were computed one token at a time while sampling; a prefill computes them together. The
two agree up to float rounding, so the sampled tokens are the same but for a rare tie broken the other way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class Kept:
    """One row's kept context: its tokens, and where their keys and values are: ``source``, a call's cache as it
    was when the row finished (per layer, keys and values ``[rows, kv_heads, width, head_dim]``, never changed
    after: the cache makes new tensors as it grows or drops rows), the row's ``slot`` in it and the mask ``real``
    ``[source width]`` of the columns that hold its tokens, in order."""

    tokens: list[int]
    source: list[tuple[Tensor, Tensor]]
    slot: int
    real: Tensor


def _agree(prompt: list[int], tokens: list[int], start: int) -> int:
    """How far ``prompt`` and a kept row's ``tokens`` agree (they agree on the first ``start``), at most
    ``len(prompt) - 1``: one token is left to feed."""
    m, end = start, min(len(prompt) - 1, len(tokens))
    while m < end and prompt[m] == tokens[m]:
        m += 1
    return min(m, end)


class KeptContexts:
    """The rows' kept keys and values between generation calls (see the module docstring)."""

    def __init__(self) -> None:
        self.by_prompt: dict[tuple[int, ...], list[Kept]] = {}  # under the context the call was given (a group's
        # rows share it)
        self.lengths: dict[int, int] = {}  # how many kept contexts have each length

    def clear(self) -> None:
        self.by_prompt.clear()
        self.lengths.clear()

    def __len__(self) -> int:
        return sum(self.lengths.values())

    def take(self, prompt: list[int]) -> tuple[int, Kept | None]:
        """The kept row whose context is the longest prefix of ``prompt`` and, among those that share it, whose
        tokens agree with ``prompt`` the longest, removed from the store; and how many of ``prompt``'s tokens its
        keys and values cover (at most ``len(prompt) - 1``: one token is left to feed)."""
        for n in sorted((n for n in self.lengths if n <= len(prompt)), reverse=True):
            key = tuple(prompt[:n])
            rows = self.by_prompt.get(key)  # a dict of tuples: hashed and compared in C
            if not rows:
                continue
            agreed = [_agree(prompt, k.tokens, n) for k in rows]
            best = max(range(len(rows)), key=agreed.__getitem__)
            kept = rows.pop(best)
            if not rows:
                del self.by_prompt[key]
            self.lengths[n] -= 1
            if not self.lengths[n]:
                del self.lengths[n]
            return agreed[best], kept
        return 0, None

    def keep(self, prompt: list[int], kept: Kept) -> None:
        """Keep a row's keys and values (its context ``prompt`` and what it generated), under ``prompt``."""
        self.by_prompt.setdefault(tuple(prompt), []).append(kept)
        self.lengths[len(prompt)] = self.lengths.get(len(prompt), 0) + 1


def layer_tensors(cache: Any) -> list[tuple[Tensor, Tensor]]:
    """Each layer's (keys, values) ``[rows, kv_heads, width, head_dim]`` of a transformers ``DynamicCache``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def padded_past(kept: list[tuple[int, Kept | None]], rows: int) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """Per layer, the rows' kept keys and values right-aligned in ``[rows, kv_heads, width, head_dim]``, and the
    mask ``[rows, width]`` of the real ones; ``kept[i]``: (positions used, the row's Kept). One gather per layer
    and per source cache."""
    width = max(m for m, _ in kept)
    used = [(r, m, k) for r, (m, k) in enumerate(kept) if m and k is not None]
    first = used[0][2].source
    dev = first[0][0].device
    mask = torch.zeros(rows, width, dtype=torch.long, device=dev)
    groups: dict[int, list[tuple[int, int, Kept]]] = {}
    for r, m, k in used:
        groups.setdefault(id(k.source), []).append((r, m, k))
        mask[r, width - m:] = 1
    out = [(k0.new_zeros(rows, k0.shape[1], width, k0.shape[-1]), v0.new_zeros(rows, v0.shape[1], width, v0.shape[-1]))
           for k0, v0 in first]
    for members in groups.values():
        source = members[0][2].source
        dest = torch.as_tensor([r for r, _, _ in members], device=dev)
        slots = torch.as_tensor([k.slot for _, _, k in members], device=dev)
        used_m = torch.as_tensor([m for _, m, _ in members], device=dev)
        real = torch.stack([k.real for _, _, k in members])  # [n, source width]
        order = real.long().cumsum(1) - 1  # each real column's place among the row's tokens
        take = real & (order < used_m[:, None])
        row_of, src_col = take.nonzero(as_tuple=True)
        cols = torch.zeros(len(members), width, dtype=torch.long, device=dev)
        cols[row_of, (width - used_m)[row_of] + order[row_of, src_col]] = src_col
        for layer, (keys, values) in enumerate(source):
            for j, src in enumerate((keys, values)):
                picked = src[slots]  # [n, kv_heads, source width, head_dim]
                index = cols[:, None, :, None].expand(-1, picked.shape[1], -1, picked.shape[-1])
                out[layer][j][dest] = picked.gather(2, index)  # a shorter past's left end: masked out
    return out, mask
