"""A turn view of a token batch: the method contract with one step per turn of an LLM episode.

A multi-turn episode's agent turns (a query, an answer, a self-report) are natural steps for methods
that reason per step: refgrpo-seed's per-turn reflection predictor (seed 000, section 6) regresses onto
per-turn advantages and shapes per-turn rewards. :class:`TurnView` turns a token-level
:class:`~reflectrl.contract.base.StepBatch` ``[R, T]`` into a turn-level one ``[R, K]`` (K: the most turns
of a row) and maps the method's :class:`~reflectrl.contract.base.Shaping` back to tokens: a reward change of
a turn goes to the turn's last token, an advantage change or weight to each of its tokens.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ..contract.base import Shaping, StepBatch


class TurnView:
    """``to_view(token batch) -> turn batch`` and ``from_view(turn shaping) -> token shaping``."""

    def __init__(self) -> None:
        self._map: tuple[Tensor, Tensor, int, int] | None = None

    def to_view(self, sb: StepBatch) -> StepBatch:
        if sb.turn_ids is None:
            raise ValueError("the turn view needs the batch's turn ids (an LLM token batch)")
        mask = (sb.mask if sb.mask is not None else torch.ones_like(sb.rewards)).bool()
        turn = torch.where(mask, sb.turn_ids, torch.full_like(sb.turn_ids, -1))
        R, T = turn.shape
        K = int(turn.max()) + 1 if bool(mask.any()) else 1
        slot = torch.where(mask, turn, torch.full_like(turn, K))  # masked steps go to a discarded slot K
        onehot = torch.zeros(R, T, K + 1).scatter_(2, slot.unsqueeze(-1), 1.0)[..., :K]  # [R, T, K]
        count = onehot.sum(1)  # [R, K]
        has = count > 0
        mean = lambda x: torch.einsum("rtk,rt...->rk...", onehot, x.float()) / count.clamp_min(1).view(
            R, K, *([1] * (x.dim() - 2)))
        last = (onehot * torch.arange(T, dtype=torch.float32).view(1, T, 1)).amax(1).long()  # last token of a turn
        end = torch.zeros(R, K, dtype=torch.bool)
        n_turns = has.sum(1)
        rows = (n_turns > 0).nonzero().squeeze(1)
        end[rows, n_turns[rows] - 1] = True
        self._map = (onehot, last, R, T)
        gather = lambda x: torch.gather(x, 1, last) * has
        return dataclasses.replace(
            sb, states=mean(sb.states), features=mean(sb.features), rewards=torch.einsum("rtk,rt->rk", onehot, sb.rewards),
            values=gather(sb.values), advantages=mean(sb.advantages), returns=mean(sb.returns), episode_end=end,
            terminated=end & torch.gather(sb.terminated, 1, last), next_values=torch.zeros(R, K), mask=has.float(),
            turn_ids=torch.arange(K).expand(R, K).where(has, torch.full((R, K), -1)))

    def from_view(self, sh: Shaping) -> Shaping:
        if self._map is None:
            raise RuntimeError("from_view before to_view: the turn view maps back the batch it last viewed")
        onehot, last, R, T = self._map

        def spread(x: Tensor) -> Tensor:
            return torch.einsum("rtk,rk->rt", onehot, x.float())

        reward = None
        if sh.reward_delta is not None:
            reward = torch.zeros(R, T).scatter_add_(1, last, sh.reward_delta.float() * (onehot.sum(1) > 0))
        weights = None
        if sh.weights is not None:
            w = spread(sh.weights)
            weights = torch.where(onehot.sum(2) > 0, w, torch.ones_like(w))
        adv = None if sh.advantage_delta is None else spread(sh.advantage_delta)
        return Shaping(reward_delta=reward, advantage_delta=adv, weights=weights)


class GroupBaselineView:
    """The token batch with ``values`` set to the group-mean baseline broadcast over each row's tokens (the
    ``V_orig`` of gear-seed on the LLM when there is no critic): the mean of the rows' total rewards within
    each group of ``group_size`` rows; and ``returns`` set to each row's total reward on its tokens (the value
    targets of a terminal reward with no discount), the scale ``--gear-tau-relative`` reads. Shapings pass through
    unchanged."""

    def to_view(self, sb: StepBatch) -> StepBatch:
        mask = sb.mask if sb.mask is not None else torch.ones_like(sb.rewards)
        score = (sb.rewards * mask).sum(1)
        g = max(1, sb.group_size)
        groups = torch.arange(score.shape[0]) // g
        n = torch.zeros(int(groups.max()) + 1).index_add_(0, groups, torch.ones_like(score))
        mean = torch.zeros_like(n).index_add_(0, groups, score) / n
        return dataclasses.replace(sb, values=mean[groups][:, None] * mask, returns=score[:, None] * mask)

    def from_view(self, sh: Shaping) -> Shaping:
        return sh
