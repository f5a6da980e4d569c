"""The methods' math on hand-worked cases: shared helpers, refgrpo-seed, gear-seed, exgrpo-seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reflectrl.contract.base import AuxInputs, EpisodeAssembler, MethodRunner, StepBatch
from reflectrl.contract.nets import ScalarMLP, control_features
from reflectrl.control.envs import EpisodeTracker
from reflectrl.core import discounted_cumsum, gae, returns_to_go
from reflectrl.methods.exgrpo_seed import (
    CoefSchedule,
    ExGRPOSeed,
    ExGRPOSeedOptions,
    ReflectionMemory,
    aggregate_reflection,
    priority_probs,
    rank_targets,
)
from reflectrl.methods.gear_seed import GearSeed, GearSeedOptions, omega_weights, select_winners, winners_per_group
from reflectrl.methods.refgrpo_seed import (
    RefGRPOSeed,
    RefGRPOSeedOptions,
    adaptive_beta,
    calibration_bonus,
    clip_bonus,
    normalized_advantages,
)


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               rtol=0, atol=tol)


# ----------------------------------------------------------------------------- shared helpers
def test_discounted_cumsum_hand_case():
    # x = 1 everywhere, discount 0.5, an episode ends at step 1: [1 + .5, 1, 1 + .5 + .25, 1 + .5, 1]
    x = torch.ones(1, 5)
    end = torch.tensor([[False, True, False, False, False]])
    close(discounted_cumsum(x, end, 0.5), [[1.5, 1.0, 1.75, 1.5, 1.0]])


@pytest.mark.parametrize("steps", [37, 700])  # matrix form and the loop fallback
def test_reward_shaping_by_linearity_equals_gae_on_shaped_rewards(steps):
    g = torch.Generator().manual_seed(0)
    r, v, nv, d = (torch.randn(3, steps, generator=g, dtype=torch.float64) for _ in range(4))
    end = torch.rand(3, steps, generator=g) < 0.1
    term = end & (torch.rand(3, steps, generator=g) < 0.5)
    adv, ret = gae(r, v, nv, term, end, 0.99, 0.95)
    inc = discounted_cumsum(d, end, 0.99 * 0.95)
    adv2, ret2 = gae(r + d, v, nv, term, end, 0.99, 0.95)
    close(adv + inc, adv2, 1e-9)
    close(adv + inc + v, ret2, 1e-9)


def test_returns_to_go_with_bootstrap():
    # r = 1, 1, 1, gamma .5, bootstrap 4: G2 = 1 + 2 = 3, G1 = 1 + 1.5 = 2.5, G0 = 1 + 1.25 = 2.25
    close(returns_to_go(torch.tensor([1.0, 1.0, 1.0]), 0.5, 4.0), [2.25, 2.5, 3.0])
    close(returns_to_go(torch.tensor([0.0, 0.0, 2.0]), 1.0, 0.0), [2.0, 2.0, 2.0])
    close(returns_to_go(torch.tensor([3.0, 5.0]), 0.0, 9.0), [3.0, 5.0])


def test_episode_assembler_joins_episodes_across_batches():
    asm = EpisodeAssembler(2, ("x",))
    x1 = torch.arange(8.0).reshape(2, 4)
    e1 = torch.tensor([[False, True, False, False], [False, False, False, False]])
    out = asm.add(e1, x=x1)
    assert [(e.row, e.index, e.end_step, e.data["x"].tolist()) for e in out] == [(0, 0, 1, [0.0, 1.0])]
    state = asm.state("p")
    x2 = torch.arange(8.0, 16.0).reshape(2, 4)
    e2 = torch.tensor([[True, False, False, False], [False, False, True, False]])
    out = asm.add(e2, x=x2)
    assert [(e.row, e.index, e.data["x"].tolist()) for e in out] == [(0, 1, [2.0, 3.0, 8.0]),
                                                                      (1, 0, [4.0, 5.0, 6.0, 7.0, 12.0, 13.0, 14.0])]
    again = EpisodeAssembler(2, ("x",))
    again.load_state("p", *state)
    assert [e.data["x"].tolist() for e in again.add(e2, x=x2)] == [[2.0, 3.0, 8.0], [4.0, 5.0, 6.0, 7.0, 12.0, 13.0, 14.0]]


def test_episode_assembler_whole_rows_keeps_no_padding():
    """LLM rows (whole_rows): each row's episode is its steps up to its end; the padding after it never becomes
    the start of the row's next episode (which is what joining across batches would do)."""
    asm = EpisodeAssembler(2, ("x",))
    x1 = torch.arange(8.0).reshape(2, 4)
    e1 = torch.tensor([[False, True, False, False], [False, False, False, True]])
    out = asm.add(e1, whole_rows=True, x=x1)
    assert [(e.row, e.index, e.end_step, e.data["x"].tolist()) for e in out] == [(0, 0, 1, [0.0, 1.0]),
                                                                                  (1, 0, 3, [4.0, 5.0, 6.0, 7.0])]
    x2 = torch.arange(8.0, 16.0).reshape(2, 4)
    e2 = torch.tensor([[False, False, True, False], [True, False, False, False]])
    out = asm.add(e2, whole_rows=True, x=x2)
    assert [(e.row, e.index, e.data["x"].tolist()) for e in out] == [(0, 1, [8.0, 9.0, 10.0]), (1, 1, [12.0])]
    assert asm.pending_length(0) == 0 and asm.pending_length(1) == 0
    # the same batches as control streams: row 0's padding tail [2, 3] would open its next episode
    joined = EpisodeAssembler(2, ("x",))
    joined.add(e1, x=x1)
    assert joined.add(e2, x=x2)[0].data["x"].tolist() == [2.0, 3.0, 8.0, 9.0, 10.0]


def test_tracker_seed_groups_share_reset_seeds():
    tr = EpisodeTracker(seed=5, num_envs=4, group_size=2)
    s = tr.seeds()
    assert s[0] == s[1] and s[2] == s[3] and s[0] != s[2]
    assert EpisodeTracker(seed=5, num_envs=4).seeds()[0] == s[0]  # group 0 keeps env 0's seeds
    tr.finish(np.array([True, False, False, False]))
    assert tr.seeds()[0] != tr.seeds()[1]  # different episode numbers, different seeds


def test_control_features_one_hot_and_continuous():
    obs = torch.zeros(2, 3, 2)
    f = control_features(obs, torch.tensor([[0, 1, 2], [2, 2, 0]]), 3)
    assert f.shape == (2, 3, 5) and f[0, 1].tolist() == [0, 0, 0, 1, 0]
    assert control_features(obs, torch.ones(2, 3, 4), None).shape == (2, 3, 6)


def test_scalar_mlp_init_and_squash():
    g = torch.Generator().manual_seed(0)
    net = ScalarMLP(5, (64, 64), members=3, out_std=0.01, squash="sym_sigmoid", generator=g)
    assert float(net.biases[-1].detach().abs().max()) == 0.0
    assert 0.005 < float(net.weights[-1].detach().std()) < 0.015
    with torch.no_grad():
        out = net(torch.randn(7, 5) * 100)
    assert out.shape == (7, 3) and float(out.abs().max()) <= 1.0


def _batch(rows=2, steps=4, feat=3, **kw) -> StepBatch:
    g = torch.Generator().manual_seed(1)
    z = lambda: torch.zeros(rows, steps)
    base = dict(states=torch.randn(rows, steps, feat, generator=g), features=torch.randn(rows, steps, feat, generator=g),
                rewards=z(), values=z(), advantages=z(), returns=z(), episode_end=z().bool(), terminated=z().bool(),
                next_values=z())
    base.update(kw)
    return StepBatch(**base)


def _constant(net: ScalarMLP, value: float) -> None:
    with torch.no_grad():
        net.weights[-1].zero_()
        net.biases[-1].fill_(value)


# ----------------------------------------------------------------------------- refgrpo-seed
def test_refgrpo_bonus_clip_and_beta_hand_cases():
    close(calibration_bonus(torch.tensor([0.0, 1.0, 2.0]), torch.zeros(3), 0.5), [0.0, -0.5, -2.0])
    b = torch.tensor([0.0, -0.5, -2.0])
    r = torch.tensor([1.0, -1.0, 2.0])  # mean |r| = 4/3
    clipped, c = clip_bonus(b, r, k=1.5)
    assert c == pytest.approx(2.0) and clipped.tolist() == [0.0, -0.5, -2.0]
    clipped, c = clip_bonus(b, r, k=0.75)
    assert c == pytest.approx(1.0) and clipped.tolist() == [0.0, -0.5, -1.0]
    assert clip_bonus(b, torch.zeros(3), k=3.0, floor=0.25)[1] == 0.25
    assert adaptive_beta(1.0, 0.5, 1.0, 0.1, 2.0) == pytest.approx(0.5)
    assert adaptive_beta(1.0, 5.0, 1.0, 0.1, 2.0) == pytest.approx(2.0)
    assert adaptive_beta(1.0, 0.01, 1.0, 0.1, 2.0) == pytest.approx(0.1)
    close(normalized_advantages(torch.tensor([1.0, 2.0, 3.0])), [-1.0, 0.0, 1.0])


@pytest.mark.parametrize("target", ["raw", "normalized"])
def test_refgrpo_shape_recomputes_gae_on_shaped_rewards(target):
    adv = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 0.0, 0.0]])
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0]])  # mean |r| = 0.5
    opts = RefGRPOSeedOptions(cal_alpha=0.5, cal_target=target, cal_clip_k=4.0, cal_beta=0.5)
    m = RefGRPOSeed(3, opts, policy_lr=1e-3, seed=0)
    _constant(m.net, 1.0)  # f = 1 everywhere
    b = _batch(advantages=adv, rewards=rewards)
    sh = m.shape(b)
    tgt = adv if target == "raw" else normalized_advantages(adv)
    expected = 0.5 * (-0.5 * (1.0 - tgt) ** 2).clamp(-2.0, 2.0)  # c = 4 * 0.5
    close(sh.reward_delta, expected)
    assert sh.advantage_delta is None and sh.weights is None
    # PPO's re-estimate through the shared apply_shaping (by linearity) equals GAE on r + beta * b
    from reflectrl.control.ppo import PPO, Rollout

    v = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
    end = torch.tensor([[False, True, False, False], [False, False, False, True]])
    a0, r0 = gae(rewards, v, v, end, end, 0.9, 0.8)
    ro = Rollout(obs=torch.zeros(2, 4, 3), actions=None, logp=None, values=v, rewards=rewards, next_values=v,
                 terminated=end, episode_end=end, advantages=a0, returns=r0)

    class Fixed:
        fit_first = True

        def fit(self, batch):
            pass

        def shape(self, batch):
            return sh

        def metrics(self):
            return {}

    class Stub:  # the parts of a PPO trainer that apply_methods reads
        cfg = type("C", (), {"gamma": 0.9, "gae_lambda": 0.8, "num_updates": 1, "seed_group_size": 1})()
        update_idx = 1
        methods = [MethodRunner(Fixed(), lambda t, b: (b.obs, b.obs))]

    PPO.apply_methods(Stub(), ro)
    a1, r1 = gae(rewards + expected, v, v, end, end, 0.9, 0.8)
    close(ro.advantages, a1, 1e-5)
    close(ro.returns, r1, 1e-5)


def test_refgrpo_advantage_credit_and_adaptive_beta():
    opts = RefGRPOSeedOptions(cal_alpha=1.0, cal_clip_k=100.0, cal_credit="advantage", cal_beta_adaptive=True,
                              cal_beta=1.0, cal_beta_min=0.1, cal_beta_max=2.0, reflection_sample=1.0)
    m = RefGRPOSeed(3, opts, policy_lr=1e-3, seed=0)
    b = _batch(advantages=torch.tensor([[1.0, -1.0, 2.0, 0.0], [0.0, 1.0, -2.0, 3.0]]), rewards=torch.ones(2, 4))
    m.fit(b)
    sh = m.shape(b)
    pre = m.metrics()["refgrpo-seed/L_cal_pre"]
    assert m.metrics()["refgrpo-seed/beta"] == pytest.approx(min(max(pre, 0.1), 2.0))
    assert sh.reward_delta is None and sh.advantage_delta.shape == (2, 4) and float(sh.advantage_delta.max()) <= 0


# ----------------------------------------------------------------------------- gear-seed
def test_gear_winners_and_omega_hand_cases():
    assert winners_per_group(0.25, 4) == 1 and winners_per_group(0.5, 4) == 2 and winners_per_group(0.01, 4) == 1
    assert select_winners(torch.tensor([3.0, 5.0, 5.0, 1.0]), 2).tolist() == [1, 2]
    v_orig = torch.zeros(4)
    v_d = torch.tensor([0.0, math.log(2.0), math.log(4.0), -math.log(4.0)])
    w, cf = omega_weights(v_d, v_orig, 1.0, 0.5, 2.0)
    close(w, [1.0, 2.0, 2.0, 0.5])
    assert cf == pytest.approx(0.5)
    w, _ = omega_weights(v_d, v_orig, 1.0, 0.5, 2.0, normalize=True)
    close(w, [1 / 1.375, 2 / 1.375, 2 / 1.375, 0.5 / 1.375])
    w, cf = omega_weights(2.0 * v_d, v_orig, 2.0, 0.1, 10.0)  # tau halves the exponent
    close(w, [1.0, 2.0, 4.0, 0.25])
    assert cf == 0.0


def test_gear_only_complete_groups_pick_winners():
    # 4 rows in groups of 2; gamma 0.5. Group 0: row 0 ends its episode 0 in batch 1, row 1 in batch 2.
    opts = GearSeedOptions(gear_distill_target="return_to_go")
    m = GearSeed(state_dim=3, rows=4, group_size=2, gamma=0.5, opts=opts, seed=0)
    end1 = torch.tensor([[False, True], [False, False], [False, False], [False, False]])
    b1 = _batch(rows=4, steps=2, episode_end=end1, terminated=end1.clone(),
                rewards=torch.tensor([[1.0, 1.0], [2.0, 2.0], [0.0, 0.0], [0.0, 0.0]]))
    assert m.shape(b1).weights is None  # V_d never fitted: omega = 1
    m.fit(b1)
    assert m.metrics()["gear-seed/winners"] == 0 and m.store.size == 0 and len(m.pending) == 1
    end2 = torch.tensor([[False, False], [True, False], [False, False], [False, False]])
    b2 = _batch(rows=4, steps=2, episode_end=end2, terminated=end2.clone(),
                rewards=torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    m.fit(b2)
    # row 1's episode (returns 2 + 2 + 2 = 6) beats row 0's (1 + 1 = 2); its targets: reward-to-go with gamma .5
    assert m.metrics()["gear-seed/winners"] == 1 and m.metrics()["gear-seed/groups_completed"] == 1
    close(m.store.y[:3], [2 + 1 + 0.5, 2 + 1, 2.0])
    torch.testing.assert_close(m.store.x[:2], b1.states[1])
    torch.testing.assert_close(m.store.x[2], b2.states[1, 0])
    assert m.target_ready and m.shape(b2).weights.shape == (4, 2)


def test_gear_ranking_loss_hand_case():
    """Rows 0, 1 form a group (G = 2), rows 2, 3 another. Row 0 ends an episode at step 1, so its
    segments are (row 0, ep 0) and (row 0, ep 1); row 1 has one segment (ep 0). Mean advantages rank
    (row 1, ep 0) over (row 0, ep 0); (row 0, ep 1) has no partner yet; rows 2, 3: row 3 wins."""
    from reflectrl.methods.gear_seed import pairwise_ranking_loss, segment_ids

    end = torch.tensor([[False, True, False], [False, False, False], [False, False, False], [False, False, False]])
    seg, rows, local = segment_ids(end)
    assert seg.tolist() == [[0, 0, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]]
    assert rows.tolist() == [0, 0, 1, 2, 3] and local.tolist() == [0, 1, 0, 0, 0]
    adv = torch.tensor([[1.0, -1.0, 5.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 0.0, 1.0]])
    m = GearSeed(state_dim=3, rows=4, group_size=2, gamma=0.9, opts=GearSeedOptions(gear_rank_coef=0.5), seed=0)
    b = _batch(rows=4, steps=3, episode_end=end, advantages=adv)
    m.shape(b)
    seg, pairs = m._rank
    flat_seg = seg.reshape(-1)
    expected = torch.zeros(5, 5, dtype=torch.bool)
    expected[2, 0] = True  # (row 1, ep 0): mean 1 > (row 0, ep 0): mean 0
    expected[4, 3] = True  # row 3: mean 1 > row 2: mean 0
    assert torch.equal(pairs, expected) and m.metrics()["gear-seed/rank_pairs"] == 2
    # log-ratios on a minibatch of steps: segment means l_0 = 0.2, l_2 = -0.1 (l_3, l_4 absent)
    idx = torch.tensor([0, 1, 3, 4])
    lr = torch.tensor([0.1, 0.3, -0.2, 0.0], requires_grad=True)
    loss, n = pairwise_ranking_loss(lr, flat_seg[idx], pairs, scale=2.0)
    assert n == 1
    close(loss, math.log1p(math.exp(-2.0 * (-0.1 - 0.2))))
    loss.backward()
    assert lr.grad[2] < 0 and lr.grad[0] > 0  # raising the winner's log-ratio (or lowering the loser's) lowers it
    # through the method contract's aux loss: coef x loss, with the pair whose segments both appear
    steps = torch.arange(12)
    out = m.aux_loss(AuxInputs(steps // 3, steps % 3, torch.zeros(12), torch.zeros(12), (4, 3)))
    close(out, 0.5 * math.log(2.0))
    assert m.metrics()["gear-seed/rank_loss"] == pytest.approx(math.log(2.0))
    assert not MethodRunner(GearSeed(3, 4, 2, 0.9, GearSeedOptions(), 0)).has_aux_loss  # off by default


def test_gear_terminal_target_and_truncation_bootstrap():
    m = GearSeed(2, 2, 2, 0.5, GearSeedOptions(gear_distill_target="terminal"), seed=0)
    from reflectrl.contract.base import Episode

    ep = Episode(0, 0, {"states": torch.zeros(3, 2), "rewards": torch.tensor([1.0, 0.0, 3.0]), "boot": torch.zeros(3)})
    close(m.value_targets(ep), [4 * 0.25, 4 * 0.5, 4.0])
    m2 = GearSeed(2, 2, 2, 0.5, GearSeedOptions(), seed=0)
    ep.data["boot"] = torch.tensor([0.0, 0.0, 8.0])  # truncated: V(final obs) = 8
    close(m2.value_targets(ep), [1 + 0.5 * (0 + 0.5 * (3 + 4)), 0 + 0.5 * (3 + 4), 3 + 4])


# ----------------------------------------------------------------------------- exgrpo-seed
def test_exgrpo_rank_targets_priorities_schedule_and_votes():
    close(rank_targets(torch.tensor([1.0, 3.0, 2.0])), [-1.0, 1.0, 0.0])
    close(rank_targets(torch.tensor([1.0, 1.0, 3.0])), [-0.5, -0.5, 1.0])
    close(rank_targets(torch.tensor([7.0])), [0.0])
    ret = torch.tensor([1.0, 3.0, 2.0])
    unc = torch.tensor([1.0, 0.0, 3.0])
    close(priority_probs(ret, None, "return", eps=0.0), [0.0, 2 / 3, 1 / 3])
    close(priority_probs(ret, unc, "uncertainty", eps=0.0), [0.25, 0.0, 0.75])
    close(priority_probs(ret, unc, "mix", mix=0.5, eps=0.0), [2 / 17, 6 / 17, 9 / 17])
    close(priority_probs(ret, None, "return", alpha=0.0), [1 / 3, 1 / 3, 1 / 3])
    s = CoefSchedule(0.1, 0.5, 0.5)
    assert [round(s(p), 6) for p in (0.0, 0.25, 0.5, 1.0)] == [0.1, 0.3, 0.5, 0.5]
    members = torch.tensor([[0.5, 0.7], [0.1, -0.3], [0.05, 0.05]])
    sig, kept = aggregate_reflection(members, confidence=0.08)
    close(sig, [0.6, -0.1, 0.0])
    assert kept.tolist() == [True, True, False]
    sig, kept = aggregate_reflection(members, vote=1.0)
    close(sig, [0.6, 0.0, 0.05])


@pytest.mark.parametrize("credit", ["terminal", "advantage"])
def test_exgrpo_trajectory_term_placement(credit):
    opts = ExGRPOSeedOptions(refl_credit=credit, refl_min_memory=2, refl_coef_start=0.5, refl_coef_end=0.5,
                             refl_scale="none")
    m = ExGRPOSeed(state_dim=3, rows=2, opts=opts, seed=0)
    m.rm.fits = 1  # pretend the reflector trained; make it output sigmoid(z)*2-1 with z = log 3 -> 0.5
    with torch.no_grad():
        m.rm.reflector.net.weights[-1].zero_()
        m.rm.reflector.net.biases[-1].fill_(math.log(3.0))
    end = torch.tensor([[False, False, True, False], [False, False, False, False]])
    sh = m.shape(_batch(episode_end=end))
    expected = torch.zeros(2, 4)
    if credit == "terminal":
        expected[0, 2] = 0.25
        close(sh.reward_delta, expected)
    else:
        expected[0, :3] = 0.25
        close(sh.advantage_delta, expected)


@pytest.mark.parametrize("priority", ["return", "mix"])
def test_exgrpo_background_fit_is_the_foreground_fit_one_training_later(priority):
    """With the same data and seed, the background mode's live reflector after training call n has
    exactly the foreground reflector's weights after call n - 1 (and the memory it saw then)."""
    def make(background):
        opts = ExGRPOSeedOptions(refl_background=background, refl_priority=priority, refl_batch=32,
                                 refl_ensemble=2)
        return ReflectionMemory(3, opts, seed=7)

    fg, bg = make(False), make(True)
    data = torch.Generator().manual_seed(0)
    fg_after, bg_after = [], []
    for _ in range(4):
        pooled, returns = torch.randn(10, 3, generator=data), torch.randn(10, generator=data)
        for rm in (fg, bg):
            rm.memory.add(pooled=pooled, returns=returns)
        fg_metrics, bg_metrics = fg.train(), bg.train()
        fg_after.append(({k: v.clone() for k, v in fg.reflector.net.state_dict().items()}, fg_metrics))
        bg_after.append(({k: v.clone() for k, v in bg.reflector.net.state_dict().items()}, bg_metrics))
    assert bg_after[0][1] == {} and bg.fits == 3 and fg.fits == 4
    for n in range(1, 4):
        want, got = fg_after[n - 1], bg_after[n]
        assert all(torch.equal(want[0][k], got[0][k]) for k in want[0])
        assert got[1] == want[1]  # the fit's metrics arrive with it
    assert not all(torch.equal(fg_after[0][0][k], bg_after[0][0][k]) for k in fg_after[0][0])  # call 1: still untrained
