"""The registry behind ``reflectrl train --algo NAME``: one entry per trainable algorithm.

An entry names its config dataclass (its fields become the CLI flags), how to build a trainer
from a config, and how to resume one from a run directory. A method that runs on top of PPO
registers a PPOConfig subclass and passes its hooks to :class:`~reflectrl.control.ppo.PPO`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError
from .config import PPOConfig
from .ppo import PPO


@dataclass(frozen=True)
class Algo:
    name: str
    config_cls: type
    build: Callable[[Any], Any]
    resume: Callable[..., Any]
    description: str


ALGOS: dict[str, Algo] = {}


def register_algo(algo: Algo) -> Algo:
    """Add an algorithm to ``--algo``'s choices."""
    ALGOS[algo.name] = algo
    return algo


def get_algo(name: str) -> Algo:
    """Look up ``--algo NAME`` or raise ConfigError listing the choices."""
    _load_builtin()
    if name not in ALGOS:
        raise ConfigError(f"unknown --algo {name!r}; available: {', '.join(sorted(ALGOS))}")
    return ALGOS[name]


def algo_names() -> list[str]:
    _load_builtin()
    return sorted(ALGOS)


def _load_builtin() -> None:
    """Import the modules that register the built-in algorithms (kept lazy: the CLI imports this)."""
    try:
        import reflectrl.methods.control_algos  # noqa: F401  (registers method algos when present)
    except ModuleNotFoundError as exc:
        if exc.name != "reflectrl.methods.control_algos":
            raise


register_algo(Algo("ppo", PPOConfig, lambda cfg: PPO(cfg), lambda run_dir, total=None, **kw: PPO.resume(run_dir, total, **kw),
                   "PPO with GAE (truncation bootstrap) and the clipped objective"))
