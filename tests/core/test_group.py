"""Group-relative advantages (GRPO, Dr.GRPO) and the token-level estimators built on them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from reflectrl.core import drgrpo_advantage, gae_advantage, group_advantages, grpo_advantage

EPS = 1e-6  # group_advantages' default eps


def t(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


def close(actual, expected, tol=1e-12):
    torch.testing.assert_close(actual, t(expected, actual.dtype), rtol=0, atol=tol)


# ---------------------------------------------------------------- group_advantages
def test_grpo_two_groups_hand_case():
    # group 0: scores [1, 2, 3]: mean 2, centred [-1, 0, 1], unbiased var = (1+0+1)/(3-1) = 1, std 1
    #   -> [-1/(1+eps), 0, 1/(1+eps)]
    # group 1: scores [5, 5]: zero variance -> 0
    scores = t([1.0, 2.0, 3.0, 5.0, 5.0])
    index = torch.tensor([0, 0, 0, 1, 1])
    adv = group_advantages(scores, index)
    close(adv, [-1 / (1 + EPS), 0.0, 1 / (1 + EPS), 0.0, 0.0])


def test_grpo_binary_rewards_uses_unbiased_std():
    # scores [1, 0, 1, 0]: mean 0.5, centred +-0.5, unbiased var = 4*0.25/3 = 1/3
    # (biased would be 0.25 -> std 0.5 -> +-1). Expected +-0.5/(sqrt(1/3)+eps) = +-0.866...
    scores = t([1.0, 0.0, 1.0, 0.0])
    adv = group_advantages(scores, torch.zeros(4, dtype=torch.long))
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)
    close(adv, [a, -a, a, -a])
    assert abs(adv[0].item() - 1.0) > 0.1  # not the biased-std value


def test_grpo_custom_eps():
    scores = t([1.0, 0.0, 1.0, 0.0])
    adv = group_advantages(scores, torch.zeros(4, dtype=torch.long), eps=0.5)
    a = 0.5 / (math.sqrt(1.0 / 3.0) + 0.5)
    close(adv, [a, -a, a, -a])


def test_drgrpo_mean_only():
    # Dr.GRPO: s - mean_g ; group 0 [1,2,3] -> [-1, 0, 1] ; group 1 [5, 5] -> [0, 0]
    scores = t([1.0, 2.0, 3.0, 5.0, 5.0])
    adv = group_advantages(scores, torch.tensor([0, 0, 0, 1, 1]), norm_by_std=False)
    close(adv, [-1.0, 0.0, 1.0, 0.0, 0.0])
    # [4, 0, 2, 2] -> mean 2 -> [2, -2, 0, 0] (no division by std = sqrt(8/3))
    adv = group_advantages(t([4.0, 0.0, 2.0, 2.0]), torch.zeros(4, dtype=torch.long), norm_by_std=False)
    close(adv, [2.0, -2.0, 0.0, 0.0])


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_zero_variance_group_gives_zero(norm_by_std):
    adv = group_advantages(t([0.7, 0.7, 0.7, 0.7]), torch.zeros(4, dtype=torch.long), norm_by_std)
    close(adv, [0.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_singleton_groups_as_verl(norm_by_std):
    # groups 0: [1, 3] ; 1: [10] alone ; 2: [-4] alone
    scores = t([1.0, 10.0, 3.0, -4.0])
    index = torch.tensor([0, 1, 0, 2])
    adv = group_advantages(scores, index, norm_by_std)
    # group 0: mean 2, centred [-1, 1], unbiased var = 2/1 = 2, std sqrt(2)
    g0 = 1 / (math.sqrt(2.0) + EPS) if norm_by_std else 1.0
    # a group of one: verl's mean 0 and std 1, so s / (1 + eps) with the std and s without it
    one = (lambda s: s / (1 + EPS)) if norm_by_std else (lambda s: s)
    close(adv, [-g0, one(10.0), g0, one(-4.0)])
    close(group_advantages(t([1.0, 2.0, 3.0]), torch.tensor([0, 1, 2]), norm_by_std), [one(1.0), one(2.0), one(3.0)])


def test_non_contiguous_unsorted_index():
    # index [7, 3, 7, 3, 7], scores [1, 10, 3, 20, 5]
    # group 7: [1, 3, 5] mean 3, centred [-2, 0, 2], var = 8/2 = 4, std 2 -> [-1, 0, 1] (/(2+eps)*2)
    # group 3: [10, 20] mean 15, centred [-5, 5], var = 50/1, std sqrt(50) -> +-5/sqrt(50)
    scores = t([1.0, 10.0, 3.0, 20.0, 5.0])
    index = torch.tensor([7, 3, 7, 3, 7])
    adv = group_advantages(scores, index)
    a7 = 2 / (2 + EPS)
    a3 = 5 / (math.sqrt(50.0) + EPS)
    close(adv, [-a7, -a3, 0.0, a3, a7])
    close(group_advantages(scores, index, norm_by_std=False), [-2.0, -5.0, 0.0, 5.0, 2.0])


def test_group_advantages_matches_plain_python_reference():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(40, generator=g, dtype=torch.float64)
    index = torch.randint(0, 9, (40,), generator=g) * 11 - 30  # sparse, negative, unsorted ids
    adv = group_advantages(scores, index)
    dr = group_advantages(scores, index, norm_by_std=False)
    s, ids = scores.tolist(), index.tolist()
    for i in range(len(s)):
        members = [s[j] for j in range(len(s)) if ids[j] == ids[i]]
        n = len(members)
        mean = sum(members) / n
        if n == 1:  # verl: mean 0, std 1
            exp, exp_dr = s[i] / (1 + EPS), s[i]
        else:
            std = math.sqrt(sum((x - mean) ** 2 for x in members) / (n - 1))
            exp, exp_dr = (s[i] - mean) / (std + EPS), s[i] - mean
        assert adv[i].item() == pytest.approx(exp, abs=1e-12)
        assert dr[i].item() == pytest.approx(exp_dr, abs=1e-12)


def test_integer_scores_are_promoted_to_float():
    adv = group_advantages(torch.tensor([1, 0, 1, 0]), torch.zeros(4, dtype=torch.long))
    assert adv.is_floating_point()
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)
    close(adv, [a, -a, a, -a], tol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_group_advantages_on_cuda():
    scores = t([1.0, 2.0, 3.0, 5.0, 5.0]).cuda()
    adv = group_advantages(scores, torch.tensor([0, 0, 0, 1, 1]).cuda())
    assert adv.device.type == "cuda"
    close(adv.cpu(), [-1 / (1 + EPS), 0.0, 1 / (1 + EPS), 0.0, 0.0])


# ---------------------------------------------------------------- grpo_advantage / drgrpo_advantage
def _outcome_batch():
    # 4 responses of one prompt (index 0) + 2 of another (index 1), T = 3.
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    rewards = t([
        [0.0, 0.0, 1.0],   # score 1
        [0.0, 0.0, 0.0],   # score 0
        [1.0, 5.0, 5.0],   # score 1 (the 5s are on padding: masked out)
        [0.0, 0.0, 0.0],   # score 0
        [0.0, 3.0, 0.0],   # score 3
        [0.0, 0.0, 1.0],   # score 1
    ])
    index = torch.tensor([0, 0, 0, 0, 1, 1])
    return rewards, mask, index


def test_grpo_advantage_broadcasts_over_tokens_and_zeroes_padding():
    rewards, mask, index = _outcome_batch()
    adv, ret = grpo_advantage(rewards, mask, index)
    # group 0 scores [1,0,1,0]: +-0.5/(sqrt(1/3)+eps) ; group 1 scores [3, 1]: mean 2, centred +-1,
    # unbiased var = 2/1 = 2 -> +-1/(sqrt(2)+eps)
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    c = 1 / (math.sqrt(2.0) + EPS)
    close(adv, [[a, a, a], [-a, -a, 0], [a, 0, 0], [-a, -a, -a], [c, c, 0], [-c, -c, -c]])
    torch.testing.assert_close(ret, adv, rtol=0, atol=0)
    assert torch.all(adv[mask == 0] == 0)


def test_grpo_advantage_reads_eps_from_config():
    rewards, mask, index = _outcome_batch()
    adv, _ = grpo_advantage(rewards, mask, index, SimpleNamespace(eps=1.0))
    a = 0.5 / (math.sqrt(1 / 3) + 1.0)
    assert adv[0, 0].item() == pytest.approx(a, abs=1e-12)


def test_drgrpo_advantage_broadcasts_over_tokens_and_zeroes_padding():
    rewards, mask, index = _outcome_batch()
    adv, ret = drgrpo_advantage(rewards, mask, index)
    # group 0: [1,0,1,0] - 0.5 = +-0.5 ; group 1: [3, 1] - 2 = +-1
    close(adv, [[0.5, 0.5, 0.5], [-0.5, -0.5, 0], [0.5, 0, 0], [-0.5, -0.5, -0.5], [1, 1, 0], [-1, -1, -1]])
    torch.testing.assert_close(ret, adv, rtol=0, atol=0)


def test_bool_response_mask():
    rewards, mask, index = _outcome_batch()
    adv_f, _ = drgrpo_advantage(rewards, mask, index)
    adv_b, _ = drgrpo_advantage(rewards, mask.bool(), index)
    torch.testing.assert_close(adv_b.to(adv_f.dtype), adv_f, rtol=0, atol=0)


# ---------------------------------------------------------------- gae_advantage on padded token rows
def _padded_rows():
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0]])
    rewards = t([[0.0, 0.0, 1.0, 9.0], [0.0, 2.0, 3.0, 3.0]])   # 9, 3, 3 sit on padding
    values = t([[0.1, 0.2, 0.3, 7.0], [0.5, 1.0, -4.0, 8.0]])   # 7, -4, 8 sit on padding
    return rewards, mask, values


def test_gae_advantage_padded_rows_gamma_lam_one():
    # gamma = lam = 1: A_t = G_t - V_t with the episode ending (terminating) at the last real token.
    # row 0: G = [1, 1, 1] -> A = [0.9, 0.8, 0.7] ; row 1: G = [2, 2] -> A = [1.5, 1.0]
    rewards, mask, values = _padded_rows()
    cfg = SimpleNamespace(gamma=1.0, lam=1.0, whiten=False)
    adv, ret = gae_advantage(rewards, mask, None, cfg, values=values)
    close(adv, [[0.9, 0.8, 0.7, 0.0], [1.5, 1.0, 0.0, 0.0]])
    close(ret, [[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]])


def test_gae_advantage_padded_rows_discounted():
    # gamma = lam = 0.5 (gamma*lam = 0.25)
    # row 0: d_2 = 1 - 0.3 = 0.7 (terminal) ; d_1 = 0 + 0.5*0.3 - 0.2 = -0.05 ; d_0 = 0.5*0.2 - 0.1 = 0
    #        A_2 = 0.7, A_1 = -0.05 + 0.25*0.7 = 0.125, A_0 = 0 + 0.25*0.125 = 0.03125
    # row 1: d_1 = 2 - 1 = 1 (terminal) ; d_0 = 0 + 0.5*1 - 0.5 = 0 ; A_1 = 1, A_0 = 0.25
    rewards, mask, values = _padded_rows()
    cfg = SimpleNamespace(gamma=0.5, lam=0.5, whiten=False)
    adv, ret = gae_advantage(rewards, mask, None, cfg, values=values)
    close(adv, [[0.03125, 0.125, 0.7, 0.0], [0.25, 1.0, 0.0, 0.0]])
    close(ret, [[0.13125, 0.325, 1.0, 0.0], [0.75, 2.0, 0.0, 0.0]])


def test_gae_advantage_padding_does_not_influence_real_steps():
    rewards, mask, values = _padded_rows()
    for whiten in (False, True):
        cfg = SimpleNamespace(gamma=0.9, lam=0.8, whiten=whiten)
        adv, ret = gae_advantage(rewards, mask, None, cfg, values=values)
        r2, v2 = rewards.clone(), values.clone()
        r2[mask == 0] = torch.tensor([-100.0, 42.0, 17.0], dtype=r2.dtype)
        v2[mask == 0] = torch.tensor([1e3, -1e3, 5.0], dtype=v2.dtype)
        adv2, ret2 = gae_advantage(r2, mask, None, cfg, values=v2)
        torch.testing.assert_close(adv2, adv, rtol=0, atol=0)
        torch.testing.assert_close(ret2, ret, rtol=0, atol=0)
        assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


def test_gae_advantage_whitens_over_real_tokens_by_default():
    # Default config (None): gamma = lam = 1 and whitening on. Unwhitened real advantages are
    # [0.9, 0.8, 0.7, 1.5, 1.0] (see the gamma = lam = 1 case); whitening uses their masked mean
    # and unbiased std only.
    rewards, mask, values = _padded_rows()
    adv, ret = gae_advantage(rewards, mask, None, None, values=values)
    raw = [0.9, 0.8, 0.7, 1.5, 1.0]
    mean = sum(raw) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 4)
    w = [(x - mean) / std for x in raw]
    close(adv, [[w[0], w[1], w[2], 0.0], [w[3], w[4], 0.0, 0.0]], tol=1e-6)
    close(ret, [[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]])


def test_group_ids_from_numpy_string_uids_as_verl_passes_them():
    import numpy as np

    scores = torch.tensor([1.0, 0.0, 5.0, 5.0])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    adv = group_advantages(scores, index, norm_by_std=False)
    # group a: mean 0.5 -> [0.5, -0.5]; group b: equal scores -> 0
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]))
