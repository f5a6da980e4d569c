"""The LLM front end: causal-LM policy with heads, group / multi-turn rollouts into the core's
``[rows, steps]`` token batch, the GRPO-family trainer, a tiny model factory, warm-up and evaluation.

``transformers`` is imported only when a model is built or loaded.
"""

from .grpo import GRPO, LLM_ALGOS, GRPOConfig, config_for_algo, register_llm_algo
from .policy import Policy, TokenOutputs, load_policy
from .rollout import (ENGINES, GenerationEngine, HFGenerate, Rollout, RolloutStats, Segment, TokenBatch, TorchSampler,
                      build_batch, make_engine, register_engine)

__all__ = ["ENGINES", "GRPO", "GRPOConfig", "GenerationEngine", "HFGenerate", "LLM_ALGOS", "Policy", "Rollout",
           "RolloutStats", "Segment", "TokenBatch", "TokenOutputs", "TorchSampler", "build_batch", "config_for_algo",
           "load_policy", "make_engine", "register_engine", "register_llm_algo"]
