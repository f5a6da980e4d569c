"""Shape-annotated tensor types of the core's ``[rows, steps]`` layout (jaxtyping; documentation for readers
and type checkers, no runtime checks)."""

from __future__ import annotations

from jaxtyping import Bool, Float, Shaped
from torch import Tensor

Steps = Float[Tensor, "rows steps"]
"""A per-step float tensor ``[R, T]`` (rewards, values, advantages, log-probs)."""
StepMask = Shaped[Tensor, "rows steps"]
"""A per-step mask ``[R, T]`` (bool, or 0 / 1 floats)."""
StepFlags = Bool[Tensor, "rows steps"]
"""Per-step booleans ``[R, T]`` (episode ends, terminations)."""
Rows = Float[Tensor, "rows"]
"""A per-row float tensor ``[R]`` (sequence scores, bootstrap values)."""
