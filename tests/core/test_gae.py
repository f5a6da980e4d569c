"""GAE, next_values_from and discounted_returns against hand-worked cases and a plain-Python reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from reflectrl.core import discounted_returns, gae, next_values_from


def t(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


def b(rows):
    return torch.tensor(rows, dtype=torch.bool)


def close(actual, expected, tol=1e-12):
    torch.testing.assert_close(actual, t(expected), rtol=0, atol=tol)


# ---------------------------------------------------------------- (a) a single terminating episode
def test_single_terminating_episode_rewards_one_values_zero():
    # rewards 1, values 0, terminated at the last step, gamma = lam = 0.5 -> gamma*lam = 0.25.
    # Every delta = 1 + 0 - 0 = 1 (the terminal one has no bootstrap), so A_t = sum_k 0.25^k:
    #   A_2 = 1, A_1 = 1 + 0.25 = 1.25, A_0 = 1 + 0.25 + 0.0625 = 1.3125
    rewards = t([[1.0, 1.0, 1.0]])
    values = t([[0.0, 0.0, 0.0]])
    next_values = t([[0.0, 0.0, 123.0]])  # garbage after termination: must be ignored
    end = b([[False, False, True]])
    adv, ret = gae(rewards, values, next_values, end, end, gamma=0.5, lam=0.5)
    close(adv, [[1.3125, 1.25, 1.0]])
    close(ret, [[1.3125, 1.25, 1.0]])


def test_single_terminating_episode_nonzero_values():
    # r = [1, 0, 2], V = [0.5, 1, 2], terminated at t=2, gamma = 0.9, lam = 0.8 (gamma*lam = 0.72)
    # delta_2 = 2 - 2 = 0 (no bootstrap)
    # delta_1 = 0 + 0.9*2 - 1 = 0.8
    # delta_0 = 1 + 0.9*1 - 0.5 = 1.4
    # A_2 = 0, A_1 = 0.8 + 0.72*0 = 0.8, A_0 = 1.4 + 0.72*0.8 = 1.976
    # returns = A + V = [2.476, 1.8, 2.0]
    rewards = t([[1.0, 0.0, 2.0]])
    values = t([[0.5, 1.0, 2.0]])
    next_values = t([[1.0, 2.0, -50.0]])
    end = b([[False, False, True]])
    adv, ret = gae(rewards, values, next_values, end, end, gamma=0.9, lam=0.8)
    close(adv, [[1.976, 0.8, 0.0]])
    close(ret, [[2.476, 1.8, 2.0]])


# ---------------------------------------------------------------- (b) lam = 1 and lam = 0
def test_lambda_one_is_mc_return_minus_value():
    # r = [1, 0, 2], V = [0.5, 1, 2], gamma = 0.9, terminated at the end.
    # G_2 = 2, G_1 = 0 + 0.9*2 = 1.8, G_0 = 1 + 0.9*1.8 = 2.62
    # A = G - V = [2.12, 0.8, 0.0]; returns = G
    rewards = t([[1.0, 0.0, 2.0]])
    values = t([[0.5, 1.0, 2.0]])
    next_values = t([[1.0, 2.0, 0.0]])
    end = b([[False, False, True]])
    adv, ret = gae(rewards, values, next_values, end, end, gamma=0.9, lam=1.0)
    close(adv, [[2.12, 0.8, 0.0]])
    close(ret, [[2.62, 1.8, 2.0]])


def test_lambda_one_truncated_is_bootstrapped_mc_return_minus_value():
    # Same rewards, but the episode is truncated at t=2 with V(final obs) = 10:
    # G_2 = 2 + 0.9*10 = 11, G_1 = 0 + 0.9*11 = 9.9, G_0 = 1 + 0.9*9.9 = 9.91
    # A = G - V = [9.41, 8.9, 9.0]
    rewards = t([[1.0, 0.0, 2.0]])
    values = t([[0.5, 1.0, 2.0]])
    next_values = t([[1.0, 2.0, 10.0]])
    adv, ret = gae(rewards, values, next_values, b([[False] * 3]), b([[False, False, True]]), 0.9, 1.0)
    close(adv, [[9.41, 8.9, 9.0]])
    close(ret, [[9.91, 9.9, 11.0]])


def test_lambda_zero_is_one_step_td_error():
    # lam = 0: A_t = delta_t = r_t + gamma * V(s_{t+1}) * (1 - term_t) - V(s_t)
    # r = [1, -1, 0.5, 2], V = [0.2, 0.4, 0.6, 0.8], next = [0.4, 0.6, 0.8, 3.0], gamma = 0.5, no ends:
    # d_0 = 1 + 0.2 - 0.2 = 1.0
    # d_1 = -1 + 0.3 - 0.4 = -1.1
    # d_2 = 0.5 + 0.4 - 0.6 = 0.3
    # d_3 = 2 + 1.5 - 0.8 = 2.7
    rewards = t([[1.0, -1.0, 0.5, 2.0]])
    values = t([[0.2, 0.4, 0.6, 0.8]])
    next_values = t([[0.4, 0.6, 0.8, 3.0]])
    no = b([[False] * 4])
    adv, _ = gae(rewards, values, next_values, no, no, gamma=0.5, lam=0.0)
    close(adv, [[1.0, -1.1, 0.3, 2.7]], tol=1e-12)


# ---------------------------------------------------------------- (c) an episode end inside the rollout
def test_episode_end_inside_rollout_hand_values():
    # 5 steps, terminated at t=1, then a new episode that runs to the rollout end (bootstrap 4.0).
    # gamma = 0.5, lam = 1 (gamma*lam = 0.5); all V = 1, next = V(s_{t+1}) = 1 except the bootstrap.
    # Episode 1: d_1 = 3 - 1 = 2 (terminal), d_0 = 1 + 0.5*1 - 1 = 0.5
    #   A_1 = 2, A_0 = 0.5 + 0.5*2 = 1.5
    # Episode 2: d_4 = 1 + 0.5*4 - 1 = 2, d_3 = 0 + 0.5 - 1 = -0.5, d_2 = 2 + 0.5 - 1 = 1.5
    #   A_4 = 2, A_3 = -0.5 + 0.5*2 = 0.5, A_2 = 1.5 + 0.5*0.5 = 1.75
    rewards = t([[1.0, 3.0, 2.0, 0.0, 1.0]])
    values = t([[1.0, 1.0, 1.0, 1.0, 1.0]])
    next_values = t([[1.0, 1.0, 1.0, 1.0, 4.0]])
    end = b([[False, True, False, False, False]])
    adv, _ = gae(rewards, values, next_values, end, end, gamma=0.5, lam=1.0)
    close(adv, [[1.5, 2.0, 1.75, 0.5, 2.0]])


def test_no_leakage_across_episode_boundary():
    torch.manual_seed(0)
    T, k = 7, 3  # terminated at t = k
    rewards = torch.randn(1, T, dtype=torch.float64)
    values = torch.randn(1, T, dtype=torch.float64)
    next_values = torch.cat([values[:, 1:], torch.randn(1, 1, dtype=torch.float64)], 1)
    end = torch.zeros(1, T, dtype=torch.bool)
    end[0, k] = True
    adv, _ = gae(rewards, values, next_values, end, end, 0.99, 0.95)

    # Change everything after the boundary (rewards, values, next values, and the ignored terminal
    # next value): advantages up to and including the terminal step must not move.
    r2, v2, n2 = rewards.clone(), values.clone(), next_values.clone()
    r2[0, k + 1:] += 100.0
    v2[0, k + 1:] -= 7.0
    n2[0, k:] += 55.0  # n2[0, k] is the post-termination value: multiplied by 0
    adv2, _ = gae(r2, v2, n2, end, end, 0.99, 0.95)
    torch.testing.assert_close(adv2[:, : k + 1], adv[:, : k + 1], rtol=0, atol=0)
    assert not torch.allclose(adv2[:, k + 1:], adv[:, k + 1:])


def test_no_leakage_across_truncation_boundary():
    # Truncation stops the lambda-recursion too: later rewards must not leak back.
    T, k = 6, 2
    rewards = t([[0.3, -0.2, 1.0, 0.7, 0.1, 0.4]])
    values = t([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    next_values = t([[0.2, 0.3, 9.0, 0.5, 0.6, 0.0]])
    term = b([[False] * T])
    end = b([[False, False, True, False, False, False]])
    adv, _ = gae(rewards, values, next_values, term, end, 0.9, 0.9)
    r2 = rewards.clone()
    r2[0, k + 1:] = 50.0
    adv2, _ = gae(r2, values, next_values, term, end, 0.9, 0.9)
    torch.testing.assert_close(adv2[:, : k + 1], adv[:, : k + 1], rtol=0, atol=0)


# ---------------------------------------------------------------- (d) truncation vs termination
def test_truncation_bootstraps_from_final_observation_value():
    # 3 steps; the episode is truncated at t=1; V(final obs of that episode) = 5.0, which differs
    # from values[0, 2] = V(first obs of the next episode) = -3.0.
    # gamma = 0.9, lam = 0.5 -> gamma*lam = 0.45
    # t=1: delta_1 = r + gamma*V_final - V = 2 + 0.9*5 - 1 = 5.5 ; A_1 = 5.5 (recursion cut)
    # t=0: delta_0 = 1 + 0.9*1 - 0.5 = 1.4 ; A_0 = 1.4 + 0.45*5.5 = 3.875
    # t=2: last step, bootstrap 2.0: delta_2 = 0 + 0.9*2 - (-3) = 4.8 ; A_2 = 4.8
    rewards = t([[1.0, 2.0, 0.0]])
    values = t([[0.5, 1.0, -3.0]])
    next_values = t([[1.0, 5.0, 2.0]])
    terminated = b([[False, False, False]])
    episode_end = b([[False, True, False]])
    adv, ret = gae(rewards, values, next_values, terminated, episode_end, 0.9, 0.5)
    close(adv, [[3.875, 5.5, 4.8]])
    # The truncated step's return is exactly the one-step bootstrap target r + gamma * V_final.
    assert ret[0, 1].item() == pytest.approx(2.0 + 0.9 * 5.0, abs=1e-12)


def test_termination_does_not_bootstrap():
    # Same data but terminated at t=1: delta_1 = r - V = 2 - 1 = 1 ; A_1 = 1
    # A_0 = 1.4 + 0.45*1 = 1.85 ; t=2 unchanged = 4.8
    rewards = t([[1.0, 2.0, 0.0]])
    values = t([[0.5, 1.0, -3.0]])
    next_values = t([[1.0, 5.0, 2.0]])
    end = b([[False, True, False]])
    adv, ret = gae(rewards, values, next_values, end, end, 0.9, 0.5)
    close(adv, [[1.85, 1.0, 4.8]])
    assert ret[0, 1].item() == pytest.approx(2.0, abs=1e-12)
    # and the terminal next value is ignored completely
    nv2 = next_values.clone()
    nv2[0, 1] = 1e6
    adv2, _ = gae(rewards, values, nv2, end, end, 0.9, 0.5)
    torch.testing.assert_close(adv2, adv, rtol=0, atol=0)


def test_truncation_minus_termination_is_discounted_final_value():
    # At the ending step, the only difference between truncation and termination is gamma*V_final.
    rewards = t([[0.0, 0.0]])
    values = t([[0.0, 0.0]])
    next_values = t([[0.0, 7.0]])
    end = b([[False, True]])
    adv_trunc, _ = gae(rewards, values, next_values, b([[False, False]]), end, 0.8, 1.0)
    adv_term, _ = gae(rewards, values, next_values, end, end, 0.8, 1.0)
    # truncated: A_1 = 0.8*7 = 5.6, A_0 = 0 + 0.8*0 - 0 + 0.8*1*5.6 = 4.48 ; terminated: all 0
    close(adv_trunc, [[4.48, 5.6]])
    close(adv_term, [[0.0, 0.0]])


# ---------------------------------------------------------------- (e) last rollout step bootstraps
def test_last_step_bootstraps_from_next_values():
    # 2 steps, no ends, bootstrap V(s_2) = 3; gamma = 0.5, lam = 0.5 (gamma*lam = 0.25)
    # d_1 = 1 + 0.5*3 - 2 = 0.5 ; d_0 = 0 + 0.5*2 - 1 = 0 ; A_1 = 0.5, A_0 = 0 + 0.25*0.5 = 0.125
    rewards = t([[0.0, 1.0]])
    values = t([[1.0, 2.0]])
    next_values = t([[2.0, 3.0]])
    no = b([[False, False]])
    adv, _ = gae(rewards, values, next_values, no, no, 0.5, 0.5)
    close(adv, [[0.125, 0.5]])
    # bumping only the bootstrap by 4 moves A_1 by gamma*4 = 2 and A_0 by gamma*lam*2 = 0.5
    nv = next_values.clone()
    nv[0, 1] += 4.0
    adv2, _ = gae(rewards, values, nv, no, no, 0.5, 0.5)
    close(adv2, [[0.625, 2.5]])


# ---------------------------------------------------------------- (f) rows are independent
def test_multiple_rows_independent():
    g = torch.Generator().manual_seed(1)
    B, T = 4, 6
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    next_values = torch.randn(B, T, generator=g, dtype=torch.float64)
    end = torch.rand(B, T, generator=g) < 0.3
    term = end & (torch.rand(B, T, generator=g) < 0.5)
    adv, ret = gae(rewards, values, next_values, term, end, 0.97, 0.9)
    for r in range(B):
        a_r, ret_r = gae(rewards[r:r + 1], values[r:r + 1], next_values[r:r + 1], term[r:r + 1],
                         end[r:r + 1], 0.97, 0.9)
        torch.testing.assert_close(adv[r:r + 1], a_r, rtol=0, atol=1e-14)
        torch.testing.assert_close(ret[r:r + 1], ret_r, rtol=0, atol=1e-14)
    # permuting rows permutes the output
    perm = torch.tensor([2, 0, 3, 1])
    adv_p, _ = gae(rewards[perm], values[perm], next_values[perm], term[perm], end[perm], 0.97, 0.9)
    torch.testing.assert_close(adv_p, adv[perm], rtol=0, atol=1e-14)


def test_two_rows_hand_values():
    # row 0: the (a) case, row 1: a single step that terminates, r=2, V=0.5 -> A = 1.5 (padded
    # with two more steps of a fresh episode with zero reward/value that bootstrap to 0 -> A = 0).
    rewards = t([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])
    values = t([[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    next_values = t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    end = b([[False, False, True], [True, False, False]])
    adv, _ = gae(rewards, values, next_values, end, end, 0.5, 0.5)
    close(adv, [[1.3125, 1.25, 1.0], [1.5, 0.0, 0.0]])


# ---------------------------------------------------------------- (g) returns = advantages + values
def test_returns_equal_advantages_plus_values():
    g = torch.Generator().manual_seed(2)
    rewards = torch.randn(3, 8, generator=g, dtype=torch.float64)
    values = torch.randn(3, 8, generator=g, dtype=torch.float64)
    next_values = torch.randn(3, 8, generator=g, dtype=torch.float64)
    end = torch.rand(3, 8, generator=g) < 0.25
    adv, ret = gae(rewards, values, next_values, end, end, 0.9, 0.7)
    torch.testing.assert_close(ret, adv + values, rtol=0, atol=1e-14)


def test_accepts_float_flags_and_keeps_input_tensors():
    rewards = t([[1.0, 1.0, 1.0]])
    values = t([[0.0, 0.0, 0.0]])
    next_values = t([[0.0, 0.0, 0.0]])
    end_f = t([[0.0, 0.0, 1.0]])
    before = [x.clone() for x in (rewards, values, next_values, end_f)]
    adv, _ = gae(rewards, values, next_values, end_f, end_f, 0.5, 0.5)
    close(adv, [[1.3125, 1.25, 1.0]])
    for x, y in zip((rewards, values, next_values, end_f), before):
        assert torch.equal(x, y)
    assert adv.dtype == torch.float64 and adv.shape == (1, 3)


# ---------------------------------------------------------------- (h) next_values_from
def test_next_values_from_shifts_and_appends_bootstrap():
    values = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    bootstrap = t([10.0, 20.0])
    nxt = next_values_from(values, bootstrap)
    close(nxt, [[2.0, 3.0, 10.0], [5.0, 6.0, 20.0]])
    # a [B, 1] bootstrap works too
    close(next_values_from(values, bootstrap[:, None]), [[2.0, 3.0, 10.0], [5.0, 6.0, 20.0]])


def test_next_values_from_replaces_truncated_steps_with_final_values():
    values = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    bootstrap = t([10.0, 20.0])
    final_values = t([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    truncated = b([[True, False, False], [False, False, True]])
    nxt = next_values_from(values, bootstrap, final_values, truncated)
    # truncated at (0,0): V_final = -1 replaces values[0,1] = 2 ; at (1,2): -6 replaces bootstrap 20
    close(nxt, [[-1.0, 3.0, 10.0], [5.0, 6.0, -6.0]])
    # only one of final_values / truncated given: no replacement
    close(next_values_from(values, bootstrap, final_values, None), [[2.0, 3.0, 10.0], [5.0, 6.0, 20.0]])


def test_next_values_from_feeds_gae_truncation():
    # End-to-end: the (d) hand case built through next_values_from.
    values = t([[0.5, 1.0, -3.0]])
    truncated = b([[False, True, False]])
    nxt = next_values_from(values, t([2.0]), t([[0.0, 5.0, 0.0]]), truncated)
    close(nxt, [[1.0, 5.0, 2.0]])
    adv, _ = gae(t([[1.0, 2.0, 0.0]]), values, nxt, b([[False] * 3]), truncated, 0.9, 0.5)
    close(adv, [[3.875, 5.5, 4.8]])


# ---------------------------------------------------------------- (i) plain-Python reference
def reference_gae(rewards, values, next_values, terminated, episode_end, gamma, lam):
    """A_t = sum_{k=0}^{K} (gamma*lam)^k delta_{t+k}, K = steps until the episode end or rollout end.

    Written as a forward sum over lists (no recursion, no tensors) to be independent of the
    implementation's backward recursion."""
    out_a, out_r = [], []
    for r, v, nv, te, en in zip(rewards, values, next_values, terminated, episode_end):
        T = len(r)
        delta = [r[i] + gamma * (0.0 if te[i] else nv[i]) - v[i] for i in range(T)]
        row = []
        for s in range(T):
            acc, w = 0.0, 1.0
            for i in range(s, T):
                acc += w * delta[i]
                if en[i]:
                    break
                w *= gamma * lam
            row.append(acc)
        out_a.append(row)
        out_r.append([a + x for a, x in zip(row, v)])
    return out_a, out_r


@pytest.mark.parametrize("seed", range(6))
def test_gae_matches_plain_python_reference(seed):
    rng = random.Random(seed)
    B, T = rng.randint(1, 5), rng.randint(1, 12)
    gamma, lam = rng.choice([0.0, 0.5, 0.9, 0.99, 1.0]), rng.choice([0.0, 0.3, 0.95, 1.0])
    rewards = [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
    values = [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
    next_values = [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
    episode_end = [[rng.random() < 0.3 for _ in range(T)] for _ in range(B)]
    terminated = [[e and rng.random() < 0.5 for e in row] for row in episode_end]
    exp_a, exp_r = reference_gae(rewards, values, next_values, terminated, episode_end, gamma, lam)
    adv, ret = gae(t(rewards), t(values), t(next_values), b(terminated), b(episode_end), gamma, lam)
    torch.testing.assert_close(adv, t(exp_a), rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, t(exp_r), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- discounted_returns
def test_discounted_returns_hand_case_with_episode_end():
    # rewards [1, 2, 3, 4], episode ends at t=1, gamma = 0.5:
    # G_1 = 2, G_0 = 1 + 0.5*2 = 2 ; G_3 = 4, G_2 = 3 + 0.5*4 = 5 (no bootstrap at the rollout end)
    rewards = t([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    end = b([[False, True, False, False], [False, False, False, True]])
    # row 1: G = [1 + .5 + .25 + .125, 1 + .5 + .25, 1 + .5, 1] = [1.875, 1.75, 1.5, 1]
    close(discounted_returns(rewards, end, 0.5), [[2.0, 2.0, 5.0, 4.0], [1.875, 1.75, 1.5, 1.0]])


def test_discounted_returns_equal_gae_lambda_one_with_zero_values():
    # With V = 0, termination at every episode end and no bootstrap, GAE(lam=1) returns are MC returns.
    rewards = t([[0.5, -1.0, 2.0, 0.25, 3.0]])
    end = b([[False, True, False, False, True]])
    zeros = torch.zeros_like(rewards)
    _, ret = gae(rewards, zeros, zeros, end, end, 0.9, 1.0)
    # hand: G_1 = -1, G_0 = 0.5 - 0.9 = -0.4 ; G_4 = 3, G_3 = 0.25 + 2.7 = 2.95, G_2 = 2 + 2.655 = 4.655
    close(discounted_returns(rewards, end, 0.9), [[-0.4, -1.0, 4.655, 2.95, 3.0]])
    torch.testing.assert_close(ret, discounted_returns(rewards, end, 0.9), rtol=0, atol=1e-12)


def test_masked_gae_skips_holes_in_the_mask():
    from reflectrl.core import masked_gae

    # mask [1,0,1,1,0]: token 1 is environment feedback, token 4 padding. gamma = lam = 1.
    # values at real tokens 0, 2, 3: [0.2, 0.5, 0.0]; reward 1 at token 3 (the last real one).
    # A_3 = 1 - 0 = 1; A_2 = 0 + V_3 - V_2 + A_3 = 0 - 0.5 + 1 = 0.5; A_0 = 0 + V_2 - V_0 + A_2 = 0.5 - 0.2 + 0.5 = 0.8
    mask = torch.tensor([[1.0, 0, 1, 1, 0]])
    rewards = torch.tensor([[0.0, 0, 0, 1, 0]])
    values = torch.tensor([[0.2, 9.0, 0.5, 0.0, 7.0]]) * mask
    adv, ret = masked_gae(rewards, values, mask, 1.0, 1.0)
    assert torch.allclose(adv, torch.tensor([[0.8, 0.0, 0.5, 1.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]]))


def test_entropy_of_masked_vocabulary_is_finite():
    from reflectrl.core import entropy_from_logits

    h = entropy_from_logits(torch.tensor([[0.0, float("-inf")], [0.0, 0.0]]))
    assert torch.allclose(h, torch.tensor([0.0, math.log(2)]))
