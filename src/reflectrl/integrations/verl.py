"""reflectrl's advantage estimators and policy losses inside verl (0.9 or newer; ``pip install 'reflectrl[verl]'``).

:func:`register_with_verl` adds every estimator of reflectrl's registry to verl's
(``verl.trainer.ppo.core_algos.register_adv_est``) as ``reflectrl_<name>`` (``reflectrl_grpo``,
``reflectrl_drgrpo``, ``reflectrl_gae``) and every policy loss to verl's ``register_policy_loss`` as
``reflectrl_<name>`` (``reflectrl_vanilla``); verl's own entries stay as they are. A verl config then selects
them with ``algorithm.adv_estimator=reflectrl_grpo`` and ``actor_rollout_ref.actor.policy_loss.loss_mode=
reflectrl_vanilla``. Registration is per process: every verl process that looks an entry up needs it, which
``VERL_USE_EXTERNAL_MODULES=reflectrl.integrations.verl_plugin`` arranges (docs/integrations.md).

Importing this module never imports verl; :func:`register_with_verl` does, and raises one
:class:`~reflectrl.errors.ReflectRLError` when verl is missing. The adapters translate verl's arguments:

- estimators get ``token_level_rewards``, ``response_mask``, ``index`` (verl's numpy object array of uid strings)
  and ``config`` (verl's ``AlgoConfig`` or the ``algorithm`` DictConfig, read for ``gamma``, ``lam`` and
  ``norm_adv_by_std_in_grpo``); ``reflectrl_grpo`` with ``norm_adv_by_std_in_grpo=False`` is Dr.GRPO, as verl's
  ``grpo`` is. ``reflectrl_gae`` needs ``values=``, which verl's trainer passes to its built-in ``gae`` only.
- policy losses get verl's actor config: ``clip_ratio`` / ``clip_ratio_low`` / ``clip_ratio_high`` (clip-higher),
  ``clip_ratio_c`` (dual clip, verl's default 3.0), the log-ratio clamp of 20 verl applies, ``loss_agg_mode`` and
  ``global_batch_info`` (``dp_size``, ``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``), so the
  micro-batch loss is normalized by the global batch as verl's is. They return verl's ``(loss, metrics)``, with
  ``actor/pg_clipfrac`` (reflectrl's ``clip_binding_frac``), ``actor/ppo_kl`` (``old_approx_kl``) and
  ``actor/pg_clipfrac_lower`` (``dual_clip_frac``); reflectrl's other statistics under ``actor/reflectrl/``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.losses import PolicyLossConfig, get_policy_loss, policy_loss_names
from ..core.masked import LOSS_AGG_MODES
from ..core.registry import adv_est_requires, get_adv_est, list_registered
from ..errors import ConfigError, ReflectRLError

PREFIX = "reflectrl_"
INSTALL_HINT = "pip install 'reflectrl[verl]'"
VERL_LOG_RATIO_CLAMP = 20.0
"""verl's vanilla loss clamps log(pi/pi_old) to [-20, 20] before the exponential; the adapters do the same."""
VERL_DUAL_CLIP_DEFAULT = 3.0
VERL_GRPO_EPS = 1e-6
"""verl's ``compute_grpo_outcome_advantage`` default epsilon."""

_STAT_NAMES = {"clip_binding_frac": "actor/pg_clipfrac", "old_approx_kl": "actor/ppo_kl",
               "dual_clip_frac": "actor/pg_clipfrac_lower"}
_ADAPTERS: dict[tuple[str, str], Callable[..., Any]] = {}  # (kind, reflectrl name) -> the callable given to verl


def verl_core_algos() -> Any:
    """verl's ``verl.trainer.ppo.core_algos`` module, or one ReflectRLError saying how to install verl."""
    try:
        return importlib.import_module("verl.trainer.ppo.core_algos")
    except ImportError as exc:
        raise ReflectRLError(f"the verl integration needs verl 0.9 or newer ({type(exc).__name__}: {exc}); "
                             f"install it with: {INSTALL_HINT}") from None


def verl_name(name: str) -> str:
    """The name a reflectrl estimator or loss has in verl's registries."""
    return PREFIX + name


def register_with_verl() -> dict[str, list[str]]:
    """Register reflectrl's estimators and policy losses in verl's registries under ``reflectrl_<name>``.

    Idempotent: a second call changes nothing (a name already holding reflectrl's adapter is kept). Raises
    ReflectRLError when verl is missing, or when a ``reflectrl_`` name in verl's registry holds something else.
    Returns the verl names, ``{"adv_estimators": [...], "policy_losses": [...]}``.
    """
    core_algos = verl_core_algos()
    est_table: dict[str, Any] = core_algos.ADV_ESTIMATOR_REGISTRY
    loss_table: dict[str, Any] = core_algos.POLICY_LOSS_REGISTRY
    out: dict[str, list[str]] = {"adv_estimators": [], "policy_losses": []}
    for name in list_registered()["adv_estimators"]:
        fn = _adapter("adv_estimator", name, _make_estimator)
        if _claim(est_table, verl_name(name), fn, "advantage estimator"):
            core_algos.register_adv_est(verl_name(name))(fn)
        out["adv_estimators"].append(verl_name(name))
    for name in policy_loss_names():
        fn = _adapter("policy_loss", name, _make_policy_loss)
        if _claim(loss_table, verl_name(name), fn, "policy loss"):
            core_algos.register_policy_loss(verl_name(name))(fn)
        out["policy_losses"].append(verl_name(name))
    return out


def _adapter(kind: str, name: str, make: Callable[[str], Callable[..., Any]]) -> Callable[..., Any]:
    if (kind, name) not in _ADAPTERS:
        _ADAPTERS[(kind, name)] = make(name)
    return _ADAPTERS[(kind, name)]


def _claim(table: dict[str, Any], name: str, fn: Callable[..., Any], kind: str) -> bool:
    """True when ``fn`` should be registered under ``name``; False when it already is. A stale reflectrl adapter
    (this module reloaded) is dropped so the fresh one replaces it; anything else under the name is an error."""
    held = table.get(name)
    if held is None:
        return True
    if held is fn:
        return False
    if getattr(held, "_reflectrl_adapter", None) == getattr(fn, "_reflectrl_adapter", object()):
        del table[name]
        return True
    raise ReflectRLError(f"verl already has a {kind} named {name!r} that is not reflectrl's ({held!r}); "
                         "remove it before calling register_with_verl()")


# ------------------------------------------------------------------------------------------------
# Reading verl's configs (dataclasses with a DictConfig-like interface, or DictConfigs, or dicts).
# ------------------------------------------------------------------------------------------------
def config_value(config: Any, key: str, default: Any = None) -> Any:
    """``config.key`` (or ``config[key]``) of a verl config, ``default`` when the config is None or lacks it."""
    if config is None:
        return default
    getter = getattr(config, "get", None)
    if callable(getter):  # dict, DictConfig and verl's BaseConfig dataclasses, read as verl reads them
        try:
            return getter(key, default)
        except (AttributeError, KeyError, TypeError):
            pass
    try:
        return getattr(config, key)
    except (AttributeError, KeyError):
        return default


class AlgoView:
    """What reflectrl's estimators read from their ``config`` (``eps``, ``gamma``, ``lam``, ``whiten``), taken
    from verl's algorithm config: ``eps`` is verl's GRPO epsilon, ``whiten`` True (verl's GAE always whitens);
    any other attribute is read from verl's config."""

    def __init__(self, config: Any, **overrides: Any):
        self._config = config
        self.eps = VERL_GRPO_EPS
        self.whiten = True
        self.gamma = config_value(config, "gamma", 1.0)
        self.lam = config_value(config, "lam", 1.0)
        self.norm_adv_by_std_in_grpo = bool(config_value(config, "norm_adv_by_std_in_grpo", True))
        for key, value in overrides.items():
            if value is not None:
                setattr(self, key, value)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        missing = object()
        value = config_value(self.__dict__.get("_config"), key, missing)
        if value is missing:
            raise AttributeError(key)
        return value


# ------------------------------------------------------------------------------------------------
# Advantage estimators.
# ------------------------------------------------------------------------------------------------
def _make_estimator(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    requires = adv_est_requires(name)

    def estimator(token_level_rewards: Tensor, response_mask: Tensor, index: Any = None, config: Any = None,
                  **kwargs: Any) -> tuple[Tensor, Tensor]:
        view = AlgoView(config, gamma=kwargs.pop("gamma", None), lam=kwargs.pop("lam", None))
        missing = sorted(k for k in requires if kwargs.get(k) is None)
        if missing:
            raise ReflectRLError(
                f"{verl_name(name)} needs {', '.join(missing)}=, which verl's trainer passes only to its built-in "
                f"{name!r} estimator; set algorithm.adv_estimator={name} in verl (reflectrl's and verl's agree, "
                "docs/integrations.md), or call it with those inputs from your own trainer")
        if index is None and not requires:
            raise ReflectRLError(f"{verl_name(name)} needs the group index (verl's non_tensor_batch['uid'])")
        target = name
        if name == "grpo" and not view.norm_adv_by_std_in_grpo:
            target = "drgrpo"  # verl's grpo with norm_adv_by_std_in_grpo=False is Dr.GRPO
        mask = response_mask.to(token_level_rewards.dtype)
        return get_adv_est(target)(token_level_rewards, mask, index, view, **kwargs)

    estimator.__name__ = estimator.__qualname__ = verl_name(name)
    estimator.__doc__ = f"reflectrl's {name!r} advantage estimator in verl's signature (reflectrl.integrations.verl)."
    estimator._reflectrl_adapter = ("adv_estimator", name)  # type: ignore[attr-defined]
    return estimator


# ------------------------------------------------------------------------------------------------
# Policy losses.
# ------------------------------------------------------------------------------------------------
def policy_loss_config(config: Any) -> tuple[PolicyLossConfig, dict[str, Any]]:
    """reflectrl's PolicyLossConfig from verl's actor config (as verl 0.9.1's vanilla loss reads it), and the
    config's ``global_batch_info``."""
    if config is None:
        raise ReflectRLError("reflectrl's verl policy losses need verl's actor config (config=None was passed)")
    clip = config_value(config, "clip_ratio", 0.2)
    low = config_value(config, "clip_ratio_low", None)
    high = config_value(config, "clip_ratio_high", None)
    low = clip if low is None else low
    high = clip if high is None else high
    clip_c = config_value(config, "clip_ratio_c", VERL_DUAL_CLIP_DEFAULT)
    if clip_c is not None and not float(clip_c) > 1.0:
        raise ConfigError(f"actor clip_ratio_c (dual clip) must be greater than 1, got {clip_c!r}")
    info = dict(config_value(config, "global_batch_info", None) or {})
    norm_len = info.get("loss_scale_factor")
    return PolicyLossConfig(clip_ratio_low=float(low), clip_ratio_high=float(high),
                            clip_ratio_c=None if clip_c is None else float(clip_c),
                            log_ratio_clamp=VERL_LOG_RATIO_CLAMP,
                            norm_len=None if norm_len is None else int(norm_len)), info


def global_scale(mask: Tensor, mode: str, info: dict[str, Any]) -> Tensor | float:
    """The factor that turns reflectrl's micro-batch loss (a mean over this micro-batch's tokens or rows) into
    verl's, which divides by the global batch's tokens (``batch_num_tokens``) or rows (``global_batch_size``) and
    multiplies by ``dp_size`` so that data-parallel gradient averaging gives the global mean."""
    dp = info.get("dp_size") or 1
    if mode == "token-mean":
        total, local = info.get("batch_num_tokens"), mask.sum()
    else:
        total, local = info.get("global_batch_size"), (mask.sum(-1) > 0).to(mask.dtype).sum()
    if total is None:
        if dp > 1:
            what = "batch_num_tokens" if mode == "token-mean" else "global_batch_size"
            raise ReflectRLError(f"global_batch_info has dp_size={dp} but no {what}; verl sets both")
        return 1.0
    return local * dp / total


def _make_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    def policy_loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
                    loss_agg_mode: str = "token-mean", config: Any = None, rollout_is_weights: Tensor | None = None,
                    **kwargs: Any) -> tuple[Tensor, dict[str, Any]]:
        if loss_agg_mode not in LOSS_AGG_MODES:
            raise ConfigError(f"{verl_name(name)} supports the loss_agg_mode values reflectrl and verl share "
                              f"({', '.join(LOSS_AGG_MODES)}), not {loss_agg_mode!r}")
        if rollout_is_weights is not None:
            raise ReflectRLError(f"{verl_name(name)} does not take rollout-correction weights; disable "
                                 "algorithm.rollout_correction or use verl's own loss_mode=vanilla")
        pconf, info = policy_loss_config(config)
        valid = response_mask.bool()
        mask = valid.to(log_prob.dtype)
        zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
        # positions outside the mask may hold anything (verl's padding can be -inf or NaN); they never reach the loss
        logp, old, adv = (torch.where(valid, x, zero) for x in (log_prob, old_log_prob, advantages))
        loss, stats = get_policy_loss(name)(old, logp, adv, mask, loss_agg_mode, pconf, **kwargs)
        loss = loss * global_scale(mask, loss_agg_mode, info)
        metrics: dict[str, Any] = {}
        for key, value in stats.items():
            metrics[_STAT_NAMES.get(key, f"actor/reflectrl/{key}")] = float(value.detach())
        metrics.setdefault("actor/pg_clipfrac_lower", 0.0)
        return loss, metrics

    policy_loss.__name__ = policy_loss.__qualname__ = verl_name(name)
    policy_loss.__doc__ = f"reflectrl's {name!r} policy loss in verl's signature (reflectrl.integrations.verl)."
    policy_loss._reflectrl_adapter = ("policy_loss", name)  # type: ignore[attr-defined]
    return policy_loss
