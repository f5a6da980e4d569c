"""A chat model's run takes the fast paths by default (the shared-prompt layout, the sampler's log-probs as the old
ones, the kept KV cache for an asked self-report turn), records them in config.json, and each flag still turns its
path off; a model without a chat template keeps the plain paths (the tiny models' golden runs stay bit for bit)."""

import json

import pytest
import torch

from reflectrl.algos import config_for_algo
from reflectrl.llm.batch import ENGINE_LOGP
from reflectrl.llm.config import GRPOConfig
from reflectrl.llm.engines import TorchLogprobSampler
from reflectrl.llm.grpo import GRPO

from .test_trainer import cfg


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A tiny random model with SmolLM2's tokenizer and chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from reflectrl.llm.models import named_tokenizer

    tok = named_tokenizer("smollm2-135m-instruct")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                                         tie_word_embeddings=True))
    out = tmp_path_factory.mktemp("chat") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_auto_resolves_to_the_fast_paths_for_a_chat_model_only():
    base = GRPOConfig(model="m")
    assert (base.attention, base.old_logp) == ("auto", "auto")
    assert base.fast_paths(chat=True) == {"attention": "shared-prompt", "old_logp": "engine"}
    assert base.fast_paths(chat=False) == {"attention": "padded", "old_logp": "recompute"}
    # the sampler's log-probs only where they equal the trainer's within rounding: the torch engine at top-k 0
    assert GRPOConfig(model="m", top_k=5).fast_paths(chat=True)["old_logp"] == "recompute"
    assert GRPOConfig(model="m", engine="vllm").fast_paths(chat=True)["old_logp"] == "recompute"
    given = GRPOConfig(model="m", attention="causal", old_logp="recompute")
    assert given.fast_paths(chat=True) == {}  # flags win


def _trainer(chat_dir, tmp_path, name, **kw):
    c = config_for_algo(kw.pop("algo", "rlcr"), task="toy-add", model=str(chat_dir), run_dir=str(tmp_path / name),
                        updates=1, prompts_per_update=2, group_size=4, max_new_tokens=4, progress=False,
                        tensorboard=False, reward_workers=0, sample_interval=0, export_model=False, **kw)
    return GRPO(c)


def test_a_chat_model_trains_on_the_fast_paths_and_records_them(chat_dir, tmp_path):
    t = _trainer(chat_dir, tmp_path, "fast", minibatches=2)
    assert t.policy.chat is not None
    assert (t.cfg.attention, t.cfg.old_logp) == ("shared-prompt", "engine") and t.policy.attention == "shared-prompt"
    assert t.engine.kept is not None and "reuse_cache=true" in t.cfg.engine_options  # the asked report's turn
    assert isinstance(t.engine, TorchLogprobSampler)  # two minibatches: the sampler's log-probs replace the pass
    t.learn()
    saved = json.loads((tmp_path / "fast" / "config.json").read_text())
    saved = saved.get("config", saved)
    assert (saved["attention"], saved["old_logp"]) == ("shared-prompt", "engine")
    assert "reuse_cache=true" in saved["engine_options"]


def test_flags_turn_each_fast_path_off(chat_dir, tmp_path):
    t = _trainer(chat_dir, tmp_path, "plain", minibatches=2, attention="padded", old_logp="recompute",
                 engine_options=("reuse_cache=false",))
    assert (t.cfg.attention, t.cfg.old_logp, t.policy.attention) == ("padded", "recompute", "padded")
    assert t.engine.kept is None and not isinstance(t.engine, TorchLogprobSampler)
    assert t.cfg.engine_options == ("reuse_cache=false",)
    t.close()


def test_a_model_without_a_chat_template_keeps_the_plain_paths(tiny_dir, tmp_path):
    t = GRPO(cfg(tiny_dir, tmp_path, self_report="confidence", minibatches=2))
    assert (t.cfg.attention, t.cfg.old_logp) == ("padded", "recompute")
    assert t.engine.kept is None and t.cfg.engine_options == ()
    t.close()


def test_one_minibatch_asks_the_sampler_for_nothing_and_equals_recompute(tiny_dir, tmp_path):
    """A batch that serves one optimizer step takes the update's own log-probs, detached, as the old ones either way:
    the engine is not asked for its log-probs, and the run is the recomputing one's bit for bit."""
    recs = {}
    for mode in ("engine", "recompute"):
        t = GRPO(cfg(tiny_dir, tmp_path, mode, old_logp=mode, updates=2))
        assert not isinstance(t.engine, TorchLogprobSampler)
        recs[mode] = [{k: v for k, v in t.iteration().items() if not k.startswith(("time/", "charts/"))}
                      for _ in range(2)]
        assert ENGINE_LOGP not in t.last_batch.extras
        t.close()
    assert recs["engine"] == recs["recompute"]
