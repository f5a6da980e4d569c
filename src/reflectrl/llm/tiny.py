"""A tiny random-init causal LM with a character-level tokenizer, in the standard Hugging Face format.

``init_tiny(out_dir)`` writes ``config.json`` + ``model.safetensors`` + ``tokenizer.json`` so that
``AutoModelForCausalLM.from_pretrained(out_dir)`` and ``AutoTokenizer.from_pretrained(out_dir)``
load it offline. It is the CPU-scale model of the LLM recipe: warm it up on a task's
demonstrations (:mod:`reflectrl.llm.warmup`), then train it by RL (:mod:`reflectrl.llm.grpo`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
# printable ASCII plus newline and tab: enough for arithmetic, Python code and SQL
CHARSET = "".join(chr(i) for i in range(32, 127)) + "\n\t"
ARCHS = ("llama", "gpt2")


def char_tokenizer(charset: str = CHARSET):
    """A ``PreTrainedTokenizerFast`` mapping each character to one token (unknown ones to ``<unk>``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(charset))
    vocab = {tok: i for i, tok in enumerate(list(SPECIAL_TOKENS) + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=4096)


def tiny_config(vocab_size: int, arch: str = "llama", layers: int = 2, width: int = 64, heads: int = 4,
                max_positions: int = 1024):
    """The ``transformers`` config of a tiny model (pad/bos/eos ids 0/1/2, tied embeddings)."""
    if arch not in ARCHS:
        raise ConfigError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    if layers < 1 or width < 8 or heads < 1 or width % heads:
        raise ConfigError(f"tiny model needs layers >= 1, width >= 8 and width divisible by heads "
                          f"(got layers={layers}, width={width}, heads={heads})")
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=vocab_size, hidden_size=width, intermediate_size=4 * width,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                           max_position_embeddings=max_positions, rms_norm_eps=1e-5, **ids)
    from transformers import GPT2Config

    return GPT2Config(vocab_size=vocab_size, n_embd=width, n_layer=layers, n_head=heads, n_positions=max_positions,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids)


def init_tiny(out_dir: str | Path, arch: str = "llama", layers: int = 2, width: int = 64, heads: int = 4,
              max_positions: int = 1024, seed: int = 0, charset: str = CHARSET, force: bool = False) -> Path:
    """Write a random-init tiny causal LM and its character tokenizer to ``out_dir``; return the path.
    A directory that holds files is refused unless ``force`` (which also removes a ``warmup.json`` that
    would describe the model replaced)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..runlog import claim_output_dir
    from .models import quiet_transformers

    quiet_transformers()
    out = claim_output_dir(out_dir, "output directory", force, stale=("warmup.json",))
    tok = char_tokenizer(charset)
    cfg = tiny_config(len(tok), arch, layers, width, heads, max_positions)
    saved_rng = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    torch.random.set_rng_state(saved_rng)
    model.generation_config.pad_token_id = 0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "reflectrl_tiny.json").write_text(json.dumps(
        {"arch": arch, "layers": layers, "width": width, "heads": heads, "seed": seed,
         "parameters": sum(p.numel() for p in model.parameters())}, indent=2))
    return out
