"""PPO policy/value losses, entropy, KL estimators and explained variance on hand-worked values."""

from __future__ import annotations

import math

import pytest
import torch

from reflectrl.core import approx_kl, entropy_from_logits, explained_variance, ppo_policy_loss, value_loss

F64 = torch.float64


def row(*xs):
    return torch.tensor([list(xs)], dtype=F64)


def ratios_to_logp(ratios):
    """(logp, old_logp) with exp(logp - old_logp) = ratio; old_logp is an arbitrary offset."""
    old = torch.full_like(ratios, -1.7)
    return old + ratios.log(), old


def approx(x, v, tol=1e-12):
    assert float(x) == pytest.approx(v, abs=tol)


# ---------------------------------------------------------------- ppo_policy_loss
@pytest.mark.parametrize(
    "ratio, adv, expected",
    [
        # inside [0.8, 1.2]: -ratio * A
        (1.1, 2.0, -2.2),
        (0.9, -1.0, 0.9),
        # above 1 + eps with A > 0: clipped to -(1.2)*A ; max(-1.5, -1.2) = -1.2
        (1.5, 1.0, -1.2),
        # below 1 - eps with A < 0: clipped: max(0.5, 0.8) = 0.8
        (0.5, -1.0, 0.8),
        # above range with A < 0: max(1.5, 1.2) picks the unclipped 1.5
        (1.5, -1.0, 1.5),
        # below range with A > 0: max(-0.5, -0.8) picks the unclipped -0.5
        (0.5, 1.0, -0.5),
    ],
)
def test_ppo_single_entry_hand_values(ratio, adv, expected):
    logp, old = ratios_to_logp(row(ratio))
    loss, _ = ppo_policy_loss(logp, old, row(adv), torch.ones(1, 1), clip_low=0.2)
    approx(loss, expected)


def _five():
    ratios = row(1.1, 1.5, 0.5, 1.5, 0.5)
    adv = row(2.0, 1.0, -1.0, -1.0, 1.0)
    logp, old = ratios_to_logp(ratios)
    return ratios, adv, logp, old


def test_ppo_batch_loss_and_stats():
    ratios, adv, logp, old = _five()
    loss, stats = ppo_policy_loss(logp, old, adv, torch.ones(1, 5), clip_low=0.2)
    # entries: -2.2, -1.2 (clipped), 0.8 (clipped), 1.5, -0.5 -> sum -1.6 -> mean -0.32
    approx(loss, -0.32)
    # CleanRL's clipfrac: ratios outside [0.8, 1.2] whatever the sign of A: 1.5, 0.5, 1.5, 0.5
    approx(stats["clipfrac"], 4 / 5)
    # the clip binds (changes the loss) for 1.5 with A > 0 and 0.5 with A < 0 only
    approx(stats["clip_binding_frac"], 2 / 5)
    rs = [1.1, 1.5, 0.5, 1.5, 0.5]
    approx(stats["approx_kl"], sum((r - 1) - math.log(r) for r in rs) / 5)
    approx(stats["old_approx_kl"], sum(-math.log(r) for r in rs) / 5)
    assert all(not v.requires_grad for v in stats.values())


def test_ppo_gradient_zero_for_clipped_entries():
    _, adv, logp, old = _five()
    logp = logp.clone().requires_grad_(True)
    loss, _ = ppo_policy_loss(logp, old, adv, torch.ones(1, 5), clip_low=0.2)
    loss.backward()
    # unclipped: d(-A * exp(logp - old))/dlogp = -A * ratio, / 5 for the token mean
    # [ -2*1.1/5, 0 (clipped), 0 (clipped), 1*1.5/5, -1*0.5/5 ]
    torch.testing.assert_close(logp.grad, row(-0.44, 0.0, 0.0, 0.3, -0.1), rtol=0, atol=1e-12)
    assert logp.grad[0, 1] == 0 and logp.grad[0, 2] == 0


def test_ppo_clip_higher_asymmetric():
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]
    ratios = row(1.25, 1.3, 0.75)
    adv = row(1.0, 1.0, -1.0)
    logp, old = ratios_to_logp(ratios)
    m = torch.ones(1, 3)
    for r, a, exp in [(1.25, 1.0, -1.25), (1.3, 1.0, -1.28), (0.75, -1.0, 0.8)]:
        lp, o = ratios_to_logp(row(r))
        loss, st = ppo_policy_loss(lp, o, row(a), torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
        approx(loss, exp)
    # 1.25 with A > 0 is NOT clipped under clip-higher, but is under the symmetric 0.2 range
    lp, o = ratios_to_logp(row(1.25))
    approx(ppo_policy_loss(lp, o, row(1.0), torch.ones(1, 1), clip_low=0.2)[0], -1.2)
    loss, st = ppo_policy_loss(logp, old, adv, m, clip_low=0.2, clip_high=0.28)
    approx(loss, (-1.25 - 1.28 + 0.8) / 3)
    approx(st["clipfrac"], 2 / 3)  # 1.3 and 0.75 lie outside [0.8, 1.28]
    approx(st["clip_binding_frac"], 2 / 3)  # and both bind: 1.3 with A > 0, 0.75 with A < 0
    # gradient flows only through the unclipped 1.25 entry: -A * ratio / 3
    lpg = logp.clone().requires_grad_(True)
    ppo_policy_loss(lpg, old, adv, m, clip_low=0.2, clip_high=0.28)[0].backward()
    torch.testing.assert_close(lpg.grad, row(-1.25 / 3, 0.0, 0.0), rtol=0, atol=1e-12)


def test_ppo_ratio_one_equals_minus_advantage_mean():
    adv = row(0.3, -1.2, 2.0, 0.1)
    logp = row(-0.5, -2.0, -0.1, -3.0)
    loss, st = ppo_policy_loss(logp, logp.clone(), adv, torch.ones(1, 4))
    approx(loss, -(0.3 - 1.2 + 2.0 + 0.1) / 4)
    approx(st["clipfrac"], 0.0)
    approx(st["approx_kl"], 0.0)
    approx(st["old_approx_kl"], 0.0)


def test_ppo_mask_excludes_entries_from_loss_and_stats():
    # The same five entries plus a padded sixth with a wild ratio: nothing changes.
    ratios = row(1.1, 1.5, 0.5, 1.5, 0.5, 20.0)
    adv = row(2.0, 1.0, -1.0, -1.0, 1.0, 100.0)
    logp, old = ratios_to_logp(ratios)
    mask = row(1, 1, 1, 1, 1, 0)
    loss, st = ppo_policy_loss(logp, old, adv, mask)
    approx(loss, -0.32)
    approx(st["clipfrac"], 0.8)
    approx(st["clip_binding_frac"], 0.4)
    rs = [1.1, 1.5, 0.5, 1.5, 0.5]
    approx(st["approx_kl"], sum((r - 1) - math.log(r) for r in rs) / 5)
    loss_b, _ = ppo_policy_loss(logp, old, adv, mask.bool())
    approx(loss_b, -0.32)


def test_ppo_agg_mode_passthrough():
    # two rows: row 0 entries [-2.2, -1.2] (real), row 1 entry [0.8] real + one padded
    ratios = torch.tensor([[1.1, 1.5], [0.5, 1.0]], dtype=F64)
    adv = torch.tensor([[2.0, 1.0], [-1.0, 5.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=F64)
    logp, old = ratios_to_logp(ratios)
    approx(ppo_policy_loss(logp, old, adv, mask, agg_mode="token-mean")[0], (-2.2 - 1.2 + 0.8) / 3)
    approx(ppo_policy_loss(logp, old, adv, mask, agg_mode="seq-mean-token-mean")[0], (-1.7 + 0.8) / 2)
    approx(ppo_policy_loss(logp, old, adv, mask, agg_mode="seq-mean-token-sum")[0], (-3.4 + 0.8) / 2)
    # sum-norm with norm_len 4: (-3.4/4 + 0.8/4) / 2
    approx(ppo_policy_loss(logp, old, adv, mask, agg_mode="seq-mean-token-sum-norm", norm_len=4)[0],
           (-3.4 / 4 + 0.8 / 4) / 2)


# ---------------------------------------------------------------- value_loss
def test_value_loss_unclipped():
    # V = [1, 2, 3], R = [0, 2, 5]: (V-R)^2 = [1, 0, 4] -> 0.5 * 5/3
    V, R = row(1.0, 2.0, 3.0), row(0.0, 2.0, 5.0)
    approx(value_loss(V, V.clone(), R, torch.ones(1, 3)), 0.5 * 5 / 3)
    # old_values are ignored without clip_coef
    approx(value_loss(V, row(100.0, -100.0, 0.0), R, torch.ones(1, 3)), 0.5 * 5 / 3)


def test_value_loss_clipped_binds():
    # V = [1, 2, 3], V_old = [0.5, 2.5, 2.0], R = [0, 2, 5], clip 0.2
    # V - V_old = [0.5, -0.5, 1.0] -> clip -> [0.2, -0.2, 0.2] -> V_clip = [0.7, 2.3, 2.2]
    # (V_clip - R)^2 = [0.49, 0.09, 7.84] ; (V - R)^2 = [1, 0, 4]
    # max = [1, 0.09, 7.84] -> 0.5 * 8.93 / 3
    V, Vold, R = row(1.0, 2.0, 3.0), row(0.5, 2.5, 2.0), row(0.0, 2.0, 5.0)
    m = torch.ones(1, 3)
    approx(value_loss(V, Vold, R, m, clip_coef=0.2), 0.5 * 8.93 / 3)
    # gradient: entry 0 takes the unclipped branch: 0.5 * 2 (V - R) / 3 = 1/3 ; entries 1 and 2 take
    # the clipped branch whose V_clip is constant in V -> 0
    Vg = V.clone().requires_grad_(True)
    value_loss(Vg, Vold, R, m, clip_coef=0.2).backward()
    torch.testing.assert_close(Vg.grad, row(1 / 3, 0.0, 0.0), rtol=0, atol=1e-12)


def test_value_loss_clipped_does_not_bind():
    # |V - V_old| <= clip everywhere -> V_clip = V -> identical to the unclipped loss
    # V = [1, 2], V_old = [0.9, 2.1], R = [0, 4]: (V-R)^2 = [1, 4] -> 0.5 * 2.5 = 1.25
    V, Vold, R = row(1.0, 2.0), row(0.9, 2.1), row(0.0, 4.0)
    approx(value_loss(V, Vold, R, torch.ones(1, 2), clip_coef=0.2), 1.25)
    approx(value_loss(V, Vold, R, torch.ones(1, 2)), 1.25)


def test_value_loss_clipped_moving_away_is_penalised_more():
    # V moved away from R past the clip: V_old = 1, V = 0.5, R = 1.2, clip 0.2 -> V_clip = 0.8
    # (V-R)^2 = 0.49, (V_clip-R)^2 = 0.16 -> max = 0.49 (the unclipped, larger error) -> 0.245
    approx(value_loss(row(0.5), row(1.0), row(1.2), torch.ones(1, 1), clip_coef=0.2), 0.245)


def test_value_loss_mask_and_agg_mode():
    V = torch.tensor([[1.0, 2.0], [3.0, 0.0]], dtype=F64)
    R = torch.tensor([[0.0, 0.0], [0.0, 50.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=F64)
    # real errors [1, 4 | 9]: token-mean 0.5*14/3 ; seq-mean-token-mean 0.5*(2.5 + 9)/2
    approx(value_loss(V, V, R, mask), 0.5 * 14 / 3)
    approx(value_loss(V, V, R, mask, agg_mode="seq-mean-token-mean"), 0.5 * 11.5 / 2)


# ---------------------------------------------------------------- entropy
@pytest.mark.parametrize("n", [2, 5, 32])
def test_entropy_uniform_is_log_n(n):
    approx(entropy_from_logits(torch.zeros(n, dtype=F64)), math.log(n))
    approx(entropy_from_logits(torch.full((n,), 3.7, dtype=F64)), math.log(n))


def test_entropy_nearly_one_hot_is_zero():
    h = entropy_from_logits(torch.tensor([60.0, 0.0, 0.0, 0.0], dtype=F64))
    assert 0.0 <= float(h) < 1e-20


def test_entropy_two_point_and_batched():
    # logits [log 3, 0] -> p = [0.75, 0.25] ; H = -(0.75 ln 0.75 + 0.25 ln 0.25)
    h2 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    logits = torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0]], [[0.0, math.log(3.0)], [50.0, 0.0]]], dtype=F64)
    h = entropy_from_logits(logits)
    assert h.shape == (2, 2)
    exp = torch.tensor([[h2, math.log(2)], [h2, 0.0]], dtype=F64)
    torch.testing.assert_close(h, exp, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- approx_kl
def test_approx_kl_k1_k3_hand_values():
    # p(a) = 0.5, ref(a) = 0.25: k1 = log 0.5 - log 0.25 = log 2
    # k3 = r - log r - 1 with r = ref/p = 0.5: 0.5 + log 2 - 1 = log 2 - 0.5
    logp, ref = torch.tensor([math.log(0.5)], dtype=F64), torch.tensor([math.log(0.25)], dtype=F64)
    approx(approx_kl(logp, ref, "k1"), math.log(2))
    approx(approx_kl(logp, ref, "k3"), math.log(2) - 0.5)
    approx(approx_kl(logp, ref), math.log(2) - 0.5)  # default k3
    # reversed: p = 0.25, ref = 0.5: k1 = -log 2 ; k3 = 2 - log 2 - 1 = 1 - log 2
    approx(approx_kl(ref, logp, "k1"), -math.log(2))
    approx(approx_kl(ref, logp, "k3"), 1 - math.log(2))


def test_approx_kl_k3_nonnegative_and_zero_when_equal():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(200, generator=g, dtype=F64) * 3
    c = torch.randn(200, generator=g, dtype=F64) * 3
    assert torch.all(approx_kl(a, c, "k3") >= 0)
    assert torch.all(approx_kl(a, a.clone(), "k3") == 0)
    assert torch.all(approx_kl(a, a.clone(), "k1") == 0)


def test_approx_kl_estimators_are_unbiased_in_expectation():
    # For categorical p, q: E_{a~p}[k1] = E_{a~p}[k3] = KL(p || q) = sum p log(p/q), exactly.
    p = [0.1, 0.2, 0.3, 0.4]
    q = [0.4, 0.3, 0.2, 0.1]
    kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    lp = torch.tensor(p, dtype=F64).log()
    lq = torch.tensor(q, dtype=F64).log()
    P = torch.tensor(p, dtype=F64)
    approx((P * approx_kl(lp, lq, "k1")).sum(), kl)
    approx((P * approx_kl(lp, lq, "k3")).sum(), kl)


def test_approx_kl_unknown_kind_raises():
    with pytest.raises(ValueError, match="k2"):
        approx_kl(torch.zeros(1), torch.zeros(1), "k2")


# ---------------------------------------------------------------- explained_variance
def test_explained_variance():
    y = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    ev = explained_variance(y.clone(), y)
    assert isinstance(ev, float) and ev == pytest.approx(1.0, abs=1e-12)
    # pred = 0 -> 1 - Var[y]/Var[y] = 0 ; pred = mean -> 0 as well
    assert explained_variance(torch.zeros_like(y), y) == pytest.approx(0.0, abs=1e-12)
    assert explained_variance(torch.full_like(y, 2.5), y) == pytest.approx(0.0, abs=1e-12)
    # pred [1,2,3,5]: residual [0,0,0,-1], unbiased var 0.25 ; Var[y] = 5/3 -> 1 - 0.15 = 0.85
    assert explained_variance(torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=F64), y) == pytest.approx(0.85, abs=1e-12)


def test_explained_variance_constant_target_is_nan():
    y = torch.full((5,), 3.0)
    assert math.isnan(explained_variance(torch.randn(5), y))
    assert math.isnan(explained_variance(y.clone(), y))


@pytest.mark.parametrize("clip_c,clip_high,clamp", [(1.5, None, None), (3.0, 0.28, 0.5), (None, 0.28, None)])
def test_exgrpo_fresh_tokens_take_the_one_clipped_term_with_every_option(clip_c, clip_high, clamp):
    """exgrpo's loss on fresh tokens is the vanilla loss, dual-clip included (it once dropped dual-clip: with
    clip_ratio_c 1.5 a token of ratio e^2 and advantage -1 cost e^2 = 7.389 there and 1.5 under the vanilla loss)."""
    from reflectrl.core.losses import PolicyLossConfig, clipped_policy_loss, mixed_policy_loss

    g = torch.Generator().manual_seed(7)
    lp, old = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    adv, mask = torch.randn(4, 6, generator=g), (torch.rand(4, 6, generator=g) > 0.2).float()
    cfg = PolicyLossConfig(clip_ratio_high=clip_high, clip_ratio_c=clip_c, log_ratio_clamp=clamp)
    want, want_stats = clipped_policy_loss(old, lp, adv, mask, config=cfg)
    got, stats = mixed_policy_loss(old, lp, adv, mask, config=cfg, offpolicy=torch.zeros(4, 6), stored_logp=old)
    assert torch.equal(got, want)
    assert all(torch.equal(stats[k], want_stats[k]) for k in want_stats)
    one = mixed_policy_loss(torch.full((1, 1), -2.0), torch.zeros(1, 1), torch.full((1, 1), -1.0), None,
                            config=PolicyLossConfig(clip_ratio_c=1.5))[0]
    assert float(one) == 1.5


def test_exgrpo_replayed_tokens_take_the_shaped_term_not_the_clip():
    from reflectrl.core.losses import PolicyLossConfig, mixed_policy_loss, shaped_ratio

    lp, old, stored = torch.zeros(1, 2), torch.full((1, 2), -2.0), torch.full((1, 2), -1.0)
    adv = torch.full((1, 2), -1.0)
    loss, _ = mixed_policy_loss(old, lp, adv, None, config=PolicyLossConfig(clip_ratio_c=1.5),
                                offpolicy=torch.tensor([[1.0, 0.0]]), stored_logp=stored)
    replayed = float(shaped_ratio(torch.tensor(math.e)))  # -A * f(w), w = e^(0 - (-1))
    assert float(loss) == pytest.approx((replayed + 1.5) / 2)
