"""Advantage estimators on the ``[rows, steps]`` layout: GAE (with truncation bootstrap) and group-relative."""

from __future__ import annotations

import torch
from torch import Tensor

from .masked import masked_whiten
from .registry import register_adv_est
from .returns import discounted_cumsum
from .types import Rows, StepFlags, StepMask, Steps


def gae(
    rewards: Steps,
    values: Steps,
    next_values: Steps,
    terminated: StepFlags,
    episode_end: StepFlags,
    gamma: float,
    lam: float,
) -> tuple[Steps, Steps]:
    """Generalized Advantage Estimation over ``[rows, steps]``; returns ``(advantages, returns)``.

    ``next_values[r, t]`` is the value of the state reached by step ``t``: V(s_{t+1}) inside an
    episode, V(final observation) when the episode was **truncated** at ``t`` (so truncation
    bootstraps), and anything when it **terminated** (it is multiplied by 0). ``episode_end`` is
    ``terminated | truncated``: it stops the lambda-recursion so advantages never cross episodes.
    """
    not_term = 1.0 - terminated.to(values.dtype)
    deltas = rewards + gamma * not_term * next_values - values
    adv = discounted_cumsum(deltas, episode_end, gamma * lam, kernel="loop")
    return adv, adv + values


def next_values_from(values: Steps, bootstrap: Rows, final_values: Steps | None = None,
                     truncated: StepFlags | None = None) -> Steps:
    """Build ``next_values`` for :func:`gae`: shift ``values`` left, append ``bootstrap`` (V of the
    observation after the last step), and put V(final observation) where an episode was truncated."""
    nxt = torch.cat([values[:, 1:], bootstrap.reshape(-1, 1).to(values.dtype)], dim=1)
    if final_values is not None and truncated is not None:
        nxt = torch.where(truncated.bool(), final_values, nxt)
    return nxt


def group_advantages(scores: Rows, index: Tensor, norm_by_std: bool = True, eps: float = 1e-6) -> Rows:
    """Group-relative advantage of each sequence score: ``(s - mean_g)`` (Dr.GRPO) or
    ``(s - mean_g) / (std_g + eps)`` (GRPO, unbiased std). A group whose scores are all equal gets
    advantage 0; a group of one is taken as verl does (mean 0, std 1): ``s / (1 + eps)``, or ``s``
    without the std."""
    scores = scores.to(torch.float32) if not scores.is_floating_point() else scores
    inv, counts = _group_ids(index, scores.device)
    n = counts.to(scores.dtype)
    sums = torch.zeros(len(counts), dtype=scores.dtype, device=scores.device).index_add_(0, inv, scores)
    mean = sums / n
    centred = scores - mean[inv]
    single = n[inv] == 1
    if not norm_by_std:
        return torch.where(single, scores, centred)
    sq = torch.zeros(len(counts), dtype=scores.dtype, device=scores.device).index_add_(0, inv, centred**2)
    std = (sq / (n - 1).clamp_min(1)).sqrt()
    adv = centred / (std[inv] + eps)
    return torch.where(single, scores / (1.0 + eps), adv)


def batch_scaled_advantages(per_row: Rows, groups: Tensor, eps: float = 1e-6) -> Rows:
    """``[R]``: ``per_row`` centred in each group, divided by the (unbiased) std of the centred values over the rows
    of the groups that hold a nonzero one; 0 where every group's values are equal. One scale for the batch, where
    GRPO's is each group's own: a per-group std depends on the group's values and so biases what they train
    (refgrpo and rlcr's balanced rank forms, docs/methods-llm.md)."""
    centred = group_advantages(per_row, groups, norm_by_std=False)
    live = torch.isin(groups, groups[centred != 0])
    if int(live.sum()) < 2:
        return torch.zeros_like(centred)
    return centred / (centred[live].std() + eps)


def _group_ids(index, device: torch.device) -> tuple[Tensor, Tensor]:
    """Dense group ids and group sizes from a tensor, list or numpy array of any hashable ids
    (verl passes uid strings as a numpy object array)."""
    if torch.is_tensor(index):
        _, inv, counts = torch.unique(index, return_inverse=True, return_counts=True)
        return inv.to(device), counts.to(device)
    import numpy as np

    _, inv, counts = np.unique(np.asarray(index), return_inverse=True, return_counts=True)
    return torch.as_tensor(inv.reshape(-1), device=device), torch.as_tensor(counts, device=device)


def _sequence_scores(token_level_rewards: Tensor, response_mask: Tensor) -> Tensor:
    return (token_level_rewards * response_mask).sum(-1)


@register_adv_est("grpo")
def grpo_advantage(token_level_rewards: Steps, response_mask: StepMask, index: Tensor, config=None,
                   **kwargs) -> tuple[Steps, Steps]:
    """GRPO outcome advantage: group mean/std normalized sequence score, broadcast over tokens."""
    eps = getattr(config, "eps", 1e-6) if config is not None else 1e-6
    adv = group_advantages(_sequence_scores(token_level_rewards, response_mask), index, True, eps)
    out = adv[:, None] * response_mask
    return out, out


@register_adv_est("drgrpo")
def drgrpo_advantage(token_level_rewards: Steps, response_mask: StepMask, index: Tensor, config=None,
                     **kwargs) -> tuple[Steps, Steps]:
    """Dr.GRPO outcome advantage: group mean-centred score only (no std), broadcast over tokens."""
    adv = group_advantages(_sequence_scores(token_level_rewards, response_mask), index, False)
    out = adv[:, None] * response_mask
    return out, out


def masked_gae(rewards: Steps, values: Steps, mask: StepMask, gamma: float, lam: float) -> tuple[Steps, Steps]:
    """GAE over token rows whose mask may have holes (multi-turn feedback tokens): masked-out steps
    are skipped, so the step before a hole bootstraps from the next *real* step; the episode ends
    after the last real step. Masked steps get advantage 0.

    The real steps of each row are packed to its start (in order), their TD errors
    ``delta_t = r_t + gamma * V_next - V_t`` summed with :func:`~reflectrl.core.returns.discounted_cumsum` at
    ``gamma * lam`` (the one discounted sum every estimator uses), and scattered back."""
    m = mask.bool()
    order = torch.argsort((~m).to(torch.int8), dim=1, stable=True)  # each row's real steps first, in order
    real = m.gather(1, order)
    r = torch.where(real, rewards.gather(1, order), torch.zeros_like(rewards))
    v = torch.where(real, values.gather(1, order), torch.zeros_like(values))
    v_next = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], 1)  # 0 after a row's last real step
    delta = torch.where(real, r + gamma * v_next - v, torch.zeros_like(v))
    packed = discounted_cumsum(delta, None, gamma * lam, kernel="loop")
    adv = torch.zeros_like(values).scatter(1, order, torch.where(real, packed, torch.zeros_like(packed)))
    return adv, (adv + values) * mask.to(values.dtype)


@register_adv_est("gae", requires=("values",))
def gae_advantage(token_level_rewards: Steps, response_mask: StepMask, index: Tensor | None = None,
                  config=None, *, values: Steps, **kwargs) -> tuple[Steps, Steps]:
    """GAE for token sequences (verl signature); see :func:`masked_gae`. Whitened unless
    ``config.whiten`` is False."""
    gamma = getattr(config, "gamma", 1.0) if config is not None else 1.0
    lam = getattr(config, "lam", 1.0) if config is not None else 1.0
    mask = response_mask.to(values.dtype)
    adv, ret = masked_gae(token_level_rewards * mask, values * mask, mask, gamma, lam)
    adv = masked_whiten(adv, mask) if getattr(config, "whiten", True) else adv
    return adv, ret
