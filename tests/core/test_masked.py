"""Masked reductions and loss aggregation modes on a hand-worked 2x3 case."""

from __future__ import annotations

import math

import pytest
import torch

from reflectrl.core import LOSS_AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten

# L = [[1, 2, 3],      mask = [[1, 1, 0],
#      [4, 5, 6]]              [1, 0, 0]]
# real entries: 1, 2 (row 0) and 4 (row 1); 3, 5, 6 are padding.
L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)


def approx(x, v, tol=1e-12):
    assert float(x) == pytest.approx(v, abs=tol)


def test_masked_sum():
    approx(masked_sum(L, M), 1 + 2 + 4)
    assert masked_sum(L, M, dim=-1).tolist() == [3.0, 4.0]
    assert masked_sum(L, M, dim=0).tolist() == [5.0, 2.0, 0.0]


def test_masked_mean():
    approx(masked_mean(L, M), 7 / 3)
    torch.testing.assert_close(masked_mean(L, M, dim=-1), torch.tensor([1.5, 4.0], dtype=torch.float64))
    # column means: (1+4)/2, 2/1, nothing -> 0
    torch.testing.assert_close(masked_mean(L, M, dim=0), torch.tensor([2.5, 2.0, 0.0], dtype=torch.float64))
    approx(masked_mean(L, torch.zeros_like(M)), 0.0)


def test_masked_var():
    # real entries [1, 2, 4], mean 7/3; squared deviations 16/9 + 1/9 + 25/9 = 42/9 = 14/3
    approx(masked_var(L, M), (14 / 3) / 2)          # unbiased: / (n - 1)
    approx(masked_var(L, M, unbiased=False), (14 / 3) / 3)


def test_masked_whiten():
    mean, std = 7 / 3, math.sqrt(7 / 3)
    w = masked_whiten(L, M)
    exp = [[(1 - mean) / std, (2 - mean) / std, 0.0], [(4 - mean) / std, 0.0, 0.0]]
    torch.testing.assert_close(w, torch.tensor(exp, dtype=torch.float64), rtol=0, atol=1e-7)
    # whitened real entries: mean 0, unbiased var 1
    approx(masked_mean(w, M), 0.0, 1e-7)
    approx(masked_var(w, M), 1.0, 1e-6)
    # shift_mean=False keeps the mean: (x - mean)/std + mean on real entries
    w2 = masked_whiten(L, M, shift_mean=False)
    exp2 = [[(1 - mean) / std + mean, (2 - mean) / std + mean, 0.0], [(4 - mean) / std + mean, 0.0, 0.0]]
    torch.testing.assert_close(w2, torch.tensor(exp2, dtype=torch.float64), rtol=0, atol=1e-7)


def test_bool_mask_matches_float_mask():
    Mb = M.bool()
    approx(masked_sum(L, Mb), 7.0)
    approx(masked_mean(L, Mb), 7 / 3)
    approx(masked_var(L, Mb), 7 / 3)
    for mode in LOSS_AGG_MODES:
        approx(agg_loss(L, Mb, mode), float(agg_loss(L, M, mode)))


def test_agg_token_mean():
    # sum of real / count of real = (1 + 2 + 4) / 3
    approx(agg_loss(L, M, "token-mean"), 7 / 3)
    approx(agg_loss(L, M), 7 / 3)  # default mode


def test_agg_seq_mean_token_mean():
    # per-row means [ (1+2)/2, 4/1 ] = [1.5, 4] -> mean 2.75
    approx(agg_loss(L, M, "seq-mean-token-mean"), 2.75)


def test_agg_seq_mean_token_sum():
    # per-row sums [3, 4] -> mean 3.5
    approx(agg_loss(L, M, "seq-mean-token-sum"), 3.5)


def test_agg_seq_mean_token_sum_norm():
    # mean over rows of row_sum / norm_len ; default norm_len = T = 3: (3/3 + 4/3)/2 = 7/6
    approx(agg_loss(L, M, "seq-mean-token-sum-norm"), 7 / 6)
    # norm_len = 2: (3/2 + 4/2)/2 = 1.75 ; norm_len = 10: (0.3 + 0.4)/2 = 0.35
    approx(agg_loss(L, M, "seq-mean-token-sum-norm", norm_len=2), 1.75)
    approx(agg_loss(L, M, "seq-mean-token-sum-norm", norm_len=10), 0.35)


def test_agg_modes_tuple():
    assert set(LOSS_AGG_MODES) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                   "seq-mean-token-sum-norm"}


def test_unknown_mode_raises_value_error():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(L, M, "mean-of-everything")


def test_padding_values_do_not_matter_and_get_no_gradient():
    Lg = L.clone().requires_grad_(True)
    for mode in LOSS_AGG_MODES:
        Lg.grad = None
        agg_loss(Lg, M, mode).backward()
        assert torch.all(Lg.grad[M == 0] == 0)
        L2 = L.clone()
        L2[M == 0] = torch.tensor([1e3, -7.0, 55.0], dtype=L2.dtype)
        approx(agg_loss(L2, M, mode), float(agg_loss(L, M, mode)))


def test_agg_gradients_hand_values():
    # d/dL of each mode on real entries:
    # token-mean: 1/3 each ; seq-mean-token-mean: row 0 entries 1/(2*2), row 1 entry 1/(1*2)
    # seq-mean-token-sum: 1/2 each ; seq-mean-token-sum-norm: 1/(2*3) each
    exp = {
        "token-mean": [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0]],
        "seq-mean-token-mean": [[0.25, 0.25, 0], [0.5, 0, 0]],
        "seq-mean-token-sum": [[0.5, 0.5, 0], [0.5, 0, 0]],
        "seq-mean-token-sum-norm": [[1 / 6, 1 / 6, 0], [1 / 6, 0, 0]],
    }
    for mode, g in exp.items():
        Lg = L.clone().requires_grad_(True)
        agg_loss(Lg, M, mode).backward()
        torch.testing.assert_close(Lg.grad, torch.tensor(g, dtype=torch.float64), rtol=0, atol=1e-12)


def test_fully_masked_row_is_ignored_by_sequence_modes():
    # Current convention: a row with no real steps does not count as a sequence (no NaN either).
    L3 = torch.cat([L, torch.tensor([[9.0, 9.0, 9.0]], dtype=torch.float64)])
    M3 = torch.cat([M, torch.zeros(1, 3, dtype=torch.float64)])
    approx(agg_loss(L3, M3, "token-mean"), 7 / 3)
    approx(agg_loss(L3, M3, "seq-mean-token-mean"), 2.75)
    approx(agg_loss(L3, M3, "seq-mean-token-sum"), 3.5)
    approx(agg_loss(L3, M3, "seq-mean-token-sum-norm"), 7 / 6)
    for mode in LOSS_AGG_MODES:
        approx(agg_loss(L, torch.zeros_like(M), mode), 0.0)
