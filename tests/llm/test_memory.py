"""Memory before work (:mod:`reflectrl.llm.memory`): the estimate against hand-worked numbers, the micro-batches the
default split chooses when an update would not fit, and a refusal, before any work, where a given split does not."""

import types

import pytest

from reflectrl.errors import ConfigError
from reflectrl.llm import memory
from reflectrl.llm.memory import GIB, ModelShape, UpdateShape, fit_update, plan_memory

MIB = 1 << 20


def smol() -> ModelShape:
    """SmolLM2-135M's shapes: 30 layers, width 576, MLP width 1536, vocabulary 49152, 3 KV heads of 64."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, vocab_size=49152,
                      num_attention_heads=9, num_key_value_heads=3)
    return ModelShape.of(cfg)


def test_the_model_shape_and_per_token_costs():
    m = smol()
    assert (m.layers, m.width, m.inner, m.vocab, m.kv_width, m.bytes) == (30, 576, 1536, 49152, 192, 4)
    assert m.train_token(lora=True) == 30 * (14 * 576 + 7 * 1536) * 4  # 2.16 MiB a token with LoRA
    assert m.train_token(lora=False) == 30 * (8 * 576 + 4.5 * 1536) * 4
    assert m.logit_row() == 49152 * 4 and m.kv_token() == 30 * 2 * 192 * 4


def test_a_plan_by_hand():
    """128 rows of prompts 40-50 tokens and responses up to 150, one micro-batch per minibatch, LoRA."""
    m = smol()
    shape = UpdateShape(rows=128, prompt_max=50, prompt_min=40, response_max=150, gen_batch=64, minibatches=1,
                        grad_accum=1, micro_tokens=0)
    assert shape.width == 200 and shape.response_share == 150 / 190 and shape.micro_tokens_max() == 128 * 200
    plan = plan_memory(m, shape, trainable=1000, lora=True, held=GIB)
    assert plan.phases["generation"] == 64 * (200 * m.kv_token() + 3 * m.logit_row())
    assert plan.phases["no-grad pass"] == pytest.approx(128 * 200 * (150 / 190) * 3.5 * m.logit_row())
    train = 128 * 200 * (m.train_token(True) + (150 / 190) * 6.5 * m.logit_row()) + 4 * 1000 * 4
    assert plan.phases["training"] == pytest.approx(train)
    assert plan.peak == pytest.approx(GIB + 1.3 * (plan.phases["no-grad pass"] + train))
    assert plan.peak > 70 * GIB  # the README's rlcr command at its old defaults: no machine of 24 GiB held it
    # packed micro-batches of 2000 tokens: the training pass and the no-grad pass shrink, generation does not
    packed = plan_memory(m, UpdateShape(128, 50, 40, 150, 64, 1, 1, 2000), 1000, True, GIB)
    assert packed.phases["generation"] == plan.phases["generation"]
    assert packed.phases["training"] == pytest.approx(2000 / (128 * 200) * (train - 16000) + 16000)
    # grad_accum splits a minibatch's rows into equal micro-batches at the batch's width
    assert UpdateShape(128, 50, 40, 150, 64, 2, 4, 0).micro_tokens_max() == 16 * 200


def cfg(**kw):
    from reflectrl.llm.config import GRPOConfig

    base = dict(model="m", prompts_per_update=16, group_size=8, max_response_tokens=150, lora_r=16)
    base.update(kw)
    return GRPOConfig(**base)


def policy(trainable=1000):
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, vocab_size=49152,
                         num_attention_heads=9, num_key_value_heads=3)
    import torch

    return types.SimpleNamespace(config=config, trainable_parameters=lambda: [torch.zeros(trainable)])


def test_the_default_split_packs_micro_batches_that_fit():
    new, note = fit_update(cfg(), policy(), [40, 50], free=22 * GIB, held=GIB)
    assert new.micro_batch_tokens > 0 and note is not None
    assert f"--micro-batch-tokens {new.micro_batch_tokens}" in note and "\n" not in note
    shape = UpdateShape(128, 50, 40, 150, 128, 1, 1, new.micro_batch_tokens)
    assert plan_memory(smol(), shape, 1000, True, GIB).peak <= memory.DEFAULT_BUDGET
    bigger = UpdateShape(128, 50, 40, 150, 128, 1, 1, new.micro_batch_tokens + 1)
    assert plan_memory(smol(), bigger, 1000, True, GIB).peak > memory.DEFAULT_BUDGET  # the largest that fits
    # the same choice on any machine with more than the default budget free; less free: smaller micro-batches
    assert fit_update(cfg(), policy(), [40, 50], free=100 * GIB, held=GIB)[0] == new
    small = fit_update(cfg(), policy(), [40, 50], free=6 * GIB, held=GIB)[0]
    assert 0 < small.micro_batch_tokens < new.micro_batch_tokens


def test_an_update_that_fits_is_left_as_it_is():
    c = cfg(prompts_per_update=1, group_size=2, max_response_tokens=16)
    assert fit_update(c, policy(), [40, 50], free=22 * GIB, held=GIB) == (c, None)
    assert fit_update(c, policy(), [40, 50], free=None, held=GIB) == (c, None)  # free memory unknown


def test_a_given_split_that_does_not_fit_is_refused_with_the_flag_that_would():
    with pytest.raises(ConfigError) as err:
        fit_update(cfg(grad_accum=2), policy(), [40, 50], free=8 * GIB, held=GIB)
    msg = str(err.value)
    assert "--micro-batch-tokens " in msg and "free memory" in msg and "\n" not in msg
    n = int(msg.split("--micro-batch-tokens ")[1].split()[0])
    assert fit_update(cfg(micro_batch_tokens=n), policy(), [40, 50], free=8 * GIB, held=GIB)[1] is None
    with pytest.raises(ConfigError, match="not even one row"):
        fit_update(cfg(), policy(), [40, 50], free=0.2 * GIB, held=GIB)


def test_the_trainer_refuses_before_any_work(tmp_path, monkeypatch, tiny_dir):
    """A run whose given split cannot fit is refused when the trainer is built: no run folder is written."""
    from reflectrl.algos import config_for_algo
    from reflectrl.llm.grpo import GRPO

    monkeypatch.setattr(memory, "available_bytes", lambda: 1.0)
    c = config_for_algo("grpo", task="arith", model=str(tiny_dir), run_dir=str(tmp_path / "r"), grad_accum=2,
                        updates=1, prompts_per_update=2, group_size=2, progress=False, threads=1)
    with pytest.raises(ConfigError, match="micro-batch|not even one row"):
        GRPO(c)
    assert not (tmp_path / "r").exists()
