"""Registries of advantage estimators and advantage shapers.

Both use verl's estimator signature, so a reflectrl estimator registers into verl unchanged::

    fn(token_level_rewards, response_mask, index, config, **kwargs) -> (advantages, returns)

A *shaper* takes the same arguments plus ``advantages=`` and ``returns=`` keywords and returns a
new ``(advantages, returns)`` pair (e.g. reweighting advantages per step).
"""

from __future__ import annotations

from typing import Callable

AdvEstimator = Callable[..., tuple]
_ADV_ESTIMATORS: dict[str, AdvEstimator] = {}
_SHAPERS: dict[str, AdvEstimator] = {}


def _register(table: dict[str, AdvEstimator], kind: str, name: str) -> Callable[[AdvEstimator], AdvEstimator]:
    def deco(fn: AdvEstimator) -> AdvEstimator:
        if name in table and table[name] is not fn:
            raise ValueError(f"{kind} {name!r} is already registered")
        table[name] = fn
        return fn

    return deco


def _get(table: dict[str, AdvEstimator], kind: str, name: str) -> AdvEstimator:
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; registered: {', '.join(sorted(table))}")
    return table[name]


def register_adv_est(name: str) -> Callable[[AdvEstimator], AdvEstimator]:
    """Decorator: register an advantage estimator under ``name``."""
    return _register(_ADV_ESTIMATORS, "advantage estimator", name)


def get_adv_est(name: str) -> AdvEstimator:
    """Look up a registered advantage estimator."""
    return _get(_ADV_ESTIMATORS, "advantage estimator", name)


def register_shaper(name: str) -> Callable[[AdvEstimator], AdvEstimator]:
    """Decorator: register an advantage shaper under ``name``."""
    return _register(_SHAPERS, "shaper", name)


def get_shaper(name: str) -> AdvEstimator:
    """Look up a registered advantage shaper."""
    return _get(_SHAPERS, "shaper", name)


def list_registered() -> dict[str, list[str]]:
    """Names of every registered estimator and shaper."""
    return {"adv_estimators": sorted(_ADV_ESTIMATORS), "shapers": sorted(_SHAPERS)}
