"""benchmarks/roofline.py: its count of a model's floating-point work is PyTorch's own count of the products the model
runs (the attention's scores and weighted values over every key, where the benchmark counts the causal half)."""

import pytest
import torch

from .helpers import benchmark_script


@pytest.mark.parametrize("n", [1, 7])
def test_the_forward_count_is_the_flop_counters(n):
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    mod = benchmark_script("roofline")
    conf = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       attn_implementation="eager")
    model = LlamaForCausalLM(conf).eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(torch.arange(n)[None])
    flops = mod.Flops(conf, lora_r=0)
    full_attention = 4 * conf.hidden_size * conf.num_hidden_layers * n * n  # every key, as eager attention runs it
    assert flops.tokens(0, n, n) - flops.attention(0, n) + full_attention == counter.get_total_flops()
    assert flops.attention(0, n) == 4 * conf.hidden_size * conf.num_hidden_layers * n * (n + 1) // 2


def test_lora_adds_its_adapters_products():
    from transformers import LlamaConfig

    mod = benchmark_script("roofline")
    conf = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)
    plain, lora = mod.Flops(conf, 0), mod.Flops(conf, 4)
    kv = 16
    per_layer = 4 * (2 * (32 + 32) + 2 * (32 + kv) + 3 * (32 + 48))
    assert lora.lora_params == 2 * per_layer
    assert lora.tokens(0, 3, 0) - plain.tokens(0, 3, 0) == 3 * 2 * lora.lora_params
    assert lora.backward(0, 3, 0) - plain.backward(0, 3, 0) == 3 * 4 * lora.lora_params
