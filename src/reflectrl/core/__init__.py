"""The algorithm core: pure tensor functions on the ``[rows, steps]`` layout with masks.

Both front ends (Gymnasium control and LLM) call these; nothing here knows about envs or models.
"""

from .advantages import (
    discounted_returns,
    drgrpo_advantage,
    gae,
    gae_advantage,
    group_advantages,
    masked_gae,
    grpo_advantage,
    next_values_from,
)
from .losses import approx_kl, entropy_from_logits, explained_variance, ppo_policy_loss, value_loss
from .masked import LOSS_AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten
from .registry import get_adv_est, get_shaper, list_registered, register_adv_est, register_shaper

__all__ = [
    "LOSS_AGG_MODES", "agg_loss", "approx_kl", "discounted_returns", "drgrpo_advantage",
    "entropy_from_logits", "explained_variance", "gae", "gae_advantage", "get_adv_est", "get_shaper",
    "group_advantages", "masked_gae", "grpo_advantage", "list_registered", "masked_mean", "masked_sum", "masked_var",
    "masked_whiten", "next_values_from", "ppo_policy_loss", "register_adv_est", "register_shaper",
    "value_loss",
]
