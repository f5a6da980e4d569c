"""Engine log-probs and the truncated importance-sampling (TIS) correction, through a fake engine on the CPU
(TorchSampler's samples; log-probs = the policy's exact ones + known noise); ``--engine vllm`` refused in one
line where vLLM or a GPU is missing; the weight names a vLLM model is given."""

import math

import pytest
import torch

from reflectrl.cli import main
from reflectrl.errors import ConfigError
from reflectrl.llm.batch import ENGINE_LOGP, RowResult, Segment, build_batch
from reflectrl.llm.engines import ENGINES, TorchSampler, register_engine
from reflectrl.llm.grpo import GRPO
from reflectrl.llm.update import TIS_WEIGHT, tis_weights
from reflectrl.tasks.base import TASKS, register_task

from .test_trainer import cfg, scored_batch
from .toytasks import AddTask


class ParityTask(AddTask):
    """Reward 1 for a completion whose first character has an even code: an untrained model's groups have
    rewards that vary."""

    name = "toy-parity"

    def score(self, problem, completion):
        return float(bool(completion) and ord(completion[0]) % 2 == 0)


if "toy-parity" not in TASKS:
    register_task("toy-parity")(ParityTask)


class NoisyEngine(TorchSampler):
    """TorchSampler's samples; their log-probs under the policy plus N(0, sigma) noise, recorded per row."""

    def __init__(self, policy, temperature=1.0, top_k=0, sigma=0.0, seed=0):
        super().__init__(policy, temperature, top_k)
        self.sigma, self.noise_gen, self.noise = sigma, torch.Generator().manual_seed(seed), []

    def generate_with_logprobs(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        outs = self.generate(prompts, max_new_tokens, generator, greedy, stop_ids)
        rows = [RowResult(list(p), [Segment(list(o), "policy", 0)], None, 0.0, False, False, []) for p, o in zip(prompts, outs)]
        with torch.no_grad():
            lp = self.policy.forward_batch(build_batch(rows, list(range(len(rows))), [], self.policy.pad_id),
                                           temperature=self.temperature).logp
        res = []
        for i, o in enumerate(outs):
            n = torch.randn(len(o), generator=self.noise_gen) * self.sigma
            self.noise.append(n)
            res.append((lp[i, :len(o)] + n).tolist())
        return outs, res


@pytest.fixture
def noisy():
    register_engine("noisy", lambda policy, temperature=1.0, top_k=0, **kw: NoisyEngine(policy, temperature, top_k, **kw))
    yield
    ENGINES.pop("noisy", None)


def test_tis_weights_by_hand():
    tr = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    eng = torch.tensor([[-1.5, -0.5, -0.5, -9.0]])
    mask = torch.tensor([[True, True, True, False]])
    w, st = tis_weights(tr, eng, mask, 2.0)
    want = [min(math.exp(0.5), 2.0), math.exp(-1.5), 1.0, 1.0]  # the masked token weighs 1
    assert torch.allclose(w, torch.tensor([want]))
    d = [0.5, -1.5, 0.0]
    assert st["rollout/engine_trainer_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / 3, rel=1e-6)
    assert st["rollout/tis_capped_frac"] == 0.0  # exp(0.5) = 1.65 < 2
    assert st["rollout/engine_logp_mean"] == pytest.approx(-2.5 / 3)
    assert st["rollout/trainer_logp_mean"] == pytest.approx(-3.5 / 3)
    w, st = tis_weights(tr, eng, mask, 1.5)
    assert st["rollout/tis_capped_frac"] == pytest.approx(1 / 3) and w[0, 0] == 1.5
    w, _ = tis_weights(tr, eng, mask, None)  # untruncated
    assert w[0, 0].item() == pytest.approx(math.exp(0.5))


def test_rollout_keeps_engine_logp_and_the_weights_are_the_hand_computation(tiny_dir, tmp_path, noisy):
    t = GRPO(cfg(tiny_dir, tmp_path, engine="noisy", engine_options=("sigma=0.3", "seed=5"), updates=1, gen_batch=64))
    rec = t.iteration()
    b = t.last_batch
    mask = b.completion_mask
    eng, old = b.extras[ENGINE_LOGP], b.old_logp
    assert eng.shape == mask.shape and old is not None  # the no-grad pass ran because the engine gave log-probs
    noise = torch.zeros_like(eng)
    for r, n in enumerate(t.engine.noise):  # one chunk: rows in the engine's order
        k = int(mask[r].sum())
        noise[r, :k] = n[:k]
    assert torch.allclose((eng - old)[mask], noise[mask], atol=1e-4)  # each log-prob sits on its own token
    want = torch.exp(old - eng).clamp(max=2.0)
    assert torch.allclose(b.extras[TIS_WEIGHT][mask], want[mask], rtol=1e-6)
    assert (b.extras[TIS_WEIGHT][~mask] == 1).all()
    k3 = torch.exp(old - eng) - (old - eng) - 1
    assert rec["rollout/engine_trainer_kl"] == pytest.approx(float(k3[mask].mean()), rel=1e-5)
    assert rec["rollout/engine_trainer_kl"] > 0
    for key in ("rollout/engine_logp_mean", "rollout/trainer_logp_mean", "rollout/tis_capped_frac", "rollout/tis_weight_mean"):
        assert key in rec, key


def test_large_noise_is_capped(tiny_dir, tmp_path, noisy):
    t = GRPO(cfg(tiny_dir, tmp_path, engine="noisy", engine_options=("sigma=3.0",), updates=1))
    rec = t.iteration()
    assert rec["rollout/tis_capped_frac"] > 0.05
    assert float(t.last_batch.extras[TIS_WEIGHT].max()) == 2.0


def test_zero_noise_update_equals_the_plain_one_and_noise_changes_it(tiny_dir, tmp_path, noisy):
    def weights(**kw):
        t = GRPO(cfg(tiny_dir, tmp_path, f"r{len(kw)}{kw.get('engine_options', '')}", task="toy-parity", updates=1,
                     gen_batch=64, **kw))
        rec = t.iteration()
        assert rec["groups/zero_std_frac"] < 1  # some advantages are not 0
        return torch.cat([p.detach().flatten() for p in t.policy.trainable_parameters()]), t

    plain, tp = weights()
    zero, tz = weights(engine="noisy", engine_options=("sigma=0.0",))
    assert torch.equal(tp.last_batch.response_ids, tz.last_batch.response_ids)  # the same samples
    assert torch.allclose(plain, zero, atol=1e-6, rtol=0)
    noisy_w, _ = weights(engine="noisy", engine_options=("sigma=1.0",))
    assert not torch.allclose(plain, noisy_w, atol=1e-6, rtol=0)


def test_the_loss_multiplies_each_token_by_its_weight(tiny_dir, tmp_path):
    """A TIS batch trains exactly as the same batch with the hand-computed weights as advantage multipliers
    (rows with the same tokens but different weights are not merged)."""
    def batch():
        b = scored_batch([1.0, 1.0, 0.0, 0.0, 1.0, 0.0], 3)
        b.response_ids[:, 1] = torch.tensor([8, 8, 9, 10, 11, 11])
        return b

    noise = torch.tensor([[0.1, -0.2], [1.5, 0.3], [-0.4, 0.0], [0.2, 2.0], [0.0, -1.0], [0.9, 0.1]])
    grads = []
    for mode in ("tis", "hand", "none"):
        t = GRPO(cfg(tiny_dir, tmp_path, prompts_per_update=2, group_size=3))
        b = batch()
        b.extras[ENGINE_LOGP] = torch.zeros(b.rows, b.steps)
        t.prepare(b)  # the trainer's log-probs (computed because the engine gave its own)
        assert b.old_logp is not None
        if mode == "tis":
            b.extras[ENGINE_LOGP] = b.old_logp - noise
            t.engine_correction(b)
            assert torch.allclose(b.extras[TIS_WEIGHT], torch.exp(noise).clamp(max=2.0), rtol=1e-5)
        else:
            b.extras.pop(ENGINE_LOGP)
            if mode == "hand":
                b.weights = torch.exp(noise).clamp(max=2.0)
        t.advantages(b)
        t.update_idx = 1
        t.update(b)
        grads.append(torch.cat([p.grad.flatten() for p in t.policy.trainable_parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-7, rtol=1e-4)
    assert not torch.allclose(grads[0], grads[2], atol=1e-7, rtol=1e-4)


def test_tis_cap_is_validated(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="--tis-cap must be >= 1"):
        GRPO(cfg(tiny_dir, tmp_path, tis_cap=0.5))
    with pytest.raises(ConfigError, match="--engine-options expects KEY=VALUE"):
        GRPO(cfg(tiny_dir, tmp_path, engine_options=("sigma",)))


def _one_error(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_engine_vllm_without_vllm_or_gpu_is_one_error_line(tiny_dir, tmp_path, capsys, monkeypatch):
    import importlib.util

    argv = ["llm", "train", "--task", "toy-add", "--model", str(tiny_dir), "--engine", "vllm", "--run-dir",
            str(tmp_path / "run"), "--no-progress", "--no-tensorboard"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert "needs vLLM, which is not installed" in _one_error(capsys, argv)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "needs a CUDA GPU" in _one_error(capsys, argv)
    assert not (tmp_path / "run").exists()


def test_hf_weights_of_a_lora_policy_are_the_base_names(tiny_dir):
    from reflectrl.llm.policy import load_policy
    from reflectrl.llm.vllm_engine import hf_weights

    plain = load_policy(tiny_dir)
    lora = load_policy(tiny_dir, lora_r=2)
    lora.model.merge_adapter()
    try:
        names = dict(hf_weights(lora.model))
    finally:
        lora.model.unmerge_adapter()
    assert set(names) == set(plain.model.state_dict())
    for k, v in plain.model.state_dict().items():  # the adapter starts at zero: merged = base
        assert torch.allclose(names[k], v), k
