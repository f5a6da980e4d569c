"""``--old-logp engine``: the torch sampler's own log-probs of the tokens it drew stand for the no-grad pass's old
log-probs. The same tokens as the plain sampler, log-probs equal to the trainer's forward within float32 rounding on a
multi-turn task (with and without the kept KV cache), no pass run, and refused where it cannot hold."""

import pytest
import torch

from reflectrl.errors import ConfigError
from reflectrl.llm.batch import ENGINE_LOGP
from reflectrl.llm.engines import TorchLogprobSampler, make_engine
from reflectrl.llm.grpo import GRPO
from reflectrl.llm.rollout import Rollout
from reflectrl.tasks.base import get_task

from .test_trainer import cfg


def _rollout(policy, logprobs: bool, reuse: bool, temperature: float):
    task = get_task("toy-guess")
    engine = make_engine("torch", policy, temperature=temperature, reuse_cache=reuse, logprobs=logprobs)
    ro = Rollout(policy, engine, task, max_new_tokens=4, max_turns=3, max_response_tokens=64, gen_batch=16)
    batch, _ = ro.run(task.problems("train")[:6], 4, torch.Generator().manual_seed(1))
    ro.close()
    return batch, engine


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_sampler_log_probs_are_the_trainers(tiny_policy, reuse, temperature):
    plain, _ = _rollout(tiny_policy, False, reuse, temperature)
    got, engine = _rollout(tiny_policy, True, reuse, temperature)
    assert isinstance(engine, TorchLogprobSampler)
    assert plain.transcripts == got.transcripts and torch.equal(plain.response_ids, got.response_ids)
    assert ENGINE_LOGP not in plain.extras
    eng = got.extras[ENGINE_LOGP]
    with torch.no_grad():
        ref = tiny_policy.forward_batch(got, temperature=temperature).logp
    m = got.completion_mask
    assert int(got.turn_ids.max()) >= 1 and int(m.sum()) > 50  # several turns' tokens
    torch.testing.assert_close(eng[m], ref[:, :eng.shape[1]][m], rtol=0, atol=1e-5)
    assert float(eng[~m].abs().max()) == 0.0 and float(eng[m].max()) < 0


def test_a_run_takes_the_engine_log_probs_and_runs_no_pass(tiny_dir, tmp_path, monkeypatch):
    calls = []
    t = GRPO(cfg(tiny_dir, tmp_path, "eng", old_logp="engine", minibatches=2, updates=1))
    real = t.policy.forward_batch
    monkeypatch.setattr(t.policy, "forward_batch", lambda *a, **k: calls.append(torch.is_grad_enabled()) or real(*a, **k))
    rec = t.iteration()
    assert calls and all(calls)  # every forward is the update's own (with grad): no no-grad pass
    assert abs(rec["losses/approx_kl"]) < 1e-3
    assert "rollout/tis_weight_mean" not in rec and "rollout/engine_trainer_kl" not in rec  # no gap to correct
    t.close()


@pytest.mark.parametrize("algo", ["refgrpo", "rlcr"])
def test_a_method_that_reads_no_hidden_states_runs_no_pass_either(tiny_dir, tmp_path, monkeypatch, algo):
    """refgrpo and rlcr shape from outcomes and self-reports: with the sampler's log-probs, their update runs no
    no-grad pass (the asked turn's question is not run through the model once more)."""
    calls = []
    t = GRPO(cfg(tiny_dir, tmp_path, algo, algo=algo, old_logp="engine", minibatches=2, updates=1, max_new_tokens=16))
    assert "hidden" not in t.needs
    real = t.policy.forward_batch
    monkeypatch.setattr(t.policy, "forward_batch", lambda *a, **k: calls.append(torch.is_grad_enabled()) or real(*a, **k))
    t.iteration()
    assert calls and all(calls)
    assert int(t.last_batch.turn_ids.max()) >= 1  # the report turn was asked and trained
    t.close()


def test_logprobs_alone_keep_the_recomputed_pass_and_its_correction(tiny_dir, tmp_path):
    t = GRPO(cfg(tiny_dir, tmp_path, "tis", engine_options=("logprobs=true",), minibatches=2, updates=1))
    rec = t.iteration()
    assert rec["rollout/engine_trainer_kl"] < 1e-6 and rec["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    t.close()


def test_the_same_seed_gives_the_same_run(tiny_dir, tmp_path):
    recs = []
    for name in ("a", "b"):
        t = GRPO(cfg(tiny_dir, tmp_path, name, old_logp="engine", minibatches=2, updates=2))
        recs.append([{k: v for k, v in t.iteration().items() if not k.startswith(("time/", "charts/"))}
                     for _ in range(2)])
        t.close()
    assert recs[0] == recs[1]


def test_refused_where_it_cannot_hold(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="--old-logp engine takes --top-k 0"):
        cfg(tiny_dir, tmp_path, old_logp="engine", top_k=5).validate()
    with pytest.raises(ConfigError, match="--old-logp engine needs an engine that returns its log-probs"):
        GRPO(cfg(tiny_dir, tmp_path, "hf", old_logp="engine", engine="hf"))
