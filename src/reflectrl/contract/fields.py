"""The typed registry of the data a rollout carries beside its tokens.

A hook, an engine or the trainer may attach a tensor to a batch (gear's teacher log-probs, exgrpo's replay
flags, a grader's per-row scores, the engine's own log-probs). Each such entry is a :class:`Field`, registered
once under its key with :func:`register_field`: its **shape** (``"token"``: ``[R, C, ...]``, padded and cut with
the responses; ``"row"``: ``[R, ...]`` or a list, one entry per row) and its **reader**:

* ``"loss"``: a keyword input of the policy loss, carried to it by :class:`LossInputs`;
* ``"method"``: a method's input, per token in ``StepBatch.per_step[key]`` or per row in
  ``StepBatch.info[key]``;
* ``"trainer"``: the trainer's own bookkeeping (row ids, per-token loss weights).

Row selection, trimming and concatenation of a batch ask the registry how to treat each entry, and putting an
unregistered key into a batch is an error that names this module, so no consumer has to know a naming
convention or re-slice a tensor by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

Per = Literal["token", "row"]
Reader = Literal["loss", "method", "trainer"]


@dataclass(frozen=True)
class Field:
    """One registered entry of a batch's ``extras``."""

    key: str
    per: Per
    reader: Reader
    doc: str


FIELDS: dict[str, Field] = {}
"""Every registered field, by key, in registration order."""


def register_field(key: str, per: Per, reader: Reader, doc: str) -> str:
    """Register ``key`` (again with the same shape and reader: a no-op) and return it, so that a module names its
    field once: ``TEACHER_LOGP = register_field("teacher_logp", "token", "method", "...")``."""
    if per not in ("token", "row") or reader not in ("loss", "method", "trainer"):
        raise ValueError(f"field {key!r}: per must be token or row and reader loss, method or trainer")
    old = FIELDS.get(key)
    if old is not None and (old.per, old.reader) != (per, reader):
        raise ValueError(f"field {key!r} is already registered as a {old.per} field for the {old.reader}")
    if old is None:
        FIELDS[key] = Field(key, per, reader, doc)
    return key


def field_of(key: str) -> Field:
    """The registered field of ``key``; an unregistered key raises a KeyError that says how to register it."""
    try:
        return FIELDS[key]
    except KeyError:
        raise KeyError(f"batch extras key {key!r} is not a registered field: register it with "
                       "reflectrl.contract.fields.register_field(key, per, reader, doc)") from None


def is_per_token(key: str) -> bool:
    """Whether ``key``'s tensors are ``[R, C, ...]`` (cut and padded with the responses)."""
    return field_of(key).per == "token"


def read_by(extras: dict[str, object], reader: Reader, per: Per | None = None) -> dict[str, Tensor]:
    """The tensors of ``extras`` whose field has this reader (and shape), by key, in insertion order."""
    out: dict[str, Tensor] = {}
    for k, v in extras.items():
        f = field_of(k)
        if f.reader == reader and (per is None or f.per == per) and isinstance(v, Tensor):
            out[k] = v
    return out


@dataclass
class LossInputs:
    """What the policy loss of one micro-batch reads, each ``[R, C]``: the log-probs the rollout was sampled
    with (``old_logp``), the current ones (``logp``), the advantages (shaped, weighted and importance-weighted)
    and the loss mask; ``extra`` holds the registered ``"loss"`` fields by keyword (exgrpo's ``offpolicy`` and
    ``stored_logp``), passed to the registered policy loss as keyword arguments."""

    old_logp: Tensor
    logp: Tensor
    advantages: Tensor
    mask: Tensor
    extra: dict[str, Tensor] = field(default_factory=dict)
