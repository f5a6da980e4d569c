"""The algorithm core: pure tensor functions on the ``[rows, steps]`` layout with masks.

Both front ends (Gymnasium control and LLM) call these; nothing here knows about envs or models.
"""

from .advantages import (
    drgrpo_advantage,
    gae,
    gae_advantage,
    group_advantages,
    grpo_advantage,
    masked_gae,
    next_values_from,
)
from .buffers import RingBuffer
from .losses import (
    PolicyLossConfig,
    approx_kl,
    clipped_policy_loss,
    entropy_from_logits,
    explained_variance,
    get_policy_loss,
    mixed_policy_loss,
    policy_loss_names,
    ppo_policy_loss,
    register_policy_loss,
    shaped_ratio,
    value_loss,
)
from .masked import LOSS_AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten
from .registry import adv_est_requires, get_adv_est, list_registered, register_adv_est
from .returns import discounted_cumsum, discounted_returns, returns_to_go

__all__ = [
    "LOSS_AGG_MODES", "PolicyLossConfig", "RingBuffer", "adv_est_requires", "agg_loss", "approx_kl",
    "clipped_policy_loss", "discounted_cumsum", "discounted_returns", "drgrpo_advantage", "entropy_from_logits",
    "explained_variance", "gae", "gae_advantage", "get_adv_est", "get_policy_loss", "group_advantages",
    "grpo_advantage", "list_registered", "masked_gae", "masked_mean", "masked_sum", "masked_var", "masked_whiten",
    "mixed_policy_loss", "next_values_from", "policy_loss_names", "ppo_policy_loss", "register_adv_est", "register_policy_loss",
    "returns_to_go", "shaped_ratio", "value_loss",
]
