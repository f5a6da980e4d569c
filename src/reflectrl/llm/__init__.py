"""The LLM front end: causal-LM policy with heads, group / multi-turn rollouts into the core's
``[rows, steps]`` token batch, the GRPO-family trainer, a tiny model factory, warm-up and evaluation.

``transformers`` is imported only when a model is built or loaded.
"""

from .batch import RowResult, Segment, TokenBatch, build_batch
from .config import GRPOConfig
from .engines import ENGINES, GenerationEngine, HFGenerate, TorchSampler, make_engine, register_engine
from .grpo import GRPO, GRPOHook
from .policy import Policy, TokenOutputs, load_policy
from .rollout import Rollout, RolloutStats

__all__ = ["ENGINES", "GRPO", "GRPOConfig", "GRPOHook", "GenerationEngine", "HFGenerate", "Policy", "Rollout",
           "RolloutStats", "RowResult", "Segment", "TokenBatch", "TokenOutputs", "TorchSampler", "build_batch",
           "load_policy", "make_engine", "register_engine"]
