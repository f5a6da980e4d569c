"""Registries of advantage estimators and policy losses."""

from __future__ import annotations

import pytest
import torch

from reflectrl.core import (
    PolicyLossConfig,
    adv_est_requires,
    clipped_policy_loss,
    drgrpo_advantage,
    gae_advantage,
    get_adv_est,
    get_policy_loss,
    grpo_advantage,
    list_registered,
    losses,
    register_adv_est,
    register_policy_loss,
    registry,
)


@pytest.fixture
def isolated_tables(monkeypatch):
    """Work on copies of the global tables so test registrations do not leak."""
    monkeypatch.setattr(registry, "_ADV_ESTIMATORS", dict(registry._ADV_ESTIMATORS))
    monkeypatch.setattr(registry, "_REQUIRES", dict(registry._REQUIRES))
    monkeypatch.setattr(losses, "_POLICY_LOSSES", dict(losses._POLICY_LOSSES))


def test_builtin_estimators_by_name():
    assert get_adv_est("grpo") is grpo_advantage
    assert get_adv_est("drgrpo") is drgrpo_advantage
    assert get_adv_est("gae") is gae_advantage
    assert {"grpo", "drgrpo", "gae"} <= set(list_registered()["adv_estimators"])


def test_unknown_estimator_raises_key_error_naming_registered():
    with pytest.raises(KeyError) as exc:
        get_adv_est("no-such-estimator")
    msg = str(exc.value)
    assert "no-such-estimator" in msg
    for name in ("drgrpo", "gae", "grpo"):
        assert name in msg


def test_estimator_requirements():
    assert adv_est_requires("gae") == {"values"} and adv_est_requires("grpo") == frozenset()
    with pytest.raises(KeyError):
        adv_est_requires("nope")


def test_register_and_get_custom_estimator(isolated_tables):
    @register_adv_est("my-est")
    def est(token_level_rewards, response_mask, index, config=None, **kwargs):
        return token_level_rewards * response_mask, token_level_rewards

    assert get_adv_est("my-est") is est
    assert "my-est" in list_registered()["adv_estimators"]
    adv, _ = get_adv_est("my-est")(torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), None)
    assert adv.tolist() == [[1.0, 0.0]]


def test_reregistering_same_function_is_allowed(isolated_tables):
    def est(*a, **k):
        return None, None

    register_adv_est("dup")(est)
    assert register_adv_est("dup")(est) is est
    assert get_adv_est("dup") is est


def test_registering_different_function_under_taken_name_raises(isolated_tables):
    def est1(*a, **k):
        return None, None

    def est2(*a, **k):
        return None, None

    register_adv_est("dup")(est1)
    with pytest.raises(ValueError, match="dup"):
        register_adv_est("dup")(est2)
    assert get_adv_est("dup") is est1  # the original survives

    with pytest.raises(ValueError, match="grpo"):
        register_adv_est("grpo")(est2)
    assert get_adv_est("grpo") is grpo_advantage


def test_policy_loss_registry(isolated_tables):
    assert get_policy_loss("vanilla") is clipped_policy_loss
    assert "vanilla" in list_registered()["policy_losses"]

    def mine(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, **kw):
        return (log_prob * 0).sum(), {}

    register_policy_loss("mine")(mine)
    assert get_policy_loss("mine") is mine
    with pytest.raises(ValueError):
        register_policy_loss("mine")(clipped_policy_loss)
    with pytest.raises(KeyError, match="vanilla"):
        get_policy_loss("nope")


def test_vanilla_policy_loss_dual_clip_and_clamp_hand_case():
    # one step, A = -1, log ratio 2 (ratio e^2 = 7.389): clipped term max(7.389, 1.2) = 7.389;
    # dual clip with c = 3 caps it at -c * A = 3
    lp, old, adv = torch.tensor([[2.0]]), torch.tensor([[0.0]]), torch.tensor([[-1.0]])
    loss, st = clipped_policy_loss(old, lp, adv, None)
    assert loss.item() == pytest.approx(torch.e ** 2)
    loss, st = clipped_policy_loss(old, lp, adv, None, config=PolicyLossConfig(clip_ratio_c=3.0))
    assert loss.item() == pytest.approx(3.0) and st["dual_clip_frac"].item() == 1.0
    loss, _ = clipped_policy_loss(old, lp, adv, None, config=PolicyLossConfig(log_ratio_clamp=1.0))
    assert loss.item() == pytest.approx(torch.e)  # log ratio clamped to 1


def test_registry_call_with_verl_style_keywords():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    index = torch.tensor([0, 0])
    adv, ret = get_adv_est("drgrpo")(token_level_rewards=rewards, response_mask=mask, index=index,
                                     config=None, extra_unused=123)
    # scores [1, 0] - mean 0.5 = [0.5, -0.5], broadcast over both tokens
    assert adv.tolist() == [[0.5, 0.5], [-0.5, -0.5]]
