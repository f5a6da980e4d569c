"""Each method's learned part learns: its loss falls on a synthetic target."""

from __future__ import annotations

import torch

from reflectrl.contract.base import StepBatch
from reflectrl.methods.exgrpo_seed import ExGRPOSeedOptions, ReflectionMemory
from reflectrl.methods.gear_seed import GearSeed, GearSeedOptions
from reflectrl.methods.refgrpo_seed import RefGRPOSeed, RefGRPOSeedOptions


def _synthetic(g: torch.Generator, rows=8, steps=64, feat=6):
    x = torch.randn(rows, steps, feat, generator=g)
    w = torch.linspace(-1.0, 1.0, feat)
    return x, torch.tanh(x @ w) * 5.0 + 2.0  # advantages with an offset and a scale


def test_reflection_predictor_calibrates_on_a_synthetic_advantage():
    g = torch.Generator().manual_seed(0)
    m = RefGRPOSeed(6, RefGRPOSeedOptions(), policy_lr=1e-3, seed=0)
    losses = []
    for _ in range(40):
        x, adv = _synthetic(g)
        z = torch.zeros_like(adv)
        m.fit(StepBatch(states=x, features=x, rewards=z, values=z, advantages=adv, returns=adv, episode_end=z.bool(),
                        terminated=z.bool(), next_values=z))
        losses.append(m.metrics()["refgrpo-seed/L_cal_pre"])
    assert losses[0] > 0.8  # an untrained predictor is no better than predicting 0 for unit-variance targets
    assert sum(losses[-5:]) / 5 < 0.3 * losses[0]
    assert m.metrics()["refgrpo-seed/L_cal_heldout"] < 0.3 * losses[0]


def test_distilled_value_head_fits_the_winners_returns():
    g = torch.Generator().manual_seed(1)
    opts = GearSeedOptions(gear_distill_epochs=10)
    m = GearSeed(state_dim=4, rows=2, group_size=2, gamma=0.9, opts=opts, seed=0)
    states = torch.randn(512, 4, generator=g)
    targets = states[:, 0] * 3.0 - states[:, 1]
    m.store.add(x=states, y=targets)
    z = torch.zeros(2, 4)
    batch = StepBatch(states=torch.zeros(2, 4, 4), features=torch.zeros(2, 4, 4), rewards=z, values=z, advantages=z,
                      returns=z, episode_end=z.bool(), terminated=z.bool(), next_values=z)
    losses = []
    for _ in range(30):
        m.fit(batch)
        losses.append(m.metrics()["gear-seed/vd_loss"])
    assert losses[-1] < 0.1 * losses[0]


def test_reflection_network_learns_return_ranks():
    g = torch.Generator().manual_seed(2)
    rm = ReflectionMemory(3, ExGRPOSeedOptions(refl_epochs=5, refl_lr=3e-3), seed=0)
    pooled = torch.randn(200, 3, generator=g)
    rm.memory.add(pooled=pooled, returns=pooled[:, 0] * 10.0 + 0.1 * torch.randn(200, generator=g))
    losses = [rm.train()["exgrpo-seed/refl_loss"] for _ in range(40)]
    assert rm.ready and losses[-1] < 0.4 * losses[0]
    out = rm.reflector.reflect(pooled)
    assert float(out.abs().max()) <= 1.0
    assert torch.corrcoef(torch.stack([out[:, 0], pooled[:, 0]]))[0, 1] > 0.8


def test_hand_gradients_equal_autograd():
    """The by-hand MSE step writes the gradients autograd computes, for deep and linear heads."""
    from reflectrl.contract.nets import ScalarMLP, _HandMSE, hand_gradients_apply

    g = torch.Generator().manual_seed(0)
    for hidden in ((64, 64), (32,), ()):
        net = ScalarMLP(7, hidden, 1, 0.5, generator=g)
        assert hand_gradients_apply(net)
        x, y = torch.randn(300, 7, generator=g), torch.randn(300, 1, generator=g)
        loss = (net(x) - y).pow(2).mean()
        net.zero_grad()
        loss.backward()
        expected = [p.grad.clone() for p in net.parameters()]
        net.zero_grad(set_to_none=True)
        hand = _HandMSE(net)(x, y)
        torch.testing.assert_close(hand, loss.detach())
        for p, e in zip(net.parameters(), expected):
            torch.testing.assert_close(p.grad, e, rtol=1e-5, atol=1e-7)
    assert not hand_gradients_apply(ScalarMLP(3, (8,), 2))
    assert not hand_gradients_apply(ScalarMLP(3, (8,), 1, dropout=0.1))
    assert not hand_gradients_apply(ScalarMLP(3, (8,), 1, squash="sym_sigmoid"))
