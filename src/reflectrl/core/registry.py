"""The registry of advantage estimators, with verl's estimator signature, so a reflectrl estimator
registers into verl unchanged::

    fn(token_level_rewards, response_mask, index, config, **kwargs) -> (advantages, returns)

Policy losses have their own registry, in verl's style too (:func:`reflectrl.core.losses.register_policy_loss`).
"""

from __future__ import annotations

from collections.abc import Callable

AdvEstimator = Callable[..., tuple]
_ADV_ESTIMATORS: dict[str, AdvEstimator] = {}
_REQUIRES: dict[str, frozenset[str]] = {}


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


def register_adv_est(name: str, requires: tuple[str, ...] = ()) -> Callable[[AdvEstimator], AdvEstimator]:
    """Decorator: register an advantage estimator under ``name``; ``requires`` names the keyword
    inputs beyond verl's four that a front end must pass (``values``: a critic's per-step values)."""
    _REQUIRES[name] = frozenset(requires)
    return _register(_ADV_ESTIMATORS, "advantage estimator", name)


def adv_est_requires(name: str) -> frozenset[str]:
    """What a registered estimator needs beyond rewards, mask and group index."""
    _get(_ADV_ESTIMATORS, "advantage estimator", name)
    return _REQUIRES.get(name, frozenset())


def get_adv_est(name: str) -> AdvEstimator:
    """Look up a registered advantage estimator."""
    return _get(_ADV_ESTIMATORS, "advantage estimator", name)


def list_registered() -> dict[str, list[str]]:
    """Names of every registered estimator and policy loss."""
    from .losses import policy_loss_names

    return {"adv_estimators": sorted(_ADV_ESTIMATORS), "policy_losses": policy_loss_names()}
