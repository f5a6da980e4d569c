"""Registries of advantage estimators and shapers."""

from __future__ import annotations

import pytest
import torch

from reflectrl.core import (
    drgrpo_advantage,
    gae_advantage,
    get_adv_est,
    get_shaper,
    grpo_advantage,
    list_registered,
    register_adv_est,
    register_shaper,
)
from reflectrl.core import registry


@pytest.fixture
def isolated_tables(monkeypatch):
    """Work on copies of the global tables so test registrations do not leak."""
    monkeypatch.setattr(registry, "_ADV_ESTIMATORS", dict(registry._ADV_ESTIMATORS))
    monkeypatch.setattr(registry, "_SHAPERS", dict(registry._SHAPERS))


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


def test_unknown_shaper_raises_key_error(isolated_tables):
    @register_shaper("my-shaper")
    def shaper(*a, **k):
        return k["advantages"], k["returns"]

    with pytest.raises(KeyError) as exc:
        get_shaper("nope")
    assert "nope" in str(exc.value) and "my-shaper" in str(exc.value)


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


def test_shaper_registry(isolated_tables):
    def s1(*a, **k):
        return k["advantages"] * 2, k["returns"]

    def s2(*a, **k):
        return k["advantages"], k["returns"]

    register_shaper("double")(s1)
    assert get_shaper("double") is s1
    assert "double" in list_registered()["shapers"]
    with pytest.raises(ValueError):
        register_shaper("double")(s2)
    # estimator and shaper namespaces are separate
    register_adv_est("double")(s2)
    assert get_adv_est("double") is s2 and get_shaper("double") is s1


def test_registry_call_with_verl_style_keywords():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    index = torch.tensor([0, 0])
    adv, ret = get_adv_est("drgrpo")(token_level_rewards=rewards, response_mask=mask, index=index,
                                     config=None, extra_unused=123)
    # scores [1, 0] - mean 0.5 = [0.5, -0.5], broadcast over both tokens
    assert adv.tolist() == [[0.5, 0.5], [-0.5, -0.5]]
