"""The one hook protocol: what a method may add to a trainer beyond the method contract.

A method whose work is not a :class:`~reflectrl.contract.base.Shaping` of a batch (a replay buffer that mixes
stored rows into the rollout, a teacher pass, a term in DQN's TD target) is a :class:`Hook`. Every trainer
calls the same lifecycle on its hooks: ``setup(trainer)`` once the trainer is built (before its optimizer),
``metrics()`` into each record, and ``state()`` / ``load_state()`` (when a hook has them) into each checkpoint.
Each front end adds the events of its own loop by subclassing: :class:`reflectrl.llm.grpo.GRPOHook`
(``select_problems``, ``group_sizes``, ``after_rollout``, ``after_prepare``, ``after_update``) and
:class:`reflectrl.control.dqn.DQNHook` (``after_step``, ``td_extra``). A hook names the registered fields
(:mod:`reflectrl.contract.fields`) it puts into a batch in ``provides``, and a trainer refuses, before any work,
a method that ``reads`` a field no hook of the run provides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from ..errors import ConfigError

T = TypeVar("T")


class Hook(Generic[T]):
    """A trainer extension of trainer type ``T``; every event is optional (the defaults do nothing)."""

    name: str | None = None
    """The key of its state in a checkpoint (``hook/NAME``; default: the class name)."""
    needs: tuple[str, ...] = ()
    """Inputs it asks the trainer to compute (the GRPO trainer's no-grad pass: ``old_logp``, ``ref_logp``,
    ``hidden``, ``entropy``; ``hidden_grad``: hidden states in the training forward)."""
    provides: tuple[str, ...] = ()
    """The registered fields it puts into a batch's ``extras`` for methods or the loss."""

    def setup(self, trainer: T) -> None:
        """Attach heads or buffers (before the optimizer is built)."""

    def metrics(self) -> dict[str, float]:
        """Merged into each ``metrics.jsonl`` record."""
        return {}


def check_provided(hooks: Iterable[Hook[Any]], reads: Iterable[tuple[str, str]]) -> None:
    """Refuse a run in which a method reads a field that no hook of the run provides: ``reads`` holds
    ``(method name, field key)`` pairs, each method's ``reads`` (the fields it needs from hooks; what the front end
    itself gives every method, such as ``logp`` or ``correct``, is not listed there)."""
    provided = {k for h in hooks for k in h.provides}
    missing = [(m, k) for m, k in reads if k not in provided]
    if missing:
        said = ", ".join(f"{m} reads {k!r}" for m, k in missing)
        raise ConfigError(f"{said}, which no hook of this run provides (a hook lists it in its `provides`)")
