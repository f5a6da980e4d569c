"""reflectrl's estimators and losses registered in verl, cross-checked against verl's own ``core_algos`` on CPU.

Every comparison runs verl's function and reflectrl's registered adapter on the same random batch: left-aligned
masks (real tokens first, then padding, lengths differing per row, some rows empty for the losses), groups of
one, groups whose scores are all equal, uids as verl passes them (a numpy object array of strings), several seeds.

Definitional differences, each checked below rather than hidden:

- verl's GAE leaves values at positions outside the mask (the whitened advantage there is ``-mean / std``; at a
  hole inside a row it carries the next real token's value; the return there is ``advantage + value``);
  reflectrl writes 0 outside the mask. Both agree on every position inside the mask, which is all a loss reads.
- verl's GRPO sums ``token_level_rewards`` over the whole row; reflectrl sums it over the mask. verl puts a
  response's reward on its last real token, where both agree (the batches here do the same).
- metric names: verl's ``actor/pg_clipfrac`` is reflectrl's ``clip_binding_frac`` (the share of tokens where the
  clipped term is the one taken), ``actor/ppo_kl`` its ``old_approx_kl`` and ``actor/pg_clipfrac_lower`` its
  ``dual_clip_frac``; reflectrl's ``clipfrac`` (ratio outside the range) and ``approx_kl`` (k3) come under
  ``actor/reflectrl/``.
- verl's ``token-sum`` aggregation has no reflectrl counterpart; the adapter refuses it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (pip install "
                                 "'reflectrl[verl]')")

from omegaconf import OmegaConf  # noqa: E402  (verl depends on omegaconf)
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from reflectrl.errors import ConfigError, ReflectRLError  # noqa: E402
from reflectrl.integrations import verl as rv  # noqa: E402

SEEDS = (0, 1, 2, 3, 4)
SHARED_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verl"
TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module", autouse=True)
def registered():
    return rv.register_with_verl()


def left_aligned_mask(lengths: list[int], steps: int) -> torch.Tensor:
    return (torch.arange(steps)[None, :] < torch.tensor(lengths)[:, None]).float()


def outcome_batch(seed: int, steps: int = 7):
    """Rows in groups of sizes 1..5 (shuffled, uid strings); one group has equal scores; rewards on the last token."""
    g = torch.Generator().manual_seed(seed)
    sizes = [1, 2, 3, 4, 5, 1, 3]
    uids = [f"uid-{seed}-{k}" for k, n in enumerate(sizes) for _ in range(n)]
    order = torch.randperm(len(uids), generator=g).tolist()
    uids = [uids[i] for i in order]
    rows = len(uids)
    lengths = torch.randint(1, steps + 1, (rows,), generator=g).tolist()
    mask = left_aligned_mask(lengths, steps)
    scores = torch.randint(0, 2, (rows,), generator=g).float() if seed % 2 else torch.randn(rows, generator=g)
    equal_group = uids[0]
    for r, u in enumerate(uids):
        if u == equal_group:
            scores[r] = 0.75
    rewards = torch.zeros(rows, steps)
    rewards[torch.arange(rows), torch.tensor(lengths) - 1] = scores
    return rewards, mask, np.array(uids, dtype=object)


def est(name: str):
    return core_algos.get_adv_estimator_fn(name)


# ------------------------------------------------------------------------------------------------ estimators
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_verl(seed, norm_by_std):
    rewards, mask, index = outcome_batch(seed)
    want_adv, want_ret = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=rewards.clone(), response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm_by_std)
    # the keyword arguments verl's compute_advantage passes to a registered estimator
    config = AlgoConfig(norm_adv_by_std_in_grpo=norm_by_std)
    adv, ret = est("reflectrl_grpo")(token_level_rewards=rewards, response_mask=mask, config=config, index=index)
    assert_close(adv, want_adv, **TOL)
    assert_close(ret, want_ret, **TOL)
    if not norm_by_std:  # Dr.GRPO = verl's grpo without the std
        dr, _ = est("reflectrl_drgrpo")(token_level_rewards=rewards, response_mask=mask, config=AlgoConfig(),
                                        index=index)
        assert_close(dr, want_adv, **TOL)


def test_grpo_groups_of_one_and_equal_groups():
    rewards, mask, index = outcome_batch(3)
    adv, _ = est("reflectrl_grpo")(token_level_rewards=rewards, response_mask=mask, index=index, config=AlgoConfig())
    uids, counts = np.unique(index, return_counts=True)
    single = {u for u, n in zip(uids, counts) if n == 1}
    for r, u in enumerate(index):
        row_adv = adv[r][mask[r].bool()]
        if u in single:  # verl's convention: mean 0, std 1
            assert_close(row_adv, torch.full_like(row_adv, float(rewards[r].sum()) / (1 + 1e-6)))
        if u == index[0]:  # the all-equal group
            assert torch.all(row_adv == 0)


def test_grpo_reads_a_dictconfig_as_verls_v1_trainer_passes_it():
    rewards, mask, index = outcome_batch(2)
    want, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, index, norm_adv_by_std_in_grpo=False)
    cfg = OmegaConf.create({"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": False, "adv_estimator": "x"})
    adv, _ = est("reflectrl_grpo")(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg)
    assert_close(adv, want, **TOL)


def gae_batch(seed: int, rows: int = 6, steps: int = 9, holes: bool = False):
    g = torch.Generator().manual_seed(100 + seed)
    lengths = torch.randint(2, steps + 1, (rows,), generator=g).tolist()
    mask = left_aligned_mask(lengths, steps)
    if holes:  # observation tokens inside a row (multi-turn): masked out, the row goes on after them
        for r, n in enumerate(lengths):
            if n >= 4:
                mask[r, 1 + r % (n - 2)] = 0.0
    rewards = torch.randn(rows, steps, generator=g) * mask
    values = torch.randn(rows, steps, generator=g)
    return rewards, values, mask


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_verl_inside_the_mask(seed, holes):
    rewards, values, mask = gae_batch(seed, holes=holes)
    gamma, lam = (0.99, 0.95) if seed % 2 else (1.0, 1.0)
    want_adv, want_ret = core_algos.compute_gae_advantage_return(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=gamma, lam=lam)
    adv, ret = est("reflectrl_gae")(token_level_rewards=rewards, response_mask=mask, values=values,
                                    config=AlgoConfig(gamma=gamma, lam=lam))
    assert_close(adv * mask, want_adv * mask, **TOL)
    assert_close(ret * mask, want_ret * mask, **TOL)
    # the documented difference: reflectrl writes 0 outside the mask, verl does not
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)
    assert not torch.all(want_adv[mask == 0] == 0)
    # gamma / lam as keywords (verl's built-in signature) override the config
    adv_kw, _ = est("reflectrl_gae")(token_level_rewards=rewards, response_mask=mask, values=values,
                                     config=AlgoConfig(), gamma=gamma, lam=lam)
    assert_close(adv_kw, adv)


def test_gae_without_values_says_verl_passes_them_to_its_own_gae_only():
    rewards, _, mask = gae_batch(0)
    with pytest.raises(ReflectRLError, match="algorithm.adv_estimator=gae"):
        est("reflectrl_gae")(token_level_rewards=rewards, response_mask=mask, config=AlgoConfig())


def test_group_estimator_without_uid_is_an_error():
    rewards, mask, _ = outcome_batch(0)
    with pytest.raises(ReflectRLError, match="uid"):
        est("reflectrl_grpo")(token_level_rewards=rewards, response_mask=mask, config=AlgoConfig())


# ------------------------------------------------------------------------------------------------ policy loss
def loss_batch(seed: int, rows: int = 8, steps: int = 10):
    g = torch.Generator().manual_seed(200 + seed)
    lengths = torch.randint(0 if seed % 2 else 1, steps + 1, (rows,), generator=g).tolist()
    mask = left_aligned_mask(lengths, steps).bool()  # verl's actor passes a bool mask
    old = torch.randn(rows, steps, generator=g) * 0.5 - 2.0
    delta = torch.randn(rows, steps, generator=g) * 0.4
    delta[0, 0] = 25.0  # beyond verl's log-ratio clamp of 20
    delta[1, 0] = -21.0
    logp = old + delta
    adv = torch.randn(rows, steps, generator=g)
    adv[2, :3] = 0.0
    return old, logp, adv, mask


def actor_config(low=0.2, high=0.2, clip_c=3.0, mode="token-mean", info=None) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=low,
                       clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=clip_c, loss_agg_mode=mode,
                       global_batch_info=dict(info or {}))


def both_losses(old, logp, adv, mask, mode, config):
    """(verl's loss, metrics, grad wrt log_prob) and reflectrl's, called as verl's actor calls a policy loss."""
    out = []
    for fn in (core_algos.get_policy_loss_fn("vanilla"), core_algos.get_policy_loss_fn("reflectrl_vanilla")):
        lp = logp.clone().requires_grad_(True)
        loss, metrics = fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask, loss_agg_mode=mode,
                           config=config, rollout_is_weights=None)
        loss.backward()
        out.append((loss.detach(), metrics, lp.grad))
    return out


CLIPS = {"symmetric": (0.2, 0.2, 3.0), "clip_higher": (0.2, 0.28, 3.0), "tight_dual_clip": (0.2, 0.28, 1.5)}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", SHARED_MODES)
@pytest.mark.parametrize("clip", sorted(CLIPS))
def test_vanilla_loss_matches_verl(seed, mode, clip):
    old, logp, adv, mask = loss_batch(seed)
    (want, want_m, want_g), (got, got_m, got_g) = both_losses(old, logp, adv, mask, mode, actor_config(*CLIPS[clip],
                                                                                                       mode=mode))
    assert_close(got, want, **TOL)
    assert_close(got_g, want_g, **TOL)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert got_m[key] == pytest.approx(want_m[key], rel=1e-5, abs=1e-7), key
    assert {"actor/reflectrl/clipfrac", "actor/reflectrl/approx_kl"} <= set(got_m)


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("mode", SHARED_MODES)
def test_vanilla_loss_with_global_batch_info_matches_verl(seed, mode):
    """A micro-batch of a data-parallel step: verl divides by the global tokens / rows and multiplies by dp_size."""
    old, logp, adv, mask = loss_batch(seed)
    info = {"dp_size": 4, "batch_num_tokens": int(mask.sum()) * 3 + 5, "global_batch_size": mask.shape[0] * 3,
            "loss_scale_factor": 32 if mode == "seq-mean-token-sum-norm" else None}
    (want, _, want_g), (got, _, got_g) = both_losses(old, logp, adv, mask, mode,
                                                     actor_config(0.2, 0.28, mode=mode, info=info))
    assert_close(got, want, **TOL)
    assert_close(got_g, want_g, **TOL)


def test_vanilla_loss_reads_a_dictconfig_with_clip_ratio_low_unset():
    old, logp, adv, mask = loss_batch(1)
    cfg = OmegaConf.create({"clip_ratio": 0.15, "clip_ratio_low": None, "clip_ratio_high": 0.3, "clip_ratio_c": 2.0,
                            "loss_agg_mode": "token-mean", "global_batch_info": {}})
    (want, want_m, _), (got, got_m, _) = both_losses(old, logp, adv, mask, "token-mean", cfg)
    assert_close(got, want, **TOL)
    assert got_m["actor/pg_clipfrac"] == pytest.approx(want_m["actor/pg_clipfrac"], rel=1e-5)
    # a config without clip_ratio_c gets verl's default dual clip, 3.0, as verl's config.get gives it
    fn = core_algos.get_policy_loss_fn("reflectrl_vanilla")
    bare, _ = fn(old, logp, adv, mask, "token-mean", OmegaConf.create({"clip_ratio": 0.2}))
    explicit, _ = fn(old, logp, adv, mask, "token-mean", OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_c": 3.0}))
    assert_close(bare, explicit)
    assert rv.policy_loss_config(OmegaConf.create({"clip_ratio": 0.2}))[0].clip_ratio_c == 3.0


def test_vanilla_loss_ignores_non_finite_padding():
    old, logp, adv, mask = loss_batch(0)
    want, _ = core_algos.get_policy_loss_fn("reflectrl_vanilla")(old, logp, adv, mask, "seq-mean-token-mean",
                                                                  actor_config(mode="seq-mean-token-mean"))
    pad = ~mask
    lp = logp.masked_fill(pad, float("nan")).requires_grad_(True)
    got, _ = core_algos.get_policy_loss_fn("reflectrl_vanilla")(old.masked_fill(pad, -math.inf), lp,
                                                                 adv.masked_fill(pad, float("nan")), mask,
                                                                 "seq-mean-token-mean",
                                                                 actor_config(mode="seq-mean-token-mean"))
    got.backward()
    assert_close(got.detach(), want)
    assert torch.isfinite(lp.grad).all() and torch.all(lp.grad[pad] == 0)


def test_vanilla_loss_refuses_what_it_cannot_match():
    old, logp, adv, mask = loss_batch(0)
    fn = core_algos.get_policy_loss_fn("reflectrl_vanilla")
    with pytest.raises(ConfigError, match="token-sum"):
        fn(old, logp, adv, mask, "token-sum", actor_config())
    with pytest.raises(ReflectRLError, match="rollout-correction"):
        fn(old, logp, adv, mask, "token-mean", actor_config(), rollout_is_weights=torch.ones_like(old))
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        fn(old, logp, adv, mask, "token-mean", OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_c": 1.0}))
    with pytest.raises(ReflectRLError, match="global_batch_size"):
        fn(old, logp, adv, mask, "seq-mean-token-mean", actor_config(info={"dp_size": 2}))
    with pytest.raises(ReflectRLError, match="actor config"):
        fn(old, logp, adv, mask, "token-mean", None)


# ------------------------------------------------------------------------------------------------ registration
def test_registration_is_idempotent_and_leaves_verls_entries(registered):
    est_table, loss_table = dict(core_algos.ADV_ESTIMATOR_REGISTRY), dict(core_algos.POLICY_LOSS_REGISTRY)
    assert rv.register_with_verl() == registered
    assert est_table == core_algos.ADV_ESTIMATOR_REGISTRY and loss_table == core_algos.POLICY_LOSS_REGISTRY
    assert {"reflectrl_grpo", "reflectrl_drgrpo", "reflectrl_gae"} <= set(registered["adv_estimators"])
    assert "reflectrl_vanilla" in registered["policy_losses"]
    assert est_table["grpo"] is core_algos.compute_grpo_outcome_advantage
    assert est_table["gae"] is core_algos.compute_gae_advantage_return
    assert loss_table["vanilla"] is core_algos.compute_policy_loss_vanilla
    verl_own = {k for k in est_table if not k.startswith(rv.PREFIX)}
    assert {e.value for e in core_algos.AdvantageEstimator} <= verl_own


def test_registration_refuses_to_overwrite_a_foreign_entry(monkeypatch):
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "reflectrl_grpo", lambda **kw: None)
    with pytest.raises(ReflectRLError, match="not reflectrl's"):
        rv.register_with_verl()


def test_registration_replaces_a_stale_adapter_of_its_own(monkeypatch):
    def stale(**kwargs):
        raise AssertionError("stale adapter called")

    stale._reflectrl_adapter = ("adv_estimator", "grpo")
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "reflectrl_grpo", stale)
    rv.register_with_verl()
    assert core_algos.ADV_ESTIMATOR_REGISTRY["reflectrl_grpo"] is not stale


# ------------------------------------------------------------------------------------------------ example configs
def test_example_configs_use_registered_names_and_verls_keys(registered):
    """Every key of examples/verl/*.yaml exists in verl's full default config (so no setting is a typo), except the
    few verl reads with .get (reward_kwargs, ray runtime_env.env_vars); every name they select exists."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    base = OmegaConf.load(Path(core_algos.__file__).parents[1] / "config" / "_generated_ppo_trainer.yaml")
    read_with_get = {"reward.custom_reward_function.reward_kwargs", "ray_kwargs.ray_init.runtime_env.env_vars"}
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert {p.stem for p in files} == {"grpo", "drgrpo", "dapo", "refgrpo", "rlcr"}
    for path in files:
        cfg = OmegaConf.load(path)
        assert list(cfg.defaults) == ["ppo_trainer", "_self_"], path.name
        body = {k: v for k, v in OmegaConf.to_container(cfg).items() if k not in ("hydra", "defaults")}
        for key in _leaf_keys(body):
            if not any(key == p or key.startswith(p + ".") for p in read_with_get):
                assert OmegaConf.select(base, key, default="<missing>") != "<missing>", f"{path.name}: {key}"
        assert cfg.algorithm.adv_estimator in registered["adv_estimators"]
        assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode in registered["policy_losses"]
        assert cfg.actor_rollout_ref.actor.use_kl_loss is False and cfg.algorithm.use_kl_in_reward is False
        env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
        assert env.VERL_USE_EXTERNAL_MODULES == "reflectrl.integrations.verl_plugin"
        fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": OmegaConf.to_container(
            cfg.reward.custom_reward_function)}}))
        out = fn(data_source="reflectrl/arith", solution_str="19", ground_truth="19", extra_info={"task": "arith"})
        assert out["outcome"] == 1.0 and set(out) >= {"score", "acc", "reflection", "confidence", "bonus"}


def _leaf_keys(tree, prefix=""):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaf_keys(value, path + ".")
        else:
            yield path


def test_example_configs_compose_with_hydra():
    """The files compose on top of verl's ppo_trainer (only where hydra-core is installed, as verl installs it)."""
    hydra = pytest.importorskip("hydra")
    for path in sorted(EXAMPLES.glob("*.yaml")):
        with hydra.initialize_config_dir(config_dir=str(EXAMPLES), version_base=None):
            cfg = hydra.compose(config_name=path.stem)
        assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "reflectrl_vanilla"
        assert cfg.actor_rollout_ref.actor.clip_ratio_c == 3.0  # verl's default dual clip, kept
        if path.stem == "drgrpo":
            assert cfg.actor_rollout_ref.actor.loss_scale_factor == cfg.data.max_response_length


@pytest.mark.slow
def test_verl_use_external_modules_registers_in_a_fresh_process():
    import os
    import subprocess
    import sys

    code = ("import verl\nfrom verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn\n"
            "print(get_adv_estimator_fn('reflectrl_grpo').__name__, get_policy_loss_fn('reflectrl_vanilla').__name__)")
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "reflectrl.integrations.verl_plugin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["reflectrl_grpo", "reflectrl_vanilla"]
