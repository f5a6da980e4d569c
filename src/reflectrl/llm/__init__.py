"""The LLM front end: causal-LM policy with heads, group / multi-turn rollouts into the core's
``[rows, steps]`` token batch, the GRPO-family trainer, a tiny model factory, warm-up and evaluation.

``transformers`` is imported only when a model is built or loaded.
"""

from .config import LLM_ALGOS, GRPOConfig, config_for_algo, register_llm_algo
from .grpo import GRPO
from .policy import Policy, TokenOutputs, load_policy
from .batch import RowResult, Segment, TokenBatch, build_batch
from .engines import ENGINES, GenerationEngine, HFGenerate, TorchSampler, make_engine, register_engine
from .rollout import Rollout, RolloutStats

__all__ = ["ENGINES", "GRPO", "GRPOConfig", "GenerationEngine", "HFGenerate", "LLM_ALGOS", "Policy", "Rollout",
           "RolloutStats", "RowResult", "Segment", "TokenBatch", "TokenOutputs", "TorchSampler", "build_batch", "config_for_algo",
           "load_policy", "make_engine", "register_engine", "register_llm_algo"]
