"""The registry of trainable algorithms, one table per front end (``control``: ``reflectrl train
--algo``; ``llm``: ``reflectrl llm train --algo``). It holds entries and knows nothing of them; the
built-in entries are registered by the composition root :mod:`reflectrl.algos`, and a method of a
user's own registers with :func:`register_algo` from its own module.

The composition root may register a group of built-ins lazily (:func:`register_builtins`): a loader that
imports their modules and registers them, run the first time a lookup needs that front end's table (so
``reflectrl train`` does not import the LLM front end). An entry a user registered under the same name
stays in place when the built-ins load later, as it would have replaced the built-in had they loaded first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

KINDS = ("control", "llm")


@dataclass(frozen=True)
class Algo:
    """One ``--algo`` entry: its config dataclass (fields become CLI flags), the defaults it applies on
    top of that dataclass's, and ``build(cfg) -> trainer``. The registry tells the trainer its name, so
    a run records and resumes as the algo it was started with."""

    name: str
    kind: str
    config_cls: type
    build: Callable[[Any], Any]
    description: str
    defaults: dict[str, Any] = field(default_factory=dict)

    def config(self, **overrides: Any) -> Any:
        """The config dataclass with the defaults its front end derives from the settings given (see
        :func:`register_implied_defaults`), then this algo's defaults, then ``overrides``."""
        implied = IMPLIED[self.kind](overrides) if self.kind in IMPLIED else {}
        kw = {**implied, **self.defaults, **overrides}
        if "algo" in {f.name for f in _fields(self.config_cls)}:
            kw["algo"] = self.name
        return self.config_cls(**kw)

    def make(self, cfg: Any) -> Any:
        """Build the trainer for ``cfg`` and name it after this algo."""
        trainer = self.build(cfg)
        trainer.algo_name = self.name
        return trainer


def _fields(cls: type) -> tuple:
    import dataclasses

    return dataclasses.fields(cls)


_PENDING: dict[str, list[Callable[[], None]]] = {k: [] for k in KINDS}  # built-in loaders not run yet


def load_builtins(kind: str) -> None:
    """Run the pending loaders of ``kind``'s built-ins (each once); entries a user registered first stay."""
    pending = _PENDING.get(kind)
    while pending:
        loader = pending.pop(0)
        table = ALGOS[kind]
        users = dict(table)
        try:
            loader()
        except BaseException:
            pending.insert(0, loader)  # not loaded: the next lookup tries again (and raises again)
            raise
        finally:
            table.update(users)


ALGOS: dict[str, dict[str, Algo]] = {k: {} for k in KINDS}  # front end -> {name: Algo}; see :func:`algo_table`
IMPLIED: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def register_implied_defaults(kind: str, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Make every ``kind`` algo's config start from ``fn(settings given)``: defaults that follow from other settings
    (the LLM front end's learning rate, group size and temperature follow the model and LoRA). An algo's own
    defaults and the settings given override them."""
    if kind not in KINDS:
        raise ValueError(f"unknown front end {kind!r}; choose one of {', '.join(KINDS)}")
    IMPLIED[kind] = fn


def algo_table(kind: str) -> dict[str, Algo]:
    """Every registered entry of front end ``kind``, its built-ins loaded."""
    load_builtins(kind)
    return ALGOS[kind]


def register_algo(algo: Algo) -> Algo:
    """Add an algorithm to its front end's ``--algo`` choices (replacing one of the same name)."""
    if algo.kind not in KINDS:
        raise ValueError(f"unknown front end {algo.kind!r}; choose one of {', '.join(KINDS)}")
    ALGOS[algo.kind][algo.name] = algo
    return algo


def register_builtins(kind: str, loader: Callable[[], None]) -> None:
    """Register a group of ``kind``'s built-in algos lazily: ``loader()`` imports and registers them the
    first time a lookup needs that front end's table (:func:`lookup`, :func:`algo_table`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown front end {kind!r}; choose one of {', '.join(KINDS)}")
    _PENDING[kind].append(loader)


def lookup(kind: str, name: str) -> Algo:
    """The registered entry, or ConfigError listing the choices (pending built-ins load only when ``name``
    is not registered yet)."""
    table = ALGOS[kind]
    if name not in table:
        table = algo_table(kind)
    if name not in table:
        where = "reflectrl train" if kind == "control" else "reflectrl llm train"
        raise ConfigError(f"unknown --algo {name!r} for `{where}`; available: {', '.join(sorted(table))}")
    return table[name]
