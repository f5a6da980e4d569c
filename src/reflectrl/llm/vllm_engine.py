"""The vLLM generation engine: ``--engine vllm`` (vLLM installed and a CUDA GPU present).

:class:`VLLMEngine` builds one in-process ``vllm.LLM`` from the policy's model directory, generates with it
(``generate``, and ``generate_with_logprobs``: the log-probability vLLM gave each sampled token, which the
trainer's truncated importance-sampling correction compares with its own, ``tis_cap`` in docs/llm.md), and
after every optimizer step loads the trainer's current weights into it (``sync``; LoRA adapters are merged
first). ``--engine-options KEY=VALUE`` pass keyword arguments to ``vllm.LLM`` (``gpu_memory_utilization``,
``enforce_eager``, ``max_model_len``, ...).

Written against vLLM's offline ``LLM`` API (``TokensPrompt`` inputs, per-request ``SamplingParams`` with
``logprobs=0``, ``logprobs_mode="processed_logprobs"`` where the version has it, ``apply_model`` or the
driver worker's model for the weight load); tests/llm/test_engine_tis.py runs the correction through a fake
engine on the CPU, and no test here runs vLLM itself (docs/scaling.md says what was not run).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError, ReflectRLError

if TYPE_CHECKING:
    from .policy import Policy

DEFAULT_OPTIONS: dict[str, Any] = {"gpu_memory_utilization": 0.3, "enable_prefix_caching": True}


def vllm_unavailable() -> str | None:
    """Why ``--engine vllm`` cannot run in this process (None when it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "--engine vllm needs vLLM, which is not installed here (pip install vllm, on a machine with a CUDA GPU)"
    if not torch.cuda.is_available():
        return "--engine vllm needs a CUDA GPU, and none is visible to this process (torch.cuda.is_available() is False)"
    return None


class VLLMEngine:
    """A :class:`~reflectrl.llm.engines.GenerationEngine` on an in-process ``vllm.LLM`` (see the module
    docstring). Per-request seeds are drawn from the rollout's generator, so a run is repeatable with the same
    vLLM build and GPU (vLLM's batching makes no bitwise promise across versions)."""

    def __init__(self, policy: Policy, temperature: float = 1.0, top_k: int = 0, **options: Any):
        why = vllm_unavailable()
        if why:
            raise ConfigError(why)
        # the engine core in this process: the weight load below reaches its model directly
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.temperature, self.top_k = temperature, top_k
        dtype = str(next(policy.model.parameters()).dtype).replace("torch.", "")
        source = str(getattr(policy, "source", "") or policy.config._name_or_path)
        kw: dict[str, Any] = {"model": source, "tokenizer": source, "dtype": dtype, "seed": 0, **DEFAULT_OPTIONS,
                              "logprobs_mode": "processed_logprobs", **options}
        try:
            self.llm = LLM(**kw)
            self.processed = True
        except TypeError as exc:  # a vLLM without logprobs_mode: its log-probs are of the raw logits
            if "logprobs_mode" not in str(exc) or "logprobs_mode" in options:
                raise ConfigError(f"vllm.LLM refused the engine options ({exc})") from None
            kw.pop("logprobs_mode")
            self.llm = LLM(**kw)
            self.processed = False
            if temperature != 1.0 or top_k:
                warnings.warn("this vLLM returns log-probs of the raw logits (no logprobs_mode): with a temperature "
                              "or top-k they are not the sampling distribution's, and the TIS weights are off",
                              stacklevel=2)
        self.ends = sorted(set(policy.eos_ids))
        self.sync(policy)

    # ------------------------------------------------------------------ generation
    def _params(self, budgets: Sequence[int], generator: torch.Generator, greedy: bool,
                stop_ids: Sequence[int]) -> list[Any]:
        from vllm import SamplingParams

        ends = sorted(set(self.ends) | set(stop_ids))
        out = []
        for b in budgets:
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
            kw: dict[str, Any] = {"n": 1, "max_tokens": int(b), "stop_token_ids": ends, "logprobs": 0, "seed": seed,
                                  "skip_special_tokens": False}
            if greedy or self.temperature == 0:
                kw["temperature"] = 0.0
            else:
                kw.update(temperature=self.temperature, top_p=1.0)
                if self.top_k:
                    kw["top_k"] = self.top_k
            out.append(SamplingParams(**kw))
        return out

    def generate_with_logprobs(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int,
                               generator: torch.Generator, greedy: bool = False, stop_ids: Sequence[int] = ()
                               ) -> tuple[list[list[int]], list[list[float]]]:
        """Per prompt the sampled token ids (ending with eos or a stop id when the model stopped) and the
        engine's log-probability of each of them."""
        from vllm.inputs import TokensPrompt

        budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        reqs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        outs = self.llm.generate(reqs, self._params(budgets, generator, greedy, stop_ids), use_tqdm=False)
        ids_out, lps_out = [], []
        for out, b in zip(outs, budgets):
            comp = out.outputs[0]
            ids = [int(t) for t in comp.token_ids][:b]
            steps = comp.logprobs or []
            lps = [float(step[t].logprob) if step is not None and t in step else float("nan")
                   for step, t in zip(steps, ids)]
            ids_out.append(ids)
            lps_out.append(lps + [float("nan")] * (len(ids) - len(lps)))
        return ids_out, lps_out

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int,
                 generator: torch.Generator, greedy: bool = False, stop_ids: Sequence[int] = ()) -> list[list[int]]:
        return self.generate_with_logprobs(prompts, max_new_tokens, generator, greedy, stop_ids)[0]

    # ------------------------------------------------------------------ weights
    def sync(self, policy: Policy) -> None:
        """Load the policy's current weights (LoRA merged) into vLLM's model and drop its prefix cache."""
        model = policy.model
        merged = hasattr(model, "merge_adapter")
        if merged:
            model.merge_adapter()
        try:
            self._load(hf_weights(model))
        finally:
            if merged:
                model.unmerge_adapter()
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):
            reset()

    def _load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        apply = getattr(self.llm, "apply_model", None)
        if callable(apply):
            apply(lambda m: m.load_weights(weights))
            return
        engine = getattr(self.llm, "llm_engine", None)
        worker = getattr(getattr(engine, "model_executor", None), "driver_worker", None)
        runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
        target = getattr(runner, "model", None)
        if target is None or not hasattr(target, "load_weights"):
            raise ReflectRLError("cannot reach the model of this vLLM version to load the trained weights "
                                 "(no LLM.apply_model and no driver worker); use a vLLM with LLM.apply_model")
        target.load_weights(weights)


def hf_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of a causal LM in Hugging Face naming: a PEFT model's base weights (with its adapter
    merged in by the caller) without the ``base_model.model.`` prefix, ``.base_layer`` and the adapter's own
    tensors."""
    out = []
    for name, t in model.state_dict().items():
        if "lora_" in name or "modules_to_save" in name:
            continue
        name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        out.append((name, t.detach()))
    return out


def make_vllm_engine(policy: Policy, temperature: float = 1.0, top_k: int = 0, **options: Any) -> VLLMEngine:
    """The ``--engine vllm`` factory."""
    return VLLMEngine(policy, temperature=temperature, top_k=top_k, **options)


__all__ = ["VLLMEngine", "hf_weights", "make_vllm_engine", "vllm_unavailable"]
