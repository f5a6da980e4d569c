"""The method contract both front ends share: each seed method runs through the same MethodRunner on a
control batch (PPO's) and on an LLM token batch (GRPO's) and its shaping means the same on both; a method
of a user's own is one file plus one registration and trains and resumes as itself."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from reflectrl.algos import config_for_algo, resume
from reflectrl.algos.registry import ALGOS, Algo, register_algo
from reflectrl.contract.base import MethodRunner, Shaping, StepBatch, apply_shaping
from reflectrl.control.config import PPOConfig
from reflectrl.control.ppo import PPO
from reflectrl.llm.grpo import GRPO, step_batch
from reflectrl.methods.exgrpo_seed import ExGRPOSeed, ExGRPOSeedOptions
from reflectrl.methods.gear_seed import GearSeed, GearSeedOptions
from reflectrl.methods.refgrpo_seed import RefGRPOSeed, RefGRPOSeedOptions
from reflectrl.runlog import read_metrics


def control_batch(tmp_path) -> tuple[PPO, StepBatch]:
    t = PPO(PPOConfig(env_id="CartPole-v1", num_envs=4, num_steps=64, total_timesteps=256, seed_group_size=2,
                      run_dir=str(tmp_path / "c"),
                      progress=False, tensorboard=False))
    b, _ = t.rollout()
    t.advantages(b)
    sb = StepBatch(states=b.obs, features=b.obs, rewards=b.rewards, values=b.values, advantages=b.advantages,
                   returns=b.returns, episode_end=b.episode_end, terminated=b.terminated, next_values=b.next_values,
                   group_size=2)
    return t, sb


def llm_batch(tiny_dir, tmp_path) -> tuple[GRPO, StepBatch, object]:
    t = GRPO(config_for_algo("grpo", task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / "l"), updates=1,
                             prompts_per_update=2, group_size=4, max_new_tokens=3, progress=False, tensorboard=False,
                             reward_workers=0), methods=[MethodRunner(_Noop())])
    batch, _ = t.rollout.run(t.next_problems(2), 4, t.gen)
    t.prepare(batch)
    t.advantages(batch)
    return t, step_batch(t, batch), batch


class _Noop:
    fit_first = True

    def fit(self, batch):
        pass

    def shape(self, batch):
        return Shaping()

    def metrics(self):
        return {}


def make(name: str, dim: int, rows: int, group: int):
    if name == "refgrpo-seed":
        return RefGRPOSeed(dim, RefGRPOSeedOptions(reflection_sample=1.0), 1e-3, seed=0)
    if name == "gear-seed":
        return GearSeed(dim, rows, group, 0.99, GearSeedOptions(gear_rank_coef=0.5), seed=0)
    return ExGRPOSeed(dim, rows, ExGRPOSeedOptions(refl_min_memory=2), seed=0)


@pytest.mark.parametrize("name", ["refgrpo-seed", "gear-seed", "exgrpo-seed"])
def test_each_seed_method_runs_on_both_front_ends_through_one_adapter(tiny_dir, tmp_path, name):
    for front in ("control", "llm"):
        if front == "control":
            _, sb = control_batch(tmp_path)
        else:
            _, sb, _ = llm_batch(tiny_dir, tmp_path)
        R, T = sb.rewards.shape
        runner = MethodRunner(make(name, sb.features.shape[-1], R, sb.group_size))
        for _ in range(3):  # learned parts become ready after a fit or two
            sh = runner.run(sb)
        for field in ("reward_delta", "advantage_delta", "weights"):
            v = getattr(sh, field)
            assert v is None or v.shape == (R, T), (front, field)
        assert any(getattr(sh, f) is not None for f in ("reward_delta", "advantage_delta", "weights")), front
        # one meaning on both fronts: apply_shaping adds deltas (masked) and multiplies weights, nothing else
        mask = sb.mask
        out = apply_shaping(sh, sb.rewards, sb.advantages, sb.returns, None, mask,
                            lambda r, d, sb=sb: (sb.advantages + d, sb.returns + d))
        m = torch.ones_like(sb.rewards) if mask is None else mask
        if sh.reward_delta is not None:
            torch.testing.assert_close(out.rewards, sb.rewards + sh.reward_delta * m)
        if sh.weights is not None:
            assert torch.equal(out.weights, sh.weights)
        if runner.has_aux_loss:  # gear-seed's ranking loss, in the batch's own [rows, steps] coordinates
            from reflectrl.contract.base import AuxInputs

            rows, steps = m.bool().nonzero(as_tuple=True)
            logp = torch.randn(rows.numel(), requires_grad=True)
            loss = runner.aux_loss(AuxInputs(rows, steps, logp, torch.zeros(rows.numel()), (R, T)))
            assert loss is not None and loss.requires_grad


def test_gear_ranking_loss_changes_the_llm_gradient(tiny_dir, tmp_path):
    """The ranking option is not a no-op on the LLM front end: the update's gradient differs with it."""
    grads = []
    for coef in (0.0, 5.0):
        t, _, batch = llm_batch(tiny_dir, tmp_path / str(coef))
        gear = GearSeed(t.policy.hidden_size, batch.rows, 4, 1.0, GearSeedOptions(gear_rank_coef=coef), seed=0)
        batch.scores[:] = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 0.0, 0.5, 0.0])
        batch.token_rewards.zero_()
        batch.token_rewards[torch.arange(batch.rows), batch.last_completion_index()] = batch.scores
        t.methods = [MethodRunner(gear)]
        t._dedupe = coef == 0.0
        t.advantages(batch)
        t.apply_methods(batch)
        batch.extras["row_id"] = torch.arange(batch.rows)
        t._batch_shape = (batch.rows, batch.steps)
        t.policy.train()
        t.optimizer.zero_grad()
        loss, _ = t.micro_loss(batch)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in t.policy.trainable_parameters() if p.grad is not None]))
    assert not torch.allclose(grads[0], grads[1])


# ------------------------------------------------------------------ a user's method, one file + one registration
@dataclass
class BonusConfig(PPOConfig):
    bonus: float = 0.5
    """A constant added to every reward."""
    exp_name: str = "my-bonus"


class ConstantBonus:
    """The smallest method: a constant reward bonus, and a counter that must survive a resume."""

    fit_first = True

    def __init__(self, bonus: float):
        self.bonus, self.fits = bonus, 0

    def fit(self, batch):
        self.fits += 1

    def shape(self, batch):
        return Shaping(reward_delta=torch.full_like(batch.rewards, self.bonus))

    def metrics(self):
        return {"my/fits": float(self.fits)}

    def state(self):
        return {}, {"fits": self.fits}

    def load_state(self, tensors, meta):
        self.fits = int(meta["fits"])


def test_a_method_registered_in_a_test_module_trains_and_resumes_as_itself(tmp_path):
    register_algo(Algo("my-bonus", "control", BonusConfig,
                       lambda cfg: PPO(cfg, [MethodRunner(ConstantBonus(cfg.bonus), lambda t, b: (b.obs, b.obs))]),
                       "PPO + a constant reward bonus (a test's method)"))
    try:
        def cfg(name, total):
            return BonusConfig(env_id="CartPole-v1", num_envs=2, num_steps=32, total_timesteps=total, bonus=0.25,
                               run_dir=str(tmp_path / name), progress=False, tensorboard=False, anneal_lr=False)

        ALGOS["control"]["my-bonus"].make(cfg("full", 64 * 4)).learn()
        ALGOS["control"]["my-bonus"].make(cfg("cut", 64 * 2)).learn()
        assert json.loads((tmp_path / "cut" / "config.json").read_text())["algo"] == "my-bonus"
        t = resume(tmp_path / "cut", 64 * 4)
        assert t.algo_name == "my-bonus" and isinstance(t.methods[0].method, ConstantBonus)
        assert t.methods[0].method.fits == 2 and t.cfg.bonus == 0.25
        t.learn()
        full = [r["my/fits"] for r in read_metrics(tmp_path / "full" / "metrics.jsonl")]
        cut = [r["my/fits"] for r in read_metrics(tmp_path / "cut" / "metrics.jsonl")]
        assert full == cut == [1.0, 2.0, 3.0, 4.0]
    finally:
        ALGOS["control"].pop("my-bonus", None)
