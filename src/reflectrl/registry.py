"""The registry of trainable algorithms, one table per front end (``control``: ``reflectrl train
--algo``; ``llm``: ``reflectrl llm train --algo``). It holds entries and knows nothing of them; the
built-in entries are registered by the composition root :mod:`reflectrl.algos`, and a method of a
user's own registers with :func:`register_algo` from its own module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ConfigError

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
        """The config dataclass with this algo's defaults, then ``overrides``."""
        kw = {**self.defaults, **overrides}
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


ALGOS: dict[str, dict[str, Algo]] = {k: {} for k in KINDS}


def register_algo(algo: Algo) -> Algo:
    """Add an algorithm to its front end's ``--algo`` choices (replacing one of the same name)."""
    if algo.kind not in KINDS:
        raise ValueError(f"unknown front end {algo.kind!r}; choose one of {', '.join(KINDS)}")
    ALGOS[algo.kind][algo.name] = algo
    return algo


def lookup(kind: str, name: str) -> Algo:
    """The registered entry, or ConfigError listing the choices."""
    table = ALGOS[kind]
    if name not in table:
        where = "reflectrl train" if kind == "control" else "reflectrl llm train"
        raise ConfigError(f"unknown --algo {name!r} for `{where}`; available: {', '.join(sorted(table))}")
    return table[name]
