"""reflectrl: reinforcement learning in which an agent's self-assessment shapes its learning signal."""

__version__ = "0.1.0"
