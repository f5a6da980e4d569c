"""Control front end: Gymnasium vector envs, actor-critics, and the PPO trainer."""

from .config import PRESETS, PPOConfig, preset_config
from .ppo import PPO

__all__ = ["PPO", "PPOConfig", "PRESETS", "preset_config"]
